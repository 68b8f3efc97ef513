"""Tests for governance.rules.lifecycle: termination authority (R4.1–R4.5) and the run
lifecycle's decision table, recovery and settlement (R6.3–R6.5)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.lifecycle import (
    AUTHORITY,
    DISPATCHING_PATHS,
    NO_ANSWER_TEXT,
    SEGMENT_SKIP_WORDS,
    Answer,
    Decision,
    EffectEvidence,
    EffectState,
    EvidenceKind,
    FactKind,
    IllegalTransitionError,
    LifecycleError,
    Outcome,
    OutsideAuthorityError,
    Owner,
    OwnerFact,
    Path,
    Phase,
    ReasonCode,
    RecoveryCondition,
    RecoveryConditions,
    ReplayAction,
    RunAuthorization,
    RunFacts,
    Settlement,
    SettlementConflictError,
    Stage,
    allowed_stages,
    answer_settlement,
    apply_decision,
    check_authority,
    classify_turn,
    dispatch_allowed,
    effect_state_after,
    next_path,
    record_fact,
    recovery_eligibility,
    replay_action,
    settle_once,
    successor_run,
)
from governance.rules.payloads import TurnPayload, VerifyEffectPayload

GOAL = "price of ACME today"
AUTH = RunAuthorization(run_id="run-1", scopes=frozenset({"web", "calc"}))

# ---------------------------------------------------------------------------
# Fact builders


def executor(kind: FactKind, subject: str = "op-1", key: str | None = None) -> OwnerFact:
    return OwnerFact(Owner.EXECUTOR, kind, subject, idempotency_key=key)


def tool_failed(subject: str = "search#1") -> OwnerFact:
    return executor(FactKind.OPERATION_FAILED, subject)


def unknown(key: str = "k1") -> OwnerFact:
    return executor(FactKind.EFFECT_UNKNOWN, f"op-{key}", key)


def verified(key: str = "k1", happened: bool = False) -> OwnerFact:
    kind = FactKind.EFFECT_HAPPENED if happened else FactKind.EFFECT_DID_NOT_HAPPEN
    return executor(kind, f"op-{key}", key)


def resource(kind: FactKind, name: str) -> OwnerFact:
    return OwnerFact(Owner.RESOURCE, kind, name)


def exhausted(name: str) -> OwnerFact:
    return resource(FactKind.RESOURCE_EXHAUSTED, name)


def committed(version: int = 1) -> OwnerFact:
    return OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "body-1", version=version)


def commit_failed() -> OwnerFact:
    return OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMIT_FAILED, "body-1")


def provider(kind: FactKind, **kw: object) -> OwnerFact:
    return OwnerFact(Owner.PROVIDER, kind, "openai", **kw)


def transient(failure_class: str = "server_error") -> OwnerFact:
    return provider(FactKind.TRANSIENT_FAILURE, failure_class=failure_class)


def answered(answer: Answer | None = None) -> OwnerFact:
    return provider(FactKind.TURN_ANSWERED, answer=answer or Answer(goal=GOAL))


def no_progress() -> OwnerFact:
    return provider(FactKind.TURN_WITHOUT_PROGRESS)


def tool_turn() -> OwnerFact:
    return provider(FactKind.TURN_CALLED_TOOLS)


def no_eligible() -> OwnerFact:
    return provider(FactKind.NO_ELIGIBLE_PROVIDER)


def cancel() -> OwnerFact:
    return OwnerFact(Owner.USER, FactKind.CANCEL_REQUESTED, "run-1")


def identity_invalid() -> OwnerFact:
    return OwnerFact(Owner.GUARD, FactKind.IDENTITY_INVALID, "lease-1")


def clock(kind: FactKind) -> OwnerFact:
    return OwnerFact(Owner.CLOCK, kind, "run-1")


def good_recovery(**changes: object) -> RecoveryConditions:
    base = RecoveryConditions(
        task_identity="task-1",
        resume_task_identity="task-1",
        checkpoint_usable=True,
        admitted_authorization=AUTH,
        resume_authorization=AUTH,
        remaining_balance=3,
        original_allows_safe_continuation=True,
    )
    return dataclasses.replace(base, **changes)


def run_with(*facts: OwnerFact, recovery: RecoveryConditions | None = None) -> RunFacts:
    return RunFacts(run_id="run-1", goal=GOAL, facts=tuple(facts), recovery=recovery)


def step(run: RunFacts, *facts: OwnerFact) -> tuple[RunFacts, Decision]:
    """Record facts, decide, apply: one lifecycle step as the runner would take it."""
    for fact in facts:
        run = record_fact(run, fact)
    decision = next_path(run)
    return apply_decision(run, decision), decision


def sample_fact(kind: FactKind) -> OwnerFact:
    """A valid fact of ``kind`` from its owner."""
    owner = next(o for o, kinds in AUTHORITY.items() if kind in kinds)
    extra: dict[str, object] = {}
    subject = "s-1"
    if kind in (FactKind.EFFECT_UNKNOWN, FactKind.EFFECT_HAPPENED, FactKind.EFFECT_DID_NOT_HAPPEN):
        extra["idempotency_key"] = "k1"
    if kind in (FactKind.RESOURCE_ADMITTED, FactKind.RESOURCE_EXHAUSTED):
        subject = "tool_calls"
    if kind is FactKind.BODY_COMMITTED:
        extra["version"] = 1
    if kind is FactKind.TRANSIENT_FAILURE:
        extra["failure_class"] = "timeout"
    if kind is FactKind.TURN_ANSWERED:
        extra["answer"] = Answer(goal=GOAL)
    return OwnerFact(owner, kind, subject, **extra)


OWNED_KINDS = sorted(set().union(*AUTHORITY.values()))
CONCLUSIONS = (
    FactKind.RUN_FAILED,
    FactKind.RUN_COMPLETED,
    FactKind.ANSWER_CORRECT,
    FactKind.PERMISSION_GRANTED,
    FactKind.RECEIPT_REWRITTEN,
)

# ---------------------------------------------------------------------------
# R4.1 Owners speak only for their own effect


@pytest.mark.parametrize("kind", OWNED_KINDS)
def test_r4_1_each_owner_may_report_its_own_facts(kind: FactKind) -> None:
    fact = sample_fact(kind)
    assert fact.kind is kind
    assert kind in AUTHORITY[fact.owner]


def test_r4_1_every_fact_kind_has_at_most_one_owner() -> None:
    owners_of = {k: [o for o, kinds in AUTHORITY.items() if k in kinds] for k in FactKind}
    assert all(len(owners) <= 1 for owners in owners_of.values())
    assert {k for k, owners in owners_of.items() if not owners} == set(CONCLUSIONS)


def test_r4_1_tool_cannot_say_the_run_failed() -> None:
    with pytest.raises(OutsideAuthorityError, match="run lifecycle"):
        OwnerFact(Owner.EXECUTOR, FactKind.RUN_FAILED, "search#1")
    assert issubclass(OutsideAuthorityError, ValueError)


@pytest.mark.parametrize("owner", list(Owner))
@pytest.mark.parametrize("kind", CONCLUSIONS)
def test_r4_1_no_owner_may_report_a_run_level_conclusion(owner: Owner, kind: FactKind) -> None:
    with pytest.raises(OutsideAuthorityError):
        check_authority(owner, kind, "run-1")


@pytest.mark.parametrize(
    ("owner", "kind"),
    [
        (Owner.EXECUTOR, FactKind.CANCEL_REQUESTED),  # a tool is not the user
        (Owner.PUBLICATION, FactKind.ANSWER_CORRECT),  # committed is not correct
        (Owner.RESOURCE, FactKind.RUN_COMPLETED),  # a balance does not complete a task
        (Owner.PROVIDER, FactKind.RESOURCE_EXHAUSTED),
        (Owner.USER, FactKind.BODY_COMMITTED),
        (Owner.CLOCK, FactKind.IDENTITY_INVALID),
    ],
)
def test_r4_1_owner_cannot_report_another_owners_fact(owner: Owner, kind: FactKind) -> None:
    with pytest.raises(OutsideAuthorityError):
        check_authority(owner, kind, "x")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(Owner)), st.sampled_from(list(FactKind)))
def test_r4_1_authority_check_accepts_exactly_the_table(owner: Owner, kind: FactKind) -> None:
    try:
        check_authority(owner, kind, "tool_calls")
        accepted = True
    except OutsideAuthorityError:
        accepted = False
    assert accepted == (kind in AUTHORITY[owner])


def test_r4_1_resource_ledger_speaks_only_for_its_own_resource() -> None:
    with pytest.raises(OutsideAuthorityError, match="its own resource"):
        OwnerFact(
            Owner.RESOURCE, FactKind.RESOURCE_EXHAUSTED, "model_requests", reporter="web_searches"
        )
    fact = OwnerFact(
        Owner.RESOURCE, FactKind.RESOURCE_EXHAUSTED, "web_searches", reporter="web_searches"
    )
    assert fact.subject == "web_searches"


def test_r4_1_plain_strings_are_normalised_to_enums() -> None:
    fact = OwnerFact("executor", "operation_failed", "op-1")  # type: ignore[arg-type]
    assert fact.owner is Owner.EXECUTOR
    assert fact.kind is FactKind.OPERATION_FAILED


@pytest.mark.parametrize(
    "build",
    [
        lambda: OwnerFact("janitor", FactKind.OPERATION_FAILED, "op"),  # type: ignore[arg-type]
        lambda: OwnerFact(Owner.EXECUTOR, "exploded", "op"),  # type: ignore[arg-type]
        lambda: OwnerFact(Owner.EXECUTOR, FactKind.OPERATION_FAILED, "  "),
        lambda: OwnerFact(Owner.EXECUTOR, FactKind.EFFECT_UNKNOWN, "op"),  # no key
        lambda: OwnerFact(Owner.RESOURCE, FactKind.RESOURCE_EXHAUSTED, "gold_coins"),
        lambda: OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "b"),  # no version
        lambda: OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "b", version=0),
        lambda: OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "b", version=True),
        lambda: OwnerFact(Owner.EXECUTOR, FactKind.OPERATION_FAILED, "op", version=2),
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TRANSIENT_FAILURE, "p"),  # no class
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TRANSIENT_FAILURE, "p", failure_class="refusal"),
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TRANSIENT_FAILURE, "p", failure_class="auth"),
        lambda: OwnerFact(
            Owner.PROVIDER, FactKind.NO_ELIGIBLE_PROVIDER, "p", failure_class="timeout"
        ),
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TURN_ANSWERED, "p"),  # no answer
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TURN_CALLED_TOOLS, "p", answer=Answer(GOAL)),
    ],
)
def test_r4_1_malformed_facts_are_rejected(build) -> None:
    with pytest.raises(ValueError):
        build()


# ---------------------------------------------------------------------------
# R4.2 A local failure never gets a global veto


def test_r4_2_one_tool_failed_others_usable_research_continues() -> None:
    decision = next_path(run_with(tool_turn(), tool_failed("search#1")))
    assert decision.path is Path.CONTINUE
    assert decision.settlement is None
    # R6.3 "must keep": the failure stays a failure, never an empty success.
    assert any(
        "search#1 failed" in k and "never turned into an empty success" in k
        for k in decision.must_keep
    )


def test_r4_2_refused_operation_is_kept_as_refused_and_research_continues() -> None:
    decision = next_path(run_with(executor(FactKind.OPERATION_REFUSED, "fetch#2")))
    assert decision.path is Path.CONTINUE
    assert any("fetch#2 was refused" in k for k in decision.must_keep)


def test_r4_2_search_quota_exhausted_refuses_only_new_searches() -> None:
    decision = next_path(run_with(exhausted("web_searches")))
    assert decision.path is Path.CONTINUE
    assert any(k.startswith("web_searches is exhausted: only new uses") for k in decision.must_keep)


def test_r4_2_failed_second_chunk_keeps_the_first_and_does_not_end_research() -> None:
    decision = next_path(run_with(committed(1), commit_failed()))
    assert decision.path is Path.CONTINUE


def test_r4_2_a_later_admission_restores_a_resource() -> None:
    run = run_with(
        exhausted("model_requests"), resource(FactKind.RESOURCE_ADMITTED, "model_requests")
    )
    assert next_path(run).path is Path.CONTINUE


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


# ---------------------------------------------------------------------------
# R6.3 Decision table


def test_r6_3_transient_failure_with_recovery_conditions_is_bounded_recovery() -> None:
    decision = next_path(run_with(transient("rate_limited"), recovery=good_recovery()))
    assert decision.path is Path.BOUNDED_RECOVERY
    assert "same task identity (task-1)" in decision.must_keep
    assert any("no new quota" in k for k in decision.must_keep)


@pytest.mark.parametrize(
    "bad",
    [
        {"resume_task_identity": "task-2"},
        {"checkpoint_usable": False},
        {"resume_authorization": RunAuthorization("run-1", frozenset({"web", "calc", "admin"}))},
        {"remaining_balance": 0},
        {"original_allows_safe_continuation": False},
    ],
)
def test_r6_3_transient_failure_without_recovery_conditions_goes_to_finalization(
    bad: dict,
) -> None:
    decision = next_path(run_with(transient(), recovery=good_recovery(**bad)))
    assert decision.path is Path.FINALIZATION_ONLY
    assert "it is not retried" in decision.reason


def test_r6_3_transient_failure_with_no_recorded_conditions_is_not_recovered() -> None:
    decision = next_path(run_with(transient()))
    assert decision.path is Path.FINALIZATION_ONLY


def test_r6_3_transient_failure_without_recovery_or_reserve_settles() -> None:
    decision = next_path(run_with(exhausted("output_reserve"), transient()))
    assert decision.settlement is not None
    assert decision.settlement.reason_code is ReasonCode.WORK_CANNOT_CONTINUE
    assert decision.settlement.outcome is Outcome.FAILED


def test_r6_3_recovered_turn_clears_the_transient_state() -> None:
    run = run_with(transient(), tool_turn(), recovery=good_recovery())
    assert next_path(run).path is Path.CONTINUE


@pytest.mark.parametrize(
    "trigger", [exhausted("model_requests"), clock(FactKind.NO_PROGRESS_TIMEOUT)]
)
def test_r6_3_ordinary_work_cannot_continue_but_reserve_holds_finalizes(
    trigger: OwnerFact,
) -> None:
    run, decision = step(run_with(tool_turn()), trigger)
    assert decision.path is Path.FINALIZATION_ONLY
    assert any("one way" in k for k in decision.must_keep)
    assert any("accepted material only" in k for k in decision.must_keep)
    assert allowed_stages(decision) == frozenset({Stage.ANSWER})
    assert run.phase is Phase.FINALIZATION
    assert run.finalization_from == 2


def test_r6_3_no_work_and_no_reserve_settles_with_what_was_committed() -> None:
    run = run_with(committed(1), exhausted("output_reserve"), exhausted("model_requests"))
    decision = next_path(run)
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.PARTIAL
    assert any("versions 1" in k for k in decision.must_keep)


def _finalizing_run() -> RunFacts:
    run, decision = step(run_with(committed(1)), exhausted("model_requests"))
    assert decision.path is Path.FINALIZATION_ONLY
    return run


def test_r6_3_finalization_proceeds_once_and_is_not_re_entered() -> None:
    run = _finalizing_run()
    start = run.finalization_from
    run, decision = step(run, resource(FactKind.RESOURCE_ADMITTED, "output_reserve"))
    assert decision.path is Path.FINALIZATION_ONLY
    assert run.finalization_from == start


@pytest.mark.parametrize(
    "failure",
    [
        transient(),
        no_progress(),
        tool_turn(),
        commit_failed(),
        clock(FactKind.NO_PROGRESS_TIMEOUT),
        exhausted("output_reserve"),
    ],
)
def test_r6_3_failed_finalization_settles_and_never_recovers(failure: OwnerFact) -> None:
    run = dataclasses.replace(_finalizing_run(), recovery=good_recovery())
    run, decision = step(run, failure)
    assert decision.path is Path.SETTLE
    assert decision.settlement is not None
    assert decision.settlement.reason_code is ReasonCode.FINALIZATION_FAILED
    assert decision.settlement.outcome is Outcome.PARTIAL  # version 1 was committed
    assert "second finalization" in decision.reason


def test_r6_3_failed_finalization_with_nothing_committed_is_failed() -> None:
    run, _ = step(run_with(), exhausted("model_requests"))
    _, decision = step(run, transient())
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.FAILED


def test_r6_3_finalization_answer_settles_partial_when_it_states_gaps() -> None:
    gaps = Answer(goal=GOAL, stated_gaps=("sources after noon not read",), narrowed=True)
    _, decision = step(_finalizing_run(), committed(2), answered(gaps))
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.PARTIAL
    assert decision.settlement.reason_code is ReasonCode.ANSWERED_WITH_GAPS


def test_r6_3_finalization_cannot_return_to_research() -> None:
    run = _finalizing_run()
    for path in (Path.CONTINUE, Path.BOUNDED_RECOVERY):
        with pytest.raises(IllegalTransitionError, match="one way"):
            apply_decision(run, Decision(path=path, reason="try research again"))


def test_r6_3_cancel_settles_cancelled_without_new_dispatch() -> None:
    decision = next_path(run_with(transient(), cancel(), recovery=good_recovery()))
    assert decision.path is Path.SETTLE
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.CANCELLED
    assert not decision.dispatches
    assert allowed_stages(decision) == frozenset()


def test_r6_3_cancel_comes_first_and_leaves_unknown_effects_unknown() -> None:
    decision = next_path(run_with(unknown("k1"), cancel()))
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.CANCELLED
    assert decision.settlement.unknown_effects == ("k1",)
    assert any("k1 stays unknown" in k for k in decision.must_keep)


@pytest.mark.parametrize(
    ("fact", "code"),
    [
        (identity_invalid(), ReasonCode.IDENTITY_INVALID),
        (clock(FactKind.DEADLINE_EXCEEDED), ReasonCode.DEADLINE_EXCEEDED),
        (resource(FactKind.HARD_LIMIT_REACHED, "run_total_cost"), ReasonCode.HARD_LIMIT),
    ],
)
def test_r6_3_hard_limits_and_invalid_identity_stop_and_settle(
    fact: OwnerFact, code: ReasonCode
) -> None:
    decision = next_path(run_with(tool_turn(), fact, recovery=good_recovery()))
    assert decision.settlement is not None
    assert decision.settlement.reason_code is code
    assert decision.settlement.outcome is Outcome.FAILED
    assert not decision.dispatches
    with_body = next_path(run_with(committed(1), fact))
    assert with_body.settlement is not None
    assert with_body.settlement.outcome is Outcome.PARTIAL


def test_r6_3_unknown_effect_is_verified_by_its_executor_before_anything_else() -> None:
    decision = next_path(run_with(unknown("k1"), transient(), recovery=good_recovery()))
    assert decision.path is Path.VERIFY_EFFECT
    assert decision.verify_keys == ("k1",)
    assert any("no blind replay" in k for k in decision.must_keep)
    assert not decision.dispatches


def test_r6_3_verified_effect_unblocks_the_run() -> None:
    run, first = step(run_with(), unknown("k1"))
    assert first.path is Path.VERIFY_EFFECT
    _, second = step(run, verified("k1", happened=False))
    assert second.path is Path.CONTINUE


def test_r6_3_executor_receipt_for_the_same_key_resolves_but_a_failure_does_not() -> None:
    receipt = executor(FactKind.OPERATION_SUCCEEDED, "op-k1", "k1")
    assert next_path(run_with(unknown("k1"), receipt)).path is Path.CONTINUE
    failure = executor(FactKind.OPERATION_FAILED, "op-k1", "k1")
    assert next_path(run_with(unknown("k1"), failure)).path is Path.VERIFY_EFFECT
    other_key = verified("k2")
    assert next_path(run_with(unknown("k1"), other_key)).verify_keys == ("k1",)


def test_r6_3_unknown_effect_blocks_completion_until_verified() -> None:
    run = run_with(unknown("k1"), committed(1), answered())
    assert next_path(run).path is Path.VERIFY_EFFECT
    decision = next_path(record_fact(run, verified("k1", happened=True)))
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.COMPLETED


def test_r6_3_no_eligible_provider_settles_honestly_with_a_critical_alert() -> None:
    decision = next_path(run_with(tool_turn(), no_eligible()))
    assert decision.path is Path.SETTLE
    assert decision.critical_alert is True
    assert decision.boundary_action_needed is not None
    for action in ("compact", "fresh start", "switch model"):
        assert action in decision.boundary_action_needed
    assert decision.settlement is not None
    assert decision.settlement.reason_code is ReasonCode.NO_ELIGIBLE_PROVIDER
    assert decision.settlement.outcome is Outcome.FAILED


def test_r6_3_no_eligible_provider_copy_speaks_with_one_voice() -> None:
    # R3.7: the same words everywhere; nothing claims "never again".
    decision = next_path(run_with(no_eligible()))
    assert SEGMENT_SKIP_WORDS in decision.reason
    assert "never again" not in decision.reason.lower()


def test_r6_3_no_eligible_provider_during_finalization_also_alerts() -> None:
    _, decision = step(_finalizing_run(), no_eligible())
    assert decision.critical_alert is True
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.PARTIAL


def test_r6_3_answer_not_committed_is_not_completed() -> None:
    decision = next_path(run_with(answered()))
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.FAILED
    assert decision.settlement.reason_code is ReasonCode.NO_BODY_COMMITTED


def test_r6_3_answer_whose_save_ended_partial_settles_partial() -> None:
    decision = next_path(run_with(committed(1), answered(), commit_failed()))
    assert decision.settlement is not None
    assert decision.settlement.outcome is Outcome.PARTIAL
    assert decision.settlement.reason_code is ReasonCode.BODY_SAVE_PARTIAL


def test_r6_3_dispatching_paths() -> None:
    assert (
        frozenset({Path.CONTINUE, Path.BOUNDED_RECOVERY, Path.FINALIZATION_ONLY})
        == DISPATCHING_PATHS
    )
    assert allowed_stages(Decision(Path.CONTINUE, "go")) == frozenset(Stage)
    assert allowed_stages(Decision(Path.VERIFY_EFFECT, "check", verify_keys=("k",))) == frozenset()


@pytest.mark.parametrize(
    "build",
    [
        lambda: Decision(Path.SETTLE, "stop"),  # no settlement
        lambda: Decision(
            Path.CONTINUE, "go", settlement=Settlement(Outcome.FAILED, ReasonCode.HARD_LIMIT, "x")
        ),
        lambda: Decision(Path.VERIFY_EFFECT, "check"),  # no keys
        lambda: Decision(Path.CONTINUE, "go", verify_keys=("k",)),
        lambda: Decision(Path.CONTINUE, "go", critical_alert=True),  # no boundary action
        lambda: Decision(Path.CONTINUE, ""),
        lambda: Decision("wander", "go"),  # type: ignore[arg-type]
        lambda: Decision(Path.CONTINUE, "go", must_keep=["x"]),  # type: ignore[arg-type]
    ],
)
def test_r6_3_malformed_decisions_are_rejected(build) -> None:
    with pytest.raises(LifecycleError):
        build()


@pytest.mark.parametrize(
    "build",
    [
        lambda: RunFacts(run_id="", goal=GOAL),
        lambda: RunFacts(run_id="r", goal=" "),
        lambda: RunFacts(run_id="r", goal=GOAL, facts=[tool_failed()]),  # type: ignore[arg-type]
        lambda: RunFacts(run_id="r", goal=GOAL, phase=Phase.FINALIZATION),
        lambda: RunFacts(run_id="r", goal=GOAL, finalization_from=0),
        lambda: RunFacts(run_id="r", goal=GOAL, phase=Phase.FINALIZATION, finalization_from=3),
        lambda: RunFacts(run_id="r", goal=GOAL, phase=Phase.SETTLED),
        lambda: RunFacts(run_id="r", goal=GOAL, phase="paused"),  # type: ignore[arg-type]
        lambda: RunFacts(run_id="r", goal=GOAL, recovery="ok"),  # type: ignore[arg-type]
        lambda: record_fact(RunFacts(run_id="r", goal=GOAL), "tool failed"),  # type: ignore[arg-type]
        lambda: next_path("run"),  # type: ignore[arg-type]
        lambda: apply_decision(RunFacts(run_id="r", goal=GOAL), "continue"),  # type: ignore[arg-type]
    ],
)
def test_r6_3_malformed_run_facts_are_rejected(build) -> None:
    with pytest.raises(LifecycleError):
        build()


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


@pytest.mark.parametrize(
    "kind",
    [
        EvidenceKind.TIMEOUT,
        EvidenceKind.READ_ONLY_LABEL,
        EvidenceKind.MODEL_SAYS_TRY_AGAIN,
        EvidenceKind.NO_RESPONSE,
    ],
)
def test_r6_4_timeout_label_or_model_retry_is_not_proof(kind: EvidenceKind) -> None:
    state = effect_state_after("k1", EffectEvidence(kind, idempotency_key="k1"))
    assert state is EffectState.UNKNOWN
    assert replay_action(state) is ReplayAction.VERIFY_FIRST
    with pytest.raises(LifecycleError, match="not proof"):
        EffectEvidence(kind, found=False)


@pytest.mark.parametrize(
    ("found", "state", "action"),
    [
        (True, EffectState.HAPPENED, ReplayAction.READ_BACK),
        (False, EffectState.DID_NOT_HAPPEN, ReplayAction.REPLAY_SAME_KEY),
    ],
)
def test_r6_4_executor_lookup_by_key_is_proof(
    found: bool, state: EffectState, action: ReplayAction
) -> None:
    evidence = EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, idempotency_key="k1", found=found)
    assert effect_state_after("k1", evidence) is state
    assert replay_action(state) is action


def test_r6_4_lookup_for_another_key_proves_nothing() -> None:
    evidence = EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, idempotency_key="k2", found=False)
    with pytest.raises(LifecycleError, match="another operation"):
        effect_state_after("k1", evidence)


@pytest.mark.parametrize(
    "build",
    [
        lambda: EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, found=True),  # no key
        lambda: EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, idempotency_key="k1"),  # no result
        lambda: EffectEvidence("hunch"),  # type: ignore[arg-type]
        lambda: effect_state_after("", EffectEvidence(EvidenceKind.TIMEOUT)),
        lambda: effect_state_after("k1", "timeout"),  # type: ignore[arg-type]
        lambda: replay_action("maybe"),  # type: ignore[arg-type]
    ],
)
def test_r6_4_bad_effect_evidence_is_rejected(build) -> None:
    with pytest.raises(LifecycleError):
        build()


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


def test_r6_4_bounded_recovery_keeps_committed_versions_by_identity() -> None:
    decision = next_path(
        run_with(committed(1), committed(2), transient(), recovery=good_recovery())
    )
    assert decision.path is Path.BOUNDED_RECOVERY
    assert any("versions 1, 2" in k and "read back by identity" in k for k in decision.must_keep)


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


# ---------------------------------------------------------------------------
# Property tests over arbitrary fact sequences (R6.3, R4.4, R6.5)

FACT_POOL = (
    tool_failed(),
    executor(FactKind.OPERATION_REFUSED, "fetch#1"),
    executor(FactKind.OPERATION_SUCCEEDED, "op-k1", "k1"),
    unknown("k1"),
    unknown("k2"),
    verified("k1", happened=True),
    verified("k2", happened=False),
    executor(FactKind.PLANNING_FAILED, "plan-1"),
    exhausted("model_requests"),
    exhausted("output_reserve"),
    exhausted("web_searches"),
    resource(FactKind.RESOURCE_ADMITTED, "model_requests"),
    resource(FactKind.HARD_LIMIT_REACHED, "run_total_cost"),
    committed(1),
    committed(2),
    commit_failed(),
    tool_turn(),
    answered(),
    answered(Answer(goal=GOAL, stated_gaps=("gap",), narrowed=True)),
    answered(Answer(goal="an easier question")),
    no_progress(),
    transient(),
    transient("rate_limited"),
    no_eligible(),
    cancel(),
    identity_invalid(),
    clock(FactKind.DEADLINE_EXCEEDED),
    clock(FactKind.NO_PROGRESS_TIMEOUT),
)

# Weight the sequence towards the ordinary run facts so paths other than settle are reached.
_COMMON = (*FACT_POOL[:4], committed(1), tool_turn(), transient(), unknown("k1"), verified("k1"))
_fact_sequences = st.lists(
    st.one_of(st.sampled_from(_COMMON), st.sampled_from(FACT_POOL)), min_size=1, max_size=14
)


def _simulate(facts: list[OwnerFact], recoverable: bool) -> list[tuple[RunFacts, Decision]]:
    """Record each fact, decide, apply; return (run before applying, decision) per step."""
    recovery = good_recovery(checkpoint_usable=recoverable)
    run = run_with(recovery=recovery)
    steps = []
    for fact in facts:
        run = record_fact(run, fact)
        decision = next_path(run)
        steps.append((run, decision))
        run = apply_decision(run, decision)
    return steps


def _model_outstanding(facts: tuple[OwnerFact, ...]) -> set[str]:
    outstanding: set[str] = set()
    for fact in facts:
        if fact.kind is FactKind.EFFECT_UNKNOWN:
            outstanding.add(fact.idempotency_key or "")
        elif fact.kind in (
            FactKind.EFFECT_HAPPENED,
            FactKind.EFFECT_DID_NOT_HAPPEN,
            FactKind.OPERATION_SUCCEEDED,
        ):
            outstanding.discard(fact.idempotency_key or "")
    return outstanding


@settings(max_examples=200, deadline=None)
@given(_fact_sequences, st.booleans())
def test_r6_3_finalization_is_one_way_for_any_fact_sequence(
    facts: list[OwnerFact], recoverable: bool
) -> None:
    entered_at: int | None = None
    for run, decision in _simulate(facts, recoverable):
        if run.finalization_from is not None:
            entered_at = entered_at if entered_at is not None else run.finalization_from
            assert run.finalization_from == entered_at  # never a second finalization
            assert decision.path not in (Path.CONTINUE, Path.BOUNDED_RECOVERY)


@settings(max_examples=200, deadline=None)
@given(_fact_sequences, st.booleans())
def test_r6_3_unknown_effect_gets_no_dispatch_until_verified(
    facts: list[OwnerFact], recoverable: bool
) -> None:
    for run, decision in _simulate(facts, recoverable):
        if run.settlement is not None:
            continue
        outstanding = _model_outstanding(run.facts)
        if outstanding:
            assert decision.path in (Path.VERIFY_EFFECT, Path.SETTLE)
            assert not decision.dispatches
            if decision.settlement is not None:
                assert set(decision.settlement.unknown_effects) == outstanding
                assert decision.settlement.outcome is not Outcome.COMPLETED
            else:
                assert set(decision.verify_keys) == outstanding


@settings(max_examples=200, deadline=None)
@given(_fact_sequences, st.booleans())
def test_r6_3_cancelled_run_never_dispatches(facts: list[OwnerFact], recoverable: bool) -> None:
    cancelled_while_running = False
    for run, decision in _simulate(facts, recoverable):
        if run.facts[-1].kind is FactKind.CANCEL_REQUESTED and run.settlement is None:
            cancelled_while_running = True
        if cancelled_while_running:
            assert not decision.dispatches
            assert decision.settlement is not None
            assert decision.settlement.outcome is Outcome.CANCELLED


@settings(max_examples=200, deadline=None)
@given(_fact_sequences, st.booleans())
def test_r4_4_no_progress_turn_is_never_settled_completed(
    facts: list[OwnerFact], recoverable: bool
) -> None:
    ending = (FactKind.TURN_ANSWERED, FactKind.TURN_WITHOUT_PROGRESS)
    no_progress_seen = False
    final: Settlement | None = None
    for run, decision in _simulate(facts, recoverable):
        latest = run.facts[-1]
        if run.settlement is None and latest.kind in ending and not no_progress_seen:
            # Only the first turn that ends the work matters (an answer before it settles).
            earlier_ending = any(f.kind in ending for f in run.facts[:-1])
            no_progress_seen = latest.kind is FactKind.TURN_WITHOUT_PROGRESS and not earlier_ending
        if no_progress_seen:
            assert not decision.dispatches
        final = decision.settlement or final
    if no_progress_seen and final is not None:
        assert final.outcome is not Outcome.COMPLETED


@settings(max_examples=200, deadline=None)
@given(_fact_sequences, st.booleans())
def test_r6_5_settlement_never_changes_once_written(
    facts: list[OwnerFact], recoverable: bool
) -> None:
    first: Settlement | None = None
    for run, decision in _simulate(facts, recoverable):
        if run.settlement is not None:
            assert first is not None
            assert decision.settlement == first
        elif decision.settlement is not None:
            first = decision.settlement


# ---------------------------------------------------------------------------
# R6.3 follow-ups: the one stage a decision starts


def _follow(decision: Decision, next_work=None, **kw: object):
    from governance.rules.lifecycle import follow_up

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


def test_r6_4_recovery_conditions_are_gathered_only_after_a_transient_failure() -> None:
    from governance.rules.lifecycle import needs_recovery_conditions

    assert needs_recovery_conditions([transient()])
    # The latest provider fact decides; other owners' facts after it do not.
    assert needs_recovery_conditions([tool_turn(), transient(), tool_failed(), committed()])
    assert not needs_recovery_conditions([transient(), tool_turn()])
    assert not needs_recovery_conditions([tool_failed(), exhausted("tool_calls")])
    assert not needs_recovery_conditions([])
