"""The Celery shell of a run: one task executes one stage (R6).

It decides nothing on its own. Each stage kind (``model_turn``, ``tool_call``,
``verify_effect``) gathers facts, asks one pure conclusion from
``governance.rules`` and writes it with one service call
(``governance.services.stages.close_stage``), then emits spans. Delivery is at
least once: a finished stage is a no-op, admissions carry stable keys, and an
effect that may have happened is verified by key, never replayed blindly.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import DatabaseError

from governance import time_source
from governance.models import Run, Stage
from governance.rules.claims import LostProcess
from governance.rules.turns import conclude_local_failure, conclude_stop, stage_must_stop
from governance.services import stages as stage_service
from governance.services.broker import STAGE_TASK, publish
from governance.services.stages import StaleClaim
from tasks import instrumentation as spans
from tasks.stages import model_turn, tool_call, verify_effect
from tasks.stages.heartbeat import heartbeat
from tasks.stages.lost_process import StageRequest, lost_from
from tasks.stages.watchdog import watchdog_pass

log = logging.getLogger(__name__)

__all__ = ["StaleClaim", "execute_stage", "publish", "run_stage", "watchdog_pass"]

# Model turns and the finalization are run by model_turn with the facts read at the claim.
HANDLERS = {
    Stage.Kind.TOOL_CALL: tool_call.execute,
    Stage.Kind.VERIFY_EFFECT: verify_effect.execute,
}


@shared_task(name=STAGE_TASK, ignore_result=True, acks_late=True, Request=StageRequest)
def execute_stage(stage_id: int, lost_process: str = "", lost_at: str = "") -> str:
    # lost_process, lost_at: sent again by the parent of the process that ran it
    # and died (tasks/stages/lost_process.py).
    return run_stage(stage_id, lost=lost_from(lost_process, lost_at))


def run_stage(stage_id: int, *, lost: LostProcess | None = None) -> str:
    now = time_source.now()
    start = stage_service.start_stage(stage_id, now, lost=lost)
    if start is None:
        return "already handled"
    if start.waiting:
        return "waiting"  # behind the thread's turn in flight; its close wakes this one
    stage = start.stage
    with heartbeat.holding(stage.holder, stage.id):
        # Everything after the claim is inside this one handler: no stage is
        # left claimed without a conclusion.
        try:
            return _run_claimed(start)
        except DatabaseError:
            # The database, not the stage, failed: nothing is concluded. The
            # lease is given up so the next delivery takes the stage over.
            log.exception("stage %s: the database failed under it", stage.id)
            stage_service.give_up_claim(stage, time_source.now())
            raise
        except Exception as exc:  # outside the span's handler (spans, clocks): still a fact
            log.exception("stage %s failed", stage.id)
            return _record_local_failure(stage, exc)[0]


def _run_claimed(start: stage_service.StageStart) -> str:
    stage = start.stage
    run = stage.run
    closed = None
    queued_clocks: dict[str, int] = {}
    if start.gather_error is None and run.status == Run.Status.SETTLED:
        stage_service.finish_skipped(stage, time_source.now())
        return "run settled"
    with spans.execution_span(
        run.trace_context,
        run_id=str(run.id),
        stage_id=stage.id,
        stage_kind=stage.kind,
        started_at=stage.started_at,
        conversation_id=run.thread_id,
    ) as execution:
        try:
            if start.gather_error is not None:
                raise start.gather_error
            queued_clocks = stage_service.stage_clock_values(
                run, stage, stage.started_at, run.last_progress_at
            )
            spans.record_queue_span(
                run.trace_context,
                run_id=str(run.id),
                stage_id=stage.id,
                stage_kind=stage.kind,
                enqueued_at=stage.enqueued_at,
                started_at=stage.started_at,
                attributes=spans.clock_attributes(queued_clocks),
            )
            result, closed = _execute(run, stage, start.context)
        except StaleClaim as exc:
            log.warning("%s", exc)
            result, closed = "superseded", None
        except DatabaseError:
            raise
        except Exception as exc:  # R4.2: a local failure is a fact, not a veto
            log.exception("stage %s failed", stage.id)
            result, closed = _record_local_failure(stage, exc)
        end = stage.finished_at or time_source.now()
        outcome = spans.stage_outcome_attributes(
            outcome=stage.outcome,
            timeout_name=stage.timeout_name,
            failure_class=stage.failure_class,
        )
        execution.set_attributes(
            {**spans.clock_attributes(stage.clocks or queued_clocks), **outcome}
        )
        execution.end(end)
    spans.observe_clocks(stage.kind, stage.clocks or {}, **outcome)
    if closed is not None:
        after_close(run, closed, end)
    return result


def _execute(run: Run, stage: Stage, context: stage_service.TurnContext | None):
    now = time_source.now()
    cancel_requested = run.cancel_requested_at is not None
    if stage_must_stop(cancel_requested=cancel_requested, now=now, deadline_at=run.deadline_at):
        conclusion = conclude_stop(cancel_requested=cancel_requested)
        return "stopped", stage_service.close_stage(stage, conclusion, now)
    if stage.kind in stage_service.MODEL_STAGES:
        return model_turn.execute(run, stage, context)
    return HANDLERS[stage.kind](run, stage)


def _record_local_failure(stage: Stage, exc: Exception):
    words = f"{type(exc).__name__}: {exc}"[:500]
    fresh = Stage.objects.select_related("run", "run__thread", "run__segment").get(id=stage.id)
    fresh.holder = stage.holder  # the claim this execution holds
    try:
        closed = stage_service.close_stage(
            fresh, conclude_local_failure(stage.kind, stage.seq, words), time_source.now()
        )
    except StaleClaim:
        return "superseded", None
    stage.finished_at, stage.outcome, stage.clocks = fresh.finished_at, "error", fresh.clocks
    stage.timeout_name, stage.failure_class = fresh.timeout_name, fresh.failure_class
    return "error", closed


def after_close(run: Run, closed: stage_service.Closed, at) -> None:
    """Spans and metrics of what the closing transaction wrote (after commit)."""
    if closed.critical_alert:
        spans.count("governance.notifications", severity="critical")
    if closed.settled:
        settlement = closed.decision.settlement
        spans.end_run_span(
            run.trace_context,
            run_id=str(run.id),
            started_at=run.created_at,
            ended_at=at,
            conversation_id=run.thread_id,
            attributes={
                "governance.run_id": str(run.id),
                "governance.settlement": settlement.outcome.value,
                "governance.settlement.reason": settlement.reason_code.value,
            },
        )
