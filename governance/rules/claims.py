"""Who may run a stage (R6.6: delivery is at least once, a stage runs under one holder).

A stage is held by one holder at a time. The holder's heartbeat renews a
short lease while the stage runs; a delivery finds the stage free, held by a
live holder, or held by one that stopped (its lease ran out, or its process is
known to be gone) and is taken over at once. The turn gate keeps one model
turn in flight per thread (R1.1: one linear history; R3.2: two runs must not
both send a due re-probe): a later turn waits behind it and is woken by its
close, not by a timer.

A stage a stopped holder had, or whose message the broker lost, is sent again
as soon as that is known — the holder's process seen gone, its lease run
out, the broker seen back without the message — and ahead of new work; a
stage merely never claimed for a long while is sent again behind it, the
last resort when nothing could be seen (``needs_resend``, ``resend_ahead``).

Pure: the caller reads the facts (and whether the holder's process exists,
and which stages the broker holds) and passes the time.
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

    @property
    def process(self) -> str:
        """The process without the claim's token: "host/pid-namespace/pid"."""
        return f"{self.host}/{self.pid_namespace}/{self.pid}"


def parse_holder(holder: str) -> HolderId | None:
    parts = holder.split("/")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return HolderId(parts[0], parts[1], int(parts[2]), parts[3])


def may_probe_process(holder: HolderId, *, host: str, pid_namespace: str) -> bool:
    """Whether asking the OS about the holder's pid tells anything true."""
    return holder.host == host and holder.pid_namespace == pid_namespace


@dataclass(frozen=True)
class LostProcess:
    """A worker process its parent saw die ("host/pid-namespace/pid"), and when:
    what the parent says when it sends the stage that process ran again."""

    process: str
    lost_at: datetime


def held_by_lost_process(holder: str, claimed_at: datetime | None, lost: LostProcess) -> bool:
    """R6.6: the holder's process is known gone because its parent saw it die —
    a claim that process made before it died (a later claim by a new process
    that got the same pid is not that one). Any worker, on any host, may take
    the stage over at once on this word; without it, only one on the holder's
    own host can tell, by asking the OS."""
    parsed = parse_holder(holder)
    return (
        parsed is not None
        and parsed.process == lost.process
        and claimed_at is not None
        and claimed_at <= lost.lost_at
    )


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
    holder_gone: bool = False  # the holder's process is known not to exist any more
    due_at: datetime | None = None  # its send waits until then (a recovery wait, a verification)
    # Whether the broker holds a message for it now (None: not looked, or the
    # broker cannot tell).
    in_broker: bool | None = None
    # Parked while a person is asked to approve its call: no message is owed;
    # the answer (or the request's expiry) sends it (rules.approvals).
    awaiting_person: bool = False


class Resend(StrEnum):
    """Why a stage is sent again (``needs_resend``)."""

    HOLDER_STOPPED = "holder_stopped"  # its holder's process is gone, or its lease ran out
    MESSAGE_LOST = "message_lost"  # the broker is seen without the message it should hold
    WAKE_LOST = "wake_lost"  # it waits behind a thread turn that is no longer in flight
    NEVER_CLAIMED = "never_claimed"  # long unclaimed, and nobody could look: the last resort


def message_expected(facts: OpenStageFacts) -> bool:
    """A message for the stage should be in the broker (or in a worker about to
    claim it): nobody holds it and it does not wait behind its thread's turn."""
    return not facts.holder and facts.parked_at is None


def needs_resend(
    facts: OpenStageFacts, now: datetime, *, resend_after: timedelta, broker_lost: bool = False
) -> Resend | None:
    """R6.6: whether, and why, the stage is sent again now.

    - Its holder stopped: the holder's process is known gone, or its lease ran
      out (the holder's heartbeat renews it while the process lives) — the
      next delivery takes it over.
    - Its message was lost: ``broker_lost`` says the broker lost messages
      (it came back empty or flushed, or a worker reconnected and dropped
      what it had taken), and the broker holds none for this stage.
    - A waiting turn's wake-up was lost: its thread has no turn in flight.
    - The last resort, a timer: never claimed for ``resend_after`` after it
      was due, and no reservation pending — the message was lost if the
      broker is seen without it, else it may still wait in a backlog.
    """
    if facts.holder:
        if facts.holder_gone or facts.lease_until is None or facts.lease_until <= now:
            return Resend.HOLDER_STOPPED
        return None
    if facts.awaiting_person:
        return None
    if facts.parked_at is not None:
        if not facts.thread_turn_in_flight and facts.parked_at <= now - resend_after:
            return Resend.WAKE_LOST
        return None
    if facts.in_broker:
        return None  # waiting its turn in the queue
    if broker_lost and facts.in_broker is False:
        return Resend.MESSAGE_LOST
    if facts.lease_until is not None and facts.lease_until > now:
        return None  # woken and on its way
    due = facts.enqueued_at if facts.due_at is None else max(facts.enqueued_at, facts.due_at)
    if due <= now - resend_after:
        return Resend.MESSAGE_LOST if facts.in_broker is False else Resend.NEVER_CLAIMED
    return None


def resend_ahead(reason: Resend) -> bool:
    """R6.6: a stage a stopped holder had, or whose message was lost, goes ahead
    of new work (the work was taken before it); one merely unclaimed for long,
    with no look at the broker, may still wait in a backlog, so it goes behind."""
    return reason is not Resend.NEVER_CLAIMED


def resend_delay(facts: OpenStageFacts, now: datetime) -> float:
    """Seconds the sent-again message still waits: what is left of the stage's
    own delay (a lost delayed message is not sent early)."""
    if facts.due_at is None:
        return 0.0
    return max(0.0, (facts.due_at - now).total_seconds())


def holds_live(facts: OpenStageFacts, now: datetime) -> bool:
    """A live holder runs the stage (the watchdog leaves its run's clocks to it)."""
    return (
        bool(facts.holder)
        and not facts.holder_gone
        and facts.lease_until is not None
        and facts.lease_until > now
    )
