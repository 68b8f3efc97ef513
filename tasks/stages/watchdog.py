"""The clock watchdog (R6.1, R6.3): runs past their deadline or without
business progress while no stage holds them are decided by the lifecycle;
stages whose message was lost, or whose holder stopped, are sent again
(R6.6, ``rules.claims.needs_resend``).

Each run is looked at on its own: a run whose stored values make a rule raise
is recorded as a fact on that run (``rules.turns.conclude_unwatchable``) and
settled by the lifecycle, and the pass goes on with the others.

The broker is a prompt, not the record. Each pass asks it whether it lost what
it held (it came back empty after a restart, or was flushed); a worker whose
connection to it came back asks for a pass of its own at once
(:func:`lost_messages_pass`), since what it had taken and not started is gone
with the old connection and sends made during the outage failed. Either way
the stages whose messages the broker no longer holds go again, ahead of new
work, not after the last-resort timer.
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
from governance.services import approvals, broker
from governance.services import stages as stage_service

log = logging.getLogger(__name__)


def watchdog_pass() -> dict[str, int]:
    """One pass; returns what it did."""
    now = time_source.now()
    resend_after = timedelta(seconds=settings.GOVERNANCE_STAGE_RESEND_AFTER_SECONDS)
    broker_lost = bool(broker.broker_lost_messages())
    if broker_lost:
        log.warning("clock watchdog: the broker lost what it held; sending its stages again")
    # Requests nobody answered in time: each call's result, and its run goes on.
    done = {"breached": 0, "republished": 0, "unwatchable": 0, "expired": approvals.expire_due(now)}
    watched_runs = stage_service.unsettled_runs(
        now, resend_after=resend_after, broker_lost=broker_lost
    )
    for watched in watched_runs:
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


def lost_messages_pass() -> int:
    """R6.6: the broker is back under a worker (its connection was lost): every
    stage whose message it no longer holds is sent again now, ahead of new
    work. Nothing about the runs' clocks is decided here (the clock watchdog's
    pass does that). Returns how many stages were sent again."""
    now = time_source.now()
    broker.broker_lost_messages()  # the same loss, if it was one: the next pass need not repeat
    watched_runs = stage_service.unsettled_runs(
        now,
        resend_after=timedelta(seconds=settings.GOVERNANCE_STAGE_RESEND_AFTER_SECONDS),
        broker_lost=True,
    )
    stale = [resend for watched in watched_runs for resend in watched.stale]
    stage_service.resend(stale)
    if stale:
        log.warning("broker back: %d stages sent again", len(stale))
    return len(stale)


def _watch(watched: stage_service.WatchedRun, now, done: dict[str, int]) -> None:
    run = watched.run
    last_progress_at = max(run.last_progress_at, run.created_at)
    # Admitted or progressed by another process after this pass read the clock:
    # no clock of it can have run out at ``now`` (and the rule refuses a fact
    # newer than its time); the next pass watches it.
    verdict = (
        None
        if last_progress_at > now
        else run_clocks.watchdog_breach(
            now,
            run_clocks.RunClockFacts(
                run_started_at=run.created_at,
                last_progress_at=last_progress_at,
                deadline_at=run.deadline_at,
                awaiting_person=watched.awaiting_person,
            ),
            no_progress_limit=timedelta(seconds=run.no_progress_limit_s),
        )
    )
    if verdict is not None:
        verdict = run_clocks.breach_to_record(
            verdict,
            no_progress_reported=stage_service.has_fact(run, FactKind.NO_PROGRESS_TIMEOUT),
        )
    if verdict is not None and not watched.held:
        conclusion = conclude_breach(verdict.name.value, awaiting_person=watched.awaiting_person)
        if stage_service.record_breach(run, conclusion, now):
            done["breached"] += 1
        return
    if watched.stale:
        stage_service.resend(watched.stale)
        done["republished"] += len(watched.stale)
