"""The clock watchdog (R6.1, R6.3): runs past their deadline or without
business progress while no stage holds them are decided by the lifecycle;
stages whose publish was lost, or whose worker died, are re-sent."""

from __future__ import annotations

from datetime import timedelta

from governance import time_source
from governance.rules import lifecycle as lc
from governance.rules import run_clocks
from governance.rules.turns import conclude_breach
from governance.services import stages as stage_service


def watchdog_pass(*, stale_after: timedelta = timedelta(minutes=2)) -> dict[str, int]:
    """One pass; returns what it did."""
    now = time_source.now()
    breached = republished = 0
    for watched in stage_service.unsettled_runs(now, stale_after=stale_after):
        run = watched.run
        verdict = run_clocks.watchdog_breach(
            now,
            run_clocks.RunClockFacts(
                run_started_at=run.created_at,
                last_progress_at=max(run.last_progress_at, run.created_at),
                deadline_at=run.deadline_at,
            ),
            no_progress_limit=timedelta(seconds=run.no_progress_limit_s),
        )
        if (
            verdict is not None
            and verdict.name == "no_progress"
            and stage_service.has_fact(run, lc.FactKind.NO_PROGRESS_TIMEOUT)
        ):
            verdict = None  # already decided (finalization or settlement); not twice
        if verdict is not None and not watched.held:
            if stage_service.record_breach(run, conclude_breach(verdict.name.value), now):
                breached += 1
            continue
        if watched.stale:
            stage_service.publish(watched.stale)
            republished += len(watched.stale)
    return {"breached": breached, "republished": republished}
