"""The run stream's transactions (R7.1–R7.3): viewers attach and detach, chunks
written to a transport are recorded **sent**, client acks are recorded **observed**.

The rules live in ``governance.rules.connection`` (the viewer state machine) and
``governance.rules.publication`` (chunk facts); this module only reads the facts,
asks those rules, and writes the outcome with conditional updates so repeats
(reconnects, duplicate acks, two streams of one run) are idempotent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from governance.models import BodyChunk, Run, RunEvent, RunViewer, Settlement
from governance.rules import connection as conn
from governance.rules import publication as pub
from governance.rules.turns import ChunkCommit
from governance.services import statements as sql
from governance.services.deliveries import run_publication
from governance.services.errors import ServiceError
from governance.services.events import new_event


def run_connection(run: Run, viewer_state: str = "running") -> conn.RunConnection:
    """R7.1: the run as a connection sees it, from the facts (settlement, stop, viewer)."""
    settlement = Settlement.objects.filter(run_id=run.id).values_list("outcome", flat=True).first()
    stopped = run.cancel_requested_at is not None
    if settlement is not None:
        outcome = pub.SettlementOutcome(settlement)
        state = (
            conn.ConnectionState.REPLAY_ORIGINAL
            if viewer_state == conn.ConnectionState.REPLAY_ORIGINAL
            else conn.ConnectionState.SETTLED
        )
        # A cancelled settlement is only ever written after a user stop (R6.5).
        return conn.RunConnection(
            state, outcome, stopped or outcome is pub.SettlementOutcome.CANCELLED
        )
    if stopped:
        return conn.RunConnection(conn.ConnectionState.CANCEL_REQUESTED, None, True)
    state = (
        conn.ConnectionState.DETACHED
        if viewer_state == conn.ConnectionState.DETACHED
        else conn.ConnectionState.RUNNING
    )
    return conn.RunConnection(state)


def connect_viewer(
    run: Run, *, connection_id: str, last_event_id: int, now: datetime
) -> tuple[RunViewer, conn.ConnectionTransition]:
    """R7.1: a subscriber (re)attached. Records the viewer; never starts work."""
    transition = conn.apply_connection_event(run_connection(run), conn.ConnectionEvent.reconnect())
    assert not transition.starts_work  # R7.1: reconnecting never starts new work
    viewer = RunViewer.objects.create(
        run=run,
        connection_id=connection_id,
        state=transition.state.value,
        connected_at=now,
        last_event_id=last_event_id,
    )
    return viewer, transition


def viewer_progress(connection_id: str, last_event_id: int) -> None:
    """Remember the last event written to this viewer (monotonic)."""
    RunViewer.objects.filter(connection_id=connection_id, last_event_id__lt=last_event_id).update(
        last_event_id=last_event_id
    )


def detach_viewer(connection_id: str, *, now: datetime) -> RunViewer | None:
    """R7.1: the subscriber's transport went away: the viewer is detached, the run
    is untouched (a disconnect never cancels). Idempotent."""
    with transaction.atomic():
        viewer = (
            RunViewer.objects.select_for_update()
            .select_related("run")
            .filter(connection_id=connection_id)
            .first()
        )
        if viewer is None:
            return None
        if viewer.disconnected_at is not None:
            return viewer  # already detached: a repeat changes nothing
        before = run_connection(viewer.run, viewer.state)
        transition = conn.apply_connection_event(before, conn.ConnectionEvent.disconnect())
        assert not transition.starts_work
        viewer.state = transition.state.value
        viewer.disconnected_at = now
        viewer.save(update_fields=["state", "disconnected_at"])
    return viewer


# A run's existence, whether it is settled and its owner, in one fixed statement:
# no row, no run. Every look of a waiting ``?wait=`` answer asks it.
RUN_SETTLED = (
    f"SELECT EXISTS (SELECT 1 FROM {sql.table(Settlement)}"
    f" WHERE run_id = {sql.table(Run)}.id), {sql.table(Run)}.owner_id"
    f" FROM {sql.table(Run)} WHERE {sql.table(Run)}.id = %s"
)


def run_is_settled(run_id: Any) -> bool | None:
    """Whether the run has its settlement; None when there is no such run."""
    found = run_settled_and_owner(run_id)
    return None if found is None else found[0]


def run_settled_and_owner(run_id: Any) -> tuple[bool, Any] | None:
    """Whether the run has its settlement, and its owner's id; None when there
    is no such run."""
    found = sql.fetch(RUN_SETTLED, (sql.value(Run, "id", run_id),))
    return (bool(found[0][0]), found[0][1]) if found else None


def events_after(run_id: Any, after_id: int, limit: int = 500) -> list[tuple[int, str, dict]]:
    """The run's events with id > ``after_id``, in order (RunEvent.id is the SSE id)."""
    return list(
        RunEvent.objects.filter(run_id=run_id, id__gt=after_id)
        .order_by("id")
        .values_list("id", "kind", "metadata")[:limit]
    )


def mark_chunks_sent(run_id: Any, chunk_nos: list[int], *, now: datetime) -> int:
    """R7.2: these chunks were written to a subscriber's transport. The rule says
    which become *sent* (committed ones, the first time); the conditional update
    keeps a second stream of the same run from moving ``sent_at``. Returns how
    many were new."""
    if not chunk_nos:
        return 0
    fresh = pub.newly_sent(run_publication(run_id), chunk_nos)
    if not fresh:
        return 0
    return BodyChunk.objects.filter(run_id=run_id, chunk_no__in=fresh, sent_at__isnull=True).update(
        sent_at=now
    )


@dataclass(frozen=True)
class AckResult:
    through: int
    committed: int
    sent: int
    observed: int
    newly_observed: int


def record_ack(run: Run, through: Any, *, now: datetime) -> AckResult:
    """R7.2/R7.3: the client acknowledged chunks 1 … ``through``; committed ones become
    observed (idempotent, cumulative: a stale lower ack changes nothing).

    A claim beyond what is committed cannot be true (publication.record_client_ack
    calls it impossible evidence). There is no fact column to keep such a claim
    for the report, so it is refused as bad input and nothing is written —
    observed stays a subset of committed either way.
    """
    if isinstance(through, bool) or not isinstance(through, int):
        raise ServiceError("through", f"must be an integer chunk number, got {through!r}")
    with transaction.atomic():
        # Serialise acks of one run so two concurrent acks cannot interleave.
        Run.objects.select_for_update().filter(id=run.id).values_list("id", flat=True).first()
        before = run_publication(run.id)
        try:
            after = pub.record_client_ack(before, through)
        except pub.PublicationError as exc:
            raise ServiceError("through", str(exc)) from None
        if after.impossible_ack_through > before.impossible_ack_through:
            raise ServiceError(
                "through",
                f"chunks through {through} acknowledged, but only {before.committed_count} "
                "are committed: a client cannot have received uncommitted chunks",
            )
        newly = sorted(after.observed_ids - before.observed_ids)
        if newly:
            BodyChunk.objects.filter(
                run_id=run.id, chunk_no__in=newly, observed_at__isnull=True
            ).update(observed_at=now)
    return AckResult(
        through=through,
        committed=after.committed_count,
        sent=len(after.sent_ids),
        observed=len(after.observed_ids),
        newly_observed=len(newly),
    )


def commit_chunks(run: Run, texts: Sequence[str], now: datetime) -> list[BodyChunk]:
    """R7.2: each chunk generated then committed with a version (the rule numbers them)."""
    committed = run.chunks.order_by("chunk_no").values_list("chunk_no", "version")
    publication = pub.Publication(chunks=tuple(pub.ChunkFacts(n, v) for n, v in committed))
    body, ids = pub.commit_body(publication, len(texts))
    commits = [
        ChunkCommit(i, body.chunk(i).committed_version or i, text, i == ids[-1])
        for i, text in zip(ids, texts, strict=True)
    ]
    return write_chunks(run, commits, now, None)


def write_chunks(
    run: Run, commits: Sequence[ChunkCommit], now: datetime, events: list[RunEvent] | None
) -> list[BodyChunk]:
    """Write committed chunks and their stream events (appended to ``events``
    when the caller writes its events in one insert)."""
    created = [
        BodyChunk(
            run=run,
            chunk_no=c.chunk_no,
            version=c.version,
            text=c.text,
            tool_calls=list(c.tool_calls),
            final=c.final,
            generated_at=now,
            committed_at=now,
        )
        for c in commits
    ]
    sql.insert(created)
    chunk_events = [
        new_event(
            run,
            "chunk",
            now,
            {
                "chunk_no": c.chunk_no,
                "version": c.version,
                "text": c.text,
                "final": c.final,
                # Only on a chunk that hands the client's calls over: events stay as they were.
                **({"tool_calls": list(c.tool_calls)} if c.tool_calls else {}),
            },
            segment=run.segment,
        )
        for c in commits
    ]
    if events is None:
        RunEvent.objects.bulk_create(chunk_events)
    else:
        events.extend(chunk_events)
    return created
