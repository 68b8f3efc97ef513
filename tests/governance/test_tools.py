"""Tests for governance.rules.tools: what a tool call and an effect verification
conclude (R4.1 the executor's fact, R5.4 one key per call, R6.1 a receipt is
progress, R6.3 continue / verify, R6.4 read back, verify, replay with the same key).

The lifecycle is asked the way ``services.stages.close_stage`` asks it: the
conclusion's facts are recorded, ``next_path`` decides and ``follow_up`` names
the next stage.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.authority import FactKind, Owner, OwnerFact
from governance.rules.decision_table import Decision, Path, next_path
from governance.rules.effects import EffectState, EvidenceKind, effect_state_after
from governance.rules.payloads import ToolCallPayload, TurnPayload, VerifyEffectPayload
from governance.rules.run_facts import RunFacts
from governance.rules.settlement import Outcome, ReasonCode
from governance.rules.tools import (
    EFFECT_FACT_KINDS,
    MAX_VERIFICATIONS,
    TOOL_MESSAGE_MAX_CHARS,
    ReceiptVerdict,
    conclude_tool_call,
    conclude_verification,
    effect_evidence,
    receipt_step,
    tool_key,
    tool_message,
)
from governance.rules.transitions import follow_up
from governance.rules.turns import ReceiptClose, quarantinable, turn_increment

GOAL = "notify the billing system"
SEARCH = {"id": "c1", "name": "search", "arguments": {"q": "ACME"}}
HOOK = {"id": "c2", "name": "webhook", "arguments": {"url": "https://example.test/hook"}}
EFFECTS = ("succeeded", "failed", "refused", "unknown")


def payload(*calls: dict[str, Any], index: int = 0, results=(), **extra: Any) -> ToolCallPayload:
    return ToolCallPayload(
        calls=tuple(calls or (SEARCH, HOOK)),
        index=index,
        results=tuple(results),
        turn_stage=7,
        **extra,
    )


def key_of(p: ToolCallPayload) -> str:
    return tool_key("run-1", p.turn_stage, p.index, p.call["id"])


def call_tool(p: ToolCallPayload, effect: str, output: Any = None, error: str = "", **kw: Any):
    return conclude_tool_call(p, effect=effect, output=output, error=error, key=key_of(p), **kw)


def decide(*facts: OwnerFact) -> Decision:
    return next_path(RunFacts(run_id="run-1", goal=GOAL, facts=tuple(facts)))


# =========================================================================== R6.4 keys


def test_r5_4_r6_4_tool_key_is_stable_across_redelivery_and_names_turn_and_position():
    assert tool_key("r", 7, 0, "c1") == tool_key("r", 7, 0, "c1")
    # Call ids are not unique: the same id at two positions or in two turns is two calls.
    assert tool_key("r", 7, 0, "c1") != tool_key("r", 7, 1, "c1")
    assert tool_key("r", 7, 0, "c1") != tool_key("r", 8, 0, "c1")
    assert tool_key("r", 7, 0, "c1") != tool_key("s", 7, 0, "c1")
    assert tool_key("r", 7, 0, "") != tool_key("r", 7, 0, "c1")


@settings(max_examples=200, deadline=None)
@given(
    st.tuples(st.integers(0, 50), st.integers(0, 20), st.text(max_size=8)),
    st.tuples(st.integers(0, 50), st.integers(0, 20), st.text(max_size=8)),
)
def test_r5_4_distinct_calls_of_a_run_get_distinct_keys(one, other):
    assert (tool_key("run-1", *one) == tool_key("run-1", *other)) == (one == other)


# =========================================================================== R6.4 receipt steps


@pytest.mark.parametrize("effect", EFFECTS)
@pytest.mark.parametrize("external", [True, False])
@pytest.mark.parametrize("verified_replay", [True, False])
def test_r6_4_a_closed_receipt_is_read_back_never_re_performed(effect, external, verified_replay):
    step = receipt_step(effect, external=external, verified_replay=verified_replay)
    assert step == "read_back"


@pytest.mark.parametrize("external", [True, False])
@pytest.mark.parametrize("verified_replay", [True, False])
def test_r6_4_a_receipt_this_delivery_wrote_is_performed(external, verified_replay):
    assert receipt_step(None, external=external, verified_replay=verified_replay) == "perform"


def test_r6_4_a_pending_external_receipt_is_verified_before_any_replay():
    """A pending receipt left by an earlier delivery may have had its effect: no
    blind replay. Only the executor's proof that it did not happen lets the same
    key be performed again."""
    assert receipt_step("pending", external=True, verified_replay=False) == "verify"
    assert receipt_step("pending", external=True, verified_replay=True) == "perform"


def test_r6_4_a_pending_read_only_builtin_has_no_external_effect_to_repeat():
    assert receipt_step("pending", external=False, verified_replay=False) == "perform"


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([None, "pending", *EFFECTS]), st.booleans(), st.booleans())
def test_r6_4_an_external_effect_that_may_have_happened_is_never_performed_blindly(
    effect, external, verified_replay
):
    step = receipt_step(effect, external=external, verified_replay=verified_replay)
    if step == "perform" and effect is not None:
        # The only re-performance of a receipt someone else wrote: a read-only
        # built-in, or an external call the executor proved did not happen.
        assert effect == "pending" and (not external or verified_replay)


# =========================================================================== the tool message


def test_r6_4_tool_message_reads_the_executors_result():
    assert json.loads(tool_message("search", "succeeded", {"price": 12.3}, "")) == {"price": 12.3}
    unknown = tool_message("webhook", "unknown", None, "timed out")
    assert "webhook" in unknown and "unknown" in unknown and "verified" in unknown
    assert tool_message("webhook", "failed", None, "HTTP 500") == "webhook failed: HTTP 500"
    assert tool_message("search", "refused", None, "") == "search refused: no detail"


def test_r3_1_a_large_tool_output_is_bounded():
    text = tool_message("search", "succeeded", {"blob": "x" * (3 * TOOL_MESSAGE_MAX_CHARS)}, "")
    assert len(text) == TOOL_MESSAGE_MAX_CHARS


# =========================================================================== conclude_tool_call


def test_r6_3_a_call_that_is_not_the_last_continues_with_the_next_call():
    conclusion = call_tool(payload(index=0), "succeeded", {"price": 12.3})
    assert conclusion.next_work["kind"] == "tool_call"
    nxt = conclusion.next_work["payload"]
    assert nxt.index == 1 and nxt.replay is False
    assert nxt.calls == (SEARCH, HOOK) and nxt.turn_stage == 7
    assert nxt.results == (
        {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"price": 12.3})},
    )


def test_r6_3_the_last_call_hands_every_result_to_the_model_turn():
    first = {"role": "tool", "tool_call_id": "c1", "content": "12.3"}
    conclusion = call_tool(payload(index=1, results=[first]), "failed", error="HTTP 500")
    assert conclusion.next_work == {
        "kind": "model_turn",
        "payload": TurnPayload(
            increment=(
                first,
                {"role": "tool", "tool_call_id": "c2", "content": "webhook failed: HTTP 500"},
            )
        ),
    }
    # R3.1: the results are a new, not yet accepted increment the next turn can quarantine.
    increment = turn_increment(conclusion.next_work["payload"].increment, final=False)
    assert all(quarantinable(item) for item in increment)


@pytest.mark.parametrize("effect", EFFECTS)
def test_r4_1_the_executor_reports_only_its_operations_fact(effect):
    p = payload(index=1)
    conclusion = call_tool(p, effect, error="detail" if effect != "succeeded" else "")
    (fact,) = conclusion.facts
    assert fact.owner is Owner.EXECUTOR and fact.kind is EFFECT_FACT_KINDS[effect]
    assert fact.subject == "webhook:c2"
    assert conclusion.outcome == effect
    # The key travels with an unknown effect (it is verified by key), only with it.
    assert fact.idempotency_key == (key_of(p) if effect == "unknown" else None)
    assert conclusion.receipts == (ReceiptClose(key_of(p), effect, None, conclusion.detail),)


@pytest.mark.parametrize("effect", EFFECTS)
def test_r6_1_a_tool_receipt_is_progress_only_when_it_succeeded(effect):
    assert call_tool(payload(), effect).progress is (effect == "succeeded")


def test_r6_4_a_read_back_receipt_is_not_closed_again():
    conclusion = call_tool(payload(), "succeeded", {"price": 12.3}, close_receipt=False)
    assert conclusion.receipts == ()
    assert conclusion.facts[0].kind is FactKind.OPERATION_SUCCEEDED


def test_r6_3_r6_4_an_unknown_effect_carries_both_ways_on_and_is_never_a_success():
    p = payload(index=1, results=[{"role": "tool", "tool_call_id": "c1", "content": "12.3"}])
    conclusion = call_tool(p, "unknown", error="read timeout after the request was sent")
    assert set(conclusion.next_work) == {"next", "replay"}
    assert conclusion.next_work["next"]["kind"] == "model_turn"
    replay = conclusion.next_work["replay"]
    # The replay is the SAME call (same index, same results so far, same key).
    assert replay == {"kind": "tool_call", "payload": replace(p, replay=True)}
    assert key_of(replay["payload"]) == key_of(p)
    assert conclusion.progress is False
    assert not any(f.kind is FactKind.OPERATION_SUCCEEDED for f in conclusion.facts)
    decision = decide(*conclusion.facts)
    assert decision.path is Path.VERIFY_EFFECT and decision.verify_keys == (key_of(p),)
    assert not decision.dispatches


@pytest.mark.parametrize("effect", ["failed", "refused"])
def test_r6_3_one_failed_tool_continues_and_stays_a_failure(effect):
    conclusion = call_tool(payload(index=0), effect, error="HTTP 500")
    decision = decide(*conclusion.facts)
    assert decision.path is Path.CONTINUE
    assert any("search:c1" in keep for keep in decision.must_keep)
    follow = follow_up(
        decision, conclusion.next_work, last_increment=(), finalization_started=False
    )
    assert follow.kind == "tool_call" and follow.payload.index == 1  # the other tool is used


# =========================================================================== R6.4 evidence


@pytest.mark.parametrize(
    ("lookup", "state"),
    [
        ("succeeded", EffectState.HAPPENED),
        ("failed", EffectState.DID_NOT_HAPPEN),
        ("unknown", EffectState.UNKNOWN),
        ("refused", EffectState.UNKNOWN),
        ("pending", EffectState.UNKNOWN),
    ],
)
def test_r6_4_only_an_explicit_executor_lookup_resolves_an_unknown_effect(lookup, state):
    evidence = effect_evidence("k1", lookup)
    assert effect_state_after("k1", evidence) is state
    if state is EffectState.UNKNOWN:
        assert evidence.kind is not EvidenceKind.EXECUTOR_LOOKUP
    else:
        assert (evidence.kind, evidence.idempotency_key) == (EvidenceKind.EXECUTOR_LOOKUP, "k1")


# =========================================================================== verification


def verify_payload(effect_conclusion) -> VerifyEffectPayload:
    """The verify stage's payload, as follow_up builds it from the tool stage's conclusion."""
    decision = decide(*effect_conclusion.facts)
    follow = follow_up(
        decision, effect_conclusion.next_work, last_increment=(), finalization_started=False
    )
    assert follow is not None and follow.kind == "verify_effect"
    return follow.payload


def test_r6_4_a_verified_effect_becomes_the_receipts_success_and_work_resumes():
    p = payload(index=1)
    unknown = call_tool(p, "unknown")
    verify = verify_payload(unknown)
    assert verify.keys == (key_of(p),) and verify.attempt == 1
    verdict = ReceiptVerdict(key_of(p), "webhook", EffectState.HAPPENED, {"status": "ok"})
    conclusion = conclude_verification(verify, [verdict])
    assert conclusion.outcome == "verified"
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind, fact.idempotency_key) == (
        Owner.EXECUTOR,
        FactKind.EFFECT_HAPPENED,
        key_of(p),
    )
    assert conclusion.receipts == (
        ReceiptClose(key_of(p), "succeeded", {"status": "ok"}, verified=True),
    )
    assert conclusion.next_work == unknown.next_work["next"]  # the model reads the results
    decision = decide(*unknown.facts, *conclusion.facts)
    assert decision.path is Path.CONTINUE
    follow = follow_up(
        decision, conclusion.next_work, last_increment=(), finalization_started=False
    )
    assert follow.kind == "model_turn"


def test_r6_4_proven_not_performed_is_replayed_with_the_same_key():
    p = payload(index=1)
    unknown = call_tool(p, "unknown")
    verify = verify_payload(unknown)
    verdict = ReceiptVerdict(key_of(p), "webhook", EffectState.DID_NOT_HAPPEN)
    conclusion = conclude_verification(verify, [verdict])
    assert conclusion.outcome == "verified"
    assert [f.kind for f in conclusion.facts] == [FactKind.EFFECT_DID_NOT_HAPPEN]
    (receipt,) = conclusion.receipts
    assert (receipt.key, receipt.effect, receipt.verified) == (key_of(p), "pending", True)
    assert conclusion.next_work == unknown.next_work["replay"]
    # The lifecycle continues into the replay, and the replay performs the same key.
    decision = decide(*unknown.facts, *conclusion.facts)
    assert decision.path is Path.CONTINUE
    follow = follow_up(
        decision, conclusion.next_work, last_increment=(), finalization_started=False
    )
    assert follow.kind == "tool_call" and follow.payload.replay is True
    assert key_of(follow.payload) == key_of(p)
    step = receipt_step(receipt.effect, external=True, verified_replay=follow.payload.replay)
    assert step == "perform"


def test_r6_4_still_unknown_is_verified_again_and_never_replayed():
    p = payload(index=1)
    unknown = call_tool(p, "unknown")
    verify = verify_payload(unknown)
    verdict = ReceiptVerdict(key_of(p), "webhook", EffectState.UNKNOWN)
    conclusion = conclude_verification(verify, [verdict])
    assert conclusion.outcome == "still_unknown"
    assert conclusion.facts == () and conclusion.receipts == ()
    assert conclusion.next_work != unknown.next_work["replay"]
    decision = decide(*unknown.facts, *conclusion.facts)
    assert decision.path is Path.VERIFY_EFFECT


def test_r6_4_r6_3_verification_is_bounded_then_a_hard_limit_settles_with_the_effect_unknown():
    """The verify stage repeats with its attempt counted; at MAX_VERIFICATIONS a
    hard limit settles the run, the effect listed as unknown, never completed."""
    p = payload(index=1)
    unknown = call_tool(p, "unknown")
    facts = list(unknown.facts)
    decision = decide(*facts)
    follow = follow_up(decision, unknown.next_work, last_increment=(), finalization_started=False)
    verifications = 0
    while follow is not None and follow.kind == "verify_effect":
        verifications += 1
        assert follow.payload.attempt == verifications
        assert follow.payload.resume == unknown.next_work  # the original ways on are kept
        verdict = ReceiptVerdict(key_of(p), "webhook", EffectState.UNKNOWN)
        conclusion = conclude_verification(follow.payload, [verdict])
        facts += conclusion.facts
        decision = decide(*facts)
        if decision.path is Path.SETTLE:
            break
        follow = follow_up(
            decision,
            conclusion.next_work,
            last_increment=(),
            finalization_started=False,
            verification=(follow.payload.resume, follow.payload.attempt),
        )
        assert verifications < 10, "verification never ends"
    assert verifications == MAX_VERIFICATIONS
    assert facts[-1].kind is FactKind.HARD_LIMIT_REACHED
    assert facts[-1].owner is Owner.RESOURCE
    assert decision.path is Path.SETTLE
    assert decision.settlement.reason_code is ReasonCode.HARD_LIMIT
    assert decision.settlement.unknown_effects == (key_of(p),)
    assert decision.settlement.outcome is not Outcome.COMPLETED


@pytest.mark.parametrize("attempt", range(1, MAX_VERIFICATIONS + 2))
def test_r6_4_only_the_last_allowed_verification_reaches_the_hard_limit(attempt):
    verify = VerifyEffectPayload(("k1",), {"next": {"kind": "model_turn"}}, attempt)
    conclusion = conclude_verification(verify, [ReceiptVerdict("k1", "webhook", "unknown")])
    hard = [f for f in conclusion.facts if f.kind is FactKind.HARD_LIMIT_REACHED]
    assert bool(hard) is (attempt >= MAX_VERIFICATIONS)


def test_r6_4_a_resolved_effect_at_the_last_attempt_is_no_hard_limit():
    verify = VerifyEffectPayload(("k1",), {"next": {"kind": "model_turn"}}, 3)
    verdict = ReceiptVerdict("k1", "webhook", EffectState.HAPPENED, {"ok": True})
    conclusion = conclude_verification(verify, [verdict])
    assert [f.kind for f in conclusion.facts] == [FactKind.EFFECT_HAPPENED]


def test_r6_4_verification_without_a_resume_starts_nothing_of_its_own():
    verdict = ReceiptVerdict("k1", "webhook", EffectState.DID_NOT_HAPPEN)
    conclusion = conclude_verification(VerifyEffectPayload(("k1",)), [verdict])
    assert conclusion.next_work is None
    assert [f.kind for f in conclusion.facts] == [FactKind.EFFECT_DID_NOT_HAPPEN]


states = st.sampled_from(list(EffectState))


@settings(max_examples=200, deadline=None)
@given(st.lists(states, min_size=1, max_size=4), st.integers(1, MAX_VERIFICATIONS + 1))
def test_r6_4_verification_facts_follow_the_executors_proof(verdict_states, attempt):
    verdicts = [
        ReceiptVerdict(f"k{i}", "webhook", s, {"n": i}) for i, s in enumerate(verdict_states)
    ]
    resume = {"next": {"kind": "model_turn", "payload": {}}, "replay": {"kind": "tool_call"}}
    conclusion = conclude_verification(
        VerifyEffectPayload(resume=resume, attempt=attempt), verdicts
    )
    proven = [v for v in verdicts if v.state is not EffectState.UNKNOWN]
    assert [f.idempotency_key for f in conclusion.facts if f.idempotency_key] == [
        v.key for v in proven
    ]
    # A receipt is closed as success only when the effect was found; an
    # unknown one is never touched, never marked success.
    assert [(r.key, r.effect) for r in conclusion.receipts] == [
        (v.key, "succeeded" if v.state is EffectState.HAPPENED else "pending") for v in proven
    ]
    assert all(r.verified for r in conclusion.receipts)
    still_unknown = len(proven) < len(verdicts)
    assert conclusion.outcome == ("still_unknown" if still_unknown else "verified")
    hard = any(f.kind is FactKind.HARD_LIMIT_REACHED for f in conclusion.facts)
    assert hard is (still_unknown and attempt >= MAX_VERIFICATIONS)
    if any(v.state is EffectState.DID_NOT_HAPPEN for v in verdicts):
        assert conclusion.next_work == resume["replay"]
    else:
        assert conclusion.next_work == resume["next"]


def test_r5_2_every_call_draws_a_tool_call_and_a_search_also_its_quota():
    """R5.2: a search draws from its own quota as well; other tools only from tool calls."""
    from governance.rules.tools import surface_refusal, tool_admissions

    assert [a.resource for a in tool_admissions("calculator")] == ["tool_calls"]
    assert [a.resource for a in tool_admissions("kb_search")] == ["tool_calls", "web_searches"]
    keys = [a.key_suffix for a in tool_admissions("kb_search")]
    assert len(set(keys)) == len(keys)  # one ledger key per resource (R5.4)
    assert surface_refusal("calculator", ("calculator",)) is None
    assert "tool surface" in surface_refusal("webhook", ("calculator",))


def test_r6_4_which_calls_may_have_acted_outside():
    from governance.rules.tools import builtin_effect_class, has_external_effect

    assert builtin_effect_class("webhook") == "external_effect"
    assert builtin_effect_class("calculator") == builtin_effect_class("kb_search") == "read_only"
    assert has_external_effect("webhook", "")
    assert has_external_effect("files.write", "external_effect")
    assert not has_external_effect("files.read", "read_only")
    assert not has_external_effect("calculator", "")
