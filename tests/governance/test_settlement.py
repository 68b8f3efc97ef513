"""R6.5: the settlement is written once (governance.rules.settlement)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.decision_table import Decision, Path
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.run_facts import Phase
from governance.rules.settlement import (
    Outcome,
    ReasonCode,
    Settlement,
    SettlementConflictError,
    settle_once,
)
from governance.rules.transitions import IllegalTransitionError, apply_decision
from tests.governance.owner_facts import answered, cancel, committed, run_with, step

# ---------------------------------------------------------------------------
# R6.5 Settlement is written once


def test_r6_5_first_settlement_is_written() -> None:
    new = Settlement(Outcome.PARTIAL, ReasonCode.FINALIZATION_FAILED, "finalization failed")
    assert settle_once(None, new) is new


def test_r6_5_identical_repeat_is_idempotent() -> None:
    first = Settlement(Outcome.FAILED, ReasonCode.HARD_LIMIT, "limit")
    again = Settlement(Outcome.FAILED, ReasonCode.HARD_LIMIT, "limit")
    assert settle_once(first, again) is first


def test_r6_5_second_different_settlement_is_refused() -> None:
    first = Settlement(Outcome.CANCELLED, ReasonCode.CANCELLED, "user stop")
    other = Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "done")
    with pytest.raises(SettlementConflictError, match="already settled cancelled"):
        settle_once(first, other)
    assert issubclass(SettlementConflictError, ValueError)


def test_r6_5_settled_run_keeps_its_settlement_whatever_arrives_later() -> None:
    run, decision = step(run_with(), cancel())
    assert run.phase is Phase.SETTLED
    later, again = step(run, committed(3), answered())
    assert again.settlement == decision.settlement
    assert later.settlement is run.settlement
    with pytest.raises(SettlementConflictError):
        apply_decision(
            run,
            Decision(
                Path.SETTLE, "x", settlement=Settlement(Outcome.FAILED, ReasonCode.HARD_LIMIT, "x")
            ),
        )
    with pytest.raises(IllegalTransitionError, match="new, linked run"):
        apply_decision(run, Decision(Path.FINALIZATION_ONLY, "finalize after all"))


@pytest.mark.parametrize(
    "build",
    [
        lambda: Settlement(Outcome.CANCELLED, ReasonCode.HARD_LIMIT, "x"),
        lambda: Settlement(Outcome.FAILED, ReasonCode.CANCELLED, "x"),
        lambda: Settlement(Outcome.COMPLETED, ReasonCode.GOAL_SWAPPED, "x"),
        lambda: Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "x", unknown_effects=("k1",)),
        lambda: Settlement(Outcome.FAILED, ReasonCode.HARD_LIMIT, ""),
        lambda: Settlement("great", ReasonCode.ANSWERED, "x"),  # type: ignore[arg-type]
        lambda: Settlement(Outcome.FAILED, ReasonCode.HARD_LIMIT, "x", unknown_effects=["k"]),  # type: ignore[arg-type]
        lambda: settle_once(None, "completed"),  # type: ignore[arg-type]
    ],
)
def test_r6_5_malformed_settlements_are_rejected(build) -> None:
    with pytest.raises(LifecycleError):
        build()


_settlements = st.builds(
    Settlement,
    st.sampled_from([Outcome.PARTIAL, Outcome.FAILED]),
    st.sampled_from([ReasonCode.HARD_LIMIT, ReasonCode.FINALIZATION_FAILED]),
    st.sampled_from(["a", "b"]),
)


@settings(max_examples=200, deadline=None)
@given(_settlements, _settlements)
def test_r6_5_settle_once_keeps_the_first_or_refuses(first: Settlement, new: Settlement) -> None:
    if first == new:
        assert settle_once(first, new) is first
    else:
        with pytest.raises(SettlementConflictError):
            settle_once(first, new)
