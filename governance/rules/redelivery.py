"""R7.3/R8.2: telling a receiver, again until it heard: completion callbacks and
alert channels share one answer to "what did this attempt mean, and when next?".

- A 2xx answer: delivered.
- 408, 425, 429 and any 5xx: the receiver may heal by itself, so retry.
- No HTTP answer at all (a network error, a timeout, even after the request
  left): retry. Delivery is at least once; the receiver dedupes by the
  ``Idempotency-Key`` it is sent.
- Any other status (other 4xx; 1xx and 3xx, as redirects are not followed):
  permanent. So is a target the outbound check refused or a channel whose
  configuration cannot work; the caller says so with ``permanent=True``.

When to try again: ``base·2^(n−1)`` after attempt ``n``, capped. A receiver's
Retry-After is a floor (never come back sooner than it asked), honoured up to
the policy's own cap for it. Once ``max_attempts`` attempts are used, a retry
becomes a failure: the sender gives up and says so.

Pure: the caller classifies its transport (status or none) and supplies the
policy read from settings.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

# Statuses that mean "not now" rather than "never" (RFC 9110 §15.5.9, RFC 8470, RFC 6585).
RETRYABLE_STATUS = frozenset({408, 425, 429})


class Verdict(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"


def attempt_verdict(status: int | None, *, permanent: bool = False) -> Verdict:
    """What one attempt's answer means (``status`` None: no HTTP answer)."""
    if permanent:
        return Verdict.FAILED
    if status is None:
        return Verdict.RETRY
    if 200 <= status < 300:
        return Verdict.DELIVERED
    if status in RETRYABLE_STATUS or status >= 500:
        return Verdict.RETRY
    return Verdict.FAILED


def smtp_reply_verdict(code: int) -> Verdict:
    """An SMTP server's error reply (RFC 5321 §4.2.1): 4yz is transient, 5yz permanent."""
    return Verdict.FAILED if code >= 500 else Verdict.RETRY


def smtp_recipients_verdict(codes: Iterable[int]) -> Verdict:
    """Every recipient refused, each with its reply code: permanent once any code
    is 5yz (that address will not work), else transient."""
    verdicts = {smtp_reply_verdict(code) for code in codes}
    return Verdict.FAILED if Verdict.FAILED in verdicts or not verdicts else Verdict.RETRY


@dataclass(frozen=True)
class RetryPolicy:
    """How a sender backs off: ``base_s·2^(n−1)`` capped at ``cap_s``; a Retry-After
    is honoured up to ``retry_after_cap_s``; at most ``max_attempts`` attempts."""

    base_s: float
    cap_s: float
    max_attempts: int
    retry_after_cap_s: float

    def __post_init__(self) -> None:
        if not (self.base_s > 0 and self.cap_s > 0 and self.retry_after_cap_s >= 0):
            raise ValueError(f"a retry policy needs positive delays, got {self!r}")
        if self.max_attempts < 1:
            raise ValueError(f"a retry policy needs at least one attempt, got {self!r}")


def retry_delay_s(attempt: int, retry_after_s: float | None, policy: RetryPolicy) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based)."""
    backoff = min(policy.base_s * 2 ** max(0, min(attempt - 1, 30)), policy.cap_s)
    if retry_after_s is None:
        return backoff
    return max(backoff, min(max(retry_after_s, 0.0), policy.retry_after_cap_s))


def may_attempt(attempts_made: int, policy: RetryPolicy) -> bool:
    """Whether another attempt may go: one whose worker died before recording an
    answer still counts, so a sender never makes more than ``max_attempts``."""
    return attempts_made < policy.max_attempts


@dataclass(frozen=True)
class AfterAttempt:
    """What the sender records: the new state, when to try next (retry only),
    and whether a retry was turned into a failure because the attempts ran out."""

    state: Verdict
    retry_in_s: float | None = None
    gave_up: bool = False


def after_attempt(
    verdict: Verdict, attempt: int, retry_after_s: float | None, policy: RetryPolicy
) -> AfterAttempt:
    """The state after attempt ``attempt`` (1-based) answered ``verdict``."""
    verdict = Verdict(verdict)
    if verdict is not Verdict.RETRY:
        return AfterAttempt(verdict)
    if attempt >= policy.max_attempts:
        return AfterAttempt(Verdict.FAILED, gave_up=True)
    return AfterAttempt(Verdict.RETRY, retry_delay_s(attempt, retry_after_s, policy))
