"""R2.1, R2.4, R6.2: every provider attempt gets exactly one class.

``classify_attempt`` names the R2.1 class of an attempt from the evidence its
adapter read (``AttemptEvidence``: the HTTP status, what the error code said,
the refusal the adapter recognised in its vendor's answer — R2.4 — the
transport and the clocks), and names a broken stream ``interrupted`` rather
than ``timeout`` when no clock fired (R6.2). It never reads a vendor's
format: each adapter (``tasks/adapters/``) reads its own.

Time is a parameter (``now`` resolves an HTTP-date ``Retry-After``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from governance.rules._checks import is_int, require_aware
from governance.rules.retry_after import parse_retry_after

__all__ = [
    "ERROR_KINDS",
    "FAILURE_CLASSES",
    "TIME_BASED_CLASSES",
    "TRANSPORT_ERRORS",
    "AttemptEvidence",
    "Classification",
    "ErrorKind",
    "FailureClass",
    "TransportError",
    "classify_attempt",
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

TransportError = Literal["connect_timeout", "read_timeout", "connect_error", "connection_reset"]
TRANSPORT_ERRORS: tuple[str, ...] = get_args(TransportError)
_TIMEOUT_TRANSPORT_ERRORS = frozenset({"connect_timeout", "read_timeout"})
# A connect failure happens before any response byte, so it cannot follow headers.
_PRE_RESPONSE_TRANSPORT_ERRORS = frozenset({"connect_timeout", "connect_error"})

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
            not is_int(self.status_code) or not 100 <= self.status_code <= 599
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


def _class_from_status(status: int) -> FailureClass | None:
    if status == 429 or status == 402:  # 402: credits/quota exhausted
        return "rate_limited"
    if status in (401, 403):
        return "auth"
    if status == 408:  # the server's own request clock fired
        return "timeout"
    if 500 <= status <= 599:  # 529 ("overloaded") included
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
    now = require_aware(now, "now")
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
