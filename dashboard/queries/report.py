"""Read-only queries of the delivery-versus-settlement report (R7.2–R7.4, R8.4).

Each settled run's delivery is judged once, by the pure rules of
``governance.rules.publication``, and kept on its ``Settlement`` row
(``governance.services.deliveries``, which also says what a run's provider and
a committed, sent or observed chunk are). Here those columns are summed per
group by the database, the cost of the runs' requests is priced from the
billed tokens kept with them, and the discrepancies are listed a page at a
time: the work does not grow with the runs of the period beyond one pass of
the database over their settlement rows.

The report reads judgements as they stand: its views have the period's
missing or stale ones judged first (``deliveries.judge_unjudged``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from uuid import UUID

from django.db.models import Case, Count, F, IntegerField, Q, QuerySet, Sum, Value, When
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Coalesce, TruncDate

from dashboard.queries.costs import prices_of, summarize
from governance.models import Provider, SettledDay, SettledUsageDay, Settlement
from governance.rules.cost import CostSummary, UsageShape, summarize_shapes
from governance.rules.discrepancies import Discrepancy
from governance.rules.publication import DeliveryVerdict, SettlementOutcome
from governance.services.deliveries import (
    FACTS_UNREADABLE,
    NO_PROVIDER,
    CallbackView,
)
from governance.services.usage import merge_shape

GROUPS = ("day", "provider", "outcome")
OUTCOMES: tuple[str, ...] = tuple(o.value for o in SettlementOutcome)
VERDICTS: tuple[str, ...] = (
    DeliveryVerdict.CLIENT_RECEIVED_ALL_COMMITTED.value,
    DeliveryVerdict.CLIENT_RECEIVED_PART.value,
    DeliveryVerdict.NO_CLIENT_EVIDENCE.value,
    DeliveryVerdict.NOTHING_COMMITTED.value,
)
# Short plain words per code, for the list (the rule's own text says the details).
CODE_TITLES: dict[str, str] = {
    "completed_without_committed_body": "Completed, but no body was committed",
    "completed_body_incomplete": "Completed, but the body is incomplete",
    "completed_attachments_unsaved": "Completed, but attachments were not saved",
    "partial_without_saved_material": "Partial, but nothing was saved",
    "failed_with_saved_material": "Failed, although material was committed",
    "committed_never_sent": "Committed, never sent",
    "no_client_evidence": "No client evidence",
    "chunks_never_observed": "Chunks never observed",
    "observed_without_send_record": "Observed without a send record",
    "observed_exceeds_committed": "Client claimed more than was committed",
    "callback_before_settlement": "Callback before settlement",
    "callback_said_completed": "Callback said completed",
    "callback_outcome_mismatch": "Callback disagrees with settlement",
    "callback_delivery_failed": "Callback never delivered",
    "effects_unknown": "Effects left unknown",
    FACTS_UNREADABLE: "Chunk records break the publication rules",
}


def code_title(code: str) -> str:
    """Plain words for a code; a code added to the rules later still reads as words."""
    return CODE_TITLES.get(code) or code.replace("_", " ").capitalize()


@dataclass(frozen=True)
class ReportQuery:
    """The filters: ``[start, end)`` on ``settled_at``, grouping, optional narrowing."""

    start: datetime
    end: datetime
    group: str = "day"
    provider: str = ""
    outcome: str = ""


# --------------------------------------------------------------------------- base query


def provider_ids() -> list[str]:
    return list(Provider.objects.order_by("provider_id").values_list("provider_id", flat=True))


def settlements(query: ReportQuery) -> QuerySet[Settlement]:
    """The settlements in the window, narrowed by provider and outcome."""
    window = Settlement.objects.filter(settled_at__gte=query.start, settled_at__lt=query.end)
    return _narrowed(window, query)


def _group_expression(group: str) -> Any:
    if group == "day":
        return TruncDate("settled_at", tzinfo=UTC)
    if group == "provider":
        return F("provider_key")
    if group == "outcome":
        return Case(
            *(When(outcome=o, then=Value(i)) for i, o in enumerate(OUTCOMES)),
            default=Value(len(OUTCOMES)),
            output_field=IntegerField(),
        )
    raise ValueError(f"unknown grouping {group!r}")


# --------------------------------------------------------------------------- aggregate


@dataclass
class GroupRow:
    """One row of the aggregate table (R7.4 in aggregate)."""

    key: Any
    runs: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    committed: int = 0
    sent: int = 0
    observed: int = 0
    evidence: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VERDICTS, 0))
    with_discrepancies: int = 0
    discrepancies: int = 0
    # What the runs' provider requests cost (governance.rules.cost).
    cost: CostSummary = field(default_factory=CostSummary)


_DAY_COLUMNS = ("runs", "committed", "sent", "observed")
_DAY_VERDICTS = dict(
    zip(VERDICTS, ("all_acknowledged", "part_acknowledged", "no_evidence", "nothing_committed"),
        strict=True)
)  # fmt: skip


def grouped_counts(query: ReportQuery) -> list[GroupRow]:
    """Runs, outcomes, chunks, verdicts and discrepancies per group: whole UTC days
    from ``SettledDay``, the part-days at either end summed from the judged
    settlements (two queries, neither reading each run of the whole days)."""
    days, edges = _edges(query)
    zero = Value(0)
    found: dict[Any, GroupRow] = {}

    def row_of(key: Any) -> GroupRow:
        if key not in found:
            found[key] = GroupRow(key=key, outcomes=dict.fromkeys(OUTCOMES, 0))
        return found[key]

    if days is not None:
        whole = _narrowed(SettledDay.objects.filter(day__gte=days[0], day__lte=days[1]), query)
        sums = {
            **{name: Sum(name) for name in _DAY_COLUMNS},
            **{column: Sum(column) for column in _DAY_VERDICTS.values()},
            "flagged_runs": Sum("flagged"), "found": Sum("discrepancies"),
        }  # fmt: skip
        for day_row in (
            whole.annotate(key=_day_group(query.group))
            .values("key", "outcome")
            .annotate(**sums)
            .order_by()
        ):
            _add_counts(row_of(day_row["key"]), day_row, day_row["outcome"])
    counts = {
        "runs": Count("id"),
        "committed": Coalesce(Sum("chunks_committed"), zero),
        "sent": Coalesce(Sum("chunks_sent"), zero),
        "observed": Coalesce(Sum("chunks_observed"), zero),
        **{
            column: Count("id", filter=Q(delivery_verdict=v)) for v, column in _DAY_VERDICTS.items()
        },
        "flagged_runs": Count("id", filter=Q(discrepancy_count__gt=0)),
        "found": Coalesce(Sum("discrepancy_count"), zero),
    }
    parts = (
        _narrowed(Settlement.objects.filter(edges), query)
        .annotate(key=_group_expression(query.group))
        .values("key", "outcome")
        .annotate(**counts)
        .order_by()
        if edges is not None
        else ()
    )
    for part in parts:
        _add_counts(row_of(part["key"]), part, part["outcome"])
    return [found[key] for key in sorted(found, key=_sortable) if found[key].runs]


def _add_counts(row: GroupRow, sums: dict[str, Any], outcome: str) -> None:
    runs = sums["runs"] or 0
    row.runs += runs
    if outcome in row.outcomes:
        row.outcomes[outcome] += runs
    row.committed += sums["committed"] or 0
    row.sent += sums["sent"] or 0
    row.observed += sums["observed"] or 0
    for verdict, column in _DAY_VERDICTS.items():
        row.evidence[verdict] += sums[column] or 0
    row.with_discrepancies += sums["flagged_runs"] or 0
    row.discrepancies += sums["found"] or 0


CostItems = dict[Any, list[tuple[int, str, UsageShape]]]


def _whole_days(query: ReportQuery) -> tuple[date, date] | None:
    """The UTC days wholly inside ``[start, end)``, as [first, last], or None."""
    first = query.start.astimezone(UTC)
    first_day = first.date() if first.time() == time.min else first.date() + timedelta(days=1)
    last_day = query.end.astimezone(UTC).date() - timedelta(days=1)  # its end ≤ end
    return (first_day, last_day) if first_day <= last_day else None


def _edges(query: ReportQuery) -> tuple[tuple[date, date] | None, Q | None]:
    """The whole UTC days of the window ([first, last] or None) and the filter of the
    settlements outside them (the part-days at either end) — None when the window is
    whole days only (dates, the usual case): there is nothing to read run by run."""
    days = _whole_days(query)
    edges = Q(settled_at__gte=query.start, settled_at__lt=query.end)
    if days is not None:
        first, last = days
        whole = (_midnight(first), _midnight(last + timedelta(1)))
        if (query.start, query.end) == whole:
            return days, None
        edges &= ~Q(settled_at__gte=whole[0], settled_at__lt=whole[1])
    return days, edges


def _narrowed(rows: QuerySet, query: ReportQuery) -> QuerySet:
    """Settlements or day sums narrowed to the query's provider and outcome."""
    if query.provider:
        rows = rows.filter(provider_key=query.provider)
    if query.outcome:
        rows = rows.filter(outcome=query.outcome)
    return rows


def _day_group(group: str) -> Any:
    """The group key of a ``SettledDay`` or ``SettledUsageDay`` row."""
    if group == "day":
        return F("day")
    if group == "provider":
        return F("provider_key")
    return _group_expression(group)


def grouped_usage(query: ReportQuery) -> CostItems:
    """The billed tokens of the window's runs per group, as (provider pk, result,
    shape): whole UTC days from ``SettledUsageDay`` (one query, however many runs),
    the part-days at either end from the usage kept with each judged run."""
    found: dict[Any, dict[tuple, UsageShape]] = defaultdict(dict)

    def add(key: Any, provider: int, refused: bool, shape: UsageShape) -> None:
        result = "refused" if refused else "other"
        merge_shape(found[key], (provider, result, shape.kinds, shape.reported), shape)

    days, edges = _edges(query)
    if days is not None:
        whole = _narrowed(SettledUsageDay.objects.filter(day__gte=days[0], day__lte=days[1]), query)
        rows = (
            whole.values_list(
                _day_group(query.group),
                "provider_id",
                "refused",
                "reported",
                # The kinds apart: a price missing for one kind leaves only those unknown.
                "bills_input",
                "bills_output",
                "bills_cached",
            )
            .annotate(n=Sum("requests"), b=Sum("billed_input"), o=Sum("output"), c=Sum("cached"))
            .order_by()
        )
        for key, provider, refused, reported, _i, _o, _c, n, b, o, c in rows:
            if n:  # a line emptied by a later judgement's difference
                add(key, provider, refused, UsageShape(n, reported, b, o, c))
    part = (
        _narrowed(Settlement.objects.filter(edges), query)
        .annotate(group_key=_group_expression(query.group), usage=KeyTransform("usage", "delivery"))
        .values_list("group_key", "usage")
        .iterator(chunk_size=2000)
        if edges is not None
        else ()
    )
    for key, usage in part:
        for provider, result, reported, n, b, o, c in usage or ():
            add(key, provider, result == "refused", UsageShape(n, reported, b, o, c))
    return {
        key: [(k[0], k[1], shape) for k, shape in shapes.items()] for key, shapes in found.items()
    }


def _midnight(day: date) -> datetime:
    return datetime.combine(day, time.min, tzinfo=UTC)


# --------------------------------------------------------------------------- per run


@dataclass(frozen=True)
class RunDelivery:
    """R7.4 for one run: settlement vs delivery evidence vs callback, and every discrepancy."""

    run_id: UUID
    settled_at: datetime
    outcome: str
    provider: str
    committed: int
    sent: int
    observed: int
    callback: CallbackView
    verdict: str
    unknown_effects: tuple[str, ...]
    discrepancies: tuple[Discrepancy, ...]


_RUN_FIELDS = (
    "run_id", "settled_at", "outcome", "provider_key", "chunks_committed", "chunks_sent",
    "chunks_observed", "delivery_verdict", "delivery",
)  # fmt: skip


def _run_delivery(row: tuple) -> RunDelivery:
    run_id, settled_at, outcome, provider, committed, sent, observed, verdict, kept = row
    kept = kept or {}
    return RunDelivery(
        run_id=run_id,
        settled_at=settled_at,
        outcome=outcome,
        provider=provider,
        committed=committed,
        sent=sent,
        observed=observed,
        callback=CallbackView.from_json(kept.get("callback")),
        verdict=verdict,
        unknown_effects=tuple(kept.get("unknown_effects", ())),
        discrepancies=tuple(
            Discrepancy(found["code"], found["text"]) for found in kept.get("discrepancies", ())
        ),
    )


def _newest_first(rows: QuerySet[Settlement]) -> QuerySet[Settlement]:
    return rows.order_by("-settled_at", "-run_id")


def run_deliveries(query: ReportQuery) -> Iterator[RunDelivery]:
    """Every settled run of the window as judged, newest first (one query, streamed)."""
    rows = _newest_first(settlements(query)).values_list(*_RUN_FIELDS)
    for row in rows.iterator(chunk_size=2000):
        yield _run_delivery(row)


@dataclass(frozen=True)
class DiscrepancyRow:
    run: RunDelivery
    code: str
    title: str
    text: str


def _rows_of(run: RunDelivery) -> list[DiscrepancyRow]:
    return [
        DiscrepancyRow(run, d.code, CODE_TITLES.get(d.code, ""), d.text) for d in run.discrepancies
    ]


class DiscrepancyList(Sequence[DiscrepancyRow]):
    """The window's discrepancies, newest run first, read a slice at a time: a page
    reads the discrepancy counts of the runs up to it and the rows of the runs it
    shows. ``count`` is known from the aggregate."""

    def __init__(self, query: ReportQuery, count: int) -> None:
        self.query = query
        self.count = count

    def __len__(self) -> int:
        return self.count

    def _flagged(self) -> QuerySet[Settlement]:
        return settlements(self.query).filter(discrepancy_count__gt=0)

    def __iter__(self) -> Iterator[DiscrepancyRow]:
        rows = _newest_first(self._flagged()).values_list(*_RUN_FIELDS)
        for row in rows.iterator(chunk_size=2000):
            yield from _rows_of(_run_delivery(row))

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, slice):
            if index < 0:
                return list(self)[index]
            found = self[index : index + 1]
            if not found:
                raise IndexError(index)
            return found[0]
        start, stop, step = index.indices(self.count)
        if step != 1:
            return list(self)[index]
        if start >= stop:
            return []
        # Every flagged run has at least one discrepancy, so rows [start, stop) lie
        # within the first ``stop`` runs: their counts (two small columns) say which.
        counts = _newest_first(self._flagged()).values_list("id", "discrepancy_count")[:stop]
        before, wanted = 0, {}
        for settlement_id, count in counts:
            if before + count > start:
                wanted[settlement_id] = before
            before += count
            if before >= stop:
                break
        rows = _newest_first(Settlement.objects.filter(id__in=list(wanted))).values_list(
            "id", *_RUN_FIELDS
        )
        found: list[DiscrepancyRow] = []
        for settlement_id, *row in rows:
            first = wanted[settlement_id]
            for offset, item in enumerate(_rows_of(_run_delivery(tuple(row)))):
                if start <= first + offset < stop:
                    found.append(item)
        return found


# --------------------------------------------------------------------------- the report


@dataclass
class Report:
    query: ReportQuery
    groups: list[GroupRow]
    total: GroupRow
    discrepancies: DiscrepancyList
    runs: int = 0
    runs_with_discrepancies: int = 0


def delivery_report(query: ReportQuery) -> Report:
    """R7.4: the aggregate per group and the cost of each group's provider requests
    (two queries); the discrepancies listed lazily (``DiscrepancyList``)."""
    groups = {row.key: row for row in grouped_counts(query)}
    items = grouped_usage(query)
    prices = {
        provider.pk: prices_of(provider)
        for provider in Provider.objects.filter(
            pk__in={provider for found in items.values() for provider, _, _ in found}
        )
    }
    ordered = [groups[key] for key in sorted(groups, key=_sortable)]
    total = GroupRow(key=None, outcomes=dict.fromkeys(OUTCOMES, 0))
    for row in ordered:
        # Already summed by shape per group (grouped_usage): priced as they are.
        row.cost = summarize_shapes(
            (result, shape, prices[provider]) for provider, result, shape in items.get(row.key, ())
        )
        total.runs += row.runs
        total.committed += row.committed
        total.sent += row.sent
        total.observed += row.observed
        total.with_discrepancies += row.with_discrepancies
        total.discrepancies += row.discrepancies
        for o in OUTCOMES:
            total.outcomes[o] += row.outcomes.get(o, 0)
        for v in VERDICTS:
            total.evidence[v] += row.evidence[v]
    total.cost = summarize((item for found in items.values() for item in found), prices)
    return Report(
        query,
        ordered,
        total,
        DiscrepancyList(query, total.discrepancies),
        runs=total.runs,
        runs_with_discrepancies=total.with_discrepancies,
    )


def _sortable(key: Any) -> tuple[int, Any]:
    if isinstance(key, date):
        return (0, key.toordinal())
    if isinstance(key, int):
        return (0, key)
    return (1 if key == NO_PROVIDER else 0, str(key))
