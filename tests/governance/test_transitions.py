"""R6.3, R6.4: moving a run along its path (governance.rules.transitions): the one
stage a decision starts and the linked run after a settlement."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.decision_table import Decision, Path, next_path
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.payloads import TurnPayload, VerifyEffectPayload
from governance.rules.settlement import Outcome
from governance.rules.transitions import successor_run
from tests.governance.owner_facts import (
    cancel,
    exhausted,
    good_recovery,
    run_with,
    step,
    tool_failed,
    tool_turn,
    transient,
    unknown,
)


def test_r6_4_continuing_after_settlement_needs_a_linked_new_run() -> None:
    settled, _ = step(run_with(tool_turn()), cancel())
    link = successor_run(settled, "run-2", "user asked to resume with a narrower scope")
    assert link.run_id == "run-2"
    assert link.caused_by_run_id == "run-1"
    assert link.caused_by_outcome is Outcome.CANCELLED
    # Admitted independently: the link carries no balance and no authorization.
    names = {f.name for f in dataclasses.fields(link)}
    assert not names & {"remaining_balance", "authorization", "admitted_authorization"}


@pytest.mark.parametrize(("new_id", "reason"), [("run-1", "again"), ("", "again"), ("run-2", " ")])
def test_r6_4_successor_needs_its_own_id_and_a_reason(new_id: str, reason: str) -> None:
    settled, _ = step(run_with(), cancel())
    with pytest.raises(LifecycleError):
        successor_run(settled, new_id, reason)


def test_r6_4_a_running_run_has_no_successor() -> None:
    with pytest.raises(LifecycleError, match="has not settled"):
        successor_run(run_with(tool_turn()), "run-2", "continue")
    with pytest.raises(LifecycleError):
        successor_run("run-1", "run-2", "continue")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# R6.3 follow-ups: the one stage a decision starts


def _follow(decision: Decision, next_work=None, **kw: object):
    from governance.rules.transitions import follow_up

    kw.setdefault("last_increment", ())
    kw.setdefault("finalization_started", False)
    return follow_up(decision, next_work, **kw)


WAYS = {
    "next": {"kind": "model_turn", "payload": {"increment": []}},
    "replay": {"kind": "tool_call", "payload": {"index": 0, "replay": True}},
}


def test_r6_3_verify_starts_a_verification_that_keeps_both_ways_on_and_counts() -> None:
    decision = next_path(run_with(unknown("k1")))
    assert decision.path is Path.VERIFY_EFFECT
    first = _follow(decision, WAYS, verify_delay_s=5.0)
    assert (first.kind, first.countdown_s) == ("verify_effect", 5.0)
    assert first.payload == VerifyEffectPayload(keys=("k1",), resume=WAYS, attempt=1)
    # A repeated verification keeps the original ways on, not the verify stage's own work.
    again = _follow(decision, WAYS["next"], verification=(WAYS, 1))
    assert again.payload == VerifyEffectPayload(keys=("k1",), resume=WAYS, attempt=2)


def test_r6_3_finalization_only_starts_the_one_finalization_and_never_a_second() -> None:
    decision = next_path(run_with(exhausted("model_requests")))
    assert decision.path is Path.FINALIZATION_ONLY
    tool_work = {"kind": "tool_call", "payload": {"calls": []}}
    first = _follow(decision, tool_work, last_increment=[{"role": "tool", "content": "x"}])
    assert (first.kind, first.payload) == ("finalization", TurnPayload(increment=()))
    assert _follow(decision, tool_work, finalization_started=True) is None


def test_r6_3_bounded_recovery_resends_the_same_turn_inside_the_original_mechanism() -> None:
    decision = next_path(run_with(transient(), recovery=good_recovery()))
    assert decision.path is Path.BOUNDED_RECOVERY
    increment = [{"role": "tool", "tool_call_id": "c1", "content": "x"}]
    follow = _follow(decision, None, last_increment=increment, recovery_delay_s=30.0)
    assert follow.kind == "model_turn" and follow.countdown_s == 30.0
    assert follow.payload == TurnPayload(increment=tuple(increment), recovery=True)
    assert follow.payload.increment[0] is not increment[0]


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.floats(min_value=0, max_value=1e4, allow_nan=False),
)
def test_r6_3_a_recovery_waits_never_less_than_zero_and_never_past_its_cap(delay, cap) -> None:
    decision = Decision(Path.BOUNDED_RECOVERY, "recover")
    follow = _follow(decision, recovery_delay_s=delay, max_recovery_wait_s=cap)
    assert 0.0 <= follow.countdown_s <= cap
    if 0.0 <= delay <= cap:
        assert follow.countdown_s == delay
    elif delay < 0:
        assert follow.countdown_s == 0.0
    else:
        assert follow.countdown_s == cap


def test_r6_3_continue_starts_the_next_work_and_settling_starts_nothing() -> None:
    decision = next_path(run_with(tool_failed()))
    assert decision.path is Path.CONTINUE
    work = {"kind": "tool_call", "payload": {"index": 1}}
    follow = _follow(decision, work)
    assert (follow.kind, dict(follow.payload), follow.countdown_s) == (
        "tool_call",
        {"index": 1},
        0.0,
    )
    assert _follow(decision, None) is None
    settled = next_path(run_with(cancel()))
    assert _follow(settled, work, recovery_delay_s=5.0, last_increment=[{"x": 1}]) is None


def test_r6_3_r4_5_a_decision_never_starts_a_stage_it_does_not_allow() -> None:
    """R6.3/R4.5: every stage started is one the decision allows. A continue
    decision cannot start a verification stage (only the verify path does):
    that is an illegal transition, reported as such."""
    decision = next_path(run_with(tool_failed()))
    with pytest.raises(LifecycleError):
        _follow(decision, {"kind": "verify_effect", "payload": {"keys": ["k1"]}})
