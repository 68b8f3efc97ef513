"""Read-only queries of the Insights page and API: re-probe outcomes.

Each send's tier is decided once, by ``governance.rules.insights.tier_sends``,
and kept on its ``ProviderAttempt`` (``governance.services.insight_tiers``; the
views tier their period's pending attempts first). Here the kept tiers of the
period are counted by the database: per tier, step, boundary kind, provider,
model and category, the sends, accepted and refused, and the median time since
the latest refusal (on PostgreSQL; elsewhere the kept tiers are read and
counted by the rule). The Wilson intervals and the rates are the rule's
(``tier_rows``). Two statements, however many sends the period holds.

The what-if replay (``governance.rules.insights.what_if``), only when asked,
reads the facts themselves, for a period ``[start, end)``:

1. the (segment, provider) pairs with a refusal-related send in the period
   (a refused send, a re-render, a history-only send or a re-probe);
2. every refusal-related send of those segments up to ``end`` — earlier ones
   too, because a re-probe's number depends on the refusals before it;
3. the refusal state a boundary carried over (the closed segment's
   ``SegmentRefusal`` row, which never changes after the close, R1.4) for
   providers whose first send in the next segment is in the period, and that
   first send (R3.8) — a first send before the period has its tier outside it;

and the recorded turns of the segments whose timelines it replays: each turn
that sent to a provider (an attempt) or skipped one (its ``llm-fallback`` card,
R3.5), and from the cards the schedule each refusal ran under — two more
queries.

Accepted original sends without refusal state change nothing and are not
read: with refusal state in a segment every send is a re-probe (R3.2).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import (
    Aggregate,
    BigIntegerField,
    Case,
    Count,
    Exists,
    FloatField,
    Min,
    OuterRef,
    Q,
    Value,
    When,
)

from governance.models import Provider, ProviderAttempt, RunEvent, SegmentRefusal
from governance.rules.insights import (
    CarriedRefusal,
    SendFact,
    TierCount,
    TieredSend,
    TierRow,
    WhatIf,
    refusal_timelines,
    reprobe_outcomes,
    tier_rows,
    tier_sends,
    what_if,
)
from governance.rules.refusal import delays_from_seconds
from governance.services import insight_tiers
from governance.services.insight_tiers import REFUSAL_RELATED, carried_of, first_sends
from governance.services.insight_tiers import SEND_FIELDS as _FIELDS
from tasks import work_metrics


@dataclass(frozen=True)
class InsightsQuery:
    start: datetime
    end: datetime
    provider: str = ""  # "" = every provider


@dataclass(frozen=True)
class Insights:
    query: InsightsQuery
    rows: list[TierRow]  # per tier, provider, model and category
    totals: list[TierRow]  # per tier over every provider (the chart)
    what_if: WhatIf | None = None  # the replay under a proposed schedule, when asked


def _fact(row: tuple) -> SendFact:
    return SendFact._make(row)  # _FIELDS are SendFact's fields, in its order


def _provider_filter(query: InsightsQuery) -> Q:
    return Q(provider__provider_id=query.provider) if query.provider else Q()


def _carried(query: InsightsQuery) -> list[CarriedRefusal]:
    """The refusal state a boundary carried over (the closed segment's row, R1.4) for each
    provider whose first send in the next segment is in the period: only such a send
    has the ``after_boundary`` tier (``tier_sends`` gives it to a pair's first send).

    One query. The provider's pk is written in (providers are few), so each of the
    closed segments' refusal rows costs two index probes of ``attempt_seg_provider``
    (a send in the period, none before it) instead of a join to the providers per
    row (60 ms → 25 ms at 5,000 such rows, bench/scale.py).
    """
    pk_of = dict(Provider.objects.values_list("provider_id", "pk"))
    if not pk_of:
        return []
    provider_pk = Case(
        *(When(provider_id=slug, then=Value(pk)) for slug, pk in pk_of.items()),
        default=None,
        output_field=BigIntegerField(),
    )

    def sends(**moment: datetime) -> Exists:
        return Exists(
            ProviderAttempt.objects.filter(
                segment_id=OuterRef("segment__next_segment_id"),
                provider_id=OuterRef("provider_pk"),
                **moment,
            )
        )

    rows = (
        SegmentRefusal.objects.filter(segment__next_segment__isnull=False)
        .filter(Q(refusals__isnull=True) | Q(refusals__gt=0))
        .annotate(provider_pk=provider_pk)
        .filter(
            sends(started_at__gte=query.start, started_at__lt=query.end),
            ~sends(started_at__lt=query.start),
        )
    )
    if query.provider:
        rows = rows.filter(provider_id=query.provider)
    return carried_of(rows)


def gather(query: InsightsQuery) -> tuple[list[SendFact], list[CarriedRefusal]]:
    """The facts of the period, for ``governance.rules.insights.tier_sends`` (the
    what-if's timelines and flip rates)."""
    in_period = Q(started_at__gte=query.start, started_at__lt=query.end)
    segments = (
        ProviderAttempt.objects.filter(REFUSAL_RELATED, in_period, _provider_filter(query))
        .order_by()
        .values_list("segment_id", flat=True)
        .distinct()
    )
    sends = {
        row[0]: _fact(row)
        for row in ProviderAttempt.objects.filter(
            REFUSAL_RELATED,
            _provider_filter(query),
            segment_id__in=segments,
            started_at__lt=query.end,
        )
        .order_by()
        .values_list(*_FIELDS)
    }
    carried = _carried(query)
    # Each carried pair's first send is in the period (``_carried``): the pair's first.
    for send in first_sends(carried):
        sends.setdefault(send.attempt_id, send)
    return list(sends.values()), carried


@dataclass(frozen=True)
class RecordedTurns:
    turns: dict[int, list[datetime]]  # each segment's turn times, in order
    schedules: dict[tuple[int, str], tuple[timedelta, ...]]  # as stored on the cards


def recorded_turns(segment_ids: Iterable[int], until: datetime) -> RecordedTurns:
    """Each segment's recorded model turns before ``until``: every turn that sent to a
    provider or skipped one (its fallback card, R3.5), at its earliest moment; and the
    schedule each (segment, provider) refusal ran under, read from those cards (issue
    12: a schedule of its own is stored with the state; none is the default)."""
    segment_ids = list(set(segment_ids))
    first: dict[tuple[int, int], datetime] = {}
    schedules: dict[tuple[int, str], tuple[timedelta, ...]] = {}
    if not segment_ids:
        return RecordedTurns({}, {})
    sent = (
        ProviderAttempt.objects.filter(segment_id__in=segment_ids, started_at__lt=until)
        .order_by()
        .values_list("segment_id", "stage_id")
        .annotate(at=Min("started_at"))
    )
    for segment_id, stage_id, at in sent:
        first[(segment_id, stage_id)] = at
    cards = (
        RunEvent.objects.filter(segment_id__in=segment_ids, kind="llm-fallback", at__lt=until)
        .order_by()
        .values_list("segment_id", "stage_id", "at", "metadata")
    )
    for segment_id, stage_id, at, metadata in cards.iterator(chunk_size=2000):
        key = (segment_id, stage_id)
        if key not in first or at < first[key]:
            first[key] = at
        for entry in (metadata or {}).get("refusal") or ():
            if not isinstance(entry, dict):
                continue
            delays = delays_from_seconds(entry.get("delays_s"))
            if delays is not None and isinstance(entry.get("provider_id"), str):
                schedules.setdefault((segment_id, entry["provider_id"]), delays)
    turns: dict[int, list[datetime]] = {}
    for (segment_id, _stage), at in first.items():
        turns.setdefault(segment_id, []).append(at)
    return RecordedTurns(
        {segment_id: sorted(times) for segment_id, times in turns.items()}, schedules
    )


class _Median(Aggregate):
    """The median as ``statistics.median`` takes it (``rules.insights.median_duration``):
    the middle value, or the mean of the two middle values — the lower middle
    ``percentile_disc`` ascending, the upper one descending — so the page shows the
    same seconds to the microsecond (``percentile_cont`` interpolates, and may round
    the other way). NULLs are left out."""

    function = "percentile_disc"
    name = "Median"
    output_field = FloatField()
    template = (
        "((%(function)s(0.5) WITHIN GROUP (ORDER BY %(expressions)s) "
        "+ %(function)s(0.5) WITHIN GROUP (ORDER BY %(expressions)s DESC)) / 2)"
    )


_GROUP = ("insight_tier", "insight_step", "insight_boundary_kind")
_DETAIL = ("provider__provider_id", "model", "insight_category")


def _kept(query: InsightsQuery):
    """The period's sends that are in a tier, as kept on them."""
    return (
        ProviderAttempt.objects.filter(started_at__gte=query.start, started_at__lt=query.end)
        .exclude(insight_tier="")
        .filter(_provider_filter(query))
        .order_by()
    )


def _counted(query: InsightsQuery, *, by_provider: bool) -> list[TierRow]:
    """One GROUP BY over the kept tiers (PostgreSQL)."""
    keys = (*_GROUP, *_DETAIL) if by_provider else _GROUP
    counts = (
        _kept(query)
        .values(*keys)
        .annotate(
            sends=Count("id"),
            accepted=Count("id", filter=Q(result="accepted")),
            refused=Count("id", filter=Q(result="refused")),
            median=_Median("insight_since_refusal_s"),
            samples=Count("insight_since_refusal_s"),
        )
    )
    return tier_rows(
        TierCount(
            row["insight_tier"],
            row["insight_step"],
            row["insight_boundary_kind"],
            row.get("provider__provider_id", ""),
            row.get("model", ""),
            row.get("insight_category", ""),
            sends=row["sends"],
            accepted=row["accepted"],
            refused=row["refused"],
            median_since_refusal=(
                timedelta(seconds=row["median"]) if row["median"] is not None else None
            ),
            since_samples=row["samples"],
        )
        for row in counts
    )


def _kept_sends(query: InsightsQuery) -> list[TieredSend]:
    """The kept tiers of the period as the rule's values (databases without
    ordered-set aggregates: counted by ``reprobe_outcomes``)."""
    fields = ("id", *_GROUP, *_DETAIL, "result", "started_at", "insight_since_refusal_s")
    sends = []
    for attempt_id, *tier, result, at, since in _kept(query).values_list(*fields):
        since_refusal = timedelta(seconds=since) if since is not None else None
        sends.append(TieredSend(*tier, result, at, since_refusal, attempt_id))
    return sends


def tier_outcomes(query: InsightsQuery) -> tuple[list[TierRow], list[TierRow]]:
    """The period's rows (per tier, provider, model and category) and totals (per
    tier), from the tiers kept on the attempts."""
    if connection.vendor == "postgresql":
        return _counted(query, by_provider=True), _counted(query, by_provider=False)
    tiered = _kept_sends(query)
    return reprobe_outcomes(tiered, by_provider=True), reprobe_outcomes(tiered, by_provider=False)


def reprobe_insights(
    query: InsightsQuery,
    *,
    proposed: Sequence[timedelta] | None = None,
    default: Sequence[timedelta] = (),
    now: datetime | None = None,
) -> Insights:
    """The tiers of the period as kept (``services.insight_tiers.tier_pending`` first
    for the period's latest attempts); with ``proposed`` (``default``: R3.2's
    schedule, for refusals that ran under it; ``now``) the what-if replay as well."""
    rows, totals = tier_outcomes(query)
    replay = None
    if proposed is not None:
        if not default or now is None:
            raise ValueError("a what-if needs the default schedule and the time")
        sends, carried = gather(query)
        tiered = tier_sends(sends, carried, start=query.start, end=query.end)
        horizon = min(query.end, now)
        recorded = recorded_turns({send.segment_id for send in sends}, horizon)

        def ran_under(segment_id: int, provider_id: str) -> Sequence[timedelta]:
            return recorded.schedules.get((segment_id, provider_id), tuple(default))

        timelines = refusal_timelines(
            sends, recorded.turns, start=query.start, end=query.end, delays=ran_under
        )
        replay = what_if(timelines, proposed, tiered, now=horizon)
    return Insights(query=query, rows=rows, totals=totals, what_if=replay)


def provider_ids() -> list[str]:
    return list(Provider.objects.order_by("provider_id").values_list("provider_id", flat=True))


def tiered_insights(query: InsightsQuery, **what_if: Any) -> Insights:
    """The period's numbers, its pending attempts tiered first (their turns finished
    since the beat's last pass): the page, the CSV and the API read the same tiers."""
    tally: Counter = Counter()
    insight_tiers.tier_pending(start=query.start, end=query.end, tally=tally)
    work_metrics.refusal_sends(tally)
    return reprobe_insights(query, **what_if)
