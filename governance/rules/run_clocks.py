"""R6.1, R6.2: the four clocks of a stage and the names of its timeouts.

Every stage (model turn, tool call, finalization) carries four separate clocks
(R6.1): *queue* (since it was enqueued), *execution* (since it actually
started), *no-progress* (since the run's latest business progress) and the
*overall deadline* (since the run started). Keeping them apart is what lets a
timeout be named by the clock that ran out (R6.2): a long wall time spent
queued is ``queue_wait``, not an execution timeout.

Pure module: the current time is always the ``now`` parameter, and every
``datetime`` must be timezone-aware.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

ZERO = timedelta(0)
_ONE_MS = timedelta(milliseconds=1)


class RunEventKind(StrEnum):
    """Kinds of run events that may carry a timestamp (R6.1)."""

    # Business progress: the run produced something usable.
    MODEL_OUTPUT_ACCEPTED = "model_output_accepted"
    BODY_CHUNK_COMMITTED = "body_chunk_committed"
    TOOL_RECEIPT = "tool_receipt"
    # Transport activity only: proves the pipe is alive, not that work advances.
    TRANSPORT_HEARTBEAT = "transport_heartbeat"
    USAGE = "usage"
    REASONING_FRAGMENT = "reasoning_fragment"


BUSINESS_PROGRESS_KINDS: frozenset[RunEventKind] = frozenset(
    {
        RunEventKind.MODEL_OUTPUT_ACCEPTED,
        RunEventKind.BODY_CHUNK_COMMITTED,
        RunEventKind.TOOL_RECEIPT,
    }
)


class TimeoutName(StrEnum):
    """The name of a timeout is the clock that ran out (R6.2)."""

    QUEUE_WAIT = "queue_wait"
    STAGE_TIMEOUT = "stage_timeout"
    NO_PROGRESS = "no_progress"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    # Not a timeout: headers arrived, then the body broke with no clock evidence.
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class TimeoutVerdict:
    """A named cut-off (R6.2).

    ``effect`` is ``"unknown"`` for ``interrupted``: the request reached the
    provider, so whether anything happened must be verified by its owner
    (R6.4). For the clock names it is ``None``: a clock says how long, never
    whether an external effect happened; the executor reports that (R4.1).
    """

    name: TimeoutName
    effect: Literal["unknown"] | None = None


@dataclass(frozen=True)
class StageClocks:
    """The four clocks of one stage (R6.1), all non-negative.

    ``queue + execution`` is the stage's wall time. A finished stage's clocks
    stopped at ``finished_at``; ``deadline_remaining`` is clamped at zero.
    """

    queue: timedelta
    execution: timedelta
    no_progress: timedelta
    deadline_remaining: timedelta

    @property
    def wall(self) -> timedelta:
        return self.queue + self.execution

    @property
    def deadline_passed(self) -> bool:
        # The deadline instant itself is already "passed": no stage may use it.
        return self.deadline_remaining <= ZERO

    def as_millis(self) -> dict[str, int]:
        """Whole milliseconds (floored), e.g. for span attributes."""
        return {
            "queue_ms": self.queue // _ONE_MS,
            "execution_ms": self.execution // _ONE_MS,
            "no_progress_ms": self.no_progress // _ONE_MS,
            "deadline_remaining_ms": self.deadline_remaining // _ONE_MS,
        }


@dataclass(frozen=True)
class RunClockFacts:
    """What the clock watchdog knows about one running run (R6.1)."""

    run_started_at: datetime
    last_progress_at: datetime
    deadline_at: datetime
    # A person is being asked to approve one of its calls: the no-progress
    # clock does not run meanwhile, the overall deadline does.
    awaiting_person: bool = False

    def __post_init__(self) -> None:
        _require_aware("run_started_at", self.run_started_at)
        _require_aware("last_progress_at", self.last_progress_at)
        _require_aware("deadline_at", self.deadline_at)
        _require_order(
            "run_started_at", self.run_started_at, "last_progress_at", self.last_progress_at
        )
        _require_run_deadline(self.run_started_at, self.deadline_at)


# --------------------------------------------------------------------------- validation


def _require_aware(name: str, value: datetime) -> None:
    if not isinstance(value, datetime):
        raise ValueError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {value.isoformat()}")


def _require_positive(name: str, value: timedelta) -> None:
    if not isinstance(value, timedelta):
        raise ValueError(f"{name} must be a timedelta, got {type(value).__name__}")
    if value <= ZERO:
        raise ValueError(f"{name} must be positive, got {value}")


def _require_order(earlier_name: str, earlier: datetime, later_name: str, later: datetime) -> None:
    if later < earlier:
        raise ValueError(
            f"out-of-order timestamps: {later_name} ({later.isoformat()}) is before "
            f"{earlier_name} ({earlier.isoformat()})"
        )


def _require_run_deadline(run_started_at: datetime, deadline_at: datetime) -> None:
    if deadline_at <= run_started_at:
        raise ValueError(
            f"deadline_at ({deadline_at.isoformat()}) must be after "
            f"run_started_at ({run_started_at.isoformat()})"
        )


# --------------------------------------------------------------------------- progress


def _event_kind(kind: RunEventKind | str) -> RunEventKind:
    try:
        return RunEventKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in RunEventKind)
        raise ValueError(f"unknown run event kind {kind!r}; known kinds: {known}") from None


def is_business_progress(kind: RunEventKind | str) -> bool:
    """R6.1: does an event of this kind reset the no-progress clock?

    Accepted model output, committed body chunks and tool receipts do.
    Transport heartbeats, usage events and reasoning fragments only show the
    pipe is alive; letting them count would let a model that streams
    reasoning forever never hit ``no_progress``.
    """
    return _event_kind(kind) in BUSINESS_PROGRESS_KINDS


# What each kind of a provider's stream event is for the no-progress clock:
# text and tool-call deltas are model output; the rest only shows a live pipe.
STREAM_EVENT_KINDS: dict[str, RunEventKind] = {
    "text": RunEventKind.MODEL_OUTPUT_ACCEPTED,
    "tool_call": RunEventKind.MODEL_OUTPUT_ACCEPTED,
    "headers": RunEventKind.TRANSPORT_HEARTBEAT,
    "heartbeat": RunEventKind.TRANSPORT_HEARTBEAT,
    "finish": RunEventKind.TRANSPORT_HEARTBEAT,
    "usage": RunEventKind.USAGE,
    "reasoning": RunEventKind.REASONING_FRAGMENT,
}


def stream_event_is_progress(kind: str) -> bool:
    """R6.1 for a stream event: an unknown kind is not progress (the safe side)."""
    event = STREAM_EVENT_KINDS.get(kind)
    return event is not None and is_business_progress(event)


# --------------------------------------------------------------------------- clocks


def stage_clocks(
    *,
    enqueued_at: datetime,
    started_at: datetime | None,
    finished_at: datetime | None,
    last_progress_at: datetime,
    run_started_at: datetime,
    deadline_at: datetime,
    now: datetime,
) -> StageClocks:
    """R6.1: the four clocks of a stage from its timestamps.

    Required order: ``run_started_at <= enqueued_at <= started_at <=
    finished_at <= now``, ``run_started_at <= last_progress_at <= end`` and
    ``deadline_at > run_started_at``, where *end* is ``finished_at`` for a
    finished stage (its clocks stopped then) and ``now`` otherwise. For a
    finished stage pass the run's latest progress as of ``finished_at``.
    A stage still queued has ``execution == 0``. A stage cannot have finished
    without having started.
    """
    names_values = (
        ("enqueued_at", enqueued_at),
        ("last_progress_at", last_progress_at),
        ("run_started_at", run_started_at),
        ("deadline_at", deadline_at),
        ("now", now),
    )
    for name, value in names_values:
        _require_aware(name, value)
    if started_at is not None:
        _require_aware("started_at", started_at)
    if finished_at is not None:
        _require_aware("finished_at", finished_at)
        if started_at is None:
            raise ValueError("finished_at is set but started_at is not: a stage must start first")

    _require_run_deadline(run_started_at, deadline_at)
    _require_order("run_started_at", run_started_at, "enqueued_at", enqueued_at)
    if started_at is not None:
        _require_order("enqueued_at", enqueued_at, "started_at", started_at)
    if finished_at is not None and started_at is not None:
        _require_order("started_at", started_at, "finished_at", finished_at)

    end_name, end = ("finished_at", finished_at) if finished_at is not None else ("now", now)
    _require_order(end_name, end, "now", now)
    _require_order("enqueued_at", enqueued_at, "now", now)
    if started_at is not None:
        _require_order("started_at", started_at, end_name, end)
    _require_order("run_started_at", run_started_at, "last_progress_at", last_progress_at)
    _require_order("last_progress_at", last_progress_at, end_name, end)

    if started_at is None:
        queue, execution = end - enqueued_at, ZERO
    else:
        queue, execution = started_at - enqueued_at, end - started_at
    return StageClocks(
        queue=queue,
        execution=execution,
        no_progress=end - last_progress_at,
        deadline_remaining=max(ZERO, deadline_at - end),
    )


def stage_budget(stage_budget: timedelta, now: datetime, deadline_at: datetime) -> timedelta:
    """R6.1: ``min(stage budget, time left to the overall deadline)``, never negative.

    Without the cap every stage could wait "legally" for its full budget and
    the run would have no finite end.
    """
    _require_positive("stage_budget", stage_budget)
    _require_aware("now", now)
    _require_aware("deadline_at", deadline_at)
    return max(ZERO, min(stage_budget, deadline_at - now))


@dataclass(frozen=True)
class AttemptAllowance:
    """What one provider request may use (R6.1): its time budget, what is left
    of the no-progress allowance, and whether the deadline set the budget."""

    budget_s: float
    no_progress_s: float
    deadline_bound: bool


def attempt_allowance(
    *,
    now: datetime,
    stage_budget_s: float,
    deadline_at: datetime,
    run_started_at: datetime,
    last_progress_at: datetime,
    no_progress_limit_s: float,
    own_allowance_since: datetime | None = None,
) -> AttemptAllowance:
    """R6.1: an attempt's limits. The budget is ``min(stage budget, time left to
    the deadline)``; the no-progress clock runs from the run's latest business
    progress, not from this attempt, so the attempt gets what is left of the
    allowance. ``own_allowance_since``: the one finalization, entered because
    progress stopped, gets its own allowance from its start (still capped by the
    deadline). Never less than a millisecond, so the adapter cuts at once."""
    full = timedelta(seconds=stage_budget_s)
    budget = stage_budget(full, now, deadline_at)
    since = max(last_progress_at, run_started_at)
    if own_allowance_since is not None:
        since = max(since, own_allowance_since)
    idle = (now - since).total_seconds()
    return AttemptAllowance(
        budget_s=max(budget.total_seconds(), 0.001),
        no_progress_s=max(no_progress_limit_s - idle, 0.001),
        deadline_bound=budget < full,
    )


# --------------------------------------------------------------------------- naming


def name_timeout(
    *,
    deadline_passed: bool,
    no_progress_exceeded: bool,
    stage_budget_exceeded: bool,
    queue_wait_exceeded: bool,
    body_interrupted_after_headers: bool,
) -> TimeoutVerdict | None:
    """R6.2: name a cut-off by the clock that ran out; ``None`` if nothing did.

    Precedence, first match wins:

    1. ``deadline_exceeded`` — the run's deadline is the hardest limit: once it
       has passed no path may continue or recover (R6.1, R6.3), so naming a
       smaller clock would suggest a retry that is not allowed.
    2. ``no_progress`` — a run-wide fact (the whole run stopped producing),
       broader than any one stage's budget.
    3. ``stage_timeout`` — this stage's execution clock ran over its budget.
    4. ``interrupted`` (effect ``unknown``) — headers arrived, then the body
       broke, and none of the clocks above gives timeout evidence: it is
       never called a timeout.
    5. ``queue_wait`` — the stage waited too long in the queue. It is last
       because it explains wall time, not a failure of execution: with the
       execution clock within budget (the 347 s queued + 13 s executing
       example) the name is ``queue_wait``, never ``stage_timeout``; and a
       broken body after a long queue is still an interruption.
    """
    flags = (
        deadline_passed,
        no_progress_exceeded,
        stage_budget_exceeded,
        queue_wait_exceeded,
        body_interrupted_after_headers,
    )
    if not all(isinstance(flag, bool) for flag in flags):
        raise ValueError("name_timeout facts must be bools")
    if deadline_passed:
        return TimeoutVerdict(TimeoutName.DEADLINE_EXCEEDED)
    if no_progress_exceeded:
        return TimeoutVerdict(TimeoutName.NO_PROGRESS)
    if stage_budget_exceeded:
        return TimeoutVerdict(TimeoutName.STAGE_TIMEOUT)
    if body_interrupted_after_headers:
        return TimeoutVerdict(TimeoutName.INTERRUPTED, effect="unknown")
    if queue_wait_exceeded:
        return TimeoutVerdict(TimeoutName.QUEUE_WAIT)
    return None


# --------------------------------------------------------------------------- watchdog


def deadline_reached(now: datetime, deadline_at: datetime) -> bool:
    """R6.1: the run's overall deadline is breached once it is reached."""
    return now >= deadline_at


def breach_to_record(
    verdict: TimeoutVerdict | None, *, no_progress_reported: bool
) -> TimeoutVerdict | None:
    """R6.1/R6.3: the breach the watchdog records, of the one it found. A
    no-progress breach is decided once (finalization follows and the run is
    still watched, so it would be found again); a deadline breach settles the
    run, so it cannot repeat."""
    if verdict is not None and verdict.name is TimeoutName.NO_PROGRESS and no_progress_reported:
        return None
    return verdict


def watchdog_breach(
    now: datetime, run: RunClockFacts, *, no_progress_limit: timedelta
) -> TimeoutVerdict | None:
    """R6.1/R6.2: has a running run breached its deadline or no-progress limit?

    Called by the periodic clock watchdog. ``deadline_exceeded`` wins over
    ``no_progress`` (same precedence as :func:`name_timeout`). Reaching a
    limit counts as breaching it. While a person is asked to approve a call,
    only the deadline runs.
    """
    _require_aware("now", now)
    _require_positive("no_progress_limit", no_progress_limit)
    _require_order("last_progress_at", run.last_progress_at, "now", now)
    if deadline_reached(now, run.deadline_at):
        return TimeoutVerdict(TimeoutName.DEADLINE_EXCEEDED)
    if not run.awaiting_person and now - run.last_progress_at >= no_progress_limit:
        return TimeoutVerdict(TimeoutName.NO_PROGRESS)
    return None
