"""The clock watchdog (R6.1, R6.3): runs past their deadline or without
business progress while no stage holds them are decided by the lifecycle;
stages whose message was lost, or whose holder stopped, are sent again.

Each run is looked at on its own: a run whose stored values make a rule raise
is recorded as a fact on that run (``rules.turns.conclude_unwatchable``) and
settled by the lifecycle, and the pass goes on with the others.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, close_old_connections

from governance import time_source
from governance.rules import run_clocks
from governance.rules.authority import FactKind
from governance.rules.turns import conclude_breach, conclude_unwatchable
from governance.services import stages as stage_service

log = logging.getLogger(__name__)


def watchdog_pass() -> dict[str, int]:
    """One pass; returns what it did."""
    now = time_source.now()
    resend_after = timedelta(seconds=settings.GOVERNANCE_STAGE_RESEND_AFTER_SECONDS)
    done = {"breached": 0, "republished": 0, "unwatchable": 0}
    for watched in stage_service.unsettled_runs(now, resend_after=resend_after):
        try:
            _watch(watched, now, done)
        except DatabaseError:
            # The database failed under this run (a deadlock with a closing
            # stage, a lost connection), not the run's values: nothing is
            # concluded, and the next pass looks at it again.
            log.warning("clock watchdog: run %s: the database failed; next pass", watched.run.id)
            close_old_connections()
        except Exception as exc:  # this run's own values; the others are still watched
            log.exception("clock watchdog: run %s", watched.run.id)
            words = f"{type(exc).__name__}: {exc}"[:500]
            try:
                if stage_service.record_breach(watched.run, conclude_unwatchable(words), now):
                    done["unwatchable"] += 1
            except Exception:
                log.exception("clock watchdog: could not record run %s", watched.run.id)
    return done


def _watch(watched: stage_service.WatchedRun, now, done: dict[str, int]) -> None:
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
    if verdict is not None:
        verdict = run_clocks.breach_to_record(
            verdict,
            no_progress_reported=stage_service.has_fact(run, FactKind.NO_PROGRESS_TIMEOUT),
        )
    if verdict is not None and not watched.held:
        if stage_service.record_breach(run, conclude_breach(verdict.name.value), now):
            done["breached"] += 1
        return
    if watched.stale:
        stage_service.publish(watched.stale)
        done["republished"] += len(watched.stale)
