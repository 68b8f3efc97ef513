"""A worker's pool process that dies under a stage (R6.6): its parent sends
the stage again at once, ahead of new work, and says which process died.

Celery's prefork parent notices a child's death within moments and fails the
task the child was running with ``WorkerLostError``; with acks late and
reject on worker lost, Celery would put the message back at the end of its
queue — behind every message queued meanwhile — and say nothing about why.
Instead, ``StageRequest`` (the parent's side of an ``execute_stage`` message)
sends the stage again in its queue's first lane, naming the process that died
and when. The next delivery, on any host, takes the stage over at once
(``rules.claims.held_by_lost_process``) instead of waiting for the dead
holder's lease to run out: only this host's OS could have told otherwise.

A message the child had been handed but had not accepted is not lost: the
pool gives it to another child. What the parent itself had taken is at most
one message per free child (``CELERY_WORKER_PREFETCH_MULTIPLIER`` 1, acks late).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery.worker.request import Request

from governance import time_source
from governance.rules.claims import LostProcess
from governance.services import claims as claim_service
from governance.services.broker import STAGE_TASK, send_by_name

log = logging.getLogger(__name__)


class StageRequest(Request):
    """An ``execute_stage`` message in the worker's parent process."""

    def reject(self, requeue: bool = False) -> None:
        # Celery rejects with requeue exactly when the execution was cut under
        # the task: its pool process died (reject on worker lost).
        if not requeue or self.acknowledged:
            return super().reject(requeue=requeue)
        try:
            send_again(self.args, self.delivery_info.get("routing_key"), self.worker_pid)
        except Exception:  # the broker as well: Celery's requeue, else lease and watchdog
            log.exception("stage message %s: could not send it again", self.id)
            return super().reject(requeue=True)
        return super().reject(requeue=False)


def send_again(args: list[Any], queue: str | None, pid: int | None) -> None:
    """The stage of ``args`` sent again ahead of new work, naming the process
    that ran it (``pid``, on this host) as gone since now."""
    kwargs = {}
    if pid:
        lost = claim_service.lost_process(pid, time_source.now())
        kwargs = {"lost_process": lost.process, "lost_at": lost.lost_at.isoformat()}
    send_by_name(STAGE_TASK, [args[0]], queue=queue or None, ahead=True, kwargs=kwargs)
    log.warning("stage %s: its worker process %s died; sent again", args[0], pid)


def lost_from(lost_process: str, lost_at: str) -> LostProcess | None:
    """What a message sent again says about the process that died, if anything."""
    if not lost_process or not lost_at:
        return None
    try:
        return LostProcess(lost_process, datetime.fromisoformat(lost_at))
    except ValueError:
        return None
