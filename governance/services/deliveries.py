"""Each settled run's delivery, judged once per change (R7.2–R7.4).

The delivery-versus-settlement report sums columns of the ``Settlement`` rows
instead of judging every run of its period on each request. Here the judgement
is made — by the pure rules of ``governance.rules.publication``, never
re-implemented — and written on the settlement: the run's provider, its chunk
counts, the delivery verdict, every discrepancy, the callback's status in words
and the billed tokens of its provider requests (priced when read, with the
prices of the day).

A settlement holds two revisions: its judgement stands for ``judged_rev``, and
``delivery_rev`` goes up, by database trigger (migration 0015), whenever a row
of the run's body chunks, completion callback or tool receipts is written. A
settlement whose revisions differ is judged again: by the beat
(``tasks.jobs.judge_deliveries``) and, for its own period, by the report
before it reads. A judgement is written only if no change came in while it
was made (the revision it read still stands); otherwise the next pass redoes it.

Each judgement also adds its difference (this judgement minus the one before)
to the run's day in ``SettledDay`` (counts) and ``SettledUsageDay`` (billed
tokens), so the report reads a month of whole days in a few hundred rows.

Definitions the report shows:

- a run's provider is the provider of its latest accepted attempt, else of its
  latest attempt, else none (a run may fall back across providers, R3.1);
- a chunk is *committed* when it has a version, *sent* when committed and
  ``sent_at`` is set, *observed* when committed and ``observed_at`` is set
  (R7.2: sent and observed require committed).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Case, F, OuterRef, Q, Subquery, Value, When
from django.db.models.functions import Coalesce

from governance.models import (
    BodyChunk,
    ProviderAttempt,
    RunCallback,
    SettledDay,
    SettledUsageDay,
    Settlement,
    ToolReceipt,
)
from governance.rules.discrepancies import Discrepancy, delivery_discrepancies
from governance.rules.publication import (
    CallbackStatus,
    ChunkFacts,
    DeliveryEvidence,
    DeliveryVerdict,
    Publication,
    PublicationError,
    SettlementOutcome,
    delivered_status,
    delivery_evidence,
)
from governance.services.usage import usage_shapes

NO_PROVIDER = ""  # runs that never reached a provider
BATCH = 500  # settlements judged per transaction

# Not a rule of governance.rules.publication: the report's own word for rows it cannot read.
FACTS_UNREADABLE = "publication_facts_unreadable"

UNJUDGED = Q(judged_rev__lt=F("delivery_rev"))


# --------------------------------------------------------------------------- callback


@dataclass(frozen=True)
class CallbackView:
    status: CallbackStatus
    label: str  # the word in the table and CSV
    note: str  # what it means, on hover and in the legend

    def as_json(self) -> dict[str, str]:
        return {"status": self.status.value, "label": self.label, "note": self.note}

    @classmethod
    def from_json(cls, data: Mapping[str, str] | None) -> CallbackView:
        if not data:
            return cls(CallbackStatus.NONE, "none", "no callback configured")
        return cls(CallbackStatus(data["status"]), data["label"], data["note"])


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


def _callback_view(record: Mapping[str, Any]) -> CallbackView:
    state, attempts = record["state"], record["attempts"]
    told = (record["payload"] or {}).get("outcome", "")
    if state == RunCallback.State.DELIVERED:
        status = delivered_status(told)
        if status.reported_outcome is None:  # a payload outside R6.5
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


# --------------------------------------------------------------------------- one run

ChunkRow = tuple[int, int | None, bool, datetime | None, datetime | None]


# The columns of a BodyChunk row that are R7.2's facts, in ChunkRow's order.
CHUNK_FACT_COLUMNS = ("chunk_no", "version", "final", "sent_at", "observed_at")


def run_publication(run_id: Any) -> Publication:
    """R7.2: the Publication value of one run, read from its chunk rows (the one
    reader the stream, the callback and the report share). Raises PublicationError
    when the rows break the ordering rules."""
    rows = (
        BodyChunk.objects.filter(run_id=run_id)
        .order_by("chunk_no")
        .values_list(*CHUNK_FACT_COLUMNS)
    )
    return publication_of(rows)


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
) -> tuple[DeliveryEvidence | None, tuple[Discrepancy, ...]]:
    """The delivery evidence and discrepancies of one settled run, by the R7.3/R7.4
    rules (no evidence when the chunk rows break the rules)."""
    try:
        publication = publication_of(chunk_rows)
    except PublicationError as exc:
        return None, (
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
    return delivery_evidence(publication), found


# --------------------------------------------------------------------------- many runs


def run_provider() -> Coalesce:
    """The run's provider (see the module's definitions), for a settlement row."""
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


@dataclass(frozen=True)
class Judged:
    """One settlement's judgement, as written on it."""

    settlement_id: int
    rev: int
    provider: str
    committed: int
    sent: int
    observed: int
    verdict: str
    discrepancies: tuple[Discrepancy, ...]
    delivery: dict[str, Any]


def _judge_batch(rows: list[tuple]) -> list[Judged]:
    """Judge the settlements ``rows`` (id, run, rev, outcome, unknown effects, callback
    URL, provider): four queries whatever their number."""
    run_ids = [row[1] for row in rows]
    chunks: dict[UUID, list[ChunkRow]] = defaultdict(list)
    for run_id, *chunk in (
        BodyChunk.objects.filter(run_id__in=run_ids)
        .order_by("run_id", "chunk_no")
        .values_list("run_id", *CHUNK_FACT_COLUMNS)
    ):
        chunks[run_id].append(tuple(chunk))
    unknown: dict[UUID, list[str]] = defaultdict(list)
    for run_id, key in (
        ToolReceipt.objects.filter(run_id__in=run_ids, effect=ToolReceipt.Effect.UNKNOWN)
        .order_by("run_id", "id")
        .values_list("run_id", "idempotency_key")
    ):
        unknown[run_id].append(key)
    callbacks = callback_statuses({row[1]: row[5] for row in rows})
    usage: dict[UUID, list[list[Any]]] = defaultdict(list)
    shapes, _prices = usage_shapes(ProviderAttempt.objects.filter(run_id__in=run_ids), by_run=True)
    for run_id, provider, result, shape in shapes:
        usage[run_id].append(
            [provider, result, shape.reported, shape.requests, shape.billed_input,
             shape.output, shape.cached]
        )  # fmt: skip
    judged = []
    for settlement_id, run_id, rev, outcome, listed, _url, provider in rows:
        effects = tuple(
            dict.fromkeys([*unknown.get(run_id, ()), *(str(e) for e in (listed or ()))])
        )
        run_chunks = chunks.get(run_id, [])
        callback = callbacks[run_id]
        evidence, found = judge_run(
            outcome=outcome, chunk_rows=run_chunks, callback=callback, unknown_effects=effects
        )
        if evidence is not None:
            counts = (evidence.committed, evidence.sent, evidence.observed)
        else:  # unreadable: the rows' own counts, shown beside FACTS_UNREADABLE
            committed = [c for c in run_chunks if c[1] is not None]
            counts = (
                len(committed),
                sum(1 for c in committed if c[3] is not None),
                sum(1 for c in committed if c[4] is not None),
            )
        judged.append(
            Judged(
                settlement_id=settlement_id,
                rev=rev,
                provider=provider,
                committed=counts[0],
                sent=counts[1],
                observed=counts[2],
                verdict=evidence.verdict.value if evidence is not None else "",
                discrepancies=found,
                delivery={
                    "callback": callback.as_json(),
                    "unknown_effects": list(effects),
                    "discrepancies": [{"code": d.code, "text": d.text} for d in found],
                    "usage": usage.get(run_id, []),
                },
            )
        )
    return judged


def _usage_lines(usage: Iterable[list[Any]]) -> dict[tuple, tuple[int, int, int, int]]:
    """A run's usage lines by rollup key: (provider pk, refused, reported, kinds…)."""
    lines: dict[tuple, tuple[int, int, int, int]] = {}
    for provider, result, reported, requests, billed, output, cached in usage:
        key = (provider, result == "refused", bool(reported), billed > 0, output > 0, cached > 0)
        had = lines.get(key, (0, 0, 0, 0))
        lines[key] = tuple(
            a + b for a, b in zip(had, (requests, billed, output, cached), strict=True)
        )
    return lines


_ROLLUP = f"""
    INSERT INTO {SettledUsageDay._meta.db_table} AS total
        (day, provider_key, outcome, provider_id, refused, reported, bills_input,
         bills_output, bills_cached, requests, billed_input, output, cached)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (day, provider_key, outcome, provider_id, refused, reported, bills_input,
                 bills_output, bills_cached)
    DO UPDATE SET requests = total.requests + excluded.requests,
                  billed_input = total.billed_input + excluded.billed_input,
                  output = total.output + excluded.output,
                  cached = total.cached + excluded.cached
"""


def _rollup_changes(judged: Judged, settled_at: datetime, outcome: str, rolled: dict) -> list:
    """What this judgement adds to (or takes from) ``SettledUsageDay``: its usage
    minus what an earlier judgement of the run already added (under the provider
    it named then)."""
    day = settled_at.astimezone(UTC).date()
    delta: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for provider_key, usage, sign in (
        (judged.provider, judged.delivery["usage"], 1),
        (rolled.get("provider_key", ""), rolled.get("usage", ()), -1),
    ):
        for key, sums in _usage_lines(usage).items():
            for i, amount in enumerate(sums):
                delta[(provider_key, *key)][i] += sign * amount
    return [
        (day, key[0], outcome, *key[1:], *sums) for key, sums in sorted(delta.items()) if any(sums)
    ]


_DAY = f"""
    INSERT INTO {SettledDay._meta.db_table} AS total
        (day, provider_key, outcome, runs, committed, sent, observed, all_acknowledged,
         part_acknowledged, no_evidence, nothing_committed, flagged, discrepancies)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (day, provider_key, outcome)
    DO UPDATE SET runs = total.runs + excluded.runs,
                  committed = total.committed + excluded.committed,
                  sent = total.sent + excluded.sent,
                  observed = total.observed + excluded.observed,
                  all_acknowledged = total.all_acknowledged + excluded.all_acknowledged,
                  part_acknowledged = total.part_acknowledged + excluded.part_acknowledged,
                  no_evidence = total.no_evidence + excluded.no_evidence,
                  nothing_committed = total.nothing_committed + excluded.nothing_committed,
                  flagged = total.flagged + excluded.flagged,
                  discrepancies = total.discrepancies + excluded.discrepancies
"""
# SettledDay's verdict columns, in the order of _DAY.
DAY_VERDICTS = (
    DeliveryVerdict.CLIENT_RECEIVED_ALL_COMMITTED.value,
    DeliveryVerdict.CLIENT_RECEIVED_PART.value,
    DeliveryVerdict.NO_CLIENT_EVIDENCE.value,
    DeliveryVerdict.NOTHING_COMMITTED.value,
)


def _day_counts(committed: int, sent: int, observed: int, verdict: str, found: int) -> list[int]:
    """One judged run as SettledDay counts (runs, chunks, verdicts, discrepancies)."""
    return [
        1, committed, sent, observed, *(int(verdict == v) for v in DAY_VERDICTS),
        int(found > 0), found,
    ]  # fmt: skip


def _day_changes(changes: dict, key: tuple, counts: list[int], sign: int) -> None:
    total = changes.setdefault(key, [0] * len(counts))
    for i, amount in enumerate(counts):
        total[i] += sign * amount


def _write(judged: list[Judged]) -> int:
    """Each judgement, only where no change came in since its revision was read, and
    the difference it makes to its day's counts and usage — in one transaction, the
    settlements locked (a change arriving meanwhile waits, then makes it stale)."""
    cast = "CAST(%s AS jsonb)" if connection.vendor == "postgresql" else "%s"
    sql = (
        f"UPDATE {Settlement._meta.db_table} SET judged_rev = %s, provider_key = %s, "
        "chunks_committed = %s, chunks_sent = %s, chunks_observed = %s, "
        f"delivery_verdict = %s, discrepancy_count = %s, delivery = {cast}, "
        f"usage_in_rollup = {cast} WHERE id = %s AND delivery_rev = %s"
    )
    by_id = {j.settlement_id: j for j in judged}
    with transaction.atomic():
        standing = [
            row
            for row in Settlement.objects.filter(id__in=list(by_id))
            .select_for_update()
            .order_by("id")
            .values_list(
                "id", "delivery_rev", "settled_at", "outcome", "usage_in_rollup", "judged_rev",
                "provider_key", "chunks_committed", "chunks_sent", "chunks_observed",
                "delivery_verdict", "discrepancy_count",
            )
            if row[1] == by_id[row[0]].rev
        ]  # fmt: skip
        writes, usage_changes, day_changes = [], [], {}
        for settlement_id, _rev, settled_at, outcome, rolled, judged_before, *before in standing:
            j = by_id[settlement_id]
            day = settled_at.astimezone(UTC).date()
            usage = {"provider_key": j.provider, "usage": j.delivery["usage"]}
            usage_changes += _rollup_changes(j, settled_at, outcome, rolled or {})
            counts = (j.committed, j.sent, j.observed, j.verdict, len(j.discrepancies))
            _day_changes(day_changes, (day, j.provider, outcome), _day_counts(*counts), 1)
            if judged_before:  # its earlier judgement is in the day already: take it out
                provider_before, *counts_before = before
                key = (day, provider_before, outcome)
                _day_changes(day_changes, key, _day_counts(*counts_before), -1)
            writes.append(
                (j.rev, j.provider, j.committed, j.sent, j.observed, j.verdict,
                 len(j.discrepancies), json.dumps(j.delivery), json.dumps(usage),
                 settlement_id, j.rev)
            )  # fmt: skip
        days = [(*key, *counts) for key, counts in sorted(day_changes.items()) if any(counts)]
        with connection.cursor() as cursor:
            if writes:
                cursor.executemany(sql, writes)
            # In key order, so two judges never wait on each other's rows crosswise.
            if days:
                cursor.executemany(_DAY, days)
            if usage_changes:
                cursor.executemany(_ROLLUP, sorted(usage_changes, key=lambda c: c[:9]))
    return len(writes)


def judge_unjudged(
    *, start: datetime | None = None, end: datetime | None = None, limit: int | None = None
) -> int:
    """Judge the settlements whose judgement is missing or stale — those settled in
    ``[start, end)`` when given — in the order they were written, ``BATCH`` per
    transaction, at most ``limit``. Returns how many were judged."""
    rows = Settlement.objects.filter(UNJUDGED)
    if start is not None:
        rows = rows.filter(settled_at__gte=start)
    if end is not None:
        rows = rows.filter(settled_at__lt=end)
    if not rows.exists():
        # Nothing stale, the usual answer (each report view, the beat every 5 s): asked
        # by the partial index alone, without building the batch's query and its
        # provider subquery (1.5 of the report's milliseconds, bench/scale.py).
        return 0
    # By id, a keyset: a judgement that lost to a change is left for the next pass.
    rows = rows.annotate(judged_provider=run_provider()).order_by("id")
    done, after = 0, 0
    while limit is None or done < limit:
        size = BATCH if limit is None else min(BATCH, limit - done)
        batch = list(
            rows.filter(id__gt=after).values_list(
                "id", "run_id", "delivery_rev", "outcome", "unknown_effects",
                "run__callback_url", "judged_provider",
            )[:size]
        )  # fmt: skip
        if not batch:
            break
        done += _write(_judge_batch(batch))
        after = batch[-1][0]
    return done
