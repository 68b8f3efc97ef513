"""Each provider attempt's Insights tier, decided once and kept on it.

The Insights page sums the tiers of its period's sends (original refused send,
re-render, history-only, re-probe n, first send after a boundary). The tier is
decided here — by ``governance.rules.insights.tier_sends``, never re-implemented
— and written on the ``ProviderAttempt``: ``insight_tier`` ("" = in no tier),
``insight_step``, ``insight_boundary_kind``, ``insight_category`` and
``insight_since_refusal_s``; ``tiered`` marks it decided.

A send's tier follows from the earlier sends of its (segment, provider), from
whether each earlier refused send was the last of its turn, and from the refusal
state a boundary carried over from the closed segment (R3.1, R3.2, R3.8). So an
attempt is tiered once its stage (its turn) has finished: later turns cannot
change it, and the carried state never changes after the close (R1.4). A
segment with untiered attempts of finished stages is tiered as a whole: its
refusal-related sends (all of them, tiered or not), the carried state and each
carried provider's first send are read in a few queries, whatever their number,
replayed by the rule, and the untiered attempts written in one transaction per
batch of segments, locked in id order (a second tierer — the beat and a page at
once — waits, then finds them tiered and writes nothing).

The beat (``tasks.jobs.tier_attempts``) tiers what is pending; the Insights
page, its CSV and API tier their own period's pending attempts before they read
(as the delivery report does with ``services.deliveries``). A stage's close
never tiers: the hot path keeps its statements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Min, Q

from governance.models import Provider, ProviderAttempt, SegmentRefusal
from governance.rules.insights import CarriedRefusal, SendFact, TieredSend, tier_sends

BATCH = 100  # segments tiered per transaction

# The sends that may change a pair's refusal state or be in a tier (besides a carried
# pair's first send): a refused send, a re-render, a history-only send or a re-probe.
REFUSAL_RELATED = Q(result="refused") | Q(kind__in=["re_render", "history_only", "re_probe"])
# Untiered, and its turn is over.
PENDING = Q(tiered=False, stage__finished_at__isnull=False)
SEND_FIELDS = (  # SendFact's fields, in its order
    "id",
    "segment_id",
    "stage_id",
    "provider__provider_id",
    "model",
    "kind",
    "started_at",
    "result",
    "refusal_category",
    "latency_ms",
)


def _carried(segment_ids: Sequence[int]) -> list[CarriedRefusal]:
    """The refusal state each boundary carried into these segments: the closed
    segment's row (R1.4), for providers still cooling or frozen there (R3.8)."""
    rows = SegmentRefusal.objects.filter(segment__next_segment_id__in=segment_ids).filter(
        Q(refusals__isnull=True) | Q(refusals__gt=0)
    )
    return carried_of(rows)


def carried_of(rows) -> list[CarriedRefusal]:
    """``SegmentRefusal`` rows as the rule's ``CarriedRefusal`` (the next segment's id)."""
    return [
        CarriedRefusal(*row)
        for row in rows.order_by().values_list(
            "segment__next_segment_id",
            "provider_id",
            "segment__closed_kind",
            "refusals",
            "refused_at",
            "category",
        )
    ]


def first_sends(carried: Sequence[CarriedRefusal]) -> list[SendFact]:
    """Each carried pair's first send in its segment, whatever its kind: only that
    send has the ``after_boundary`` tier (two queries)."""
    pk_of = dict(
        Provider.objects.filter(provider_id__in={c.provider_id for c in carried}).values_list(
            "provider_id", "pk"
        )
    )
    wanted = {(c.segment_id, pk_of[c.provider_id]) for c in carried if c.provider_id in pk_of}
    if not wanted:
        return []
    firsts = (
        ProviderAttempt.objects.filter(
            segment_id__in={s for s, _ in wanted}, provider_id__in={p for _, p in wanted}
        )
        .order_by()
        .values_list("segment_id", "provider_id")
        .annotate(first=Min("started_at"))
    )
    moments = {(s, p, at) for s, p, at in firsts if (s, p) in wanted}
    if not moments:
        return []
    # Three short IN lists and the exact (segment, provider, moment) kept here.
    rows = ProviderAttempt.objects.filter(
        segment_id__in={m[0] for m in moments},
        provider_id__in={m[1] for m in moments},
        started_at__in={m[2] for m in moments},
    )
    return [
        SendFact._make(row)
        for provider_pk, *row in rows.order_by().values_list("provider_id", *SEND_FIELDS)
        if (row[1], provider_pk, row[6]) in moments
    ]


def tiers_of(segment_ids: Sequence[int]) -> list[TieredSend]:
    """Every tiered send of these segments, by the rule, from their recorded facts
    (three to five queries). Period-free: a send's tier does not depend on the
    period it is read in."""
    sends = {
        row[0]: SendFact._make(row)
        for row in ProviderAttempt.objects.filter(REFUSAL_RELATED, segment_id__in=segment_ids)
        .order_by()
        .values_list(*SEND_FIELDS)
    }
    carried = _carried(segment_ids)
    if carried:
        for send in first_sends(carried):
            sends.setdefault(send.attempt_id, send)
    return tier_sends(list(sends.values()), carried)


_WRITE = (
    f"UPDATE {ProviderAttempt._meta.db_table} SET tiered = %s, insight_tier = %s, "
    "insight_step = %s, insight_boundary_kind = %s, insight_category = %s, "
    "insight_since_refusal_s = %s WHERE id = %s"
)


def _mark(ids: list[int]) -> None:
    """The attempts in no tier: only their marker."""
    if not ids:
        return
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {ProviderAttempt._meta.db_table} SET tiered = true WHERE id = ANY(%s)",
                [ids],
            )
        return
    for at in range(0, len(ids), 500):  # SQLite's limit of variables
        ProviderAttempt.objects.filter(id__in=ids[at : at + 500]).update(tiered=True)


def tier_segments(
    segment_ids: Sequence[int], *, skip_locked: bool = False, tally: Counter | None = None
) -> int:
    """Tier the untiered attempts of finished stages in these segments, in one
    transaction. Returns how many attempts were tiered; ``tally`` (when given)
    gains one per send written with a tier, by (provider id, tier, step): the
    caller counts them for Prometheus once they are committed.

    The attempts are locked in id order: a concurrent tierer of the same segments
    waits, then finds them tiered (its condition is read again) and writes nothing;
    with ``skip_locked`` it leaves them to the one holding them (beat passes that
    overlap share a backlog instead of queueing behind each other). Either way the
    rule replays the segments' facts in full, so any subset it writes is right."""
    with transaction.atomic():
        pending = list(
            ProviderAttempt.objects.filter(PENDING, segment_id__in=segment_ids)
            .select_for_update(of=("self",), skip_locked=skip_locked)
            .order_by("id")
            .values_list("id", flat=True)
        )
        if not pending:
            return 0
        waiting = set(pending)
        sends = [send for send in tiers_of(segment_ids) if send.attempt_id in waiting]
        writes = [
            (
                True,
                send.tier,
                send.step,
                send.boundary_kind,
                send.category,
                send.since_refusal.total_seconds() if send.since_refusal is not None else None,
                send.attempt_id,
            )
            for send in sends
        ]
        writes.sort(key=lambda w: w[-1])
        if writes:
            with connection.cursor() as cursor:
                cursor.executemany(_WRITE, writes)
        written = {w[-1] for w in writes}
        _mark([i for i in pending if i not in written])
    if tally is not None:
        tally.update(
            (send.provider_id, send.tier, send.step) for send in sends if send.attempt_id in written
        )
    return len(pending)


def tier_pending(
    *,
    start: datetime | None = None,
    end: datetime | None = None,
    limit: int | None = None,
    skip_locked: bool = False,
    tally: Counter | None = None,
) -> int:
    """Tier the segments holding untiered attempts of finished stages — those with
    such an attempt started in ``[start, end)`` when given — ``BATCH`` segments per
    transaction, at most ``limit`` segments. Returns how many attempts were tiered.
    A page passes no ``skip_locked``: it waits for a tierer holding its period's
    attempts, so it reads their tiers. ``tally``: as for :func:`tier_segments`."""
    rows = ProviderAttempt.objects.filter(PENDING)
    if start is not None:
        rows = rows.filter(started_at__gte=start)
    if end is not None:
        rows = rows.filter(started_at__lt=end)
    segments = rows.order_by("segment_id").values_list("segment_id", flat=True).distinct()
    done = seen = after = 0
    while limit is None or seen < limit:
        size = BATCH if limit is None else min(BATCH, limit - seen)
        batch = list(segments.filter(segment_id__gt=after)[:size])
        if not batch:
            break
        done += tier_segments(batch, skip_locked=skip_locked, tally=tally)
        seen += len(batch)
        after = batch[-1]
    return done
