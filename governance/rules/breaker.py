"""R2.2 (and R2.1's auth disablement): the per-provider circuit breaker.

Only the *time-based* classes move it (R2.2, R2.3): closed → open after N
consecutive failures → half-open after an exponential, jittered, capped
cooldown → closed after a success. ``Retry-After`` is honoured for
``rate_limited``. ``auth`` disables the provider until its configuration
changes (R2.1). ``health_verdict`` says whether a provider may be tried now.

Time is always a parameter (aware datetimes); randomness (jitter) comes from
an injected ``random.Random``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Literal, get_args

from governance.rules._checks import is_int, optional_aware, require_aware
from governance.rules.classification import FAILURE_CLASSES, TIME_BASED_CLASSES, Classification

__all__ = [
    "BREAKER_STATES",
    "SUCCESS_PRECISION",
    "BreakerPolicy",
    "BreakerState",
    "HealthVerdict",
    "ProviderHealth",
    "breaker_cooldown",
    "effective_breaker_state",
    "health_changed",
    "health_verdict",
    "record_failure",
    "record_success",
]

BreakerState = Literal["closed", "open", "half_open"]
BREAKER_STATES: tuple[str, ...] = get_args(BreakerState)
# R2.1: "timeout / network … circuit breaker, short cooldown".
SHORT_COOLDOWN_CLASSES: frozenset[str] = frozenset({"timeout", "network"})


@dataclass(frozen=True)
class BreakerPolicy:
    """Breaker settings (R2.2). Defaults: open after 3, 30 s doubling to 10 min, ±20 %.

    ``timeout_cooldown`` is the R2.1 "short cooldown" base for timeout/network.
    ``max_retry_after`` bounds a provider's Retry-After (a garbage header must
    not park a provider for years). ``probe_lease`` is how long one admitted
    half-open probe holds the slot before another may go (a lost probe must
    not lock the provider out forever).
    """

    failure_threshold: int = 3
    base_cooldown: timedelta = timedelta(seconds=30)
    max_cooldown: timedelta = timedelta(minutes=10)
    jitter_ratio: float = 0.2
    timeout_cooldown: timedelta = timedelta(seconds=10)
    max_retry_after: timedelta = timedelta(days=1)
    probe_lease: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if not is_int(self.failure_threshold) or self.failure_threshold < 1:
            raise ValueError(
                f"failure_threshold must be an int >= 1, got {self.failure_threshold!r}"
            )
        for name in (
            "base_cooldown",
            "max_cooldown",
            "timeout_cooldown",
            "max_retry_after",
            "probe_lease",
        ):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ValueError(f"{name} must be a positive timedelta, got {value!r}")
        if self.base_cooldown > self.max_cooldown or self.timeout_cooldown > self.max_cooldown:
            raise ValueError("base_cooldown and timeout_cooldown must not exceed max_cooldown")
        if (
            isinstance(self.jitter_ratio, bool)
            or not isinstance(self.jitter_ratio, int | float)
            or not 0 <= self.jitter_ratio < 1
        ):
            raise ValueError(f"jitter_ratio must be in [0, 1), got {self.jitter_ratio!r}")


@dataclass(frozen=True)
class ProviderHealth:
    """Stored health of one provider (R2.2; auth disablement per R2.1).

    ``breaker == "open"`` with ``open_until`` in the past reads as half-open;
    a stored ``"half_open"`` means one probe was admitted (``admit_probe``)
    and holds the slot until ``probe_lease_until``.
    """

    provider_id: str
    breaker: BreakerState = "closed"
    consecutive_failures: int = 0
    trips: int = 0
    open_until: datetime | None = None
    last_failure_class: str | None = None
    last_failure_at: datetime | None = None
    disabled_config: str | None = None
    probe_lease_until: datetime | None = None
    last_success_at: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.provider_id, str) or not self.provider_id:
            raise ValueError("provider_id must be a non-empty string")
        if self.breaker not in BREAKER_STATES:
            raise ValueError(f"unknown breaker state {self.breaker!r}; expected {BREAKER_STATES}")
        for name in ("consecutive_failures", "trips"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.breaker == "open" and self.open_until is None:
            raise ValueError("an open breaker needs open_until")
        if self.last_failure_class is not None and self.last_failure_class not in FAILURE_CLASSES:
            raise ValueError(f"unknown last_failure_class {self.last_failure_class!r}")
        for name in ("open_until", "last_failure_at", "probe_lease_until", "last_success_at"):
            optional_aware(getattr(self, name), name)


@dataclass(frozen=True)
class HealthVerdict:
    """May this provider be tried now, and why (R2.1, R2.2)."""

    available: bool
    state: Literal["closed", "open", "half_open", "disabled"]
    retry_at: datetime | None
    reason: str
    # Who switched a disabled provider off: an administrator, or an auth
    # failure that waits for a configuration change (R2.1).
    disabled_by: Literal["", "admin", "auth"] = ""

    @property
    def probe_in_flight(self) -> bool:
        """Half-open with its one probe admitted and not yet reported (R2.2)."""
        return self.state == "half_open" and not self.available


def breaker_cooldown(
    policy: BreakerPolicy, failure_class: str, trips: int, rng: random.Random
) -> timedelta:
    """Cooldown for the ``trips``-th consecutive open (R2.2).

    ``min(max, base * 2**(trips-1))``, times ``uniform(1-r, 1+r)``, capped at
    ``max_cooldown`` again. Base is ``timeout_cooldown`` for timeout/network
    (R2.1 "short cooldown"), ``base_cooldown`` otherwise.
    """
    if failure_class not in TIME_BASED_CLASSES:
        raise ValueError(f"{failure_class!r} is not time-based; it has no breaker cooldown (R2.3)")
    if not is_int(trips) or trips < 1:
        raise ValueError(f"trips must be an int >= 1, got {trips!r}")
    base = (
        policy.timeout_cooldown if failure_class in SHORT_COOLDOWN_CLASSES else policy.base_cooldown
    )
    cap_seconds = policy.max_cooldown.total_seconds()
    # Cap the exponent so a long outage cannot overflow the float/timedelta.
    raw_seconds = min(cap_seconds, base.total_seconds() * 2.0 ** min(trips - 1, 64))
    factor = rng.uniform(1 - policy.jitter_ratio, 1 + policy.jitter_ratio)
    return min(policy.max_cooldown, timedelta(seconds=raw_seconds * factor))


def effective_breaker_state(health: ProviderHealth, now: datetime) -> BreakerState:
    """The breaker as of ``now``: an open breaker past ``open_until`` is half-open (R2.2)."""
    now = require_aware(now, "now")
    if health.breaker == "open":
        assert health.open_until is not None  # enforced by ProviderHealth
        return "open" if now < health.open_until else "half_open"
    return health.breaker


def _is_disabled(health: ProviderHealth, config_fingerprint: str | None) -> bool:
    # Without a fingerprint we cannot see a config change: stay disabled (R2.1).
    return health.disabled_config is not None and (
        config_fingerprint is None or config_fingerprint == health.disabled_config
    )


def _clock(moment: datetime, now: datetime) -> str:
    moment = moment.astimezone(UTC)
    if moment.date() == now.astimezone(UTC).date():
        return moment.strftime("%H:%M:%S UTC")
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def health_verdict(
    health: ProviderHealth,
    now: datetime,
    config_fingerprint: str | None = None,
    *,
    enabled: bool = True,
) -> HealthVerdict:
    """Whether ``health``'s provider may be tried at ``now`` (R2.1, R2.2).

    An administrator's switch comes first: a provider not ``enabled`` is not
    tried, whatever its breaker says.
    Disabled (auth) until ``config_fingerprint`` differs from the recorded
    one; open until ``open_until``; then half-open: available for one probe
    (unavailable while an admitted probe holds its lease); closed: available.
    """
    now = require_aware(now, "now")
    if not enabled:
        return HealthVerdict(
            False, "disabled", None, "disabled by an administrator", disabled_by="admin"
        )
    if _is_disabled(health, config_fingerprint):
        since = f" at {_clock(health.last_failure_at, now)}" if health.last_failure_at else ""
        return HealthVerdict(
            available=False,
            state="disabled",
            retry_at=None,
            reason=f"disabled after an auth failure{since}; waits for a configuration change",
            disabled_by="auth",
        )
    state = effective_breaker_state(health, now)
    last = health.last_failure_class or "time-based failure"
    if state == "open":
        assert health.open_until is not None
        return HealthVerdict(
            available=False,
            state="open",
            retry_at=health.open_until,
            reason=(
                f"breaker open after {health.consecutive_failures} consecutive failures "
                f"(last: {last}) until {_clock(health.open_until, now)}"
            ),
        )
    if state == "half_open":
        if health.probe_lease_until is not None and now < health.probe_lease_until:
            return HealthVerdict(
                available=False,
                state="half_open",
                retry_at=health.probe_lease_until,
                reason=(
                    "half-open: one probe is in flight; another may go at "
                    f"{_clock(health.probe_lease_until, now)} if it does not report"
                ),
            )
        return HealthVerdict(
            available=True,
            state="half_open",
            retry_at=None,
            reason=f"half-open after cooldown (last: {last}): one probe may be sent",
        )
    failures = health.consecutive_failures
    return HealthVerdict(
        available=True,
        state="closed",
        retry_at=None,
        reason=(
            "breaker closed"
            if failures == 0
            else f"breaker closed ({failures} consecutive failures, last: {last})"
        ),
    )


def _disabled_by_auth(
    health: ProviderHealth, now: datetime, config_fingerprint: str | None
) -> ProviderHealth:
    """R2.1: an auth failure disables the provider until its configuration changes."""
    if not config_fingerprint:
        raise ValueError(
            "an auth failure needs config_fingerprint: the provider stays disabled "
            "until its configuration changes (R2.1)"
        )
    # The breaker is left alone: a bad key is not a time fact. A probe that
    # failed on auth is finished, so its slot is released.
    return replace(
        health,
        disabled_config=config_fingerprint,
        last_failure_class="auth",
        last_failure_at=now,
        probe_lease_until=None,
    )


def _retry_after_until(
    classification: Classification, now: datetime, policy: BreakerPolicy
) -> datetime | None:
    """R2.2: when a rate-limited provider said to come back (bounded), or None."""
    seconds = classification.retry_after_seconds
    if classification.failure_class != "rate_limited" or seconds is None:
        return None
    return now + min(timedelta(seconds=seconds), policy.max_retry_after)


def record_failure(
    health: ProviderHealth,
    classification: Classification,
    now: datetime,
    policy: BreakerPolicy,
    rng: random.Random,
    config_fingerprint: str | None = None,
) -> ProviderHealth:
    """Apply one failed attempt to the provider's health (R2.1–R2.3, R6.2).

    * refusal, bad_request, interrupted: unchanged (R2.3; not health facts).
    * auth: disabled until ``config_fingerprint`` changes (required here).
    * time-based: closed counts consecutive failures and opens at the
      threshold; half-open re-opens with the next backoff step; open keeps
      its window. ``rate_limited`` with Retry-After opens at once, until
      ``max(now + retry_after, computed cooldown)``.
    """
    now = require_aware(now, "now")
    failure_class = classification.failure_class
    if failure_class is None:
        raise ValueError("a successful attempt is recorded with record_success, not record_failure")
    if failure_class == "auth":
        return _disabled_by_auth(health, now, config_fingerprint)
    if failure_class not in TIME_BASED_CLASSES:
        return health

    disabled_config = health.disabled_config
    if config_fingerprint is not None and config_fingerprint != disabled_config:
        disabled_config = None  # the config that failed auth is gone (R2.1)
    retry_after_until = _retry_after_until(classification, now, policy)
    failures = health.consecutive_failures + 1
    common = {
        "consecutive_failures": failures,
        "last_failure_class": failure_class,
        "last_failure_at": now,
        "disabled_config": disabled_config,
    }

    state = effective_breaker_state(health, now)
    if state == "open":
        # An attempt that started before the breaker opened reports late: it
        # counts, but it is not a new open and does not shorten the window.
        assert health.open_until is not None
        open_until = health.open_until
        if retry_after_until is not None:
            open_until = max(open_until, retry_after_until)
        return replace(health, open_until=open_until, **common)

    if state == "half_open" or failures >= policy.failure_threshold:
        trips = health.trips + 1
        open_until = now + breaker_cooldown(policy, failure_class, trips, rng)
        if retry_after_until is not None:
            open_until = max(open_until, retry_after_until)
    elif retry_after_until is not None:
        # Below the threshold the provider itself said when to come back (R2.2).
        trips = health.trips + 1
        open_until = retry_after_until
    else:
        return replace(health, **common)
    return replace(
        health,
        breaker="open",
        trips=trips,
        open_until=open_until,
        probe_lease_until=None,
        **common,
    )


def record_success(health: ProviderHealth, now: datetime) -> ProviderHealth:
    """A success closes the breaker and resets its counters (R2.2).

    It also proves the current configuration authenticates, so an auth
    disablement is cleared. ``last_failure_*`` stay as history.
    """
    now = require_aware(now, "now")
    return replace(
        health,
        breaker="closed",
        consecutive_failures=0,
        trips=0,
        open_until=None,
        probe_lease_until=None,
        disabled_config=None,
        last_success_at=now,
    )


# How precisely a healthy provider's "last success" is kept: a success that
# changes nothing else is written at most this often, so busy workers do not
# queue on one row to say "still fine".
SUCCESS_PRECISION = timedelta(minutes=1)


def health_changed(before: ProviderHealth, after: ProviderHealth) -> bool:
    """R2.2: whether ``after`` is news worth writing: any breaker fact moved, or
    the last success is older than ``SUCCESS_PRECISION``."""
    if replace(after, last_success_at=before.last_success_at) != before:
        return True
    if after.last_success_at is None:
        return False
    return before.last_success_at is None or (
        after.last_success_at - before.last_success_at >= SUCCESS_PRECISION
    )
