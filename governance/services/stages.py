"""Stages: the claim, the facts a stage reads, and the one transaction that
writes what the stage concluded (R6.1–R6.6).

A stage is three steps: gather the facts (:func:`start_stage`,
:func:`turn_context`), ask one pure conclusion (``governance.rules.turns`` /
``governance.rules.tools``), write it with :func:`close_stage` — attempts,
refusal state with its card and notices (outbox included), breaker moves,
history, chunks, receipts, the owners' facts, the lifecycle's decision, the
next stage or the settlement with its callback row — and publish after commit.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction

from governance.models import (
    BodyChunk,
    Notification,
    Provider,
    ProviderHealthState,
    Run,
    RunEvent,
    Segment,
    Stage,
    Thread,
    ThreadSession,
    ToolApproval,
    ToolReceipt,
)
from governance.rules import breaker as breaker_rules
from governance.rules import budget as budget_rules
from governance.rules import claims as claim_rules
from governance.rules import publication as pub
from governance.rules import refusal_memory, routing, run_clocks
from governance.rules import turns as turn_rules
from governance.rules.authority import FactKind
from governance.rules.budget import ORDINARY_RESEARCH_RESOURCE
from governance.rules.decision_table import Decision, Path, needs_recovery_conditions, next_path
from governance.rules.payloads import TurnPayload
from governance.rules.recovery import RecoveryConditions, RunAuthorization
from governance.rules.refusal import (
    ProviderRefusal,
    ReprobeSchedules,
    no_eligible_provider_notice,
)
from governance.rules.run_facts import Phase, RunFacts
from governance.rules.transitions import apply_decision, follow_up
from governance.rules.turns import StageConclusion
from governance.services import budget as budget_service
from governance.services import callbacks
from governance.services import statements as sql
from governance.services.broker import publish, queued_stage_ids
from governance.services.budget import budget_view
from governance.services.claims import holder_gone, lease
from governance.services.events import facts_event
from governance.services.health import (
    apply_health_moves,
    health_rows_later,
    provider_health,
    providers_with_health,
)
from governance.services.incidents import emit_notice
from governance.services.receipts import close_receipt_by_key
from governance.services.refusals import (
    attempt_rows,
    record_turn,
    remember_turn_refusal,
    reprobe_delays,
    reprobe_schedules,
    segment_refusals,
    segment_refusals_later,
    turn_memory,
)
from governance.services.runs import (
    claim_stage,
    decision_entry,
    enqueue_stage,
    fact_payloads_later,
    finish_stage,
    run_facts,
    settlement_row,
)
from governance.services.stream import write_chunks
from governance.services.threads import accepted_messages, append_history, open_segment

log = logging.getLogger(__name__)

MODEL_STAGES = (Stage.Kind.MODEL_TURN, Stage.Kind.FINALIZATION)
MAX_RECOVERY_WAIT_S = 600.0  # the watchdog's deadline still bounds the run


class StaleClaim(Exception):
    """Another worker holds (or finished) this stage: this execution's facts are void."""


# --------------------------------------------------------------------------- claim


@dataclass
class StageStart:
    """A claimed stage (``stage.holder`` is the claim that must close it)."""

    stage: Stage
    waiting: bool = False  # another turn of the thread is in flight: woken by its close
    context: TurnContext | None = None  # a model turn's facts, read with the claim
    gather_error: Exception | None = None  # reading the facts failed: a local failure


def start_stage(
    stage_id: int, now: datetime, *, lost: claim_rules.LostProcess | None = None
) -> StageStart | None:
    """Claim a stage (``claim_stage``) and read what it needs, in one transaction.

    One model turn at a time per thread (``rules.claims.turn_may_start``): a
    later turn waits behind the one in flight, parked without a message, and
    the closing transaction of that turn wakes it. A failure while reading
    the facts keeps the claim and is handed to the caller to record, so no
    stage is left claimed without a conclusion.

    One of the run's hot paths, in fixed SQL (``services.statements``): the
    claim's writes, the gate's question, the turn's reads and the ledger's lock
    share one round trip after the claim's read (pipeline mode), where the ORM
    built each statement's SQL anew: about 0.5 ms of CPU a statement, most of a
    stage's cost then (docs/performance.md). ``lost``: the message says the
    process that held the stage died (its worker's parent saw it).
    """
    try:
        with transaction.atomic():
            return _claim_and_gather(stage_id, now, lost)
    except Exception as exc:  # the claim rolled back with the gather: claim alone
        log.exception("stage %s: reading its facts failed", stage_id)
        with transaction.atomic():
            stage = claim_stage(stage_id, now, lease=lease(), lost=lost)
        return None if stage is None else StageStart(stage, gather_error=exc)


def _claim_and_gather(
    stage_id: int, now: datetime, lost: claim_rules.LostProcess | None
) -> StageStart | None:
    # On PostgreSQL the claim's writes, the gate's question and the turn's reads
    # go in one round trip after the claim's read (statements.together): the
    # block's end, after which their answers are read.
    with sql.together():
        stage = claim_stage(stage_id, now, lease=lease(), lost=lost)
        if stage is None:
            return None
        run = stage.run
        if run.status == Run.Status.QUEUED:
            sql.update(Run, {"id": run.id, "status": Run.Status.QUEUED}, status=Run.Status.RUNNING)
            run.status = Run.Status.RUNNING
        if stage.kind not in MODEL_STAGES or run.status == Run.Status.SETTLED:
            return StageStart(stage)
        # The thread row, locked by the claim, serialises the gate with the closes
        # that wake waiting turns.
        other_turns = _other_turn_leases().later(
            sql.value(Run, "thread", run.thread_id), *MODEL_STAGES, stage.id
        )
        # What the turn reads, in the claim's transaction (one commit fewer); read
        # along with the gate's answer, and left unused when the turn must wait.
        stopping = turn_rules.stage_must_stop(
            cancel_requested=run.cancel_requested_at is not None,
            now=now,
            deadline_at=run.deadline_at,
        )
        reads = None if stopping else _turn_reads(run, stage, now)
        # Locked with the reads: the turn's first request is admitted on it below.
        ledger = None if stopping else budget_service.locked_ledger_later(run.id)
    in_flight = any(claim_rules.turn_in_flight(r.lease_until, now) for r in other_turns.value())
    if not claim_rules.turn_may_start(other_turn_in_flight=in_flight):
        # Still in the claim's transaction (the caller's): the thread stays locked.
        sql.update(
            Stage, {"id": stage.id}, claimed_at=None, holder="", lease_until=None, parked_at=now
        )
        stage.holder, stage.parked_at = "", now
        return StageStart(stage, waiting=True)
    if reads is None:
        return StageStart(stage)
    context = reads()
    _admit_first_request(stage, context, ledger.value(), now)
    return StageStart(stage, context=context)


def _admit_first_request(
    stage: Stage,
    context: TurnContext,
    ledger: tuple[int, budget_rules.Ledger] | None,
    now: datetime,
) -> None:
    """R5.1: the draw of the request the turn sends first, admitted on the run's
    ledger read locked with the claim: one commit fewer than an admission of
    its own. The turn takes it by its key (``context.admitted``)."""
    first = routing.first_send(
        context.plan.route, has_unaccepted_increment=context.plan.has_unaccepted_increment
    )
    if first is None:
        return
    candidate, kind = first
    draw = turn_rules.turn_draw(
        stage_id=stage.id, claim=stage.deliveries, provider_id=candidate.provider_id, kind=kind,
        step=1, recovery=stage.typed_payload.recovery,
        final=stage.kind == Stage.Kind.FINALIZATION,
    )  # fmt: skip
    admission = budget_service.admit_locked(ledger, draw, now=now, stage=stage)
    if admission is not None:
        context.admitted[draw.key] = admission


@cache
def _other_turn_leases() -> sql.Read:
    """The leases of the thread's other unfinished model turns (rules.claims
    .turn_in_flight says which are in flight); a lease-less turn is left out here."""
    stage, run = sql.table(Stage), sql.table(Run)
    return sql.Read(
        sql.fields_of(Stage, "lease_until"),
        f"FROM {stage} JOIN {run} ON {run}.id = {stage}.run_id WHERE {run}.thread_id = %s"
        f" AND {stage}.kind IN ({sql.placeholders(len(MODEL_STAGES))})"
        f" AND {stage}.finished_at IS NULL AND {stage}.lease_until IS NOT NULL"
        f" AND {stage}.id <> %s",
    )


def give_up_claim(stage: Stage, now: datetime) -> None:
    """The database failed under a running stage: end this holder's lease so
    the stage is taken over (its ledger uses marked unknown) and send it again.
    While the database is still away this fails too, and the lease runs out."""
    try:
        close_old_connections()  # the failed connection is not reused
        with transaction.atomic():
            if Stage.objects.filter(
                id=stage.id, holder=stage.holder, finished_at__isnull=True
            ).update(lease_until=now):
                publish([stage], ahead=True)  # sent again: ahead of new work (R6.6)
    except DatabaseError:
        log.warning("stage %s: the database is still away; its lease will run out", stage.id)


def wake_next_turn(
    thread_id: Any,
    now: datetime,
    *,
    thread_locked: bool = False,
    found: list[sql.Row] | None = None,
) -> int | None:
    """In the transaction that closes a thread's turn: the oldest turn waiting
    behind it is reserved (its lease marks it on its way) and sent on commit.
    The thread row is locked first (``thread_locked``: the close holds it).
    ``found``: that turn, read already under the thread's lock (:func:`waiting_turn_later`)."""
    if not thread_locked:
        Thread.objects.select_for_update().filter(pk=thread_id).first()
    if found is None:
        found = waiting_turn_later(thread_id).value()
    if not found:
        return None
    waiting = found[0]
    sql.update(Stage, {"id": waiting[0]}, parked_at=None, lease_until=now + lease())
    publish([waiting])
    return waiting[0]


def waiting_turn_later(thread_id: Any) -> sql.Later[list[sql.Row]]:
    """The thread's oldest turn parked behind the one in flight, read with others
    (``statements.together``); read it under the thread's lock."""
    return sql.Later(
        _waiting_turn_sql(), [sql.value(Run, "thread", thread_id), *MODEL_STAGES], list
    )


@cache
def _waiting_turn_sql() -> str:
    """The thread's oldest model turn parked behind the one in flight."""
    return (
        f"SELECT s.id, s.kind FROM {sql.table(Stage)} s JOIN {sql.table(Run)} r ON r.id = s.run_id"
        f" WHERE r.thread_id = %s AND s.kind IN ({sql.placeholders(len(MODEL_STAGES))})"
        " AND s.finished_at IS NULL AND s.parked_at IS NOT NULL"
        " ORDER BY s.parked_at, s.id LIMIT 1"
    )


# --------------------------------------------------------------------------- gather


@dataclass
class TurnContext:
    """The facts a model turn reads, gathered in one read transaction."""

    segment: Segment
    session: ThreadSession
    history: list[dict[str, Any]]
    providers: dict[str, Provider]
    refusals: dict[str, ProviderRefusal]
    health: dict[str, Any]
    memory: refusal_memory.TurnRefusalMemory
    publication: pub.Publication
    delays: ReprobeSchedules  # R3.2's default, and each provider's own
    last_progress_at: datetime
    plan: turn_rules.TurnPlan  # the increment and the route, from these facts
    # Ledger draws admitted with the claim, by key (the turn's first request):
    # taken once by the request they were admitted for.
    admitted: dict[str, budget_rules.Admission] = field(default_factory=dict)


def turn_context(run: Run, stage: Stage, now: datetime) -> TurnContext:
    """What a model turn reads, in one read transaction (the claim's, when called in it)."""
    with transaction.atomic(savepoint=False):
        with sql.together():
            context = _turn_reads(run, stage, now)
        return context()  # the block's end was the round trip


def _turn_reads(run: Run, stage: Stage, now: datetime) -> Callable[[], TurnContext]:
    """Send what a model turn reads (inside ``statements.together``: at once);
    the returned call reads the answers and builds the context with the turn's
    plan (``rules.turns.plan_turn``)."""
    stage_seq = stage.seq
    # One open segment per thread: the run's, unless a boundary closed it.
    segment = run.segment if run.segment.closed_at is None else open_segment(run.thread)
    chain = run.thread.provider_chain
    history = accepted_messages(segment.session_id)
    found = providers_with_health(chain)
    refusals = segment_refusals_later(segment)
    # R2.3's memory of the chain's providers (a provider that does not exist has none).
    memory = turn_memory(chain, now)
    # The body so far: a run's first stage has none by construction.
    committed = _committed_chunks(run) if stage_seq > 1 else None

    def context() -> TurnContext:
        providers = found.value()
        verdicts = {}
        for provider in providers.values():
            value = provider_health(provider, _health_row(provider))
            verdicts[provider.provider_id] = breaker_rules.health_verdict(
                value, now, provider.config_fingerprint(), enabled=provider.enabled
            )
        chunks = committed.value() if committed is not None else ()
        turn = {
            "history": history.value(),
            "refusals": refusals.value(),
            "memory": memory.value(),
            # R3.2's default and each provider's own schedule, from the
            # providers read above: no query of its own.
            "delays": reprobe_schedules(providers.values()),
        }
        plan = turn_rules.plan_turn(
            stage_increment=stage.typed_payload.increment,
            final=stage.kind == Stage.Kind.FINALIZATION,
            provider_chain=chain,
            provider_models={pid: p.model for pid, p in providers.items()},
            segment_model=segment.model,
            segment_key=segment.key,
            health=verdicts,
            now=now,
            **turn,
        )
        return TurnContext(
            segment=segment,
            session=segment.session,
            providers=providers,
            health=verdicts,
            publication=pub.Publication(chunks=tuple(pub.ChunkFacts(n, v) for n, v in chunks)),
            last_progress_at=run.last_progress_at,  # read with the claim
            plan=plan,
            **turn,
        )

    return context


def _committed_chunks(run: Run) -> sql.Later[list]:
    return sql.Later(
        f"SELECT c.chunk_no, c.version FROM {sql.table(BodyChunk)} c WHERE c.run_id = %s"
        " ORDER BY c.chunk_no",
        [sql.value(BodyChunk, "run", run.id)],
        list,
    )


def _health_row(provider: Provider) -> ProviderHealthState | None:
    try:
        return provider.health
    except ProviderHealthState.DoesNotExist:  # no failure recorded yet
        return None


def tool_surface(run: Run) -> tuple[str, ...]:
    return tuple(open_segment(run.thread).tool_surface)


# --------------------------------------------------------------------------- close


@dataclass
class Closed:
    """What the closing transaction wrote (for spans and metrics after commit)."""

    decision: Decision
    settled: bool = False
    notifications: list[Notification] = field(default_factory=list)
    critical_alert: bool = False


def stage_clock_values(run: Run, stage: Stage, at: datetime, last_progress_at: datetime):
    started = stage.started_at or at
    finished = stage.finished_at or at
    # The run's latest progress as of the stage's end, as stage_clocks asks for.
    progress = min(max(last_progress_at, run.created_at), finished)
    return run_clocks.stage_clocks(
        enqueued_at=stage.enqueued_at,
        started_at=started,
        finished_at=finished,
        last_progress_at=progress,
        run_started_at=run.created_at,
        deadline_at=run.deadline_at,
        now=finished,
    ).as_millis()


def _recovery_conditions(run: Run, stage: Stage | None) -> RecoveryConditions:
    """R6.4's five conditions, each read from its owner."""
    auth = RunAuthorization(str(run.id), frozenset(run.authorization.get("scopes", [])))
    unknown = tuple(
        ToolReceipt.objects.filter(run=run, effect=ToolReceipt.Effect.UNKNOWN).values_list(
            "idempotency_key", flat=True
        )
    )
    increment_kept = (
        stage is None
        or isinstance(stage.typed_payload, TurnPayload)
        or (bool(_last_turn_increment(run, stage)))
    )
    return RecoveryConditions(
        task_identity=str(run.id),
        resume_task_identity=str(stage.run_id if stage is not None else run.id),
        # The turn is rebuilt from the accepted history and the stage's stored increment.
        checkpoint_usable=increment_kept,
        admitted_authorization=auth,
        resume_authorization=auth,  # recorded at admission, never re-judged
        remaining_balance=budget_view(run)[ORDINARY_RESEARCH_RESOURCE].remaining,
        # The turn to resume is a model request: no external effect of its own. The
        # rule judges the unknown tool effects (R6.4: no resend before verification).
        original_allows_safe_continuation=True,
        unknown_effect_keys=unknown,
    )


def _last_turn_increment(run: Run, stage: Stage | None) -> list[dict[str, Any]]:
    if stage is not None and stage.kind == Stage.Kind.MODEL_TURN:
        return list(stage.typed_payload.increment)
    last = run.stages.filter(kind=Stage.Kind.MODEL_TURN).order_by("-seq").first()
    return list(last.typed_payload.increment) if last else []


def _hold_later(stage: Stage) -> sql.Later[Run]:
    """Lock the stage, its run and its thread for the close; its value is the
    run's current row (the fields a close reads: decisions, phase, status, last
    progress). Sent now: inside ``statements.together`` the reads sent after it
    run once its locks are held.

    Fencing: only the holder of the current claim may close the stage. A
    worker that was taken over while it waited on a provider (its heartbeat
    stalled past the lease) finds another holder here, and its whole closing
    transaction rolls back.
    """
    # The thread is locked too: a model turn's close wakes the next turn (wake_next_turn).
    text, shape = _hold_sql()

    def held(rows: list[sql.Row]) -> Run:
        if not rows:
            raise StaleClaim(f"stage {stage.id} was taken over or finished meanwhile")
        return shape.load(rows[0])

    return sql.Later(text, [stage.id, stage.holder], held)


@cache
def _hold_sql() -> tuple[str, sql.Columns]:
    shape = sql.Columns(Run, "r", only=("id", "decisions", "phase", "status", "last_progress_at"))
    text = (
        f"SELECT {shape.sql} FROM {sql.table(Stage)} s"
        f" JOIN {sql.table(Run)} r ON r.id = s.run_id"
        f" JOIN {sql.table(Thread)} t ON t.id = r.thread_id"
        f" WHERE s.id = %s AND s.finished_at IS NULL AND s.holder = %s"
        f"{sql.lock_clause('s', 'r', 't')}"
    )
    return text, shape


@dataclass
class _CloseReads:
    """What a close reads besides its lock, read in the lock's round trip
    (None: not read there; the close reads it when it needs it)."""

    health: dict[Any, ProviderHealthState] | None = None  # the turn's providers' rows
    fact_payloads: list[Any] | None = None  # the run's logged facts (R6.3)
    waiting: list[sql.Row] | None = None  # the thread's next parked turn


def _hold_and_read(
    stage: Stage | None, run: Run, conclusion: StageConclusion, context: TurnContext | None
) -> tuple[Run, _CloseReads]:
    """The close's locks (:func:`_hold_later`), and in the same round trip the
    reads the close makes under them: the health rows its breaker moves start
    from, the run's facts its decision reads, the turn parked behind it. A fact
    from outside any stage (``stage`` None) locks the run alone and reads these
    when it needs them."""
    if stage is None:
        return Run.objects.select_for_update().get(id=run.id), _CloseReads()
    with sql.together():
        held = _hold_later(stage)
        health = (
            health_rows_later(context.providers[m.provider_id] for m in conclusion.health)
            if conclusion.turn is not None and context is not None and conclusion.health
            else None
        )
        facts = fact_payloads_later(run.id)
        waiting = waiting_turn_later(run.thread_id) if stage.kind in MODEL_STAGES else None
    # Read after the block: its end is the one round trip.
    return held.value(), _CloseReads(
        health=health.value() if health is not None else None,
        fact_payloads=facts.value(),
        waiting=waiting.value() if waiting is not None else None,
    )


def close_stage(
    stage: Stage | None,
    conclusion: StageConclusion,
    now: datetime,
    *,
    run: Run | None = None,
    context: TurnContext | None = None,
    last_progress_at: datetime | None = None,
    abandoned: Sequence[Stage] = (),
) -> Closed:
    """Write everything one stage concluded in one transaction, and decide (R6.3).

    ``stage`` None: a fact from outside any stage (the clock watchdog), which
    closes the ``abandoned`` stages it stopped waiting for.

    One of the run's hot paths, in fixed SQL (``services.statements``): the
    lock reads what the close needs with it, and the writes from the history on
    share one round trip (pipeline mode), where the ORM built each statement's
    SQL anew (docs/performance.md has what each piece bought).
    """
    run = run if run is not None else stage.run
    with transaction.atomic():
        locked, reads = _hold_and_read(stage, run, conclusion, context)
        run.decisions, run.phase, run.status = locked.decisions, locked.phase, locked.status
        run.last_progress_at = locked.last_progress_at
        segment = context.segment if context is not None else run.segment
        events: list[RunEvent] = []
        closed = Closed(decision=None)  # type: ignore[arg-type]
        closed.notifications = _write_counted(
            stage, run, segment, conclusion, context, abandoned, reads, now, events
        )
        # From here on the writes' counts are not read: on PostgreSQL they go with
        # the reads that follow them (statements.together), 3 round trips, not 8.
        with sql.together():
            _write_results(stage, run, conclusion, context, last_progress_at, now, events)
            if any(s.kind in MODEL_STAGES for s in (stage, *abandoned) if s is not None):
                # The thread's turn is free again (a stage's close holds its row: _hold_later).
                wake_next_turn(
                    run.thread_id, now, thread_locked=stage is not None, found=reads.waiting
                )
            closed.decision = decision = _decide(run, stage, conclusion, now, reads.fact_payloads)
            if decision.path is Path.SETTLE:
                closed.settled = _settle(run, decision, now, events)
            sql.insert(events)
            sql.update(
                Run,
                {"id": run.id},
                last_progress_at=run.last_progress_at,
                decisions=run.decisions,
                phase=run.phase,
                status=run.status,
            )
        if closed.settled and decision.critical_alert:
            # Outside the block: a notice may update its existing row (a count is read).
            closed.critical_alert = _no_provider_alert(run, decision, segment, now)
    return closed


def _write_counted(
    stage: Stage | None,
    run: Run,
    segment: Segment,
    conclusion: StageConclusion,
    context: TurnContext | None,
    abandoned: Sequence[Stage],
    reads: _CloseReads,
    now: datetime,
    events: list[RunEvent],
) -> list:
    """The close's writes whose counts are read (outside pipeline mode): the turn's
    attempts and refusal memory, the providers' health, the receipts, the
    stages the watchdog stopped waiting for. Returns the turn's notifications."""
    notifications = []
    if conclusion.turn is not None and context is not None:
        providers = context.providers
        notifications = record_turn(
            run=run, stage=stage, segment=segment, outcome=conclusion.turn,
            attempts=attempt_rows(conclusion.attempts, providers), now=now, events=events,
        )  # fmt: skip
        apply_health_moves(
            providers, conclusion.health, now, rng=random.Random(), read=reads.health
        )
        for provider_id, digest in conclusion.turn_refusals:
            remember_turn_refusal(providers[provider_id], digest, now)
    for receipt in conclusion.receipts:
        close_receipt_by_key(
            receipt.key, effect=receipt.effect, output=receipt.output,
            error=receipt.error, now=now, verified=receipt.verified,
        )  # fmt: skip
    for other in abandoned:
        if Stage.objects.filter(id=other.id, finished_at__isnull=True).update(
            finished_at=now,
            outcome="abandoned",
            timeout_name=conclusion.timeout_name,
            detail=conclusion.detail or "the clock watchdog stopped waiting for this stage",
            clocks={},
        ):
            other.outcome, other.timeout_name = "abandoned", conclusion.timeout_name
    return notifications


def _write_results(
    stage: Stage | None,
    run: Run,
    conclusion: StageConclusion,
    context: TurnContext | None,
    last_progress_at: datetime | None,
    now: datetime,
    events: list[RunEvent],
) -> None:
    """The accepted history, the committed chunks, the facts' event, the stage's
    own row and the run's progress (inside the close's pipelined block)."""
    if conclusion.history:
        # One turn at a time per thread: nothing else appended since the gather.
        append_history(
            context.session, conclusion.history, run=run, now=now,
            last_seq=len(context.history),
        )  # fmt: skip
    if conclusion.chunks:
        write_chunks(run, conclusion.chunks, now, events)
    progress = max(last_progress_at or run.last_progress_at, run.last_progress_at)
    if conclusion.progress:
        progress = max(progress, now)
    if conclusion.facts:
        events.append(facts_event(run, conclusion.facts, now, stage))
    if stage is not None:
        stage.finished_at = now
        clocks = stage_clock_values(run, stage, now, progress)
        sql.update(
            Stage,
            {"id": stage.id},
            finished_at=now,
            outcome=conclusion.outcome,
            timeout_name=conclusion.timeout_name,
            failure_class=conclusion.failure_class,
            detail=conclusion.detail[:4000],
            clocks=clocks,
        )
        stage.outcome, stage.clocks = conclusion.outcome, clocks
        stage.timeout_name = conclusion.timeout_name
        stage.failure_class = conclusion.failure_class
    if progress > run.last_progress_at:
        run.last_progress_at = progress


def _settle(run: Run, decision: Decision, now: datetime, events: list[RunEvent]) -> bool:
    """The settlement row (once, R6.5) and its callback; True when written now."""
    row, created = settlement_row(
        run, decision.settlement, now, events, known_absent=run.phase != "settled"
    )
    if created:
        # R7.3: the callback row is written with the settlement and
        # published only once both are committed.
        callback = callbacks.create_for_settlement(run, row, now)
        if callback is not None:
            callbacks.publish(callback.id)
    return created


def _decide(
    run: Run,
    stage: Stage | None,
    conclusion: StageConclusion,
    now: datetime,
    fact_payloads: list[Any] | None = None,
) -> Decision:
    """Ask the lifecycle (R6.3) with every fact recorded — this stage's too,
    written in the same transaction — and start what it allows."""
    # The run row is locked and fresh: only a settled run has a settlement to read.
    facts = run_facts(
        run, extra=conclusion.facts, read_settlement=run.phase == "settled",
        payloads=fact_payloads,
    )  # fmt: skip
    if needs_recovery_conditions(facts.facts):
        facts = RunFacts(
            run_id=facts.run_id, goal=facts.goal, facts=facts.facts, phase=facts.phase,
            finalization_from=facts.finalization_from, settlement=facts.settlement,
            recovery=_recovery_conditions(run, stage),
        )  # fmt: skip
    decision = next_path(facts)
    after = apply_decision(facts, decision)  # one way: finalization never returns (R6.3)
    entering = after.phase is Phase.FINALIZATION and run.phase != "finalization"
    entry = decision_entry(decision, now, facts_before=len(facts.facts) if entering else None)
    run.decisions = [*run.decisions, entry]
    if entering:
        run.phase, run.status = "finalization", Run.Status.FINALIZING
    if decision.path is Path.SETTLE:
        return decision
    verification = None
    if stage is not None and stage.kind == Stage.Kind.VERIFY_EFFECT:
        verifying = stage.typed_payload
        verification = (verifying.resume, verifying.attempt)
    follow = follow_up(
        decision,
        conclusion.next_work,
        last_increment=_last_turn_increment(run, stage)
        if decision.path is Path.BOUNDED_RECOVERY
        else (),
        # Entering finalization enqueues the one finalization; once in, it exists.
        finalization_started=not entering,
        recovery_delay_s=conclusion.recovery_delay_s,
        max_recovery_wait_s=MAX_RECOVERY_WAIT_S,
        verify_delay_s=settings.GOVERNANCE_VERIFY_DELAY_SECONDS,
        verification=verification,
    )
    if follow is not None:
        new = enqueue_stage(run, follow.kind, follow.payload, now, delay_s=follow.countdown_s)
        publish([new], {new.id: follow.countdown_s})
    return decision


def _no_provider_alert(run: Run, decision: Decision, segment: Segment, now: datetime) -> bool:
    """A critical alert when every provider is frozen in the segment (R6.3)."""
    notice = no_eligible_provider_notice(
        run_id=str(run.id),
        segment_key=segment.key,
        provider_ids=segment.thread.provider_chain,
        refusals=segment_refusals(segment),
        now=now,
        boundary_action_needed=decision.boundary_action_needed or "",
        delays=reprobe_delays(),
    )
    if notice is None:
        return False
    _row, created = emit_notice(notice, segment)
    return created


def finish_skipped(stage: Stage, now: datetime) -> None:
    """A stage delivered after its run settled starts nothing (and frees its
    thread's turn)."""
    with transaction.atomic():
        if finish_stage(stage, outcome="skipped", now=now, detail="run already settled"):
            stage.finished_at, stage.outcome = now, "skipped"
            if stage.kind in MODEL_STAGES:
                wake_next_turn(stage.run.thread_id, now)


# --------------------------------------------------------------------------- watchdog


@dataclass(frozen=True)
class StageResend:
    """A stage to send again, as ``rules.claims.needs_resend`` says."""

    stage: tuple[int, str]  # its id and kind
    reason: claim_rules.Resend
    ahead: bool  # before new work (rules.claims.resend_ahead)
    delay_s: float  # what is left of its own delay (rules.claims.resend_delay)


@dataclass
class WatchedRun:
    run: Run
    held: bool  # a live holder runs one of its stages
    stale: list[StageResend]  # its stages to send again
    awaiting_person: bool = False  # one of its calls waits for a person's approval


def unsettled_runs(
    now: datetime, *, resend_after: timedelta, broker_lost: bool = False
) -> list[WatchedRun]:
    """What the clock watchdog looks at: the unsettled runs and their open
    stages, read in one transaction, with whether each holder's process is
    known gone on this host. ``broker_lost``: the broker may have lost the
    messages it held (it came back empty, or a worker reconnected).

    The broker's queues are read only when the answer depends on them: after
    a loss, for the stages that should have a message there, and for a stage
    the last-resort timer would send again (a message still waiting in a
    backlog is not sent twice, a lost one goes ahead of new work).
    """
    with transaction.atomic():
        runs = list(Run.objects.exclude(status=Run.Status.SETTLED).select_related("segment"))
        thread_of = {run.id: run.thread_id for run in runs}
        open_stages: dict[Any, list[Stage]] = {}
        busy_threads = set()
        for stage in Stage.objects.filter(run__in=runs, finished_at__isnull=True):
            open_stages.setdefault(stage.run_id, []).append(stage)
            if stage.kind in MODEL_STAGES and claim_rules.turn_in_flight(stage.lease_until, now):
                busy_threads.add(thread_of[stage.run_id])
        asking = set(
            ToolApproval.objects.filter(
                stage__in=[s.id for stages in open_stages.values() for s in stages],
                state=ToolApproval.State.PENDING,
            ).values_list("stage_id", flat=True)
        ) if open_stages else set()  # fmt: skip
    facts = {
        run.id: [
            (
                (s.id, s.kind),
                claim_rules.OpenStageFacts(
                    holder=s.holder,
                    lease_until=s.lease_until,
                    enqueued_at=s.enqueued_at,
                    parked_at=s.parked_at,
                    thread_turn_in_flight=run.thread_id in busy_threads,
                    holder_gone=bool(s.holder) and holder_gone(s.holder),
                    due_at=s.due_at,
                    awaiting_person=s.id in asking,
                ),
            )
            for s in open_stages.get(run.id, [])
        ]
        for run in runs
    }

    def reasons() -> dict[int, claim_rules.Resend | None]:
        return {
            ref[0]: claim_rules.needs_resend(
                f, now, resend_after=resend_after, broker_lost=broker_lost
            )
            for stages in facts.values()
            for ref, f in stages
        }

    why = reasons()
    expected = [
        f for stages in facts.values() for _, f in stages if claim_rules.message_expected(f)
    ]
    if (broker_lost and expected) or claim_rules.Resend.NEVER_CLAIMED in why.values():
        queued = queued_stage_ids()
        if queued is not None:
            for stages in facts.values():
                stages[:] = [
                    (ref, replace(f, in_broker=ref[0] in queued))
                    if claim_rules.message_expected(f)
                    else (ref, f)
                    for ref, f in stages
                ]
            why = reasons()
    return [
        WatchedRun(
            run,
            held=any(claim_rules.holds_live(f, now) for _, f in facts[run.id]),
            stale=[
                StageResend(
                    ref,
                    reason,
                    ahead=claim_rules.resend_ahead(reason),
                    delay_s=claim_rules.resend_delay(f, now),
                )
                for ref, f in facts[run.id]
                if (reason := why[ref[0]]) is not None
            ],
            awaiting_person=any(f.awaiting_person for _, f in facts[run.id]),
        )
        for run in runs
    ]


def resend(stages: Sequence[StageResend]) -> None:
    """Send stages again: each in its lane, with what is left of its delay."""
    for ahead in (True, False):
        lane = [s for s in stages if s.ahead is ahead]
        if lane:
            publish(
                [s.stage for s in lane],
                {s.stage[0]: s.delay_s for s in lane if s.delay_s},
                ahead=ahead,
            )


def has_fact(run: Run, kind: FactKind) -> bool:
    """Whether an owner already reported a fact of this kind on the run."""
    return any(fact.kind is kind for fact in run_facts(run, read_settlement=False).facts)


def record_breach(run: Run, conclusion: StageConclusion, now: datetime) -> bool:
    """The watchdog's clock fact for a run no stage holds; the stages it stopped
    waiting for are closed as abandoned. False when the run settled meanwhile."""
    run = Run.objects.select_related("thread", "segment").get(id=run.id)
    if run.status == Run.Status.SETTLED:
        return False
    abandoned = list(Stage.objects.filter(run=run, finished_at__isnull=True))
    close_stage(None, conclusion, now, run=run, abandoned=abandoned)
    # A person asked about a call of an abandoned stage is no longer asked.
    ToolApproval.objects.filter(stage__in=abandoned, state=ToolApproval.State.PENDING).update(
        state=ToolApproval.State.EXPIRED, decided_at=now
    )
    return True
