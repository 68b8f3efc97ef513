"""R2: provider failure classes and provider health (plus R6.2 `interrupted`).

Three pure pieces:

* ``classify_attempt`` puts every failed provider attempt into exactly one
  class of the R2.1 table, detects refusals per adapter (R2.4) and names a
  broken stream ``interrupted`` rather than ``timeout`` when no clock fired
  (R6.2).
* A per-provider circuit breaker for the *time-based* classes only (R2.2):
  closed → open after N consecutive failures → half-open after an
  exponential, jittered, capped cooldown → closed after a success.
  ``Retry-After`` is honoured for ``rate_limited``. ``auth`` disables the
  provider until its configuration changes.
* The turn-level refusal memory (R2.3): a refusal is a fact about *these
  request bytes*, never a provider-health failure; the memory only keeps the
  same turn from being re-sent to that provider for ``REFUSAL_SCOPE_TTL``.

Time is always a parameter (aware datetimes); randomness (jitter) comes from
an injected ``random.Random``.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Literal, get_args

from governance.rules.refusal import REFUSAL_SCOPE_TTL

__all__ = [
    "ERROR_KINDS",
    "FAILURE_CLASSES",
    "TIME_BASED_CLASSES",
    "TRANSPORT_ERRORS",
    "AttemptEvidence",
    "BreakerPolicy",
    "Classification",
    "ErrorKind",
    "FailureClass",
    "HealthVerdict",
    "ProviderHealth",
    "TurnRefusal",
    "TurnRefusalMemory",
    "breaker_cooldown",
    "classify_attempt",
    "effective_breaker_state",
    "health_verdict",
    "parse_retry_after",
    "record_failure",
    "record_success",
    "remember_turn_refusal",
    "turn_recently_refused",
]

FailureClass = Literal[
    "server_error",
    "rate_limited",
    "timeout",
    "network",
    "auth",
    "bad_request",
    "refusal",
    "interrupted",
]
FAILURE_CLASSES: tuple[str, ...] = get_args(FailureClass)

# R2.2/R2.3: only failures that time itself cures move the breaker. A refusal
# (the bytes), a bad request (the request) and an interrupted stream (effect
# unknown, the provider did answer) say nothing about the provider's health.
TIME_BASED_CLASSES: frozenset[str] = frozenset(
    {"server_error", "rate_limited", "timeout", "network"}
)
# R2.1: "timeout / network … circuit breaker, short cooldown".
SHORT_COOLDOWN_CLASSES: frozenset[str] = frozenset({"timeout", "network"})

TransportError = Literal["connect_timeout", "read_timeout", "connect_error", "connection_reset"]
TRANSPORT_ERRORS: tuple[str, ...] = get_args(TransportError)
_TIMEOUT_TRANSPORT_ERRORS = frozenset({"connect_timeout", "read_timeout"})
# A connect failure happens before any response byte, so it cannot follow headers.
_PRE_RESPONSE_TRANSPORT_ERRORS = frozenset({"connect_timeout", "connect_error"})

BreakerState = Literal["closed", "open", "half_open"]
BREAKER_STATES: tuple[str, ...] = get_args(BreakerState)

# R2.1: what a provider's error code said, in no vendor's words. Each adapter
# reads its vendor's codes into one of these (tasks/adapters/); a code it does
# not know is no kind at all, and the HTTP status decides.
ErrorKind = Literal["quota", "server", "auth", "timeout", "bad_request"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)
# After the status: the class an error kind names when no status explains the
# failure (e.g. an error event in a stream that sent 200 headers).
_CLASS_OF_ERROR_KIND: dict[str, FailureClass] = {
    "server": "server_error",
    "auth": "auth",
    "timeout": "timeout",
    "bad_request": "bad_request",
}


def _require_aware(value: datetime, name: str) -> datetime:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def _optional_aware(value: datetime | None, name: str) -> None:
    if value is not None:
        _require_aware(value, name)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------
# R2.1 / R2.4 / R6.2: classification


@dataclass(frozen=True)
class AttemptEvidence:
    """What an adapter read from one attempt, in no vendor's words (R2.1, R2.4, R6.2).

    Every field is optional; the adapter reports what it saw and
    ``classify_attempt`` names the class. Each adapter reads its own vendor's
    answer (R2.4): ``refusal_category`` is set when that answer was a refusal
    (its category kept), ``error_kind`` when the vendor's error code said what
    went wrong. The vendor's own words stay with the adapter's answer.
    """

    status_code: int | None = None
    error_kind: ErrorKind | None = None
    refusal_category: str | None = None
    transport_error: TransportError | None = None
    headers_received: bool = False
    body_complete: bool = True
    deadline_evidence: bool = False
    retry_after: str | float | None = None

    def __post_init__(self) -> None:
        if self.status_code is not None and (
            not _is_int(self.status_code) or not 100 <= self.status_code <= 599
        ):
            raise ValueError(
                f"status_code must be an HTTP status 100..599, got {self.status_code!r}"
            )
        if self.error_kind is not None and self.error_kind not in ERROR_KINDS:
            raise ValueError(
                f"unknown error_kind {self.error_kind!r}; expected one of {ERROR_KINDS}"
            )
        if self.refusal_category is not None and (
            not isinstance(self.refusal_category, str) or not self.refusal_category
        ):
            raise ValueError("refusal_category, when given, must name a category (R2.4)")
        if self.transport_error is not None and self.transport_error not in TRANSPORT_ERRORS:
            raise ValueError(
                f"unknown transport_error {self.transport_error!r}; expected one of "
                f"{TRANSPORT_ERRORS}"
            )
        if self.transport_error in _PRE_RESPONSE_TRANSPORT_ERRORS and self.response_started:
            raise ValueError(
                f"transport_error {self.transport_error!r} happens before any response, "
                "but headers/status were reported as received"
            )
        if not self.body_complete and not self.response_started:
            raise ValueError(
                "body_complete=False needs headers_received (a body cannot break before "
                "headers arrive); report a transport_error instead"
            )
        if self.retry_after is not None and (
            isinstance(self.retry_after, bool)
            or not isinstance(self.retry_after, str | int | float)
        ):
            raise ValueError(
                "retry_after must be the raw header (str) or seconds (number), "
                f"got {type(self.retry_after).__name__}"
            )

    @property
    def response_started(self) -> bool:
        """Response headers arrived (an HTTP status implies them)."""
        return self.headers_received or self.status_code is not None


@dataclass(frozen=True)
class Classification:
    """The one R2.1 class of an attempt; ``failure_class=None`` means success.

    ``effect`` is ``"unknown"`` exactly for ``interrupted`` (R6.2): the provider
    started answering, so whether it did the work cannot be told.
    """

    failure_class: FailureClass | None
    refusal_category: str | None
    effect: Literal["none", "unknown"]
    retry_after_seconds: float | None

    def __post_init__(self) -> None:
        if self.failure_class is not None and self.failure_class not in FAILURE_CLASSES:
            raise ValueError(
                f"unknown failure_class {self.failure_class!r}; expected one of {FAILURE_CLASSES}"
            )
        if (self.failure_class == "refusal") != (self.refusal_category is not None):
            raise ValueError("refusal_category is kept for refusals and only for refusals (R2.4)")
        if self.effect not in ("none", "unknown"):
            raise ValueError(f"effect must be 'none' or 'unknown', got {self.effect!r}")
        if (self.failure_class == "interrupted") != (self.effect == "unknown"):
            raise ValueError("effect is 'unknown' exactly for interrupted attempts (R6.2)")
        if self.retry_after_seconds is not None:
            if self.failure_class is None:
                raise ValueError("a successful attempt has no retry_after_seconds")
            if isinstance(self.retry_after_seconds, bool) or not (
                isinstance(self.retry_after_seconds, int | float)
                and math.isfinite(self.retry_after_seconds)
                and self.retry_after_seconds >= 0
            ):
                raise ValueError(
                    "retry_after_seconds must be a finite number >= 0, "
                    f"got {self.retry_after_seconds!r}"
                )

    @property
    def moves_breaker(self) -> bool:
        """Only time-based classes count as provider-health failures (R2.2, R2.3)."""
        return self.failure_class in TIME_BASED_CLASSES


_MONTHS = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_IMF_FIXDATE = re.compile(
    r"^[A-Za-z]{3},\s+(\d{1,2})\s+([A-Za-z]{3})\s+(\d{4})\s+(\d{2}):(\d{2}):(\d{2})\s+GMT$",
    re.IGNORECASE,
)
_RFC850_DATE = re.compile(
    r"^[A-Za-z]+,\s+(\d{1,2})-([A-Za-z]{3})-(\d{2})\s+(\d{2}):(\d{2}):(\d{2})\s+GMT$",
    re.IGNORECASE,
)
_ASCTIME_DATE = re.compile(
    r"^[A-Za-z]{3}\s+([A-Za-z]{3})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})\s+(\d{4})$",
    re.IGNORECASE,
)
_DELAY_SECONDS = re.compile(r"^\d+(\.\d+)?$")


def _http_date(text: str, now: datetime) -> datetime | None:
    """Parse the three HTTP-date forms of RFC 9110 §5.6.7; None if unparseable.

    Written by hand rather than with email.utils/strptime: those pull in
    os/socket/time and depend on the process locale.
    """
    if match := _IMF_FIXDATE.match(text):
        day, month, year, hour, minute, second = match.groups()
    elif match := _RFC850_DATE.match(text):
        day, month, short_year, hour, minute, second = match.groups()
        # RFC 9110: a two-digit year more than 50 years in the future is in the past.
        year_number = now.year - now.year % 100 + int(short_year)
        if year_number > now.year + 50:
            year_number -= 100
        year = str(year_number)
    elif match := _ASCTIME_DATE.match(text):
        month, day, hour, minute, second, year = match.groups()
    else:
        return None
    month_number = _MONTHS.get(month.lower())
    if month_number is None:
        return None
    try:
        return datetime(
            int(year),
            month_number,
            int(day),
            int(hour),
            int(minute),
            min(int(second), 59),  # a leap second is still "that minute"
            tzinfo=UTC,
        )
    except ValueError:
        return None


def parse_retry_after(raw: str | float | None, now: datetime) -> float | None:
    """Seconds to wait from a raw ``Retry-After`` value (R2.2), or None.

    Accepts delay-seconds (``"120"``, ``"1.5"``, a number) and an HTTP-date
    (a date in the past means "now": 0). The header comes from the provider,
    so an unparseable, negative or non-finite value is treated as absent
    rather than raised; a value of the wrong *type* is a caller bug and raises.
    """
    now = _require_aware(now, "now")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"retry_after must be str or number, got {type(raw).__name__}")
    if isinstance(raw, int | float):
        seconds = float(raw)
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    text = raw.strip()
    if _DELAY_SECONDS.match(text):
        seconds = float(text)
        return seconds if math.isfinite(seconds) else None
    moment = _http_date(text, now)
    if moment is None:
        return None
    return max(0.0, (moment - now).total_seconds())


def _class_from_status(status: int) -> FailureClass | None:
    if status == 429 or status == 402:  # 402: credits/quota exhausted
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status == 408:  # the server's own request clock fired
        return "timeout"
    if 500 <= status <= 599:  # includes Anthropic's 529 overloaded
        return "server_error"
    # An unexpected redirect (never followed) means the request or its
    # configuration is wrong, not that the provider is down.
    if 400 <= status <= 499 or 300 <= status <= 399:
        return "bad_request"
    return None


def _failure_class(evidence: AttemptEvidence) -> FailureClass | None:
    if evidence.error_kind == "quota":  # R2.1 "429, quota errors", whatever status carries them
        return "rate_limited"
    if evidence.status_code is not None and (by_status := _class_from_status(evidence.status_code)):
        return by_status
    if evidence.error_kind is not None:
        return _CLASS_OF_ERROR_KIND[evidence.error_kind]
    timer_fired = (
        evidence.deadline_evidence or evidence.transport_error in _TIMEOUT_TRANSPORT_ERRORS
    )
    if evidence.response_started:
        # R6.2: headers arrived, then the body broke. Only a clock that actually
        # fired makes this a timeout; otherwise it is interrupted, effect unknown.
        if not evidence.body_complete or evidence.transport_error is not None:
            return "timeout" if timer_fired else "interrupted"
        return None
    if timer_fired:
        return "timeout"
    if evidence.transport_error is not None:
        return "network"
    return None


def classify_attempt(evidence: AttemptEvidence, now: datetime) -> Classification:
    """Classify one provider attempt into exactly one R2.1 class (or success).

    Precedence: refusal (R2.4, as the adapter read it) → a quota error →
    HTTP status → the error's kind → broken body after headers (R6.2:
    ``timeout`` only with deadline evidence, else ``interrupted``) →
    transport errors → success. ``now`` resolves an HTTP-date ``Retry-After``.
    """
    if not isinstance(evidence, AttemptEvidence):
        raise TypeError(f"evidence must be AttemptEvidence, got {type(evidence).__name__}")
    now = _require_aware(now, "now")
    category = evidence.refusal_category
    failure_class: FailureClass | None = (
        "refusal" if category is not None else _failure_class(evidence)
    )
    if failure_class is None:
        return Classification(None, None, "none", None)
    return Classification(
        failure_class=failure_class,
        refusal_category=category,
        effect="unknown" if failure_class == "interrupted" else "none",
        retry_after_seconds=parse_retry_after(evidence.retry_after, now),
    )


# ---------------------------------------------------------------------------
# R2.2: the per-provider circuit breaker


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
        if not _is_int(self.failure_threshold) or self.failure_threshold < 1:
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
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.breaker == "open" and self.open_until is None:
            raise ValueError("an open breaker needs open_until")
        if self.last_failure_class is not None and self.last_failure_class not in FAILURE_CLASSES:
            raise ValueError(f"unknown last_failure_class {self.last_failure_class!r}")
        for name in ("open_until", "last_failure_at", "probe_lease_until", "last_success_at"):
            _optional_aware(getattr(self, name), name)


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
    if not _is_int(trips) or trips < 1:
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
    now = _require_aware(now, "now")
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
    now = _require_aware(now, "now")
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
    now = _require_aware(now, "now")
    failure_class = classification.failure_class
    if failure_class is None:
        raise ValueError("a successful attempt is recorded with record_success, not record_failure")
    if failure_class == "auth":
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
    if failure_class not in TIME_BASED_CLASSES:
        return health

    disabled_config = health.disabled_config
    if config_fingerprint is not None and config_fingerprint != disabled_config:
        disabled_config = None  # the config that failed auth is gone (R2.1)
    retry_after_until: datetime | None = None
    if failure_class == "rate_limited" and classification.retry_after_seconds is not None:
        wait = min(timedelta(seconds=classification.retry_after_seconds), policy.max_retry_after)
        retry_after_until = now + wait
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
    now = _require_aware(now, "now")
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


# ---------------------------------------------------------------------------
# R2.3: turn-level refusal memory


@dataclass(frozen=True)
class TurnRefusal:
    """One remembered refusal: this provider refused these request bytes at ``refused_at``."""

    provider_id: str
    request_digest: str
    refused_at: datetime

    def __post_init__(self) -> None:
        _check_turn_key(self.provider_id, self.request_digest)
        _require_aware(self.refused_at, "refused_at")


def _check_turn_key(provider_id: str, request_digest: str) -> None:
    if not isinstance(provider_id, str) or not provider_id:
        raise ValueError("provider_id must be a non-empty string")
    if not isinstance(request_digest, str) or not request_digest:
        raise ValueError("request_digest must be a non-empty string")


def _check_ttl(ttl: timedelta) -> None:
    if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
        raise ValueError(f"ttl must be a positive timedelta, got {ttl!r}")


@dataclass(frozen=True)
class TurnRefusalMemory:
    """Immutable map (provider_id, request_digest) → refused_at (R2.3).

    Kept sorted by key so equal memories compare equal.
    """

    entries: tuple[TurnRefusal, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.entries, tuple) or not all(
            isinstance(entry, TurnRefusal) for entry in self.entries
        ):
            raise ValueError("TurnRefusalMemory.entries must be a tuple of TurnRefusal")
        keys = [(entry.provider_id, entry.request_digest) for entry in self.entries]
        if len(set(keys)) != len(keys):
            raise ValueError("TurnRefusalMemory holds one entry per (provider_id, request_digest)")
        ordered = tuple(sorted(self.entries, key=lambda e: (e.provider_id, e.request_digest)))
        object.__setattr__(self, "entries", ordered)

    def __len__(self) -> int:
        return len(self.entries)

    def refused_at(self, provider_id: str, request_digest: str) -> datetime | None:
        """When this provider last refused these bytes, or None."""
        for entry in self.entries:
            if entry.provider_id == provider_id and entry.request_digest == request_digest:
                return entry.refused_at
        return None


def remember_turn_refusal(
    memory: TurnRefusalMemory, provider_id: str, request_digest: str, now: datetime
) -> TurnRefusalMemory:
    """Remember that ``provider_id`` refused the request ``request_digest`` at ``now`` (R2.3).

    Anchored on the latest refusal: a report older than the one remembered
    (out-of-order workers) never moves the time back.
    """
    _check_turn_key(provider_id, request_digest)
    now = _require_aware(now, "now")
    previous = memory.refused_at(provider_id, request_digest)
    refused_at = now if previous is None else max(previous, now)
    kept = tuple(
        entry
        for entry in memory.entries
        if (entry.provider_id, entry.request_digest) != (provider_id, request_digest)
    )
    return TurnRefusalMemory((*kept, TurnRefusal(provider_id, request_digest, refused_at)))


def turn_recently_refused(
    memory: TurnRefusalMemory,
    provider_id: str,
    request_digest: str,
    now: datetime,
    ttl: timedelta = REFUSAL_SCOPE_TTL,
) -> bool:
    """True while ``now < refused_at + ttl``: do not re-send this turn there (R2.3)."""
    _check_turn_key(provider_id, request_digest)
    _check_ttl(ttl)
    now = _require_aware(now, "now")
    refused_at = memory.refused_at(provider_id, request_digest)
    return refused_at is not None and now < refused_at + ttl
