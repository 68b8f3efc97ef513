"""R4.3: advisory inputs never block dispatch (governance.rules.dispatch)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.decision_table import next_path
from governance.rules.dispatch import dispatch_allowed
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.settlement import Outcome
from tests.governance.owner_facts import answered, cancel, committed, run_with

# ---------------------------------------------------------------------------
# R4.3 Advisory inputs never block


def test_r4_3_changed_research_needs_do_not_block_dispatch() -> None:
    verdict = dispatch_allowed(
        prepared_needs=("q1", "q2"),
        current_needs=("q1", "q3"),
        cancel_requested=False,
        permitted=True,
        budget_admitted=True,
    )
    assert verdict.allowed is True
    assert verdict.blocked_by == ()
    assert len(verdict.advisories) == 1 and "does not block" in verdict.advisories[0]


def test_r4_3_unchanged_needs_have_no_advisory() -> None:
    verdict = dispatch_allowed(
        prepared_needs=["q1"],
        current_needs=("q1",),
        cancel_requested=False,
        permitted=True,
        budget_admitted=True,
    )
    assert verdict.allowed and verdict.advisories == ()


@pytest.mark.parametrize(
    ("cancel_requested", "permitted", "budget_admitted", "words"),
    [
        (True, True, True, "asked to stop"),
        (False, False, True, "not permitted"),
        (False, True, False, "did not admit"),
    ],
)
def test_r4_3_objective_limits_still_block_dispatch(
    cancel_requested: bool, permitted: bool, budget_admitted: bool, words: str
) -> None:
    verdict = dispatch_allowed(
        prepared_needs=(),
        current_needs=(),
        cancel_requested=cancel_requested,
        permitted=permitted,
        budget_admitted=budget_admitted,
    )
    assert verdict.allowed is False
    assert any(words in b for b in verdict.blocked_by)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(max_size=5), max_size=4),
    st.lists(st.text(max_size=5), max_size=4),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_r4_3_only_objective_limits_decide_dispatch(
    prepared: list[str], current: list[str], cancelled: bool, permitted: bool, admitted: bool
) -> None:
    verdict = dispatch_allowed(
        prepared_needs=prepared,
        current_needs=current,
        cancel_requested=cancelled,
        permitted=permitted,
        budget_admitted=admitted,
    )
    assert verdict.allowed == (not cancelled and permitted and admitted)
    assert bool(verdict.advisories) == (prepared != current)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prepared_needs": "q1", "current_needs": ()},
        {"prepared_needs": (), "current_needs": (1,)},
        {"prepared_needs": (), "current_needs": (), "permitted": 1},
        {"prepared_needs": (), "current_needs": (), "cancel_requested": None},
    ],
)
def test_r4_3_dispatch_check_rejects_bad_input(kwargs: dict) -> None:
    full = {"cancel_requested": False, "permitted": True, "budget_admitted": True, **kwargs}
    with pytest.raises(LifecycleError):
        dispatch_allowed(**full)


def test_r4_3_a_stop_hook_is_not_an_input_of_the_decision_table_but_cancel_is() -> None:
    # The model proposed a legal completion and the body is committed: it settles completed…
    done = next_path(run_with(committed(1), answered()))
    assert done.settlement is not None and done.settlement.outcome is Outcome.COMPLETED
    # …unless an objective limit owned by the user stops it first.
    stopped = next_path(run_with(committed(1), answered(), cancel()))
    assert stopped.settlement is not None and stopped.settlement.outcome is Outcome.CANCELLED
