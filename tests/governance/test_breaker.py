"""Tests for governance.rules.breaker: R2.2 (the circuit breaker), R2.1 (auth
disablement, the administrator's switch) and R2.3 (what never moves it)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.breaker import (
    BreakerPolicy,
    ProviderHealth,
    breaker_cooldown,
    effective_breaker_state,
    health_verdict,
    record_failure,
    record_success,
)
from governance.rules.classification import (
    FAILURE_CLASSES,
    TIME_BASED_CLASSES,
    Classification,
)
from tests.governance.classifications import T0, classify, failure

NO_JITTER = BreakerPolicy(jitter_ratio=0.0)
FINGERPRINT = "cfg-v1"


def fail(
    health: ProviderHealth,
    failure_class: str,
    now: datetime,
    policy: BreakerPolicy = NO_JITTER,
    retry_after_seconds: float | None = None,
    seed: int = 0,
    config_fingerprint: str | None = None,
) -> ProviderHealth:
    return record_failure(
        health,
        failure(failure_class, retry_after_seconds),
        now,
        policy,
        random.Random(seed),
        config_fingerprint,
    )


def fail_times(health: ProviderHealth, failure_class: str, count: int, now: datetime, **kw):
    for _ in range(count):
        health = fail(health, failure_class, now, **kw)
    return health


def test_r6_2_interrupted_never_moves_the_breaker() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 2, T0)
    interrupted = classify(status_code=200, headers_received=True, body_complete=False)
    after = record_failure(health, interrupted, T0, NO_JITTER, random.Random(1))
    assert after == health


# ---------------------------------------------------------------------------
# R2.2: breaker transitions


def test_r2_2_breaker_opens_after_three_consecutive_failures_by_default() -> None:
    health = ProviderHealth("p")
    for _ in range(2):
        health = fail(health, "server_error", T0)
        assert health.breaker == "closed"
        assert health_verdict(health, T0).available
    health = fail(health, "server_error", T0)
    verdict = health_verdict(health, T0)
    assert (health.breaker, health.trips, health.consecutive_failures) == ("open", 1, 3)
    assert health.open_until == T0 + NO_JITTER.base_cooldown
    assert (verdict.available, verdict.state, verdict.retry_at) == (
        False,
        "open",
        health.open_until,
    )
    assert "3 consecutive" in verdict.reason
    assert "server_error" in verdict.reason
    assert "12:00:30 UTC" in verdict.reason


@pytest.mark.parametrize("threshold", [1, 2, 5])
def test_r2_2_threshold_is_configurable(threshold: int) -> None:
    policy = BreakerPolicy(failure_threshold=threshold, jitter_ratio=0.0)
    health = fail_times(ProviderHealth("p"), "network", threshold - 1, T0, policy=policy)
    assert health.breaker == "closed"
    assert fail(health, "network", T0, policy=policy).breaker == "open"


def test_r2_2_mixed_time_based_classes_count_together() -> None:
    health = ProviderHealth("p")
    for failure_class in ("server_error", "timeout", "network"):
        health = fail(health, failure_class, T0)
    assert health.breaker == "open"
    # The class that tripped it sets the cooldown base: network uses the short one.
    assert health.open_until == T0 + NO_JITTER.timeout_cooldown


def test_r2_2_open_until_then_half_open_at_the_boundary() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 3, T0)
    assert health.open_until is not None
    just_before = health.open_until - timedelta(microseconds=1)
    assert health_verdict(health, just_before).state == "open"
    assert effective_breaker_state(health, just_before) == "open"
    verdict = health_verdict(health, health.open_until)
    assert (verdict.available, verdict.state, verdict.retry_at) == (True, "half_open", None)
    assert effective_breaker_state(health, health.open_until) == "half_open"


def test_r2_2_half_open_failure_reopens_with_next_backoff_step() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 3, T0)
    expected = NO_JITTER.base_cooldown
    for trips in range(2, 8):
        assert health.open_until is not None
        probe_time = health.open_until
        health = fail(health, "server_error", probe_time)
        expected = min(NO_JITTER.max_cooldown, expected * 2)
        assert (health.breaker, health.trips) == ("open", trips)
        assert health.open_until == probe_time + expected
    assert expected == NO_JITTER.max_cooldown  # 30s * 2**6 is above 10 min: capped


def test_r2_2_success_closes_and_resets_the_backoff() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 3, T0)
    health = fail(health, "server_error", health.open_until)  # trips 2
    probe = health.open_until
    closed = record_success(health, probe)
    assert (closed.breaker, closed.consecutive_failures, closed.trips, closed.open_until) == (
        "closed",
        0,
        0,
        None,
    )
    assert closed.last_success_at == probe
    assert closed.last_failure_class == "server_error"  # history stays
    assert health_verdict(closed, probe).state == "closed"
    # The next outage starts from the base cooldown again.
    reopened = fail_times(closed, "server_error", 3, probe)
    assert reopened.open_until == probe + NO_JITTER.base_cooldown


def test_r2_2_success_breaks_the_consecutive_count() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 2, T0)
    health = record_success(health, T0)
    health = fail_times(health, "server_error", 2, T0)
    assert health.breaker == "closed"


def test_r2_2_timeout_and_network_use_the_short_cooldown() -> None:
    for failure_class in ("timeout", "network"):
        health = fail_times(ProviderHealth("p"), failure_class, 3, T0)
        assert health.open_until == T0 + NO_JITTER.timeout_cooldown
    assert NO_JITTER.timeout_cooldown < NO_JITTER.base_cooldown


def test_r2_2_failure_reported_while_open_keeps_the_window() -> None:
    """R2.2: a late report from an attempt started before the open is no new trip."""
    health = fail_times(ProviderHealth("p"), "server_error", 3, T0)
    later = T0 + timedelta(seconds=10)
    after = fail(health, "server_error", later)
    assert (after.breaker, after.trips, after.open_until) == ("open", 1, health.open_until)
    assert after.consecutive_failures == 4
    assert after.last_failure_at == later


def test_r2_2_jitter_comes_from_the_injected_rng() -> None:
    policy = BreakerPolicy()  # jitter ±20 %
    opens = set()
    for seed in range(20):
        health = fail_times(ProviderHealth("p"), "server_error", 3, T0, policy=policy, seed=seed)
        again = fail_times(ProviderHealth("p"), "server_error", 3, T0, policy=policy, seed=seed)
        assert health.open_until == again.open_until  # same seed, same cooldown
        assert health.open_until is not None
        cooldown = health.open_until - T0
        assert timedelta(seconds=24) <= cooldown <= timedelta(seconds=36)
        opens.add(cooldown)
    assert len(opens) > 1  # the rng actually spreads the cooldowns


def test_r2_2_cooldown_table_without_jitter() -> None:
    rng = random.Random(0)
    seconds = [
        breaker_cooldown(NO_JITTER, "server_error", trips, rng).total_seconds()
        for trips in range(1, 7)
    ]
    assert seconds == [30, 60, 120, 240, 480, 600]
    assert breaker_cooldown(NO_JITTER, "timeout", 1, rng) == timedelta(seconds=10)
    assert breaker_cooldown(NO_JITTER, "network", 10_000, rng) == NO_JITTER.max_cooldown


def test_r2_2_cooldown_rejects_non_time_classes_and_bad_trips() -> None:
    rng = random.Random(0)
    with pytest.raises(ValueError, match="not time-based"):
        breaker_cooldown(NO_JITTER, "refusal", 1, rng)
    with pytest.raises(ValueError, match="trips"):
        breaker_cooldown(NO_JITTER, "server_error", 0, rng)


# R2.2: Retry-After for rate_limited


def test_r2_2_rate_limit_with_retry_after_opens_immediately() -> None:
    health = fail(ProviderHealth("p"), "rate_limited", T0, retry_after_seconds=90)
    verdict = health_verdict(health, T0)
    assert (health.breaker, health.trips, health.consecutive_failures) == ("open", 1, 1)
    assert verdict.retry_at == T0 + timedelta(seconds=90)
    assert not verdict.available
    assert health_verdict(health, T0 + timedelta(seconds=90)).state == "half_open"


def test_r2_2_rate_limit_without_retry_after_waits_for_the_threshold() -> None:
    health = fail_times(ProviderHealth("p"), "rate_limited", 2, T0)
    assert health.breaker == "closed"
    health = fail(health, "rate_limited", T0)
    assert health.open_until == T0 + NO_JITTER.base_cooldown


@pytest.mark.parametrize(("retry_after", "expected"), [(5, 30), (300, 300)])
def test_r2_2_retry_after_at_threshold_takes_the_later_time(
    retry_after: float, expected: float
) -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 2, T0)
    health = fail(health, "rate_limited", T0, retry_after_seconds=retry_after)
    assert health.open_until == T0 + timedelta(seconds=expected)


def test_r2_2_retry_after_is_bounded_by_max_retry_after() -> None:
    policy = BreakerPolicy(jitter_ratio=0.0, max_retry_after=timedelta(hours=1))
    health = fail(ProviderHealth("p"), "rate_limited", T0, policy=policy, retry_after_seconds=1e12)
    assert health.open_until == T0 + timedelta(hours=1)


def test_r2_2_retry_after_while_open_extends_the_window() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 3, T0)
    after = fail(health, "rate_limited", T0, retry_after_seconds=120)
    assert after.open_until == T0 + timedelta(seconds=120)
    assert after.trips == 1


def test_r2_2_retry_after_is_ignored_for_server_error() -> None:
    """R2.2 honours Retry-After for rate_limited only."""
    health = fail(ProviderHealth("p"), "server_error", T0, retry_after_seconds=500)
    assert health.breaker == "closed"


# R2.2: one half-open probe


def test_r2_2_verdict_reason_for_closed_counts_failures() -> None:
    assert health_verdict(ProviderHealth("p"), T0).reason == "breaker closed"
    health = fail(ProviderHealth("p"), "timeout", T0)
    assert "1 consecutive" in health_verdict(health, T0).reason


def test_r2_2_verdict_reason_names_the_date_when_not_today() -> None:
    policy = BreakerPolicy(jitter_ratio=0.0, max_retry_after=timedelta(days=3))
    health = fail(ProviderHealth("p"), "rate_limited", T0, policy=policy, retry_after_seconds=86400)
    assert "2025-03-02 12:00:00 UTC" in health_verdict(health, T0).reason


def test_r2_2_record_failure_rejects_a_success() -> None:
    with pytest.raises(ValueError, match="record_success"):
        record_failure(
            ProviderHealth("p"),
            Classification(None, None, "none", None),
            T0,
            NO_JITTER,
            random.Random(0),
        )


@pytest.mark.parametrize(
    "fields",
    [
        {"failure_threshold": 0},
        {"failure_threshold": 2.5},
        {"base_cooldown": timedelta(0)},
        {"max_cooldown": timedelta(seconds=-1)},
        {"base_cooldown": timedelta(hours=1)},
        {"timeout_cooldown": timedelta(hours=1)},
        {"jitter_ratio": 1.0},
        {"jitter_ratio": -0.1},
        {"probe_lease": timedelta(0)},
        {"max_retry_after": 5},
    ],
)
def test_r2_2_bad_policy_is_rejected(fields: dict) -> None:
    with pytest.raises(ValueError):
        BreakerPolicy(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"provider_id": ""},
        {"provider_id": "p", "breaker": "ajar"},
        {"provider_id": "p", "breaker": "open"},
        {"provider_id": "p", "consecutive_failures": -1},
        {"provider_id": "p", "trips": True},
        {"provider_id": "p", "last_failure_class": "gremlins"},
        {"provider_id": "p", "last_failure_at": datetime(2025, 1, 1)},
    ],
)
def test_r2_2_bad_health_record_is_rejected(fields: dict) -> None:
    with pytest.raises(ValueError):
        ProviderHealth(**fields)


def test_r2_2_naive_now_is_rejected_everywhere() -> None:
    naive = datetime(2025, 3, 1, 12)
    health = ProviderHealth("p")
    with pytest.raises(ValueError, match="timezone-aware"):
        health_verdict(health, naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        record_success(health, naive)
    with pytest.raises(ValueError, match="timezone-aware"):
        record_failure(health, failure("timeout"), naive, NO_JITTER, random.Random(0))


# ---------------------------------------------------------------------------
# R2.1: auth disables until the configuration changes


def test_r2_1_auth_disables_until_config_changes() -> None:
    health = fail(ProviderHealth("p"), "auth", T0, config_fingerprint=FINGERPRINT)
    assert health.disabled_config == FINGERPRINT
    assert health.breaker == "closed"  # not a time fact
    much_later = T0 + timedelta(days=30)
    for fingerprint in (FINGERPRINT, None):
        verdict = health_verdict(health, much_later, fingerprint)
        assert (verdict.available, verdict.state, verdict.retry_at) == (False, "disabled", None)
        assert "configuration change" in verdict.reason
    changed = health_verdict(health, much_later, "cfg-v2")
    assert (changed.available, changed.state) == (True, "closed")


def test_r2_1_auth_failure_needs_a_config_fingerprint() -> None:
    with pytest.raises(ValueError, match="config_fingerprint"):
        fail(ProviderHealth("p"), "auth", T0)


def test_r2_1_auth_does_not_count_toward_the_breaker() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 2, T0)
    health = fail(health, "auth", T0, config_fingerprint=FINGERPRINT)
    assert (health.breaker, health.consecutive_failures) == ("closed", 2)


def test_r2_1_new_config_clears_the_disablement() -> None:
    disabled = fail(ProviderHealth("p"), "auth", T0, config_fingerprint=FINGERPRINT)
    after_failure = fail(disabled, "timeout", T0, config_fingerprint="cfg-v2")
    assert after_failure.disabled_config is None
    same_config = fail(disabled, "timeout", T0, config_fingerprint=FINGERPRINT)
    assert same_config.disabled_config == FINGERPRINT
    assert record_success(disabled, T0).disabled_config is None


# ---------------------------------------------------------------------------
# R2.3: refusals are not provider-health facts


@pytest.mark.parametrize("failure_class", ["refusal", "bad_request", "interrupted"])
def test_r2_3_refusal_bad_request_and_interrupted_leave_health_unchanged(
    failure_class: str,
) -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 2, T0)
    for _ in range(10):
        assert fail(health, failure_class, T0) == health
    # They neither count towards nor reset the streak.
    assert fail(health, "server_error", T0).breaker == "open"


def test_r2_3_refusal_does_not_close_an_open_breaker() -> None:
    health = fail_times(ProviderHealth("p"), "server_error", 3, T0)
    assert fail(health, "refusal", T0) == health


# ---------------------------------------------------------------------------
# Hypothesis properties (R2.2, R2.3)

times = st.integers(min_value=0, max_value=7 * 24 * 3600).map(lambda s: T0 + timedelta(seconds=s))
policies = st.builds(
    BreakerPolicy,
    failure_threshold=st.integers(1, 6),
    base_cooldown=st.integers(1, 300).map(lambda s: timedelta(seconds=s)),
    max_cooldown=st.integers(300, 3600).map(lambda s: timedelta(seconds=s)),
    jitter_ratio=st.floats(0, 0.99),
    timeout_cooldown=st.integers(1, 300).map(lambda s: timedelta(seconds=s)),
)


@st.composite
def healths(draw: st.DrawFn) -> ProviderHealth:
    breaker = draw(st.sampled_from(["closed", "open", "half_open"]))
    return ProviderHealth(
        provider_id="p",
        breaker=breaker,
        consecutive_failures=draw(st.integers(0, 20)),
        trips=draw(st.integers(0, 20)),
        open_until=draw(times) if breaker == "open" else draw(st.none() | times),
        last_failure_class=draw(st.none() | st.sampled_from(FAILURE_CLASSES)),
        last_failure_at=draw(st.none() | times),
        disabled_config=draw(st.none() | st.just(FINGERPRINT)),
        probe_lease_until=draw(st.none() | times),
    )


@settings(max_examples=200, deadline=None)
@given(
    health=healths(),
    failure_class=st.sampled_from(["refusal", "bad_request", "interrupted"]),
    now=times,
    policy=policies,
    seed=st.integers(0, 2**32),
    retry=st.none() | st.floats(0, 1e6),
)
def test_r2_3_property_non_time_classes_never_change_breaker_state(
    health: ProviderHealth,
    failure_class: str,
    now: datetime,
    policy: BreakerPolicy,
    seed: int,
    retry: float | None,
) -> None:
    after = fail(health, failure_class, now, policy=policy, retry_after_seconds=retry, seed=seed)
    assert after == health
    assert health_verdict(after, now) == health_verdict(health, now)


@settings(max_examples=200, deadline=None)
@given(
    policy=policies,
    failure_class=st.sampled_from(sorted(TIME_BASED_CLASSES)),
    trips=st.integers(1, 10_000),
    seed=st.integers(0, 2**64),
)
def test_r2_2_property_cooldown_never_exceeds_max(
    policy: BreakerPolicy, failure_class: str, trips: int, seed: int
) -> None:
    cooldown = breaker_cooldown(policy, failure_class, trips, random.Random(seed))
    assert timedelta(0) < cooldown <= policy.max_cooldown


@settings(max_examples=200, deadline=None)
@given(policy=policies, trips=st.integers(1, 40))
def test_r2_2_property_unjittered_backoff_is_monotone(policy: BreakerPolicy, trips: int) -> None:
    flat = replace(policy, jitter_ratio=0.0)
    rng = random.Random(0)
    assert breaker_cooldown(flat, "server_error", trips, rng) <= breaker_cooldown(
        flat, "server_error", trips + 1, rng
    )


events = st.lists(
    st.tuples(
        st.sampled_from(
            ["server_error", "rate_limited", "timeout", "network", "refusal", "bad_request",
             "interrupted", "success"]
        ),
        st.integers(0, 3600),  # seconds since the previous event
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(policy=policies, sequence=events, seed=st.integers(0, 2**32))
def test_r2_2_property_never_opens_below_threshold_without_retry_after(
    policy: BreakerPolicy, sequence: list[tuple[str, int]], seed: int
) -> None:
    rng = random.Random(seed)
    health = ProviderHealth("p")
    now = T0
    streak = 0  # consecutive time-based failures since the last success, counted independently
    for event, gap in sequence:
        now += timedelta(seconds=gap)
        if event == "success":
            health = record_success(health, now)
            streak = 0
        else:
            health = record_failure(health, failure(event), now, policy, rng)
            if event in TIME_BASED_CLASSES:
                streak += 1
        if health.breaker != "closed":
            assert streak >= policy.failure_threshold
        assert health.consecutive_failures == streak


@settings(max_examples=200, deadline=None)
@given(
    policy=policies,
    sequence=events,
    retry=st.lists(st.none() | st.floats(0, 1e7), min_size=40, max_size=40),
    seed=st.integers(0, 2**32),
)
def test_r2_2_property_open_window_is_bounded(
    policy: BreakerPolicy,
    sequence: list[tuple[str, int]],
    retry: list[float | None],
    seed: int,
) -> None:
    rng = random.Random(seed)
    health = ProviderHealth("p")
    now = T0
    bound = max(policy.max_cooldown, policy.max_retry_after)
    for (event, gap), retry_after in zip(sequence, retry, strict=False):
        now += timedelta(seconds=gap)
        if event == "success":
            health = record_success(health, now)
            continue
        retry_after = retry_after if event == "rate_limited" else None
        health = record_failure(health, failure(event, retry_after), now, policy, rng)
        if health.breaker == "open":
            assert health.open_until is not None
            assert health.open_until - now <= bound
            if retry_after is not None:
                # R2.2: a rate limit with Retry-After never reopens sooner than it asked.
                wait = min(timedelta(seconds=retry_after), policy.max_retry_after)
                assert health.open_until >= now + wait


@settings(max_examples=200, deadline=None)
@given(health=healths(), now=times)
def test_r2_2_property_success_always_closes(health: ProviderHealth, now: datetime) -> None:
    closed = record_success(health, now)
    verdict = health_verdict(closed, now)
    assert (closed.breaker, closed.consecutive_failures, closed.trips) == ("closed", 0, 0)
    assert (verdict.available, verdict.state) == (True, "closed")


@settings(max_examples=200, deadline=None)
@given(health=healths(), now=times, fingerprint=st.none() | st.sampled_from([FINGERPRINT, "v2"]))
def test_r2_2_property_verdict_is_consistent(
    health: ProviderHealth, now: datetime, fingerprint: str | None
) -> None:
    verdict = health_verdict(health, now, fingerprint)
    if verdict.state in ("open", "disabled"):
        assert not verdict.available
    if verdict.state == "open":
        assert verdict.retry_at is not None and verdict.retry_at > now
    if verdict.available:
        assert verdict.retry_at is None
    assert verdict.reason


def test_r2_2_a_success_that_changes_nothing_recent_is_not_news() -> None:
    """R2.2: a repeated success within SUCCESS_PRECISION moves no breaker fact and
    is not written; any breaker move, or an older last success, is."""
    from governance.rules.breaker import SUCCESS_PRECISION, health_changed, record_success

    fresh = record_success(ProviderHealth(provider_id="p"), T0)
    assert health_changed(ProviderHealth(provider_id="p"), fresh)  # first success ever
    again = record_success(fresh, T0 + SUCCESS_PRECISION / 2)
    assert not health_changed(fresh, again)
    later = record_success(fresh, T0 + SUCCESS_PRECISION)
    assert health_changed(fresh, later)
    failing = replace(fresh, consecutive_failures=2, last_failure_class="timeout")
    assert health_changed(failing, record_success(failing, T0 + timedelta(seconds=1)))


@pytest.mark.parametrize(
    "health",
    [
        ProviderHealth("p"),  # closed: would be tried
        fail_times(ProviderHealth("p"), "server_error", 5, T0),  # open
        fail(ProviderHealth("p"), "auth", T0, config_fingerprint="v1"),  # auth
    ],
    ids=["closed", "open", "auth-disabled"],
)
def test_r2_1_an_administrators_switch_comes_before_the_breaker(health):
    switched_off = health_verdict(health, T0, "v1", enabled=False)
    assert (switched_off.available, switched_off.state) == (False, "disabled")
    assert switched_off.reason == "disabled by an administrator"
    assert switched_off.retry_at is None
    assert switched_off.disabled_by == "admin"
    assert health_verdict(health, T0, "v1").reason != switched_off.reason


def test_r2_1_the_verdict_says_who_disabled_a_provider_and_whether_a_probe_is_out():
    auth_failed = fail(ProviderHealth("p"), "auth", T0, config_fingerprint="v1")
    assert health_verdict(auth_failed, T0, "v1").disabled_by == "auth"
    # A new configuration lifts the auth disable: nobody disabled it any more.
    assert health_verdict(auth_failed, T0, "v2").disabled_by == ""
    assert health_verdict(ProviderHealth("p"), T0, "v1").disabled_by == ""
    half_open = replace(
        fail_times(ProviderHealth("p"), "server_error", 5, T0), open_until=T0, breaker="open"
    )
    free = health_verdict(half_open, T0)
    assert (free.state, free.probe_in_flight) == ("half_open", False)
    leased = replace(half_open, probe_lease_until=T0 + timedelta(seconds=30))
    out = health_verdict(leased, T0)
    assert (out.state, out.available, out.probe_in_flight) == ("half_open", False, True)
    assert not health_verdict(ProviderHealth("p"), T0).probe_in_flight
