"""R6.3: the decision table (governance.rules.decision_table), with R4.2 (a local
failure never gets a global veto) as it decides it, and its properties over
arbitrary fact sequences."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.answers import Answer
from governance.rules.authority import FactKind, OwnerFact
from governance.rules.decision_table import (
    DISPATCHING_PATHS,
    SEGMENT_SKIP_WORDS,
    Decision,
    Path,
    next_path,
)
from governance.rules.lifecycle_input import LifecycleError
from governance.rules.recovery import RunAuthorization
from governance.rules.run_facts import Phase, RunFacts, record_fact
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from governance.rules.transitions import (
    IllegalTransitionError,
    Stage,
    allowed_stages,
    apply_decision,
)
from tests.governance.owner_facts import (
    GOAL,
    answered,
    cancel,
    clock,
    commit_failed,
    committed,
    executor,
    exhausted,
    good_recovery,
    identity_invalid,
    no_eligible,
    no_progress,
    resource,
    run_with,
    step,
    tool_failed,
    tool_turn,
    transient,
    unknown,
    verified,
)

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


def test_r6_4_bounded_recovery_keeps_committed_versions_by_identity() -> None:
    decision = next_path(
        run_with(committed(1), committed(2), transient(), recovery=good_recovery())
    )
    assert decision.path is Path.BOUNDED_RECOVERY
    assert any("versions 1, 2" in k and "read back by identity" in k for k in decision.must_keep)


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


def test_r6_4_recovery_conditions_are_gathered_only_after_a_transient_failure() -> None:
    from governance.rules.decision_table import needs_recovery_conditions

    assert needs_recovery_conditions([transient()])
    # The latest provider fact decides; other owners' facts after it do not.
    assert needs_recovery_conditions([tool_turn(), transient(), tool_failed(), committed()])
    assert not needs_recovery_conditions([transient(), tool_turn()])
    assert not needs_recovery_conditions([tool_failed(), exhausted("tool_calls")])
    assert not needs_recovery_conditions([])
