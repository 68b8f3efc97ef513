"""R6.5 at the OpenAI-compatible door: a settled run that gave the client
nothing is told as an error, never as an empty answer.

A client of the Chat Completions protocol reads a 200 with empty content as
"the model said nothing". A run that failed, was stopped or ran out of its
budget or deadline did not answer: its settlement says why, and the client's
SDK raises its usual exception for the status. A run that answered (text or
tool calls), and a refused turn (``content_filter``, R3.7), is a 200.

The door already tried the route's fallbacks and retries inside the run; the
SDK's own automatic retry would send the same request again and may pay again,
so every such error says ``x-should-retry: false``: whether to try again is the
client's decision. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from governance.rules.settlement import Outcome, ReasonCode


@dataclass(frozen=True)
class DoorFailure:
    """The HTTP status and OpenAI's ``type``/``code`` for a run that did not answer."""

    status: int
    type: str
    code: str


# By the settlement's reason; anything else that did not answer is the
# upstream's failure (502): every provider of the route failed or gave nothing.
FAILURES = {
    ReasonCode.CANCELLED: DoorFailure(409, "run_cancelled", "run_cancelled"),
    ReasonCode.DEADLINE_EXCEEDED: DoorFailure(504, "timeout", "deadline_exceeded"),
    # OpenAI's own words for a spent quota: its SDK raises RateLimitError.
    ReasonCode.HARD_LIMIT: DoorFailure(429, "insufficient_quota", "insufficient_quota"),
}


def door_failure(
    outcome: Outcome | str, reason_code: ReasonCode | str, *, answered: bool, refused: bool
) -> DoorFailure | None:
    """None when the run's answer is the client's 200: it answered (text or
    tool calls, completed or partial) or its providers refused (content_filter).
    A stop is always an error: someone decided the client gets no answer (R7.1)."""
    code = ReasonCode(reason_code)
    if code is ReasonCode.CANCELLED:
        return FAILURES[code]
    if answered or refused or Outcome(outcome) is Outcome.COMPLETED:
        return None
    return FAILURES.get(code, DoorFailure(502, "server_error", code.value))
