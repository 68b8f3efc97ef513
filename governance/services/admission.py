"""Backpressure at admission (R6.7): a new run is refused while the turns
queue is backed up (``rules.admission.admission_verdict``), instead of being
queued behind a backlog that would make its queue clock the whole story."""

from __future__ import annotations

from django.conf import settings

from governance.rules.admission import AdmissionVerdict, admission_verdict
from governance.services.broker import QueueState, queue_states


class Overloaded(Exception):
    """The turns queue is backed up: come back after ``retry_after_s`` (HTTP 429)."""

    def __init__(self, verdict: AdmissionVerdict) -> None:
        super().__init__(verdict.reason)
        self.retry_after_s = verdict.retry_after_s
        self.message = f"not admitted now: {verdict.reason}; retry in {verdict.retry_after_s} s"


def turns_queue() -> QueueState:
    [turns] = queue_states(["turns"])
    return turns


def check_admission() -> None:
    """Raise ``Overloaded`` when a new run must wait (the broker unreadable is
    no reason to refuse: the stage is written to the database either way)."""
    max_age, max_queued = (
        settings.GOVERNANCE_ADMISSION_MAX_QUEUE_AGE_SECONDS,
        settings.GOVERNANCE_ADMISSION_MAX_QUEUED,
    )
    if not max_age and not max_queued:
        return
    try:
        turns = turns_queue()
    except Exception:  # the broker's trouble is reported by /healthz
        return
    verdict = admission_verdict(
        depth=turns.depth, oldest_age_s=turns.oldest_age_s, max_age_s=max_age,
        max_queued=max_queued,
    )  # fmt: skip
    if not verdict.admit:
        raise Overloaded(verdict)
