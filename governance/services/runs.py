"""Runs and stages: admission, claims, the lifecycle's decisions and the settlement (R6)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q

from governance.models import (
    ApiToken,
    BudgetAccount,
    BudgetEntry,
    Run,
    RunEvent,
    Segment,
    Settlement,
    Stage,
    Thread,
    ThreadSession,
)
from governance.rules import claims as claim_rules
from governance.rules import connection as conn
from governance.rules import settlement as rules_settlement
from governance.rules.authority import FactKind, Owner, OwnerFact
from governance.rules.decision_table import Decision, Path
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.payloads import StagePayload, TurnPayload
from governance.rules.recovery import RecoveryConditions
from governance.rules.run_facts import RunFacts
from governance.rules.transitions import successor_run
from governance.services import statements as sql
from governance.services.admission import Overloaded, check_admission
from governance.services.audit import audit
from governance.services.broker import publish
from governance.services.claims import holder_gone, new_holder
from governance.services.errors import RunSettled, ServiceError
from governance.services.events import FACT_KINDS, facts_of, new_event, record_fact
from governance.services.stream import run_connection
from governance.services.threads import open_segment

# What a run may ask for at admission. The clock watchdog reads these values
# on every pass, so the bounds are checked after conversion to a timedelta
# (1e-320 s is positive and finite, and still zero once converted).
DURATION_MIN = timedelta(seconds=1)
DURATION_MAX = timedelta(days=7)
BUDGET_MAX = 1_000_000  # per resource


def _duration(name: str, value: float | None, default: float) -> float:
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ServiceError(name, "must be a number of seconds")
    words = f"must be from {DURATION_MIN.total_seconds():g} s to {DURATION_MAX.days} days"
    try:
        converted = timedelta(seconds=value)
    except (OverflowError, ValueError):
        raise ServiceError(name, words) from None
    if not DURATION_MIN <= converted <= DURATION_MAX:
        raise ServiceError(name, words)
    return converted.total_seconds()


def submit_run(
    thread: Thread,
    *,
    input: str,
    now: datetime,
    user=None,
    idempotency_key: str | None = None,
    deadline_s: float | None = None,
    stage_budget_s: float | None = None,
    no_progress_s: float | None = None,
    limits: dict[str, int] | None = None,
    trace_context: dict[str, str] | None = None,
    previous_run: Run | None = None,
    run_id: uuid.UUID | None = None,
    segment: Segment | None = None,
    increment: Sequence[dict[str, Any]] | None = None,
    request_options: dict[str, Any] | None = None,
    client_prefix: str = "",
    api_token: ApiToken | None = None,
) -> tuple[Run, Stage | None, bool]:
    """Admit a run on the thread's open segment and queue its first stage.

    ``api_token``: the token that asked (the run API, the OpenAI door): the
    run's client, its name copied so it stays readable after the token goes.

    ``segment``: the open segment, when the caller read it with the thread in
    this transaction (the API: one statement); otherwise it is read here.
    ``increment``: the first turn's new messages when they are more than
    ``input`` as one user message (the door's tool results, R3.1);
    ``request_options``: what the client asked of each reply (``Run.request_options``);
    ``client_prefix``: the door's digest of the messages the run answers.
    Returns (run, first stage or None for a repeated key, created).

    One of the run's hot paths, in fixed SQL (``services.statements``): its
    rows are inserted without a queryset (:func:`_insert_run`).
    """
    if not isinstance(input, str) or not input.strip():
        raise ServiceError("input", "say what the run should do")
    try:
        check_admission()
    except Overloaded:
        # A repeat of an admitted run is answered, not refused.
        existing = (
            Run.objects.filter(idempotency_key=idempotency_key).first() if idempotency_key else None
        )
        if existing is None or existing.thread_id != thread.id:
            raise
        return existing, None, False
    merged = _budget_limits(limits)
    run = Run(
        id=run_id or uuid.uuid4(),
        thread=thread,
        segment=segment,
        input=input,
        created_at=now,
        last_progress_at=now,
        authorization=_authorization(user, now),
        owner=user if getattr(user, "pk", None) is not None else None,
        api_token=api_token,
        client_name=api_token.name if api_token is not None else "",
        idempotency_key=idempotency_key or None,
        trace_context=trace_context or {},
        callback_url=thread.callback_url,
        previous_run=previous_run,
        request_options=request_options or {},
        client_prefix=client_prefix,
        **_clocks(now, deadline_s, stage_budget_s, no_progress_s),
    )
    if previous_run is not None:
        # R6.4: continuing after settlement is a new run, linked and admitted on its own.
        try:
            successor_run(run_facts(previous_run), str(run.id), "continues a settled run")
        except LifecycleError as exc:
            raise ServiceError("previous_run", str(exc)) from None
    try:
        # Only a key can collide (the run's id is new): without one, no savepoint
        # to roll back to is needed inside the caller's transaction.
        with transaction.atomic(savepoint=bool(idempotency_key)):
            if segment is None:
                run.segment = open_segment(thread)
            return (run, _insert_run(run, merged, now, increment), True)
    except IntegrityError:
        # The key was used before (or by a request racing this one): the run
        # it admitted is the answer. Asking first would cost every new run a read.
        existing = _admitted_before(thread, idempotency_key)
        if existing is None:
            raise
        return existing, None, False


def _insert_run(
    run: Run,
    limits: dict[str, int],
    now: datetime,
    increment: Sequence[dict[str, Any]] | None = None,
) -> Stage:
    """The run, its one ledger and its first stage, inserted by fixed SQL (no
    queryset compiled: about 0.3 ms of CPU each on the submit's path). Returns
    the first stage."""
    stage = Stage(
        run=run,
        seq=1,  # a new run's first stage
        kind=Stage.Kind.MODEL_TURN,
        payload=TurnPayload(
            increment=tuple(increment or ({"role": "user", "content": run.input},))
        ).to_json(),
        enqueued_at=now,  # its queue clock starts here (R6.1)
    )
    sql.insert([run])
    sql.insert([BudgetAccount(run=run, limits=limits)])
    sql.insert([stage])
    return stage


def _authorization(user, now: datetime) -> dict:
    """Who asked and what they may do, recorded at admission (R6.4)."""
    scopes = sorted(
        getattr(user, "get_all_permissions", lambda: set())()
        if getattr(user, "is_authenticated", False)
        else []
    )
    return {
        "user": getattr(user, "username", "") or "",
        "scopes": scopes,
        "recorded_at": now.isoformat(),
    }


def _clocks(
    now: datetime,
    deadline_s: float | None,
    stage_budget_s: float | None,
    no_progress_s: float | None,
) -> dict:
    """The run's clock limits (R6.1): what the client set, else the defaults."""
    deadline = _duration("deadline_s", deadline_s, settings.RUN_DEFAULT_DEADLINE_S)
    return {
        "deadline_at": now + timedelta(seconds=deadline),
        "stage_budget_s": _duration(
            "stage_budget_s", stage_budget_s, settings.RUN_DEFAULT_STAGE_BUDGET_S
        ),
        "no_progress_limit_s": _duration(
            "no_progress_s", no_progress_s, settings.RUN_DEFAULT_NO_PROGRESS_S
        ),
    }


def _budget_limits(limits: dict[str, int] | None) -> dict[str, int]:
    """The run's ledger limits: the defaults, with what the client set (R5.2)."""
    merged = dict(settings.RUN_DEFAULT_BUDGET)
    for name, value in (limits or {}).items():
        if name not in merged:
            raise ServiceError("budget", f"unknown resource {name!r}")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= BUDGET_MAX:
            raise ServiceError("budget", f"{name} must be a whole number from 0 to {BUDGET_MAX:,}")
        merged[name] = value
    return merged


def _admitted_before(thread: Thread, idempotency_key: str | None) -> Run | None:
    """The run a repeated key admitted (None: the collision was not on the key)."""
    existing = (
        Run.objects.filter(idempotency_key=idempotency_key).first() if idempotency_key else None
    )
    if existing is not None and existing.thread_id != thread.id:
        raise ServiceError("idempotency_key", "already used for another thread") from None
    return existing


def enqueue_stage(
    run: Run,
    kind: str,
    payload: StagePayload,
    now: datetime,
    *,
    seq: int | None = None,
    delay_s: float = 0.0,
) -> Stage:
    """A new stage row, queued at ``now`` (its queue clock starts here, R6.1);
    ``delay_s``: its message waits that long (kept as ``due_at``, so a message
    sent again after a loss keeps the delay)."""
    if seq is None:
        seq = (run.stages.order_by("-seq").values_list("seq", flat=True).first() or 0) + 1
    return Stage.objects.create(
        run=run, seq=seq, kind=kind, payload=payload.to_json(), enqueued_at=now,
        due_at=now + timedelta(seconds=delay_s) if delay_s > 0 else None,
    )  # fmt: skip


def claim_stage(
    stage_id: int,
    now: datetime,
    *,
    lease: timedelta,
    lost: claim_rules.LostProcess | None = None,
) -> Stage | None:
    """Take a stage for this process unless a live holder runs it or it is done
    (R6.6, ``rules.claims.claim_verdict``).

    The row is locked while it is judged. A holder that stopped renewing its
    lease, or whose process is known to be gone — this host's OS says so, or
    the message says its parent saw it die (``lost``) — is taken over at once,
    and what it drew from the ledger is marked as having no known outcome
    (R5.3: the retry draws from the same balance). ``deliveries`` counts the
    pick-ups; the returned stage's ``claim_verdict`` says how it was taken.
    """
    with transaction.atomic(savepoint=False):  # the caller's transaction, when there is one
        return _claim(stage_id, now, lease, lost)


def _claim(
    stage_id: int, now: datetime, lease: timedelta, lost: claim_rules.LostProcess | None
) -> Stage | None:
    stage = _locked_stage(stage_id)
    if stage is None:
        return None
    reported = lost is not None and claim_rules.held_by_lost_process(
        stage.holder, stage.claimed_at, lost
    )
    gone = bool(stage.holder) and (reported or holder_gone(stage.holder))
    verdict = claim_rules.claim_verdict(
        claim_rules.ClaimFacts(
            finished=stage.finished_at is not None,
            holder=stage.holder,
            lease_until=stage.lease_until,
            holder_gone=gone,
        ),
        now,
    )
    if verdict in (claim_rules.ClaimVerdict.DONE, claim_rules.ClaimVerdict.HELD):
        return None
    stage.deliveries += 1
    stage.started_at = stage.started_at or now
    stage.claimed_at, stage.holder, stage.lease_until = now, new_holder(), now + lease
    stage.parked_at = None
    sql.update(
        Stage,
        {"id": stage.id},
        deliveries=stage.deliveries,
        started_at=stage.started_at,
        claimed_at=now,
        holder=stage.holder,
        lease_until=stage.lease_until,
        parked_at=None,
    )
    if verdict is claim_rules.ClaimVerdict.TAKE_OVER:
        BudgetEntry.objects.filter(stage_id=stage.id, outcome="").update(outcome="unknown")
    stage.claim_verdict = verdict
    return stage


@cache
def _claim_sql() -> tuple[str, tuple[sql.Columns, ...]]:
    shapes = (
        sql.columns(Stage, "s"),
        sql.columns(Run, "r"),
        sql.columns(Thread, "t"),
        sql.columns(Segment, "g"),
        sql.columns(ThreadSession, "x"),
    )
    text = (
        f"SELECT {', '.join(shape.sql for shape in shapes)}"
        f" FROM {sql.table(Stage)} s"
        f" JOIN {sql.table(Run)} r ON r.id = s.run_id"
        f" JOIN {sql.table(Thread)} t ON t.id = r.thread_id"
        f" JOIN {sql.table(Segment)} g ON g.id = r.segment_id"
        f" JOIN {sql.table(ThreadSession)} x ON x.id = g.session_id"
        f" WHERE s.id = %s{sql.lock_clause('s', 't')}"
    )
    return text, shapes


def _locked_stage(stage_id: int) -> Stage | None:
    """The stage with its run, thread, segment and session, the stage and the
    thread locked: the thread serialises a model turn's gate
    (rules.claims.turn_may_start) with the closes that wake waiting turns."""
    text, shapes = _claim_sql()
    found = sql.fetch(text, [stage_id])
    if not found:
        return None
    row, start, loaded = found[0], 0, []
    for shape in shapes:
        loaded.append(shape.load(row, start))
        start += shape.width
    stage, run, thread, segment, session = loaded
    sql.cache_related(stage, "run", run)
    sql.cache_related(run, "thread", thread)
    sql.cache_related(run, "segment", segment)
    sql.cache_related(segment, "session", session)
    if segment.thread_id == thread.id:
        sql.cache_related(segment, "thread", thread)
    return stage


def finish_stage(
    stage: Stage,
    *,
    outcome: str,
    now: datetime,
    clocks: dict[str, int] | None = None,
    timeout_name: str = "",
    detail: str = "",
) -> bool:
    changed = Stage.objects.filter(id=stage.id, finished_at__isnull=True).update(
        finished_at=now,
        outcome=outcome,
        timeout_name=timeout_name,
        detail=detail[:4000],
        clocks=clocks or {},
    )
    return bool(changed)


def mark_progress(run: Run, at: datetime) -> None:
    """R6.1: only business progress moves the no-progress clock."""
    Run.objects.filter(id=run.id).filter(
        Q(last_progress_at__lt=at) | Q(last_progress_at__isnull=True)
    ).update(last_progress_at=at)


def run_goal(run: Run) -> str:
    return f"run:{run.id}"


def run_facts(
    run: Run,
    recovery: RecoveryConditions | None = None,
    *,
    extra: Sequence[OwnerFact] = (),
    read_settlement: bool = True,
    payloads: Sequence[Any] | None = None,
) -> RunFacts:
    """The lifecycle's view of a run: its owners' facts in order (``extra``: the
    facts of a close not yet written), its phase and where finalization began
    (kept on the decision that entered it), its settlement. ``payloads``: the
    logged facts, read already in this transaction (:func:`fact_payloads_later`)."""
    if payloads is None:
        payloads = fact_payloads_later(run.id).value()
    facts = tuple(fact for metadata in payloads for fact in facts_of(metadata)) + tuple(extra)
    finalization_from = None
    if run.phase == "finalization":
        entered = next(
            (d for d in run.decisions if d.get("path") == Path.FINALIZATION_ONLY.value), {}
        )
        finalization_from = min(entered.get("facts_before", len(facts)), len(facts))
    row = Settlement.objects.filter(run=run).first() if read_settlement else None
    settlement = (
        rules_settlement.Settlement(
            row.outcome, row.reason_code, row.reason, tuple(row.unknown_effects)
        )
        if row is not None
        else None
    )
    return RunFacts(
        run_id=str(run.id),
        goal=run_goal(run),
        facts=facts,
        phase="settled" if settlement else run.phase,
        finalization_from=finalization_from,
        settlement=settlement,
        recovery=recovery,
    )


@cache
def _fact_payloads_sql() -> tuple[str, sql.Columns]:
    shape = sql.Columns(RunEvent, "e", only=("metadata",))
    text = (
        f"SELECT {shape.sql} FROM {sql.table(RunEvent)} e"
        f" WHERE e.run_id = %s AND e.kind IN ({sql.placeholders(len(FACT_KINDS))}) ORDER BY e.id"
    )
    return text, shape


def fact_payloads_later(run_id: Any) -> sql.Later[list[Any]]:
    """The run's owners' facts as logged, oldest first (read with others inside
    ``statements.together``)."""
    text, shape = _fact_payloads_sql()
    return sql.Later(
        text,
        [sql.value(RunEvent, "run", run_id), *FACT_KINDS],
        lambda rows: [shape.values(row)[0] for row in rows],
    )


def decision_entry(
    decision: Decision, now: datetime, *, facts_before: int | None = None
) -> dict[str, Any]:
    """The lifecycle's decision as the run keeps it (the run page's path)."""
    entry: dict[str, Any] = {
        "at": now.isoformat(),
        "path": decision.path.value,
        "reason": decision.reason,
    }
    if decision.boundary_action_needed:
        entry["boundary_action_needed"] = decision.boundary_action_needed
    if decision.must_keep:
        entry["must_keep"] = list(decision.must_keep)
    if facts_before is not None:
        entry["facts_before"] = facts_before  # where finalization began (R6.3: one way)
    return entry


# NOTIFY channel of a new settlement (payload: the run's id), heard by the web's
# waiting reads (``GET /api/v1/runs/{id}?wait=``) so they answer at the commit.
RUN_SETTLED_CHANNEL = "governance_run_settled"


def settlement_row(
    run: Run,
    settlement: rules_settlement.Settlement,
    now: datetime,
    events: list,
    *,
    known_absent: bool = False,
) -> tuple[Settlement, bool]:
    """R6.5 inside a stage's closing transaction (the run row is locked): the
    settlement is written once; its event joins ``events``. ``known_absent``:
    the caller read the run's settlement under the lock and there was none."""
    existing = None if known_absent else Settlement.objects.filter(run=run).first()
    if existing is not None:
        return existing, False
    row = Settlement(
        run=run,
        outcome=settlement.outcome.value,
        reason_code=settlement.reason_code.value,
        reason=settlement.reason,
        unknown_effects=list(settlement.unknown_effects),
        settled_at=now,
    )
    sql.insert([row])
    sql.notify(RUN_SETTLED_CHANNEL, str(run.id))
    run.status, run.phase = Run.Status.SETTLED, "settled"
    events.append(
        new_event(
            run,
            "settlement",
            now,
            {
                "outcome": row.outcome,
                "reason_code": row.reason_code,
                "reason": row.reason,
                "unknown_effects": row.unknown_effects,
            },
            segment=run.segment,
        )
    )
    return row, True


def cancel_requested(run: Run) -> bool:
    """Whether the user asked to stop the run (R7.1: only an explicit stop cancels)."""
    return Run.objects.filter(id=run.id, cancel_requested_at__isnull=False).exists()


def request_cancel(run: Run, *, by: str, now: datetime) -> bool:
    """R7.1: only an explicit stop cancels. ``rules.connection`` decides: a repeat
    changes nothing (False), a stop after settlement raises ``RunSettled`` (R6.5:
    a settled run is not reopened). A new stop nudges the run's pending stages
    after commit, so an idle run settles without waiting for the watchdog."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        before = run_connection(locked)
        try:
            conn.apply_connection_event(before, conn.ConnectionEvent.user_stop())
        except conn.IllegalConnectionTransition:
            raise RunSettled(
                "run", f"the run is already settled {before.settlement}; nothing to stop"
            ) from None
        if before.user_stop_requested:
            return False
        Run.objects.filter(id=run.id).update(cancel_requested_at=now, cancel_requested_by=by)
        record_fact(
            locked,
            OwnerFact(Owner.USER, FactKind.CANCEL_REQUESTED, str(run.id), f"by {by}"),
            now,
        )
        audit(
            actor=by,
            action="run.cancel",
            target_type="run",
            target_id=str(run.id),
            reason="user stop",
            detail={},
            now=now,
        )
        publish(list(locked.stages.filter(finished_at__isnull=True).values_list("id", "kind")))
    return True
