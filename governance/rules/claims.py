"""Who may run a stage (R6.6: delivery is at least once, a stage runs under one holder).

A stage is held by one holder at a time. The holder's heartbeat renews a
short lease while the stage runs; a delivery finds the stage free, held by a
live holder, or held by one that stopped (its lease ran out, or its process is
known to be gone) and is taken over at once. The turn gate keeps one model
turn in flight per thread (R1.1: one linear history; R3.2: two runs must not
both send a due re-probe): a later turn waits behind it and is woken by its
close, not by a timer.

Pure: the caller reads the facts (and whether the holder's process exists)
and passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class ClaimVerdict(StrEnum):
    TAKE = "take"  # nobody holds it
    TAKE_OVER = "take_over"  # its holder stopped: what it drew has no known outcome
    HELD = "held"  # a live holder runs it: this delivery is a duplicate
    DONE = "done"  # finished: its effect is recorded


@dataclass(frozen=True)
class ClaimFacts:
    finished: bool
    holder: str  # "" when nobody holds it (never claimed, parked, or woken)
    lease_until: datetime | None
    holder_gone: bool = False  # its process is known not to exist any more


def claim_verdict(facts: ClaimFacts, now: datetime) -> ClaimVerdict:
    """R6.6: may this delivery run the stage?"""
    if facts.finished:
        return ClaimVerdict.DONE
    if not facts.holder:
        return ClaimVerdict.TAKE
    if facts.holder_gone or facts.lease_until is None or facts.lease_until <= now:
        return ClaimVerdict.TAKE_OVER
    return ClaimVerdict.HELD


@dataclass(frozen=True)
class HolderId:
    """A holder's identity: a process on a host, and the claim's own token.

    The pid is only comparable inside one pid namespace of one host, so a
    process is judged gone only when both match the asker's.
    """

    host: str
    pid_namespace: str
    pid: int
    token: str

    def __str__(self) -> str:
        return f"{self.host}/{self.pid_namespace}/{self.pid}/{self.token}"


def parse_holder(holder: str) -> HolderId | None:
    parts = holder.split("/")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return HolderId(parts[0], parts[1], int(parts[2]), parts[3])


def may_probe_process(holder: HolderId, *, host: str, pid_namespace: str) -> bool:
    """Whether asking the OS about the holder's pid tells anything true."""
    return holder.host == host and holder.pid_namespace == pid_namespace


def turn_in_flight(lease_until: datetime | None, now: datetime) -> bool:
    """R1.1/R6.6: an unfinished model turn is in flight while its lease runs — held
    by a worker, or woken and on its way (the wake reserves it with a lease)."""
    return lease_until is not None and lease_until > now


def turn_may_start(*, other_turn_in_flight: bool) -> bool:
    """R1.1/R3.2: a model turn starts only when no other turn of its thread is
    in flight (held, or woken and on its way); otherwise it waits behind it."""
    return not other_turn_in_flight


@dataclass(frozen=True)
class OpenStageFacts:
    """An unfinished stage as the clock watchdog reads it."""

    holder: str
    lease_until: datetime | None
    enqueued_at: datetime
    parked_at: datetime | None
    thread_turn_in_flight: bool  # another turn of its thread is held or on its way


def needs_resend(facts: OpenStageFacts, now: datetime, *, resend_after: timedelta) -> bool:
    """R6.6: whether the watchdog sends a stage again — its holder stopped
    renewing (the next delivery takes it over), its message was lost (never
    claimed for ``resend_after``, and no reservation pending), or it waits
    behind a thread turn that is no longer in flight (a lost wake-up)."""
    if facts.holder:
        return facts.lease_until is None or facts.lease_until <= now
    if facts.lease_until is not None and facts.lease_until > now:
        return False  # woken and on its way
    if facts.parked_at is not None:
        return not facts.thread_turn_in_flight and facts.parked_at <= now - resend_after
    return facts.enqueued_at <= now - resend_after


def holds_live(facts: OpenStageFacts, now: datetime) -> bool:
    """A live holder runs the stage (the watchdog leaves its run's clocks to it)."""
    return bool(facts.holder) and facts.lease_until is not None and facts.lease_until > now
