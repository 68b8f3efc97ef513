"""R6.7 backpressure: whether a new run is admitted while the turns
queue is backed up. Pure: the queue's state and the bounds are arguments."""

from __future__ import annotations

import math
from dataclasses import dataclass

# A client told to come back waits at least this long, at most this long.
MIN_RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 60
# With only a depth to go by, the queue drains by about this much per second
# of waiting; the answer is an estimate a client can plan with.
DEPTH_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class AdmissionVerdict:
    admit: bool
    retry_after_s: int = 0
    reason: str = ""


def admission_verdict(
    *, depth: int | None, oldest_age_s: float | None, max_age_s: int, max_queued: int
) -> AdmissionVerdict:
    """Refuse a new run while the turns queue's oldest message has waited
    longer than ``max_age_s`` or the queue holds more than ``max_queued``
    messages (0 turns a bound off; ``None``: the broker cannot tell, so the
    bound does not apply)."""
    if max_age_s and oldest_age_s is not None and oldest_age_s > max_age_s:
        wait = math.ceil(oldest_age_s - max_age_s)
        return AdmissionVerdict(
            False,
            min(max(wait, MIN_RETRY_AFTER_S), MAX_RETRY_AFTER_S),
            f"the turns queue's oldest run has waited {oldest_age_s:.0f} s "
            f"(the bound is {max_age_s} s)",
        )
    if max_queued and depth is not None and depth > max_queued:
        return AdmissionVerdict(
            False,
            DEPTH_RETRY_AFTER_S,
            f"the turns queue holds {depth:,} waiting stages (the bound is {max_queued:,})",
        )
    return AdmissionVerdict(True)
