"""R4.5: degrading narrows the promise, never swaps the goal
(governance.rules.answers)."""

from __future__ import annotations

import pytest

from governance.rules.answers import Answer, answer_settlement
from governance.rules.authority import FactKind
from governance.rules.decision_table import next_path
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.settlement import Outcome, ReasonCode
from governance.rules.transitions import allowed_stages
from tests.governance.owner_facts import GOAL, answered, committed, executor, run_with

# ---------------------------------------------------------------------------
# R4.5 Degrade narrows the promise, never swaps the goal


def test_r4_5_failed_plan_is_planning_failed_and_nothing_follows() -> None:
    run = run_with(executor(FactKind.PLANNING_FAILED, "plan-1"))
    decision = next_path(run)
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.FAILED
    assert decision.settlement.reason_code is ReasonCode.PLANNING_FAILED
    assert allowed_stages(decision) == frozenset()


def test_r4_5_after_planning_failed_a_later_answer_does_not_proceed() -> None:
    run = run_with(executor(FactKind.PLANNING_FAILED, "plan-1"), committed(1), answered())
    decision = next_path(run)
    assert decision.settlement is not None
    assert decision.settlement.reason_code is ReasonCode.PLANNING_FAILED
    assert decision.settlement.outcome is Outcome.FAILED


def test_r4_5_answer_to_an_easier_question_is_never_completed() -> None:
    easier = Answer(goal="what is a stock price", stated_gaps=("no current data",), narrowed=True)
    decision = next_path(run_with(committed(1), answered(easier)))
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.FAILED
    assert decision.settlement.reason_code is ReasonCode.GOAL_SWAPPED


def test_r4_5_narrowed_answer_that_states_its_gap_is_partial() -> None:
    narrowed = Answer(goal=GOAL, stated_gaps=("no quote after 14:00",), narrowed=True)
    settlement = answer_settlement(GOAL, narrowed)
    assert settlement.outcome is Outcome.PARTIAL
    assert "no quote after 14:00" in settlement.reason


def test_r4_5_narrowed_answer_must_state_its_gap() -> None:
    with pytest.raises(LifecycleError, match="state the gap"):
        Answer(goal=GOAL, narrowed=True)


def test_r4_5_full_answer_to_the_asked_question_is_completed() -> None:
    assert answer_settlement(GOAL, Answer(goal=GOAL)).outcome is Outcome.COMPLETED


@pytest.mark.parametrize(
    "build",
    [
        lambda: Answer(goal=""),
        lambda: Answer(goal=GOAL, stated_gaps=["gap"]),  # type: ignore[arg-type]
        lambda: Answer(goal=GOAL, stated_gaps=("",)),
        lambda: answer_settlement("", Answer(goal=GOAL)),
        lambda: answer_settlement(GOAL, "answer"),  # type: ignore[arg-type]
    ],
)
def test_r4_5_bad_answers_are_rejected(build) -> None:
    with pytest.raises(LifecycleError):
        build()
