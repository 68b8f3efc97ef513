"""Read-only queries of the delivery-versus-settlement report (R7.2–R7.4, R8.4).

Counts are grouped in the database. Discrepancies are judged per run by the pure
rules in ``governance.rules.publication`` (never re-implemented here): the facts of every
run in the window are read in four queries (settlements, body chunks, unknown
tool receipts, completion callback records), whatever the number of runs.

Definitions shared by the database counts and the per-run facts, so both agree:

- a run belongs to the window when its settlement's ``settled_at`` is inside it;
- a run's provider is the provider of its latest accepted attempt, else of its
  latest attempt, else none (a run may fall back across providers, R3.1);
- a chunk is *committed* when it has a version, *sent* when committed and
  ``sent_at`` is set, *observed* when committed and ``observed_at`` is set
  (R7.2: sent and observed require committed).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any
from uuid import UUID

from django.db.models import (
    Case,
    Count,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce, TruncDate

from dashboard.queries.costs import costs_by_run, summarize
from governance.models import (
    BodyChunk,
    Provider,
    ProviderAttempt,
    RunCallback,
    Settlement,
    ToolReceipt,
)
from governance.rules.cost import CostSummary, UsageShape
from governance.rules.publication import (
    CallbackStatus,
    ChunkFacts,
    DeliveryVerdict,
    Discrepancy,
    Publication,
    PublicationError,
    SettlementOutcome,
    delivery_discrepancies,
    delivery_evidence,
)

GROUPS = ("day", "provider", "outcome")
OUTCOMES: tuple[str, ...] = tuple(o.value for o in SettlementOutcome)
VERDICTS: tuple[str, ...] = (
    DeliveryVerdict.CLIENT_RECEIVED_ALL_COMMITTED.value,
    DeliveryVerdict.CLIENT_RECEIVED_PART.value,
    DeliveryVerdict.NO_CLIENT_EVIDENCE.value,
    DeliveryVerdict.NOTHING_COMMITTED.value,
)
NO_PROVIDER = ""  # the group of runs that never reached a provider

# Not a rule of governance.rules.publication: the report's own word for rows it cannot read.
FACTS_UNREADABLE = "publication_facts_unreadable"

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


# --------------------------------------------------------------------------- callback


@dataclass(frozen=True)
class CallbackView:
    status: CallbackStatus
    label: str  # the word in the table and CSV
    note: str  # what it means, on hover and in the legend


def callback_statuses(callback_urls: Mapping[UUID, str]) -> dict[UUID, CallbackView]:
    """R7.4: the completion callback status of each run, by run id (one query).

    From the ``RunCallback`` delivery records: delivered (with the outcome the
    receiver was told, read from the payload it got), failed (never delivered),
    or pending while attempts are in flight or scheduled. A run without a
    callback URL has none; a URL without a record (settled before callbacks
    were sent) is "not sent yet". Neither pending state is a disagreement.
    """
    records = {
        row["run_id"]: row
        for row in RunCallback.objects.filter(run_id__in=list(callback_urls)).values(
            "run_id", "state", "attempts", "payload", "status_code", "last_error",
            "next_attempt_at", "delivered_at",
        )
    }  # fmt: skip
    views = {}
    for run_id, url in callback_urls.items():
        record = records.get(run_id)
        if record is not None:
            views[run_id] = _callback_view(record)
        elif url:
            views[run_id] = CallbackView(
                CallbackStatus.PENDING, "not sent yet", "a callback URL is set; nothing sent yet"
            )
        else:
            views[run_id] = CallbackView(CallbackStatus.NONE, "none", "no callback configured")
    return views


_DELIVERED = {
    SettlementOutcome.COMPLETED.value: CallbackStatus.DELIVERED_COMPLETED,
    SettlementOutcome.PARTIAL.value: CallbackStatus.DELIVERED_PARTIAL,
    SettlementOutcome.FAILED.value: CallbackStatus.DELIVERED_FAILED,
    SettlementOutcome.CANCELLED.value: CallbackStatus.DELIVERED_CANCELLED,
}


def _callback_view(record: Mapping[str, Any]) -> CallbackView:
    state, attempts = record["state"], record["attempts"]
    told = (record["payload"] or {}).get("outcome", "")
    if state == RunCallback.State.DELIVERED:
        status = _DELIVERED.get(told)
        if status is None:  # a payload outside R6.5: we cannot say what it told
            return CallbackView(
                CallbackStatus.DELIVERY_FAILED,
                "delivered (unreadable)",
                f"delivered after {attempts} attempt(s), but its outcome {told!r} is unknown",
            )
        return CallbackView(
            status,
            f"delivered: {told}",
            f"the receiver was told {told!r} (HTTP {record['status_code']}, attempt {attempts})",
        )
    if state == RunCallback.State.FAILED:
        return CallbackView(
            CallbackStatus.DELIVERY_FAILED,
            "failed",
            f"never delivered after {attempts} attempt(s): {record['last_error'] or 'no detail'}",
        )
    if state == RunCallback.State.RETRY:
        note = (
            f"attempt {attempts} failed ({record['last_error'] or 'no detail'}); "
            f"next at {record['next_attempt_at']:%Y-%m-%d %H:%M:%S} UTC"
        )
        return CallbackView(CallbackStatus.PENDING, "pending (retrying)", note)
    if state == RunCallback.State.SENDING:
        return CallbackView(CallbackStatus.PENDING, "pending (sending)", f"attempt {attempts}")
    return CallbackView(CallbackStatus.PENDING, "pending", "queued, not attempted yet")


# --------------------------------------------------------------------------- base query


def provider_ids() -> list[str]:
    return list(Provider.objects.order_by("provider_id").values_list("provider_id", flat=True))


def _run_provider() -> Coalesce:
    latest = (
        ProviderAttempt.objects.filter(run_id=OuterRef("run_id"))
        .order_by(
            Case(When(result="accepted", then=Value(0)), default=Value(1)),
            "-started_at",
            "-id",
        )
        .values("provider__provider_id")[:1]
    )
    return Coalesce(Subquery(latest), Value(NO_PROVIDER))


def settlements(query: ReportQuery) -> QuerySet[Settlement]:
    """The settlements in the window, narrowed by provider and outcome."""
    rows = Settlement.objects.filter(
        settled_at__gte=query.start, settled_at__lt=query.end
    ).annotate(provider_key=_run_provider())
    if query.provider:
        rows = rows.filter(provider_key=query.provider)
    if query.outcome:
        rows = rows.filter(outcome=query.outcome)
    return rows


def _group_expression(group: str) -> Any:
    if group == "day":
        return TruncDate("settled_at", tzinfo=UTC)
    if group == "provider":
        return _run_provider()
    if group == "outcome":
        return Case(
            *(When(outcome=o, then=Value(i)) for i, o in enumerate(OUTCOMES)),
            default=Value(len(OUTCOMES)),
            output_field=IntegerField(),
        )
    raise ValueError(f"unknown grouping {group!r}")


def group_key(group: str, *, settled_at: datetime, provider: str, outcome: str) -> Any:
    """The same key in Python as ``_group_expression`` computes in the database."""
    if group == "day":
        return settled_at.astimezone(UTC).date()
    if group == "provider":
        return provider
    return OUTCOMES.index(outcome) if outcome in OUTCOMES else len(OUTCOMES)


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
    # What the runs' provider requests cost (issue 12; governance.rules.cost).
    cost: CostSummary = field(default_factory=CostSummary)


def grouped_counts(query: ReportQuery) -> list[GroupRow]:
    """Runs, outcomes and chunk counts per group, counted by the database (one query)."""
    chunk_committed = Q(run__chunks__version__isnull=False)
    counts = {
        "runs": Count("id", distinct=True),
        **{f"outcome_{o}": Count("id", distinct=True, filter=Q(outcome=o)) for o in OUTCOMES},
        "committed": Count("run__chunks", distinct=True, filter=chunk_committed),
        "sent": Count(
            "run__chunks",
            distinct=True,
            filter=chunk_committed & Q(run__chunks__sent_at__isnull=False),
        ),
        "observed": Count(
            "run__chunks",
            distinct=True,
            filter=chunk_committed & Q(run__chunks__observed_at__isnull=False),
        ),
    }
    rows = (
        settlements(query)
        .values(key=_group_expression(query.group))
        .annotate(**counts)
        .order_by("key")
    )
    return [
        GroupRow(
            key=row["key"],
            runs=row["runs"],
            outcomes={o: row[f"outcome_{o}"] for o in OUTCOMES},
            committed=row["committed"],
            sent=row["sent"],
            observed=row["observed"],
        )
        for row in rows
    ]


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


ChunkRow = tuple[int, int | None, bool, datetime | None, datetime | None]


def publication_of(rows: Iterable[ChunkRow]) -> Publication:
    """R7.2: the Publication value of one run from its BodyChunk rows, in chunk order.

    A row exists once its candidate was generated; committed = it has a version;
    sent = ``sent_at``; observed = ``observed_at``; ``final`` marks the last chunk.
    An ``observed_at`` on a chunk that is not committed is a client claim that
    cannot be true: it is kept as ``impossible_ack_through`` (not believed).
    Raises PublicationError when the rows break the ordering rules.
    """
    chunks = []
    final = None
    ack_through = impossible = 0
    for chunk_no, version, is_final, sent_at, observed_at in rows:
        committed = version is not None
        chunks.append(
            ChunkFacts(
                chunk_id=chunk_no,
                committed_version=version,
                sent=committed and sent_at is not None,
                observed=committed and observed_at is not None,
            )
        )
        if observed_at is not None:
            ack_through = max(ack_through, chunk_no)
            if not committed:
                impossible = max(impossible, chunk_no)
        if is_final:
            final = chunk_no if final is None else max(final, chunk_no)
    return Publication(
        chunks=tuple(chunks),
        final_chunk_id=final,
        client_ack_through=ack_through,
        impossible_ack_through=impossible,
    )


def judge_run(
    *,
    outcome: str,
    chunk_rows: list[ChunkRow],
    callback: CallbackView,
    unknown_effects: tuple[str, ...],
) -> tuple[str, tuple[Discrepancy, ...]]:
    """The delivery verdict and discrepancies of one settled run, by the R7.3/R7.4 rules."""
    try:
        publication = publication_of(chunk_rows)
    except PublicationError as exc:
        return "", (
            Discrepancy(
                FACTS_UNREADABLE,
                f"the body chunk records break the publication rules ({exc}); "
                "the report cannot judge this run's delivery",
            ),
        )
    try:
        settled = SettlementOutcome(outcome)
    except ValueError:
        settled = None  # an outcome outside R6.5: judged like an unsettled run
    found = delivery_discrepancies(
        settlement=settled,
        publication=publication,
        callback=callback.status,
        unknown_effects=unknown_effects,
    )
    return delivery_evidence(publication).verdict.value, found


def run_deliveries(query: ReportQuery) -> Iterator[RunDelivery]:
    """Every settled run of the window, newest first. Four queries in all."""
    base = settlements(query)
    run_ids = base.values("run_id")
    chunks: dict[UUID, list[ChunkRow]] = defaultdict(list)
    for run_id, *row in (
        BodyChunk.objects.filter(run_id__in=run_ids)
        .order_by("run_id", "chunk_no")
        .values_list("run_id", "chunk_no", "version", "final", "sent_at", "observed_at")
        .iterator(chunk_size=5000)
    ):
        chunks[run_id].append(tuple(row))
    unknown: dict[UUID, list[str]] = defaultdict(list)
    for run_id, key in (
        ToolReceipt.objects.filter(run_id__in=run_ids, effect=ToolReceipt.Effect.UNKNOWN)
        .order_by("run_id", "id")
        .values_list("run_id", "idempotency_key")
        .iterator(chunk_size=5000)
    ):
        unknown[run_id].append(key)
    rows = list(
        base.order_by("-settled_at", "run_id").values_list(
            "run_id",
            "settled_at",
            "outcome",
            "provider_key",
            "unknown_effects",
            "run__callback_url",
        )
    )
    callbacks = callback_statuses({row[0]: row[5] for row in rows})
    for run_id, settled_at, outcome, provider, listed, _url in rows:
        effects = tuple(
            dict.fromkeys([*unknown.get(run_id, ()), *(str(e) for e in (listed or ()))])
        )
        run_chunks = chunks.get(run_id, [])
        verdict, found = judge_run(
            outcome=outcome,
            chunk_rows=run_chunks,
            callback=callbacks[run_id],
            unknown_effects=effects,
        )
        committed = [c for c in run_chunks if c[1] is not None]
        yield RunDelivery(
            run_id=run_id,
            settled_at=settled_at,
            outcome=outcome,
            provider=provider,
            committed=len(committed),
            sent=sum(1 for c in committed if c[3] is not None),
            observed=sum(1 for c in committed if c[4] is not None),
            callback=callbacks[run_id],
            verdict=verdict,
            unknown_effects=effects,
            discrepancies=found,
        )


# --------------------------------------------------------------------------- the report


@dataclass(frozen=True)
class DiscrepancyRow:
    run: RunDelivery
    code: str
    title: str
    text: str


@dataclass
class Report:
    query: ReportQuery
    groups: list[GroupRow]
    total: GroupRow
    discrepancies: list[DiscrepancyRow]
    runs: int = 0
    runs_with_discrepancies: int = 0


def delivery_report(query: ReportQuery) -> Report:
    """R7.4: the aggregate per group (database) merged with the per-run judgement (rules),
    and the cost of each group's provider requests (one more query)."""
    groups = {row.key: row for row in grouped_counts(query)}
    run_costs, prices = costs_by_run(settlements(query).values("run_id"))
    cost_items: dict[Any, list[tuple[int, str, UsageShape]]] = defaultdict(list)
    listed: list[DiscrepancyRow] = []
    runs = flagged = 0
    for run in run_deliveries(query):
        runs += 1
        key = group_key(
            query.group, settled_at=run.settled_at, provider=run.provider, outcome=run.outcome
        )
        # Same filters, separate statements: a run settled in between lands here only.
        row = groups.setdefault(key, GroupRow(key=key, outcomes=dict.fromkeys(OUTCOMES, 0)))
        cost_items[key].extend(run_costs.get(run.run_id, ()))
        if run.verdict:
            row.evidence[run.verdict] += 1
        if run.discrepancies:
            flagged += 1
            row.with_discrepancies += 1
            row.discrepancies += len(run.discrepancies)
        for found in run.discrepancies:
            listed.append(
                DiscrepancyRow(run, found.code, CODE_TITLES.get(found.code, ""), found.text)
            )
    for key, row in groups.items():
        row.cost = summarize(cost_items.get(key, ()), prices)
    ordered = [groups[key] for key in sorted(groups, key=_sortable)]
    total = GroupRow(key=None, outcomes=dict.fromkeys(OUTCOMES, 0))
    total.cost = summarize((i for items in cost_items.values() for i in items), prices)
    for row in ordered:
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
    return Report(query, ordered, total, listed, runs=runs, runs_with_discrepancies=flagged)


def _sortable(key: Any) -> tuple[int, Any]:
    if isinstance(key, date):
        return (0, key.toordinal())
    if isinstance(key, int):
        return (0, key)
    return (1 if key == NO_PROVIDER else 0, str(key))
