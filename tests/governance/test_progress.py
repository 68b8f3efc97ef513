"""R4.4: the no-progress rule (governance.rules.progress) and how the decision
table ends such a run."""

from __future__ import annotations

import pytest

from governance.rules.authority import FactKind
from governance.rules.decision_table import Path, next_path
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.progress import NO_ANSWER_TEXT, classify_turn
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from tests.governance.owner_facts import answered, committed, no_progress, run_with, tool_turn

# ---------------------------------------------------------------------------
# R4.4 No-progress rule


@pytest.mark.parametrize(
    ("body", "calls", "expected"),
    [
        ("", 0, FactKind.TURN_WITHOUT_PROGRESS),
        ("  \n\t", 0, FactKind.TURN_WITHOUT_PROGRESS),
        ("The price is 12.", 0, FactKind.TURN_ANSWERED),
        ("", 2, FactKind.TURN_CALLED_TOOLS),
        ("Let me check.", 1, FactKind.TURN_CALLED_TOOLS),
    ],
)
def test_r4_4_turns_are_classified_by_business_progress(
    body: str, calls: int, expected: FactKind
) -> None:
    assert classify_turn(body, calls) is expected


@pytest.mark.parametrize(("body", "calls"), [(None, 0), ("x", -1), ("x", True), ("x", 1.0)])
def test_r4_4_classify_turn_rejects_bad_input(body: object, calls: object) -> None:
    with pytest.raises(LifecycleError):
        classify_turn(body, calls)  # type: ignore[arg-type]


def test_r4_4_no_progress_turn_ends_the_run_saying_no_answer_was_produced() -> None:
    decision = next_path(run_with(tool_turn(), no_progress()))
    assert decision.path is Path.SETTLE
    assert decision.settlement == Settlement(
        Outcome.FAILED, ReasonCode.NO_ANSWER_PRODUCED, NO_ANSWER_TEXT
    )
    assert "No answer was produced" in decision.reason
    assert not decision.dispatches


def test_r4_4_no_progress_ends_boundedly_even_with_reserve_and_committed_chunks() -> None:
    decision = next_path(run_with(committed(1), no_progress()))
    assert decision.path is Path.SETTLE  # not finalization, not another turn
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.PARTIAL
    assert decision.settlement.reason_code is ReasonCode.NO_ANSWER_PRODUCED


def test_r4_4_a_later_answer_cannot_turn_a_no_progress_run_into_completed() -> None:
    decision = next_path(run_with(no_progress(), committed(1), answered()))
    assert decision.settlement is not None
    assert decision.settlement.reason_code is ReasonCode.NO_ANSWER_PRODUCED


def test_r4_4_settlement_for_no_answer_can_never_be_completed() -> None:
    with pytest.raises(LifecycleError, match="never completed"):
        Settlement(Outcome.COMPLETED, ReasonCode.NO_ANSWER_PRODUCED, NO_ANSWER_TEXT)
