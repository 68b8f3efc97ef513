"""Tests for governance.rules.run_clocks: R6.1 (four clocks, business progress, capped
stage budget) and R6.2 (timeouts named by their clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.run_clocks import (
    BUSINESS_PROGRESS_KINDS,
    RunClockFacts,
    RunEventKind,
    StageClocks,
    TimeoutName,
    TimeoutVerdict,
    is_business_progress,
    name_timeout,
    stage_budget,
    stage_clocks,
    watchdog_breach,
)

T0 = datetime(2026, 10, 19, 9, 0, tzinfo=UTC)
S = timedelta(seconds=1)
MIN = timedelta(minutes=1)
HOUR = timedelta(hours=1)

NON_PROGRESS = (
    RunEventKind.TRANSPORT_HEARTBEAT,
    RunEventKind.USAGE,
    RunEventKind.REASONING_FRAGMENT,
)
PROGRESS = (
    RunEventKind.MODEL_OUTPUT_ACCEPTED,
    RunEventKind.BODY_CHUNK_COMMITTED,
    RunEventKind.TOOL_RECEIPT,
)


def clocks_at(**overrides):
    """A running stage of a run that started at T0 with a 1 h deadline."""
    args = {
        "enqueued_at": T0,
        "started_at": T0 + 10 * S,
        "finished_at": None,
        "last_progress_at": T0,
        "run_started_at": T0,
        "deadline_at": T0 + HOUR,
        "now": T0 + 30 * S,
    }
    args.update(overrides)
    return stage_clocks(**args)


def facts(**overrides):
    args = {
        "deadline_passed": False,
        "no_progress_exceeded": False,
        "stage_budget_exceeded": False,
        "queue_wait_exceeded": False,
        "body_interrupted_after_headers": False,
    }
    args.update(overrides)
    return args


# --------------------------------------------------------------------------- business progress


@pytest.mark.parametrize("kind", PROGRESS)
def test_r6_1_business_progress_kinds_count(kind):
    """R6.1: accepted model output, committed body chunk, tool receipt are progress."""
    assert is_business_progress(kind) is True
    assert is_business_progress(kind.value) is True


@pytest.mark.parametrize("kind", NON_PROGRESS)
def test_r6_1_transport_usage_reasoning_are_not_progress(kind):
    """R6.1: heartbeats, usage events and reasoning fragments are not business progress."""
    assert is_business_progress(kind) is False
    assert is_business_progress(kind.value) is False


def test_r6_1_every_event_kind_is_classified():
    """R6.1: the progress set is exactly the three business kinds."""
    assert set(PROGRESS) | set(NON_PROGRESS) == set(RunEventKind)
    assert frozenset(PROGRESS) == BUSINESS_PROGRESS_KINDS


def test_r6_1_unknown_event_kind_is_rejected():
    """R6.1: an unknown kind is an error, not silently "no progress"."""
    with pytest.raises(ValueError, match="unknown run event kind"):
        is_business_progress("keepalive")


aware_offsets = st.integers(min_value=0, max_value=10_000_000)
event_lists = st.lists(st.tuples(st.sampled_from(list(RunEventKind)), aware_offsets), max_size=20)


# --------------------------------------------------------------------------- four clocks


def test_r6_1_running_stage_has_four_separate_clocks():
    """R6.1: queue, execution, no-progress and deadline remaining of a running stage."""
    clocks = clocks_at(
        enqueued_at=T0 + 5 * S,
        started_at=T0 + 20 * S,
        last_progress_at=T0 + 12 * S,
        now=T0 + 50 * S,
    )
    assert clocks == StageClocks(
        queue=15 * S,
        execution=30 * S,
        no_progress=38 * S,
        deadline_remaining=HOUR - 50 * S,
    )
    assert clocks.wall == 45 * S
    assert clocks.deadline_passed is False


def test_r6_1_queued_stage_has_zero_execution():
    """R6.1: a stage still queued has execution 0 and its queue clock keeps running."""
    clocks = clocks_at(started_at=None, now=T0 + 90 * S)
    assert clocks.execution == timedelta(0)
    assert clocks.queue == 90 * S


def test_r6_1_finished_stage_clocks_stop_at_finished_at():
    """R6.1: a finished stage's clocks stop at finished_at, whatever now is."""
    clocks = clocks_at(
        started_at=T0 + 10 * S,
        finished_at=T0 + 40 * S,
        last_progress_at=T0 + 40 * S,
        now=T0 + 2 * HOUR,
    )
    assert clocks.queue == 10 * S
    assert clocks.execution == 30 * S
    assert clocks.no_progress == timedelta(0)
    assert clocks.deadline_remaining == HOUR - 40 * S


def test_r6_1_deadline_remaining_is_clamped_at_zero():
    """R6.1: after the deadline the remaining time is zero, not negative."""
    clocks = clocks_at(now=T0 + 2 * HOUR)
    assert clocks.deadline_remaining == timedelta(0)
    assert clocks.deadline_passed is True
    assert clocks_at(now=T0 + HOUR).deadline_passed is True


def test_r6_1_as_millis_uses_span_keys():
    """R6.1: the four clocks as whole milliseconds under stable keys."""
    clocks = clocks_at(
        enqueued_at=T0,
        started_at=T0 + timedelta(milliseconds=1500),
        last_progress_at=T0 + S,
        now=T0 + timedelta(milliseconds=4250, microseconds=999),
    )
    assert clocks.as_millis() == {
        "queue_ms": 1500,
        "execution_ms": 2750,
        "no_progress_ms": 3250,
        "deadline_remaining_ms": 3600_000 - 4251,
    }


def test_r6_1_clocks_accept_any_aware_timezone():
    """R6.1: aware non-UTC times are compared as instants."""
    plus2 = timezone(timedelta(hours=2))
    clocks = clocks_at(now=(T0 + 30 * S).astimezone(plus2))
    assert clocks.execution == 20 * S


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"started_at": T0 - S, "enqueued_at": T0}, "started_at"),
        ({"enqueued_at": T0 - S}, "enqueued_at"),
        ({"finished_at": T0 + 5 * S}, "finished_at"),
        ({"finished_at": T0 + 40 * S, "now": T0 + 35 * S}, "now"),
        ({"now": T0 + 5 * S}, "now"),
        ({"started_at": None, "now": T0 - S}, "now"),
        ({"last_progress_at": T0 - S}, "last_progress_at"),
        ({"last_progress_at": T0 + 31 * S}, "last_progress_at"),
        (
            {"finished_at": T0 + 20 * S, "last_progress_at": T0 + 25 * S},
            "last_progress_at",
        ),
        ({"deadline_at": T0}, "deadline_at"),
        ({"deadline_at": T0 - HOUR}, "deadline_at"),
        ({"started_at": None, "finished_at": T0 + 20 * S}, "must start first"),
    ],
)
def test_r6_1_out_of_order_timestamps_raise(overrides, message):
    """R6.1: out-of-order timestamps (negative clocks) are rejected."""
    with pytest.raises(ValueError, match=message):
        clocks_at(**overrides)


@pytest.mark.parametrize(
    "name",
    ["enqueued_at", "started_at", "finished_at", "last_progress_at", "deadline_at", "now"],
)
def test_r6_1_naive_timestamps_raise(name):
    """R6.1: every timestamp must be timezone-aware."""
    naive = (T0 + 35 * S).replace(tzinfo=None)
    overrides = {name: naive}
    if name == "finished_at":
        overrides["now"] = T0 + 40 * S
    with pytest.raises(ValueError, match="timezone-aware"):
        clocks_at(**overrides)


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=10**9), min_size=5, max_size=5),
    progress_frac=st.floats(min_value=0, max_value=1),
    state=st.sampled_from(["queued", "running", "finished"]),
    deadline_ms=st.integers(min_value=1, max_value=10**10),
)
def test_r6_1_property_queue_plus_execution_within_wall_time(
    gaps, progress_frac, state, deadline_ms
):
    """R6.1: queue + execution <= wall time, all clocks non-negative, in ms too."""
    ms = timedelta(milliseconds=1)
    run_started = T0
    enqueued = run_started + gaps[0] * ms
    started = enqueued + gaps[1] * ms
    finished = started + gaps[2] * ms
    now = finished + gaps[3] * ms
    started_at = None if state == "queued" else started
    finished_at = finished if state == "finished" else None
    end = finished_at or now
    progress = run_started + (end - run_started) * progress_frac
    progress = min(max(progress, run_started), end)
    clocks = stage_clocks(
        enqueued_at=enqueued,
        started_at=started_at,
        finished_at=finished_at,
        last_progress_at=progress,
        run_started_at=run_started,
        deadline_at=run_started + deadline_ms * ms,
        now=now,
    )
    wall = end - enqueued
    assert clocks.queue + clocks.execution <= wall
    for value in (clocks.queue, clocks.execution, clocks.no_progress, clocks.deadline_remaining):
        assert value >= timedelta(0)
    millis = clocks.as_millis()
    assert millis["queue_ms"] + millis["execution_ms"] <= wall // ms
    if state == "queued":
        assert clocks.execution == timedelta(0)


# --------------------------------------------------------------------------- stage budget


def test_r6_1_stage_budget_is_full_when_deadline_is_far():
    """R6.1: far from the deadline a stage gets its own budget."""
    assert stage_budget(5 * MIN, T0, T0 + HOUR) == 5 * MIN


def test_r6_1_stage_budget_is_capped_by_time_left():
    """R6.1: near the deadline the stage gets only the time left."""
    assert stage_budget(5 * MIN, T0 + HOUR - 90 * S, T0 + HOUR) == 90 * S


def test_r6_1_stage_budget_is_zero_past_the_deadline():
    """R6.1: no stage may wait legally past the run's end: budget 0, never negative."""
    assert stage_budget(5 * MIN, T0 + 2 * HOUR, T0 + HOUR) == timedelta(0)
    assert stage_budget(5 * MIN, T0 + HOUR, T0 + HOUR) == timedelta(0)


@pytest.mark.parametrize("budget", [timedelta(0), -S])
def test_r6_1_stage_budget_must_be_positive(budget):
    """R6.1: a zero or negative stage budget is bad input."""
    with pytest.raises(ValueError, match="positive"):
        stage_budget(budget, T0, T0 + HOUR)


def test_r6_1_stage_budget_rejects_naive_times():
    """R6.1: times must be timezone-aware."""
    with pytest.raises(ValueError, match="timezone-aware"):
        stage_budget(MIN, T0.replace(tzinfo=None), T0 + HOUR)
    with pytest.raises(ValueError, match="timezone-aware"):
        stage_budget(MIN, T0, (T0 + HOUR).replace(tzinfo=None))


@settings(max_examples=200, deadline=None)
@given(
    budget_ms=st.integers(min_value=1, max_value=10**9),
    now_ms=st.integers(min_value=-(10**9), max_value=10**9),
    deadline_ms=st.integers(min_value=-(10**9), max_value=10**9),
)
def test_r6_1_property_stage_budget_within_time_left(budget_ms, now_ms, deadline_ms):
    """R6.1: 0 <= stage budget <= min(budget, time left to the deadline) for all inputs."""
    ms = timedelta(milliseconds=1)
    now, deadline = T0 + now_ms * ms, T0 + deadline_ms * ms
    got = stage_budget(budget_ms * ms, now, deadline)
    assert timedelta(0) <= got <= budget_ms * ms
    assert got <= max(timedelta(0), deadline - now)
    assert now + got <= max(now, deadline)


# --------------------------------------------------------------------------- timeout names


def test_r6_2_nothing_exceeded_is_no_timeout():
    """R6.2: no clock ran out and no interruption: no name at all."""
    assert name_timeout(**facts()) is None


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("deadline_passed", TimeoutName.DEADLINE_EXCEEDED),
        ("no_progress_exceeded", TimeoutName.NO_PROGRESS),
        ("stage_budget_exceeded", TimeoutName.STAGE_TIMEOUT),
        ("queue_wait_exceeded", TimeoutName.QUEUE_WAIT),
        ("body_interrupted_after_headers", TimeoutName.INTERRUPTED),
    ],
)
def test_r6_2_each_clock_names_its_own_timeout(flag, expected):
    """R6.2: each single fact gives the name of its clock."""
    verdict = name_timeout(**facts(**{flag: True}))
    assert verdict is not None
    assert verdict.name is expected
    assert verdict.name.value == expected.value


def test_r6_2_interrupted_has_unknown_effect_and_timeouts_do_not_claim_one():
    """R6.2: headers then a broken body is `interrupted` with effect unknown, never a timeout."""
    verdict = name_timeout(**facts(body_interrupted_after_headers=True))
    assert verdict == TimeoutVerdict(TimeoutName.INTERRUPTED, effect="unknown")
    assert "timeout" not in verdict.name.value
    assert name_timeout(**facts(stage_budget_exceeded=True)).effect is None


def test_r6_2_deadline_wins_over_every_other_fact():
    """R6.2: deadline first — it is the hardest limit."""
    verdict = name_timeout(
        deadline_passed=True,
        no_progress_exceeded=True,
        stage_budget_exceeded=True,
        queue_wait_exceeded=True,
        body_interrupted_after_headers=True,
    )
    assert verdict.name is TimeoutName.DEADLINE_EXCEEDED


def test_r6_2_precedence_chain():
    """R6.2: deadline > no_progress > stage_timeout > interrupted > queue_wait."""
    assert (
        name_timeout(**facts(no_progress_exceeded=True, stage_budget_exceeded=True)).name
        is TimeoutName.NO_PROGRESS
    )
    assert (
        name_timeout(**facts(stage_budget_exceeded=True, body_interrupted_after_headers=True)).name
        is TimeoutName.STAGE_TIMEOUT
    )
    assert (
        name_timeout(**facts(stage_budget_exceeded=True, queue_wait_exceeded=True)).name
        is TimeoutName.STAGE_TIMEOUT
    )
    assert (
        name_timeout(**facts(queue_wait_exceeded=True, body_interrupted_after_headers=True)).name
        is TimeoutName.INTERRUPTED
    )


def test_r6_2_name_timeout_rejects_non_bool_facts():
    """R6.2: facts are booleans; a truthy string is bad input."""
    with pytest.raises(ValueError, match="bools"):
        name_timeout(**facts(deadline_passed="yes"))


@settings(max_examples=200, deadline=None)
@given(flags=st.lists(st.booleans(), min_size=5, max_size=5))
def test_r6_2_property_deadline_always_first_and_interrupted_only_without_clock_evidence(flags):
    """R6.2: deadline passed always names deadline_exceeded; interrupted only without
    deadline/no-progress/stage evidence, and only interrupted has effect unknown."""
    keys = [
        "deadline_passed",
        "no_progress_exceeded",
        "stage_budget_exceeded",
        "queue_wait_exceeded",
        "body_interrupted_after_headers",
    ]
    given_facts = dict(zip(keys, flags, strict=True))
    verdict = name_timeout(**given_facts)
    if given_facts["deadline_passed"]:
        assert verdict.name is TimeoutName.DEADLINE_EXCEEDED
    if verdict is None:
        assert not any(flags)
    else:
        assert (verdict.effect == "unknown") == (verdict.name is TimeoutName.INTERRUPTED)
        if verdict.name is TimeoutName.INTERRUPTED:
            assert given_facts["body_interrupted_after_headers"]
            assert not any(flags[:3])


# --------------------------------------------------------------------------- watchdog


def run_facts(last_progress_min=0):
    return RunClockFacts(
        run_started_at=T0,
        last_progress_at=T0 + last_progress_min * MIN,
        deadline_at=T0 + HOUR,
    )


def test_r6_1_watchdog_healthy_run_has_no_breach():
    """R6.1: recent progress and time left: the watchdog reports nothing."""
    assert watchdog_breach(T0 + 10 * MIN, run_facts(8), no_progress_limit=5 * MIN) is None


def test_r6_1_watchdog_reports_no_progress():
    """R6.1: no business progress for the limit is a no_progress breach."""
    verdict = watchdog_breach(T0 + 13 * MIN, run_facts(8), no_progress_limit=5 * MIN)
    assert verdict == TimeoutVerdict(TimeoutName.NO_PROGRESS)
    assert watchdog_breach(T0 + 12 * MIN, run_facts(8), no_progress_limit=5 * MIN) is None


def test_r6_1_watchdog_reports_deadline_before_no_progress():
    """R6.1/R6.2: past the deadline the breach is deadline_exceeded, even if stalled too."""
    verdict = watchdog_breach(T0 + HOUR, run_facts(0), no_progress_limit=5 * MIN)
    assert verdict == TimeoutVerdict(TimeoutName.DEADLINE_EXCEEDED)


def test_r6_1_watchdog_bad_input():
    """R6.1: out-of-order run facts, naive now, non-positive limit raise ValueError."""
    with pytest.raises(ValueError, match="last_progress_at"):
        RunClockFacts(run_started_at=T0, last_progress_at=T0 - S, deadline_at=T0 + HOUR)
    with pytest.raises(ValueError, match="deadline_at"):
        RunClockFacts(run_started_at=T0, last_progress_at=T0, deadline_at=T0)
    with pytest.raises(ValueError, match="timezone-aware"):
        RunClockFacts(run_started_at=T0.replace(tzinfo=None), last_progress_at=T0, deadline_at=T0)
    with pytest.raises(ValueError, match="now"):
        watchdog_breach(T0 + 7 * MIN, run_facts(8), no_progress_limit=5 * MIN)
    with pytest.raises(ValueError, match="timezone-aware"):
        watchdog_breach(T0.replace(tzinfo=None), run_facts(0), no_progress_limit=5 * MIN)
    with pytest.raises(ValueError, match="positive"):
        watchdog_breach(T0 + MIN, run_facts(0), no_progress_limit=timedelta(0))


@settings(max_examples=200, deadline=None)
@given(
    progress_s=st.integers(min_value=0, max_value=3600),
    elapsed_s=st.integers(min_value=0, max_value=7200),
    limit_s=st.integers(min_value=1, max_value=3600),
)
def test_r6_1_property_watchdog_matches_clocks(progress_s, elapsed_s, limit_s):
    """R6.1: the watchdog breaches exactly when a clock reaches its limit."""
    run = RunClockFacts(
        run_started_at=T0, last_progress_at=T0 + progress_s * S, deadline_at=T0 + HOUR
    )
    now = run.last_progress_at + elapsed_s * S
    verdict = watchdog_breach(now, run, no_progress_limit=limit_s * S)
    if now >= run.deadline_at:
        assert verdict.name is TimeoutName.DEADLINE_EXCEEDED
    elif elapsed_s >= limit_s:
        assert verdict.name is TimeoutName.NO_PROGRESS
    else:
        assert verdict is None


@pytest.mark.parametrize(
    ("kind", "progress"),
    [
        ("text", True),
        ("tool_call", True),
        ("heartbeat", False),
        ("headers", False),
        ("usage", False),
        ("reasoning", False),
        ("finish", False),
        ("keepalive", False),
    ],
)
def test_r6_1_stream_events_are_progress_only_when_business_progress(kind, progress):
    """R6.1: a stream's text and tool-call deltas move the no-progress clock;
    pings, headers, usage and reasoning only show the pipe is alive."""
    from governance.rules.run_clocks import stream_event_is_progress

    assert stream_event_is_progress(kind) is progress


# --- R6.1 one attempt's allowance ---------------------------------------------------------


def _allowance(**kw):
    from governance.rules.run_clocks import attempt_allowance

    base = dict(
        stage_budget_s=120.0,
        deadline_at=T0 + HOUR,
        run_started_at=T0,
        last_progress_at=T0,
        no_progress_limit_s=600.0,
    )
    return attempt_allowance(**{**base, **kw})


def test_r6_1_an_attempts_budget_is_the_stage_budget_capped_by_the_deadline():
    far = _allowance(now=T0 + MIN)
    assert far.budget_s == 120.0 and not far.deadline_bound
    near = _allowance(now=T0 + 59 * MIN)
    assert near.budget_s == 60.0 and near.deadline_bound
    # Past the deadline nothing is left: the adapter cuts at once.
    past = _allowance(now=T0 + 2 * HOUR)
    assert 0 < past.budget_s <= 0.001 and past.deadline_bound


def test_r6_1_the_no_progress_allowance_runs_from_the_runs_latest_progress():
    kw = dict(no_progress_limit_s=120.0, last_progress_at=T0 + 9 * MIN, stage_budget_s=300.0)
    assert _allowance(now=T0 + 10 * MIN, **kw).no_progress_s == 60.0
    # A new attempt does not restart the clock: it gets what is left.
    assert _allowance(now=T0 + 10 * MIN + 30 * S, **kw).no_progress_s == 30.0
    assert _allowance(now=T0 + 20 * MIN, **kw).no_progress_s == 0.001


def test_r6_1_the_one_finalization_gets_its_own_no_progress_allowance():
    started = T0 + 50 * MIN
    kw = dict(no_progress_limit_s=120.0, stage_budget_s=300.0, own_allowance_since=started)
    own = _allowance(now=started + 30 * S, **kw)
    assert own.no_progress_s == 90.0  # from the finalization's start, not from T0
    assert own.budget_s == 300.0
    # ... still capped by the deadline.
    late = _allowance(now=T0 + 58 * MIN, **kw)
    assert late.budget_s == 120.0 and late.deadline_bound


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 7200),  # now, seconds after the run started
    st.integers(1, 900),  # stage budget
    st.integers(1, 3600),  # deadline, seconds after the run started
    st.integers(0, 7200),  # latest progress
    st.integers(1, 900),  # no-progress limit
)
def test_r6_1_no_attempt_may_wait_past_the_end_of_the_run(now_s, budget, deadline, progress, limit):
    progress = min(progress, now_s)
    allowance = _allowance(
        now=T0 + now_s * S,
        stage_budget_s=float(budget),
        deadline_at=T0 + deadline * S,
        last_progress_at=T0 + progress * S,
        no_progress_limit_s=float(limit),
    )
    left = deadline - now_s
    assert allowance.budget_s == pytest.approx(max(min(budget, left), 0.001))
    assert allowance.deadline_bound is (left < budget)
    assert allowance.no_progress_s == pytest.approx(max(limit - (now_s - progress), 0.001))
    assert allowance.budget_s > 0 and allowance.no_progress_s > 0


def test_r6_1_r6_3_a_no_progress_breach_is_recorded_once_and_a_deadline_always():
    from governance.rules.run_clocks import TimeoutName, TimeoutVerdict, breach_to_record

    stalled = TimeoutVerdict(TimeoutName.NO_PROGRESS)
    late = TimeoutVerdict(TimeoutName.DEADLINE_EXCEEDED)
    assert breach_to_record(stalled, no_progress_reported=False) == stalled
    assert breach_to_record(stalled, no_progress_reported=True) is None
    assert breach_to_record(late, no_progress_reported=True) == late
    assert breach_to_record(None, no_progress_reported=False) is None
