"""R6.5 at the door (rules/door.py): which settled runs are an error for the
client, and which status and code say why."""

from __future__ import annotations

import pytest

from governance.rules.door import DoorFailure, door_failure
from governance.rules.settlement import Outcome, ReasonCode


@pytest.mark.parametrize(
    ("outcome", "code", "expected"),
    [
        (Outcome.CANCELLED, ReasonCode.CANCELLED,
         DoorFailure(409, "run_cancelled", "run_cancelled")),
        (Outcome.FAILED, ReasonCode.DEADLINE_EXCEEDED,
         DoorFailure(504, "timeout", "deadline_exceeded")),
        (Outcome.FAILED, ReasonCode.HARD_LIMIT,
         DoorFailure(429, "insufficient_quota", "insufficient_quota")),
        (Outcome.FAILED, ReasonCode.NO_ANSWER_PRODUCED,
         DoorFailure(502, "server_error", "no_answer_produced")),
        (Outcome.PARTIAL, ReasonCode.NO_BODY_COMMITTED,
         DoorFailure(502, "server_error", "no_body_committed")),
    ],
)  # fmt: skip
def test_r6_5_a_run_that_gave_nothing_is_an_error_naming_why(outcome, code, expected):
    assert door_failure(outcome, code, answered=False, refused=False) == expected


@pytest.mark.parametrize("code", [ReasonCode.DEADLINE_EXCEEDED, ReasonCode.HARD_LIMIT])
def test_r6_5_what_was_answered_is_the_clients_200_even_when_the_run_did_not_complete(code):
    assert door_failure(Outcome.PARTIAL, code, answered=True, refused=False) is None


def test_r3_7_a_refused_turn_is_content_filter_not_an_error():
    """Every provider cooling or frozen: the answer is R3.7's refusal, a 200."""
    assert (
        door_failure(Outcome.FAILED, ReasonCode.NO_ELIGIBLE_PROVIDER, answered=False, refused=True)
        is None
    )


def test_r7_1_a_stopped_run_is_an_error_even_with_an_answer_committed():
    assert door_failure(
        Outcome.CANCELLED, ReasonCode.CANCELLED, answered=True, refused=False
    ) == DoorFailure(409, "run_cancelled", "run_cancelled")


def test_r6_5_a_completed_run_is_never_an_error():
    assert door_failure("completed", "answered", answered=False, refused=False) is None


def test_r6_5_strings_from_the_database_are_read_as_the_enums():
    assert door_failure("failed", "deadline_exceeded", answered=False, refused=False).status == 504
