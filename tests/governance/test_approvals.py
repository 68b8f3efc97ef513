"""A person approves the exact call (rules/approvals.py): R4.1 (the answer is
its owner's fact), R4.2 (a no is the call's result, not a veto), R6.1 (the
wait is its own clock: no-progress does not run, the deadline does)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from governance.rules import approvals as rules
from governance.rules.run_clocks import RunClockFacts, TimeoutName, watchdog_breach

T0 = datetime(2026, 3, 4, 5, 6, tzinfo=UTC)


@pytest.mark.parametrize(
    ("policy", "effect", "asked"),
    [
        ("never", "external_effect", False),
        ("never", "read_only", False),
        ("side_effects", "external_effect", True),
        ("side_effects", "", True),  # not known to be read-only: a side effect
        ("side_effects", "read_only", False),
        ("always", "read_only", True),
    ],
)
def test_r4_1_which_calls_wait_for_a_person(policy, effect, asked):
    assert rules.needs_approval(policy, effect) is asked


def test_r4_1_a_tools_own_policy_wins_over_its_servers():
    overrides = {"delete": "always", "read": "never"}
    assert rules.policy_for("side_effects", overrides, "delete") is rules.ApprovalPolicy.ALWAYS
    assert rules.policy_for("side_effects", overrides, "read") is rules.ApprovalPolicy.NEVER
    assert rules.policy_for("side_effects", overrides, "send") is rules.ApprovalPolicy.SIDE_EFFECTS
    assert rules.policy_for("", None, "send") is rules.ApprovalPolicy.NEVER


@pytest.mark.parametrize(
    ("required", "state", "step"),
    [
        (False, None, "perform"),
        (True, None, "ask"),
        (True, "pending", "wait"),
        (True, "approved", "perform"),
        (True, "denied", "refused"),
        (True, "expired", "refused"),
        # Asked under an earlier policy: the answer given stands.
        (False, "denied", "refused"),
        (False, "pending", "wait"),
    ],
)
def test_r4_2_what_a_delivery_does_about_approval(required, state, step):
    assert rules.approval_step(required, state) == step


def test_r4_2_a_no_is_the_calls_result_in_words_the_model_reads():
    said = rules.refusal_words(
        "denied", decided_by="olga", reason="not during the freeze", wait=timedelta(hours=1)
    )
    assert said == "not approved by olga: not during the freeze; the call was not made"
    expired = rules.refusal_words("expired", decided_by="", reason="", wait=timedelta(hours=1))
    assert expired == "not approved: no answer within 1 h; the call was not made"
    assert rules.wait_words(timedelta(minutes=90)) == "1 h 30 min"
    assert rules.wait_words(timedelta(minutes=15)) == "15 min"


def facts(**changes) -> rules.DecisionFacts:
    base = {
        "state": "pending", "expires_at": T0 + timedelta(hours=1), "approver_in_role": True,
        "approver_submitted_run": False, "four_eyes": False, "run_settled": False,
    }  # fmt: skip
    return rules.DecisionFacts(**{**base, **changes})


def test_r4_1_an_answer_counts_only_while_the_request_is_open_and_from_its_role():
    assert rules.decision_refusal(facts(), T0) is None
    assert rules.decision_refusal(facts(state="approved"), T0) == (409, "already approved")
    assert rules.decision_refusal(facts(), T0 + timedelta(hours=1))[0] == 409
    assert rules.decision_refusal(facts(run_settled=True), T0)[0] == 409
    status, words = rules.decision_refusal(facts(approver_in_role=False), T0)
    assert status == 403 and "permission" in words


def test_r4_1_four_eyes_forbids_approving_a_call_in_ones_own_run():
    assert rules.decision_refusal(facts(approver_submitted_run=True), T0) is None
    status, words = rules.decision_refusal(facts(approver_submitted_run=True, four_eyes=True), T0)
    assert status == 403 and "four eyes" in words


def test_r6_1_no_progress_does_not_run_while_a_person_is_asked_the_deadline_does():
    run = dict(run_started_at=T0, last_progress_at=T0, deadline_at=T0 + timedelta(hours=2))
    limit = timedelta(minutes=5)
    later = T0 + timedelta(minutes=30)
    assert watchdog_breach(later, RunClockFacts(**run), no_progress_limit=limit).name is (
        TimeoutName.NO_PROGRESS
    )
    assert watchdog_breach(later, RunClockFacts(**run, awaiting_person=True),
                           no_progress_limit=limit) is None  # fmt: skip
    past = T0 + timedelta(hours=2)
    asked = RunClockFacts(**run, awaiting_person=True)
    verdict = watchdog_breach(past, asked, no_progress_limit=limit)
    assert verdict.name is TimeoutName.DEADLINE_EXCEEDED


def test_r6_1_an_expiry_is_due_at_the_end_of_the_wait():
    assert not rules.expired("pending", T0, T0 - timedelta(seconds=1))
    assert rules.expired("pending", T0, T0)
    assert not rules.expired("approved", T0, T0 + timedelta(days=1))


def test_r3_6_one_notice_per_recorded_call_to_the_channels():
    notice = rules.approval_notice(
        key="k-1", tool="notify", run_id="r-1", segment_key="s#1", role="operator",
        requested_at=T0, expires_at=T0 + timedelta(hours=1),
    )  # fmt: skip
    assert notice.dedupe_key == "approval:k-1" and notice.severity == "normal"
    assert "notify" in notice.text and "operator" in notice.text
    assert "2026-03-04 06:06 UTC" in notice.text


def test_r4_1_a_request_waits_for_an_answer_while_open_and_its_run_goes_on():
    assert rules.waits_for_answer("pending", run_settled=False)
    assert not rules.waits_for_answer("pending", run_settled=True)
    assert not rules.waits_for_answer("approved", run_settled=False)
