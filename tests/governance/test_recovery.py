"""R6.4: recovery eligibility (governance.rules.recovery)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.decision_table import Path, next_path
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.recovery import RecoveryCondition, RunAuthorization, recovery_eligibility
from tests.governance.owner_facts import AUTH, good_recovery, run_with, transient

# ---------------------------------------------------------------------------
# R6.4 Recovery eligibility, unknown effects, successor runs


def test_r6_4_all_five_conditions_hold() -> None:
    verdict = recovery_eligibility(good_recovery())
    assert verdict.eligible is True
    assert verdict.failed == ()


@pytest.mark.parametrize(
    ("bad", "condition"),
    [
        ({"resume_task_identity": "task-2"}, RecoveryCondition.SAME_TASK_IDENTITY),
        ({"checkpoint_usable": False}, RecoveryCondition.USABLE_CHECKPOINT),
        (
            {"resume_authorization": RunAuthorization("run-1", frozenset({"web"}))},
            RecoveryCondition.SAME_RUN_AUTHORIZATION,
        ),
        ({"remaining_balance": 0}, RecoveryCondition.REMAINING_BALANCE),
        ({"original_allows_safe_continuation": False}, RecoveryCondition.SAFE_CONTINUATION),
        ({"unknown_effect_keys": ("k1",)}, RecoveryCondition.SAFE_CONTINUATION),
    ],
)
def test_r6_4_each_failed_condition_is_named(bad: dict, condition: RecoveryCondition) -> None:
    verdict = recovery_eligibility(good_recovery(**bad))
    assert verdict.eligible is False
    assert verdict.failed == (condition,)


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.booleans(), st.booleans(), st.integers(0, 5), st.booleans())
def test_r6_4_eligible_exactly_when_every_condition_holds(
    same_task: bool, checkpoint: bool, same_auth: bool, balance: int, safe: bool
) -> None:
    other_auth = RunAuthorization("run-1", frozenset({"web"}))
    conditions = good_recovery(
        resume_task_identity="task-1" if same_task else "task-9",
        checkpoint_usable=checkpoint,
        resume_authorization=AUTH if same_auth else other_auth,
        remaining_balance=balance,
        original_allows_safe_continuation=safe,
    )
    expected = {
        RecoveryCondition.SAME_TASK_IDENTITY: same_task,
        RecoveryCondition.USABLE_CHECKPOINT: checkpoint,
        RecoveryCondition.SAME_RUN_AUTHORIZATION: same_auth,
        RecoveryCondition.REMAINING_BALANCE: balance > 0,
        RecoveryCondition.SAFE_CONTINUATION: safe,
    }
    verdict = recovery_eligibility(conditions)
    assert set(verdict.failed) == {c for c, holds in expected.items() if not holds}
    assert verdict.eligible == all(expected.values())


def test_r6_4_changed_permission_table_does_not_rejudge_a_running_run() -> None:
    # The table now lacks "calc", but the run keeps what was recorded at admission.
    conditions = good_recovery(permission_table_now=frozenset({"web"}))
    assert recovery_eligibility(conditions).eligible is True
    decision = next_path(run_with(transient(), recovery=conditions))
    assert decision.path is Path.BOUNDED_RECOVERY


@pytest.mark.parametrize(
    "bad",
    [
        {"remaining_balance": -1},
        {"remaining_balance": True},
        {"checkpoint_usable": "yes"},
        {"task_identity": ""},
        {"resume_authorization": "run-1"},
        {"unknown_effect_keys": ["k1"]},
    ],
)
def test_r6_4_bad_recovery_conditions_are_rejected(bad: dict) -> None:
    with pytest.raises(LifecycleError):
        good_recovery(**bad)
    with pytest.raises(LifecycleError):
        recovery_eligibility("all good")  # type: ignore[arg-type]
