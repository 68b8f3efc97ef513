"""Tests for governance.rules.turns: what one model turn (or the one finalization)
concludes — R1.1 request bytes, R3.1 quarantine, R2.3 health and turn memory,
R4.3 dispatch, R4.4 no progress, R6.1–R6.3 clocks and paths, R7.2 chunks.

The turns are driven the way ``tasks/stages/model_turn.py`` drives them, but
pure: :class:`Shell` builds every request with ``attempt_parts``, records a
``TurnCall`` and answers ``routing.drive_turn`` through ``attempt_outcome``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from governance.rules import publication as pub
from governance.rules.answers import Answer
from governance.rules.authority import FactKind, Owner, OwnerFact
from governance.rules.breaker import HealthVerdict
from governance.rules.classification import (
    TIME_BASED_CLASSES,
    AttemptEvidence,
    Classification,
    classify_attempt,
)
from governance.rules.decision_table import Decision, Path, needs_recovery_conditions, next_path
from governance.rules.payloads import ToolCallPayload, TurnPayload
from governance.rules.provider_failures import TRANSIENT_FAILURE_CLASSES
from governance.rules.recovery import RecoveryConditions, RunAuthorization
from governance.rules.refusal import RULE_TEXT, ProviderRefusal
from governance.rules.routing import (
    AttemptOutcome,
    Candidate,
    ChainEntry,
    drive_turn,
    route_turn,
)
from governance.rules.run_facts import RunFacts, record_fact
from governance.rules.settlement import Outcome, ReasonCode
from governance.rules.transitions import apply_decision, follow_up
from governance.rules.turns import (
    CHUNK_MIN_CHARS,
    FINALIZE_INSTRUCTION,
    RUN_CLOCK_CUTS,
    WITHHELD_CONTENT,
    WITHHELD_PLACEHOLDER,
    StageConclusion,
    TurnCall,
    TurnFacts,
    attempt_outcome,
    attempt_parts,
    attempt_result,
    chunks_of,
    conclude_breach,
    conclude_local_failure,
    conclude_stop,
    conclude_turn,
    dispatch_outcome,
    quarantinable,
    request_digest,
    request_messages,
    rerender,
    rerender_level,
    sent_increment,
    stage_must_stop,
    turn_increment,
    turn_memory_key,
    turn_request_digests,
    withheld,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
GOAL = "price of ACME today"
SEGMENT = "sess#1"
CHAIN = (ChainEntry("a", "model-a"), ChainEntry("b", "model-b"))

# --- classifications, from the adapters' evidence (R2.1, R2.4, R6.2) --------------------


def classify(**evidence: Any) -> Classification:
    return classify_attempt(AttemptEvidence(**evidence), T0)


OK = classify()
REFUSAL = classify(refusal_category="content_filter")
SERVER_ERROR = classify(status_code=503)
RATE_LIMITED = classify(status_code=429)
AUTH = classify(status_code=401)
BAD_REQUEST = classify(status_code=400)
TIMEOUT = classify(transport_error="read_timeout")
NETWORK = classify(transport_error="connection_reset")
INTERRUPTED = classify(headers_received=True, body_complete=False)
CUT = classify(headers_received=True, body_complete=False, deadline_evidence=True)

# --- messages ---------------------------------------------------------------------------

SEARCH_CALL = {"id": "c1", "name": "search", "arguments": {"q": "ACME"}}
HISTORY: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "What is the price of ACME today?"},
    {"role": "assistant", "content": "", "tool_calls": [SEARCH_CALL]},
)
TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "ACME 12.30 <<PAYLOAD-7f3a>>"}
EVENT = {"role": "user", "external": True, "content": "webhook says <<EVENT-91bc>>"}
USER = {"role": "user", "content": "and in euros?"}
ANSWER = (
    "ACME closed at 12.30 USD today according to the exchange feed, "
    "which is about 11.40 EUR at the current rate."
)


# --- the pure shell ---------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """What one provider request came back with."""

    classification: Classification = OK
    text: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()
    pieces: tuple[str, ...] = ()
    timeout_name: str = ""
    error: str = ""


ReplyFor = Reply | Callable[[str, int], Reply]  # (kind, level) -> Reply


def answer(text: str = ANSWER) -> Reply:
    return Reply(text=text, pieces=(text,))


def refused(kind_accepted: str | None = None, text: str = ANSWER) -> Callable[[str, int], Reply]:
    """Refuses every request except the one of ``kind_accepted`` (a kind or "kind:level")."""

    def reply(kind: str, level: int) -> Reply:
        if kind_accepted in (kind, f"{kind}:{level}"):
            return answer(text)
        return Reply(REFUSAL, error="refused: content_filter")

    return reply


@dataclass
class Shell:
    history: tuple[dict[str, Any], ...]
    increment: list[dict[str, Any]]
    replies: dict[str, ReplyFor]
    # flags for dispatch_outcome, by the number of requests already made
    dispatch: Callable[[int], dict[str, bool]] = lambda _sent: {}
    calls: list[TurnCall] = field(default_factory=list)
    log: list[tuple[str, str, int]] = field(default_factory=list)

    def send(self, candidate: Candidate, kind: str) -> AttemptOutcome:
        flags = {"cancel_requested": False, "permitted": True, "budget_admitted": True}
        flags.update(self.dispatch(len(self.calls)))
        blocked = dispatch_outcome(**flags)
        if blocked is not None:
            return blocked
        pid = candidate.provider_id
        level = rerender_level(self.calls, pid, kind)
        parts = attempt_parts(self.history, self.increment, kind, level)
        self.log.append((pid, kind, level))
        reply = self.replies[pid]
        if callable(reply):
            reply = reply(kind, level)
        ended = T0 + timedelta(seconds=len(self.calls) + 1)
        self.calls.append(
            TurnCall(
                provider_id=pid,
                model=candidate.model or "",
                kind=kind,
                parts=tuple(parts),
                started_at=ended - timedelta(seconds=1),
                classification=reply.classification,
                text=reply.text,
                tool_calls=reply.tool_calls,
                text_pieces=reply.pieces,
                timeout_name=reply.timeout_name,
                error=reply.error,
            )
        )
        return attempt_outcome(reply.classification, reply.timeout_name or None, ended)


def facts(
    increment=(TOOL_RESULT,),
    *,
    final: bool = False,
    tool_surface=("search",),
    publication: pub.Publication | None = None,
) -> TurnFacts:
    return TurnFacts(
        run_id="run-1",
        stage_id=7,
        goal=GOAL,
        final=final,
        increment=tuple(turn_increment(increment, final=final)),
        tool_surface=tuple(tool_surface),
        segment_key=SEGMENT,
        publication=publication or pub.Publication(),
    )


def run_turn(
    replies: dict[str, ReplyFor],
    turn_facts: TurnFacts | None = None,
    *,
    history=HISTORY,
    refusals: dict[str, ProviderRefusal] | None = None,
    health: dict[str, HealthVerdict] | None = None,
    now: datetime = T0,
    dispatch: Callable[[int], dict[str, bool]] | None = None,
    chain=CHAIN,
):
    turn_facts = turn_facts or facts()
    refusals = refusals or {}
    shell = Shell(tuple(history), list(turn_facts.increment), replies)
    if dispatch is not None:
        shell.dispatch = dispatch
    route = route_turn(chain, now=now, health=health or {}, refusals=refusals)
    outcome = drive_turn(
        route,
        shell.send,
        segment_key=SEGMENT,
        refusals=refusals,
        has_unaccepted_increment=not turn_facts.final
        and any(quarantinable(i) for i in turn_facts.increment),
        now=now,
    )
    conclusion = conclude_turn(turn_facts, shell.calls, outcome, now)
    return conclusion, shell, outcome


def kinds(conclusion: StageConclusion) -> list[FactKind]:
    return [f.kind for f in conclusion.facts]


def lifecycle_after(conclusion: StageConclusion, *before: OwnerFact, **run: Any) -> Decision:
    """R6.3: what the lifecycle decides once the conclusion's facts are recorded."""
    state = RunFacts(run_id="run-1", goal=GOAL, facts=(*before, *conclusion.facts), **run)
    return next_path(state)


def in_finalization(*conclusion_facts: OwnerFact) -> RunFacts:
    """A run that ran out of research budget and entered its one finalization."""
    exhausted = OwnerFact(Owner.RESOURCE, FactKind.RESOURCE_EXHAUSTED, "model_requests")
    run = RunFacts(run_id="run-1", goal=GOAL, facts=(exhausted,))
    decision = next_path(run)
    assert decision.path is Path.FINALIZATION_ONLY
    run = apply_decision(run, decision)
    for fact in conclusion_facts:
        run = record_fact(run, fact)
    return run


def state(count: int, when: datetime = T0, provider: str = "a") -> ProviderRefusal:
    return ProviderRefusal(provider, f"model-{provider}", "content_filter", count, when)


# =========================================================================== R3.1 quarantine


def test_r3_1_tool_results_and_external_events_are_quarantinable_user_words_are_not():
    assert quarantinable(TOOL_RESULT)
    assert quarantinable(EVENT)
    assert not quarantinable(USER)
    assert not quarantinable({"role": "assistant", "content": "x"})
    assert not quarantinable({"role": "user", "external": False, "content": "x"})


def test_r3_1_withheld_increment_sends_none_of_the_quarantinable_bytes():
    sent = withheld([TOOL_RESULT, EVENT, USER])
    assert [m["content"] for m in sent[:2]] == [WITHHELD_CONTENT, WITHHELD_CONTENT]
    serialized = json.dumps(sent)
    assert "PAYLOAD-7f3a" not in serialized and "EVENT-91bc" not in serialized
    # The wire protocol still holds: the tool call is answered, by its id.
    assert sent[0]["role"] == "tool" and sent[0]["tool_call_id"] == "c1"
    assert sent[2] == USER  # the user's own words are not quarantined
    assert TOOL_RESULT["content"].endswith("<<PAYLOAD-7f3a>>")  # the input is not mutated


def test_r3_1_rerenders_are_neutral_and_leave_user_words_alone():
    level1 = rerender([TOOL_RESULT, USER], 1)
    level2 = rerender([TOOL_RESULT, USER], 2)
    assert level1[1] == USER and level2[1] == USER
    # Level 1 quotes the content as inert data: the bytes are there, fenced.
    assert TOOL_RESULT["content"] in level1[0]["content"]
    assert level1[0]["content"] != TOOL_RESULT["content"]
    # Level 2 keeps only the shape: none of the content's bytes.
    assert "PAYLOAD-7f3a" not in level2[0]["content"]
    assert str(len(TOOL_RESULT["content"])) in level2[0]["content"]
    assert level1[0]["tool_call_id"] == level2[0]["tool_call_id"] == "c1"
    assert len({TOOL_RESULT["content"], level1[0]["content"], level2[0]["content"]}) == 3


@pytest.mark.parametrize("kind", ["original", "fallback", "re_probe"])
def test_r3_1_r3_2_original_fallback_and_reprobe_send_the_increment_as_is(kind):
    """R3.2: a re-probe is sent once, without a re-render."""
    assert sent_increment([TOOL_RESULT, USER], kind, 2) == [TOOL_RESULT, USER]


def test_r3_1_sent_increment_by_attempt_kind():
    assert sent_increment([TOOL_RESULT], "history_only", 1) == withheld([TOOL_RESULT])
    assert sent_increment([TOOL_RESULT], "re_render", 1) == rerender([TOOL_RESULT], 1)
    assert sent_increment([TOOL_RESULT], "re_render", 2) == rerender([TOOL_RESULT], 2)


def test_r6_3_finalization_input_is_only_its_instruction():
    """R6.3: the one finalization uses accepted material only: the pending
    increment is not sent, only the instruction to finalize."""
    assert turn_increment([TOOL_RESULT], final=True) == [
        {"role": "user", "content": FINALIZE_INSTRUCTION}
    ]
    ordinary = turn_increment([TOOL_RESULT], final=False)
    assert ordinary == [TOOL_RESULT] and ordinary[0] is not TOOL_RESULT


quarantine_items = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["tool", "user"]),
        "content": st.text(min_size=1, max_size=40).map(lambda s: f"<<{s}>>"),
        "external": st.booleans(),
    }
)


@settings(max_examples=200, deadline=None)
@given(st.lists(quarantine_items, max_size=5), st.sampled_from([1, 2]))
def test_r3_1_quarantine_never_touches_what_is_not_quarantinable(increment, level):
    for sent in (withheld(increment), rerender(increment, level)):
        assert len(sent) == len(increment)
        for before, after in zip(increment, sent, strict=True):
            if quarantinable(before):
                assert after["content"] != before["content"]
                assert {k: v for k, v in after.items() if k != "content"} == {
                    k: v for k, v in before.items() if k != "content"
                }
            else:
                assert after == before
    for before, after in zip(increment, withheld(increment), strict=True):
        if quarantinable(before):
            assert after["content"] == WITHHELD_CONTENT


# =========================================================================== R1.1 request bytes


@pytest.mark.parametrize(
    ("kind", "level"),
    [("original", 1), ("fallback", 1), ("re_probe", 1), ("re_render", 1), ("re_render", 2),
     ("history_only", 1)],
)  # fmt: skip
def test_r1_1_every_attempt_replays_the_accepted_history_verbatim_then_the_input(kind, level):
    parts = attempt_parts(HISTORY, [TOOL_RESULT], kind, level)
    assert parts[: len(HISTORY)] == list(HISTORY)
    assert parts[len(HISTORY) :] == sent_increment([TOOL_RESULT], kind, level)


def test_r1_1_request_is_system_then_history_then_new_input():
    parts = attempt_parts(HISTORY, [TOOL_RESULT], "original")
    messages = request_messages("You are careful.", parts)
    assert messages == [
        {"role": "system", "content": "You are careful."},
        *HISTORY,
        TOOL_RESULT,
    ]
    assert request_messages("", parts) == parts  # no empty system part


def test_r1_1_r3_1_history_only_with_nothing_accepted_still_sends_a_request():
    assert attempt_parts((), [], "history_only") == [
        {"role": "user", "content": WITHHELD_PLACEHOLDER}
    ]
    assert attempt_parts((), [], "original") == []


def test_r2_3_request_digest_names_the_bytes_and_the_provider():
    parts = attempt_parts(HISTORY, [TOOL_RESULT], "original")
    reordered = [dict(reversed(list(m.items()))) for m in parts]
    assert request_digest(parts, "a") == request_digest(reordered, "a")  # key order is not bytes
    assert request_digest(parts, "a") != request_digest(parts, "b")
    other = attempt_parts(HISTORY, [TOOL_RESULT], "history_only")
    assert request_digest(parts, "a") != request_digest(other, "a")


# =========================================================================== one attempt


def test_r2_1_r3_1_attempt_result_accepted_refused_or_failed():
    assert attempt_result(OK) == "accepted"
    assert attempt_result(REFUSAL) == "refused"
    for failed in (SERVER_ERROR, RATE_LIMITED, AUTH, BAD_REQUEST, TIMEOUT, NETWORK, INTERRUPTED):
        assert attempt_result(failed) == "failed"


def test_r3_3_refusal_outcome_keeps_category_and_is_anchored_on_its_answer():
    at = T0 + timedelta(minutes=3)
    assert attempt_outcome(REFUSAL, None, at) == AttemptOutcome(
        "refused", refusal_category="content_filter", at=at
    )
    assert attempt_outcome(OK, None, at) == AttemptOutcome("accepted")
    assert attempt_outcome(SERVER_ERROR, "stage_timeout", at) == AttemptOutcome(
        "failed", failure_class="server_error"
    )
    assert attempt_outcome(INTERRUPTED, None, at).failure_class == "interrupted"


@pytest.mark.parametrize("cut", sorted(RUN_CLOCK_CUTS))
@pytest.mark.parametrize("classification", [OK, REFUSAL, CUT, SERVER_ERROR])
def test_r6_1_a_run_clock_cut_ends_the_turn_whatever_the_answer(cut, classification):
    outcome = attempt_outcome(classification, cut, T0)
    assert outcome == AttemptOutcome("failed", failure_class=cut)
    # ... and no provider of the chain is asked after it.
    shell_replies = {"a": Reply(classification, timeout_name=cut), "b": answer()}
    conclusion, shell, turn_outcome = run_turn(shell_replies)
    assert [pid for pid, _, _ in shell.log] == ["a"]
    assert turn_outcome.result == "failed"
    assert conclusion.timeout_name == cut


flag = st.booleans()


@settings(max_examples=50, deadline=None)
@given(flag, flag, flag)
def test_r4_3_only_objective_limits_block_a_dispatch(cancel, permitted, admitted):
    outcome = dispatch_outcome(
        cancel_requested=cancel, permitted=permitted, budget_admitted=admitted
    )
    if not cancel and permitted and admitted:
        assert outcome is None
        return
    assert outcome is not None and outcome.result == "failed"
    expected = "cancelled" if cancel else "not_permitted" if not permitted else "budget_exhausted"
    assert outcome.failure_class == expected


@pytest.mark.parametrize(
    ("flags", "failure_class"),
    [
        ({"cancel_requested": True}, "cancelled"),
        ({"permitted": False}, "not_permitted"),
        ({"budget_admitted": False}, "budget_exhausted"),
    ],
)
def test_r4_3_a_blocked_dispatch_ends_the_turn_without_any_request(flags, failure_class):
    """R4.3/R5.2: the stop, the permission and the ledger block every send, on
    every provider: no fallback sends "to be graceful"."""
    conclusion, shell, outcome = run_turn(
        {"a": answer(), "b": answer()}, dispatch=lambda _sent: flags
    )
    assert shell.calls == [] and conclusion.attempts == ()
    assert (outcome.result, outcome.failure_class) == ("failed", failure_class)
    assert conclusion.health == () and conclusion.history == ()
    assert conclusion.progress is False and conclusion.next_work is None


# =========================================================================== accepted turns


def test_r4_4_accepted_tool_calls_go_to_history_and_start_the_tool_stage():
    reply = Reply(text="Let me look.", tool_calls=(SEARCH_CALL,))
    conclusion, _, _ = run_turn({"a": reply, "b": answer()})
    assert conclusion.outcome == "accepted" and conclusion.progress is True
    assert kinds(conclusion) == [FactKind.TURN_CALLED_TOOLS]
    assert conclusion.facts[0].owner is Owner.PROVIDER and conclusion.facts[0].subject == "a"
    # R1.3: history grows by what was accepted: the input as sent, then the answer.
    assert conclusion.history == (
        TOOL_RESULT,
        {"role": "assistant", "content": "Let me look.", "tool_calls": [SEARCH_CALL]},
    )
    assert conclusion.next_work == {
        "kind": "tool_call",
        "payload": ToolCallPayload(calls=(SEARCH_CALL,), index=0, results=(), turn_stage=7),
    }
    assert conclusion.chunks == ()  # a tool turn publishes nothing (R7.2)


def test_r4_4_only_tools_of_the_segment_surface_are_valid_calls():
    rogue = {"id": "c2", "name": "delete_everything", "arguments": {}}
    mixed = Reply(tool_calls=(SEARCH_CALL, rogue))
    conclusion, _, _ = run_turn({"a": mixed, "b": answer()})
    assert conclusion.next_work["payload"].calls == (SEARCH_CALL,)
    assert conclusion.history[-1]["tool_calls"] == [SEARCH_CALL]
    # Only invalid calls and no body: no progress (R4.4).
    only_rogue, _, _ = run_turn({"a": Reply(tool_calls=(rogue,)), "b": answer()})
    assert kinds(only_rogue) == [FactKind.TURN_WITHOUT_PROGRESS]
    assert only_rogue.progress is False and only_rogue.next_work is None
    # Invalid calls next to a body: the body is the deliverable.
    with_text, _, _ = run_turn({"a": Reply(text=ANSWER, tool_calls=(rogue,)), "b": answer()})
    assert FactKind.TURN_ANSWERED in kinds(with_text)


def test_r4_4_a_call_of_the_clients_own_tool_is_the_answer_handed_back_to_it():
    weather = {"id": "w1", "name": "get_weather", "arguments": {"city": "Paris"}}
    client_turn = dataclasses.replace(facts(), client_tools=("get_weather",))
    reply = Reply(text="Checking.", tool_calls=(weather,))
    conclusion, _, _ = run_turn({"a": reply, "b": answer()}, client_turn)
    # A valid call is progress (R4.4); the client executes it, so nothing runs here.
    assert conclusion.progress is True and conclusion.next_work is None
    assert kinds(conclusion) == [FactKind.BODY_COMMITTED, FactKind.TURN_ANSWERED]
    # The text, then one chunk handing the call over, in words for people (R7.2).
    assert [(c.text, c.tool_calls, c.final) for c in conclusion.chunks] == [
        ("Checking.", (), False),
        ('Calls the client\'s tools: get_weather({"city": "Paris"})', (weather,), True),
    ]
    assert conclusion.history[-1] == {
        "role": "assistant", "content": "Checking.", "tool_calls": [weather],
    }  # fmt: skip
    decision = lifecycle_after(conclusion)
    assert decision.settlement is not None and decision.settlement.outcome.value == "completed"
    # A tool the client did not offer is no call of its (R4.4: not progress).
    stranger, _, _ = run_turn({"a": reply, "b": answer()}, facts(tool_surface=()))
    assert FactKind.TURN_ANSWERED in kinds(stranger)
    assert all(not c.tool_calls for c in stranger.chunks)
    # The one finalization hands nothing over (R6.3: accepted material only).
    final, _, _ = run_turn(
        {"a": reply, "b": answer()},
        dataclasses.replace(facts(final=True), client_tools=("get_weather",)),
    )
    assert all(not c.tool_calls for c in final.chunks)


def test_r7_2_accepted_text_is_committed_as_chunks_and_answers_the_goal():
    text = "A" * 50 + "B" * 50 + "C" * 10
    reply = Reply(text=text, pieces=("A" * 50, "B" * 50, "C" * 10))
    conclusion, _, _ = run_turn({"a": reply, "b": answer()})
    assert conclusion.outcome == "accepted" and conclusion.progress is True
    assert [(c.chunk_no, c.version, c.text, c.final) for c in conclusion.chunks] == [
        (1, 1, "A" * 50 + "B" * 50, False),
        (2, 2, "C" * 10, True),
    ]
    assert kinds(conclusion) == [FactKind.BODY_COMMITTED, FactKind.TURN_ANSWERED]
    body, answered = conclusion.facts
    assert body.owner is Owner.PUBLICATION and body.version == 2
    assert answered.answer == Answer(GOAL)
    assert conclusion.history == (TOOL_RESULT, {"role": "assistant", "content": text})
    assert conclusion.next_work is None


def test_r7_2_chunk_versions_continue_after_the_chunks_already_committed():
    # An earlier, non-final body part: chunks 1 and 2 committed, body not ended.
    before = pub.commit_chunk(pub.generate_chunk(pub.Publication(), 1), 1, 1)
    before = pub.commit_chunk(pub.generate_chunk(before, 2), 2, 2)
    conclusion, _, _ = run_turn({"a": answer(), "b": answer()}, facts(publication=before))
    assert [(c.chunk_no, c.version, c.final) for c in conclusion.chunks] == [(3, 3, True)]
    assert conclusion.facts[0].version == 3


def test_r4_4_accepted_turn_with_neither_body_nor_tool_call_is_no_progress():
    for empty in (Reply(), Reply(text="  \n ")):
        conclusion, _, _ = run_turn({"a": empty, "b": answer()})
        assert conclusion.outcome == "accepted"
        assert kinds(conclusion) == [FactKind.TURN_WITHOUT_PROGRESS]
        assert conclusion.progress is False
        assert conclusion.history == () and conclusion.chunks == ()
        assert conclusion.next_work is None
        decision = lifecycle_after(conclusion)
        assert decision.settlement is not None
        assert decision.settlement.reason_code is ReasonCode.NO_ANSWER_PRODUCED
        assert decision.settlement.outcome is not Outcome.COMPLETED


def test_r3_1_history_only_acceptance_keeps_the_increment_withheld_and_says_so():
    conclusion, shell, outcome = run_turn({"a": refused("history_only"), "b": answer()})
    assert [k for _, k, _ in shell.log] == ["original", "re_render", "re_render", "history_only"]
    assert outcome.accepted_kind == "history_only" and outcome.recorded == ()
    assert conclusion.history[:-1] == tuple(withheld([TOOL_RESULT]))
    assert "PAYLOAD-7f3a" not in json.dumps(conclusion.history)
    assert "withheld" in conclusion.detail
    # R1.1: what history keeps is exactly what the accepted request sent.
    accepted = shell.calls[-1]
    assert list(accepted.parts[len(HISTORY) :]) == list(conclusion.history[:-1])


@pytest.mark.parametrize("level", [1, 2])
def test_r3_1_re_render_acceptance_keeps_the_re_rendered_increment(level):
    conclusion, shell, outcome = run_turn({"a": refused(f"re_render:{level}"), "b": answer()})
    assert outcome.accepted_kind == "re_render"
    assert conclusion.history[:-1] == tuple(rerender([TOOL_RESULT], level))
    accepted = shell.calls[-1]
    assert (accepted.kind, shell.log[-1][2]) == ("re_render", level)
    assert list(accepted.parts[len(HISTORY) :]) == list(conclusion.history[:-1])
    assert conclusion.detail == ""


def test_r3_1_fallback_acceptance_keeps_the_original_increment():
    conclusion, _, outcome = run_turn({"a": refused(), "b": answer()})
    assert outcome.accepted_by == "b" and outcome.accepted_kind == "fallback"
    assert conclusion.history[:-1] == (TOOL_RESULT,)


def test_r6_3_finalization_keeps_no_increment_has_no_tool_calls_and_states_its_gap():
    reply = Reply(text=ANSWER, tool_calls=(SEARCH_CALL,), pieces=(ANSWER,))
    conclusion, shell, _ = run_turn({"a": reply, "b": answer()}, facts(final=True))
    # The request carried only the instruction, and no quarantine (nothing to isolate).
    assert shell.log == [("a", "original", 1)]
    assert shell.calls[0].parts[-1] == {"role": "user", "content": FINALIZE_INSTRUCTION}
    assert conclusion.history == ({"role": "assistant", "content": ANSWER},)
    assert conclusion.next_work is None
    answered = next(f for f in conclusion.facts if f.kind is FactKind.TURN_ANSWERED)
    assert answered.answer.goal == GOAL and answered.answer.narrowed
    assert answered.answer.stated_gaps  # R4.5: a narrowed answer states its gap
    decision = next_path(in_finalization(*conclusion.facts))
    assert decision.path is Path.SETTLE
    assert decision.settlement.outcome is Outcome.PARTIAL


def test_r6_3_finalization_that_only_calls_tools_made_no_progress_and_settles():
    conclusion, _, _ = run_turn({"a": Reply(tool_calls=(SEARCH_CALL,)), "b": answer()},
                                facts(final=True))  # fmt: skip
    assert kinds(conclusion) == [FactKind.TURN_WITHOUT_PROGRESS]
    assert conclusion.next_work is None and conclusion.history == ()
    decision = next_path(in_finalization(*conclusion.facts))
    assert decision.settlement.reason_code is ReasonCode.FINALIZATION_FAILED


def test_r4_4_r6_3_answered_turn_settles_completed_through_the_lifecycle():
    conclusion, _, _ = run_turn({"a": answer(), "b": answer()})
    decision = lifecycle_after(conclusion)
    assert decision.path is Path.SETTLE
    assert decision.settlement.outcome is Outcome.COMPLETED


def test_r6_3_tool_turn_continues_into_the_tool_stage():
    conclusion, _, _ = run_turn({"a": Reply(tool_calls=(SEARCH_CALL,)), "b": answer()})
    decision = lifecycle_after(conclusion)
    assert decision.path is Path.CONTINUE
    follow = follow_up(
        decision, conclusion.next_work, last_increment=(), finalization_started=False
    )
    assert follow is not None and follow.kind == "tool_call"
    assert follow.payload.calls == (SEARCH_CALL,) and follow.countdown_s == 0.0


# =========================================================================== no provider


def test_r6_3_every_provider_frozen_is_no_eligible_provider():
    refusals = {"a": state(4), "b": state(4, provider="b")}
    conclusion, shell, _ = run_turn({"a": answer(), "b": answer()}, refusals=refusals)
    assert shell.calls == []
    assert conclusion.outcome == "no_provider"
    (fact,) = conclusion.facts
    assert (fact.kind, fact.subject) == (FactKind.NO_ELIGIBLE_PROVIDER, SEGMENT)
    assert RULE_TEXT in fact.detail
    decision = lifecycle_after(conclusion)
    assert decision.settlement.reason_code is ReasonCode.NO_ELIGIBLE_PROVIDER
    assert decision.critical_alert


def test_r6_3_refused_now_and_frozen_elsewhere_is_no_eligible_provider():
    conclusion, shell, outcome = run_turn(
        {"a": refused(), "b": answer()}, refusals={"b": state(4, provider="b")}
    )
    assert len(shell.calls) == 4 and outcome.recorded[0].provider_id == "a"
    assert kinds(conclusion) == [FactKind.NO_ELIGIBLE_PROVIDER]
    assert conclusion.counts["governance.notifications"] == 1


def test_r2_2_r6_3_open_breakers_are_a_transient_failure_with_a_recovery_delay():
    soon = HealthVerdict(False, "open", T0 + timedelta(seconds=40), "breaker open")
    later = HealthVerdict(False, "open", T0 + timedelta(minutes=5), "breaker open")
    conclusion, _, _ = run_turn({"a": answer(), "b": answer()}, health={"a": later, "b": soon})
    (fact,) = conclusion.facts
    assert fact.kind is FactKind.TRANSIENT_FAILURE
    assert fact.failure_class in TRANSIENT_FAILURE_CLASSES
    assert conclusion.recovery_delay_s == 40.0  # the earliest half-open, not the latest


def test_r6_3_disabled_providers_are_no_progress_naming_each_reason():
    off = HealthVerdict(False, "disabled", None, "auth failed; waits for a configuration change")
    conclusion, _, _ = run_turn({"a": answer(), "b": answer()}, health={"a": off, "b": off})
    (fact,) = conclusion.facts
    assert fact.kind is FactKind.TURN_WITHOUT_PROGRESS
    assert "a: auth failed" in fact.detail and "b: auth failed" in fact.detail
    assert conclusion.recovery_delay_s == 0.0


# =========================================================================== failed turns


def test_r5_2_exhausted_request_budget_is_the_ledgers_fact():
    conclusion, _, _ = run_turn({"a": answer(), "b": answer()},
                                dispatch=lambda _s: {"budget_admitted": False})  # fmt: skip
    assert conclusion.outcome == "budget_exhausted"
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind, fact.subject) == (
        Owner.RESOURCE,
        FactKind.RESOURCE_EXHAUSTED,
        "model_requests",
    )
    assert lifecycle_after(conclusion).path is Path.FINALIZATION_ONLY


def test_r5_2_finalization_out_of_budget_exhausts_the_output_reserve():
    conclusion, _, _ = run_turn({"a": answer(), "b": answer()}, facts(final=True),
                                dispatch=lambda _s: {"budget_admitted": False})  # fmt: skip
    assert [(f.kind, f.subject) for f in conclusion.facts] == [
        (FactKind.RESOURCE_EXHAUSTED, "output_reserve")
    ]


def test_r5_3_a_re_render_the_ledger_refuses_ends_the_turn():
    """R5.3: re-renders draw from the same balance; a refused admission ends the
    turn on every provider (no fallback on a fresh budget)."""
    conclusion, shell, _ = run_turn(
        {"a": refused(), "b": answer()}, dispatch=lambda sent: {"budget_admitted": sent < 1}
    )
    assert shell.log == [("a", "original", 1)]
    assert kinds(conclusion) == [FactKind.RESOURCE_EXHAUSTED]
    assert conclusion.turn_refusals == () and conclusion.health == ()


def test_r6_2_deadline_cut_is_the_clocks_fact_and_not_a_health_fact():
    cut = Reply(CUT, timeout_name="deadline_exceeded", error="deadline_exceeded: stopped")
    conclusion, shell, _ = run_turn({"a": cut, "b": answer()})
    assert len(shell.calls) == 1
    assert (conclusion.outcome, conclusion.timeout_name) == ("timeout", "deadline_exceeded")
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind) == (Owner.CLOCK, FactKind.DEADLINE_EXCEEDED)
    assert conclusion.health == ()
    assert lifecycle_after(conclusion).settlement.reason_code is ReasonCode.DEADLINE_EXCEEDED


def test_r6_2_no_progress_cut_is_the_clocks_fact_and_leads_to_finalization():
    cut = Reply(CUT, timeout_name="no_progress", error="no_progress: stopped")
    conclusion, _, _ = run_turn({"a": cut, "b": answer()})
    assert (conclusion.outcome, conclusion.timeout_name) == ("timeout", "no_progress")
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind) == (Owner.CLOCK, FactKind.NO_PROGRESS_TIMEOUT)
    assert conclusion.health == ()
    assert lifecycle_after(conclusion).path is Path.FINALIZATION_ONLY


@pytest.mark.parametrize("cut", sorted(RUN_CLOCK_CUTS))
def test_r6_2_a_run_clock_cut_after_a_stage_timeout_is_still_named_by_its_clock(cut):
    """R6.2: a timeout is named by its clock. Provider a used up its stage budget
    (``stage_timeout``: a time-based failure, the turn falls back), then the
    run's own clock cut provider b: the turn ended on ``cut``, so the clock owns
    the fact — not a provider's "turn without progress"."""
    first = Reply(CUT, timeout_name="stage_timeout", error="stage_timeout: stopped reading")
    second = Reply(CUT, timeout_name=cut, error=f"{cut}: stopped reading")
    conclusion, shell, outcome = run_turn({"a": first, "b": second})
    assert [pid for pid, _, _ in shell.log] == ["a", "b"]
    assert (outcome.result, outcome.failure_class) == ("failed", cut)
    assert conclusion.timeout_name == cut
    expected = {
        "deadline_exceeded": FactKind.DEADLINE_EXCEEDED,
        "no_progress": FactKind.NO_PROGRESS_TIMEOUT,
    }[cut]
    assert [(f.owner, f.kind) for f in conclusion.facts] == [(Owner.CLOCK, expected)]
    # a's stage timeout is a health fact (time-based); b's run-clock cut is not.
    assert [m.provider_id for m in conclusion.health] == ["a"]


def test_r6_2_interrupted_stream_is_transient_with_unknown_effect_never_a_timeout():
    broken = Reply(INTERRUPTED, error="stream broke after headers")
    conclusion, shell, outcome = run_turn({"a": broken, "b": answer()})
    assert len(shell.calls) == 1 and outcome.result == "interrupted"
    # Three facts apart: the outcome, the failure class, and no clock ran out.
    assert (conclusion.outcome, conclusion.failure_class, conclusion.timeout_name) == (
        "interrupted", "interrupted", "",
    )  # fmt: skip
    (fact,) = conclusion.facts
    assert fact.kind is FactKind.TRANSIENT_FAILURE and fact.failure_class == "interrupted"
    assert fact.detail == "a: stream broke after headers"  # which provider, what was seen
    assert conclusion.detail == "stream broke after headers"
    assert conclusion.health == ()  # an interruption says nothing of health
    assert FactKind.DEADLINE_EXCEEDED not in kinds(conclusion)


def test_r6_3_interrupted_turn_recovers_when_the_conditions_hold():
    conclusion, _, _ = run_turn({"a": Reply(INTERRUPTED), "b": answer()})
    auth = RunAuthorization("run-1", frozenset())
    conditions = RecoveryConditions(
        task_identity="t", resume_task_identity="t", checkpoint_usable=True,
        admitted_authorization=auth, resume_authorization=auth, remaining_balance=2,
        original_allows_safe_continuation=True,
    )  # fmt: skip
    assert needs_recovery_conditions(conclusion.facts)
    decision = lifecycle_after(conclusion, recovery=conditions)
    assert decision.path is Path.BOUNDED_RECOVERY


def test_r6_3_cancel_stops_the_turn_without_facts_and_keeps_what_happened():
    conclusion, shell, _ = run_turn(
        {"a": Reply(SERVER_ERROR, error="503"), "b": answer()},
        dispatch=lambda sent: {"cancel_requested": sent >= 1},
    )
    assert [pid for pid, _, _ in shell.log] == ["a"]
    assert conclusion.outcome == "stopped" and conclusion.facts == ()
    assert conclusion.next_work is None and conclusion.progress is False
    assert [m.provider_id for m in conclusion.health] == ["a"]  # the 503 did happen


def test_r2_1_every_provider_failing_on_time_is_a_transient_failure():
    conclusion, _, _ = run_turn(
        {"a": Reply(SERVER_ERROR, error="503 a"), "b": Reply(RATE_LIMITED, error="429 b")}
    )
    assert conclusion.outcome == "failed"
    (fact,) = conclusion.facts
    assert (fact.kind, fact.failure_class) == (FactKind.TRANSIENT_FAILURE, "rate_limited")
    assert conclusion.detail == "429 b"
    assert [m.provider_id for m in conclusion.health] == ["a", "b"]


@pytest.mark.parametrize("classification", [BAD_REQUEST, AUTH])
def test_r2_1_failures_time_does_not_repair_are_a_turn_without_progress(classification):
    conclusion, _, _ = run_turn({"a": Reply(classification), "b": Reply(classification)})
    (fact,) = conclusion.facts
    assert fact.kind is FactKind.TURN_WITHOUT_PROGRESS
    assert classification.failure_class in fact.detail
    assert not any(f.kind is FactKind.TRANSIENT_FAILURE for f in conclusion.facts)


def test_r2_1_bad_request_fails_the_turn_without_asking_the_next_provider():
    conclusion, shell, _ = run_turn({"a": Reply(BAD_REQUEST), "b": answer()})
    assert [pid for pid, _, _ in shell.log] == ["a"]
    assert conclusion.outcome == "failed" and conclusion.health == ()


# =========================================================================== health, memory


def test_r2_3_a_refusal_is_never_a_health_fact_but_the_fallbacks_success_is():
    conclusion, shell, _ = run_turn({"a": refused(), "b": answer()})
    assert len(shell.calls) == 5
    assert [(m.provider_id, m.classification) for m in conclusion.health] == [("b", OK)]


def test_r2_2_auth_and_time_based_failures_move_health_and_a_success_too():
    conclusion, _, _ = run_turn({"a": Reply(AUTH, error="401"), "b": answer()})
    assert [
        (m.provider_id, m.classification.failure_class, m.error) for m in conclusion.health
    ] == [
        ("a", "auth", "401"),
        ("b", None, ""),
    ]


def test_r2_3_turn_memory_remembers_the_refused_history_only_request():
    conclusion, shell, _ = run_turn({"a": refused(), "b": answer()})
    history_only = shell.calls[3]
    assert history_only.kind == "history_only"
    expected = request_digest(attempt_parts(HISTORY, [TOOL_RESULT], "history_only"), "a")
    assert history_only.digest == expected
    # Kept within its segment: the same bytes in another thread are another turn.
    assert conclusion.turn_refusals == (("a", turn_memory_key(expected, SEGMENT)),)
    assert turn_memory_key(expected, SEGMENT) != turn_memory_key(expected, "other-segment")


def test_r2_3_turn_memory_remembers_a_refused_reprobe_and_not_an_accepted_one():
    due = T0 + timedelta(minutes=15)
    conclusion, shell, _ = run_turn({"a": refused(), "b": answer()},
                                    refusals={"a": state(1)}, now=due)  # fmt: skip
    assert shell.log[0] == ("a", "re_probe", 1)
    assert conclusion.turn_refusals == (("a", turn_memory_key(shell.calls[0].digest, SEGMENT)),)
    assert conclusion.counts["governance.reprobes"] == 1
    accepted, _, outcome = run_turn({"a": answer(), "b": answer()},
                                    refusals={"a": state(1)}, now=due)  # fmt: skip
    assert accepted.turn_refusals == () and outcome.cleared == ("a",)


def test_r2_3_refused_quarantine_steps_that_were_later_accepted_are_not_remembered():
    conclusion, _, _ = run_turn({"a": refused("re_render:2"), "b": answer()})
    assert conclusion.turn_refusals == ()
    assert conclusion.counts["governance.refusals"] == 2


def test_r3_6_counts_of_a_first_refused_turn():
    conclusion, _, outcome = run_turn({"a": refused(), "b": answer()})
    assert conclusion.turn is outcome
    assert conclusion.counts == {
        "governance.refusals": 4,
        "governance.reprobes": 0,
        "governance.fallbacks": 1,
        "governance.freezes": 0,
        "governance.notifications": 1,
    }


def test_r3_6_the_freezing_reprobe_counts_one_critical_notice():
    frozen_at = T0 + timedelta(hours=7, minutes=15)
    conclusion, _, _ = run_turn({"a": refused(), "b": answer()},
                                refusals={"a": state(3)}, now=frozen_at)  # fmt: skip
    assert conclusion.counts["governance.freezes"] == 1
    assert conclusion.counts["governance.notifications"] == 1


# =========================================================================== R7.2 chunks


def test_r7_2_chunks_follow_the_stream_deltas_coalesced():
    assert chunks_of("abc", ("a", "b", "c"), min_chars=2) == ["ab", "c"]
    assert chunks_of("abcd", ("a", "", "bcd"), min_chars=2) == ["abcd"]
    # Deltas that do not spell the text are not trusted: the text is the body.
    assert chunks_of("xyz", ("a", "b"), min_chars=2) == ["xyz"]
    assert chunks_of("xyz", (), min_chars=2) == ["xyz"]
    assert chunks_of("short", ("short",)) == ["short"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=12), st.integers(min_value=1, max_value=100))
def test_r7_2_chunks_spell_the_body_in_order_at_stream_boundaries(pieces, min_chars):
    text = "".join(pieces)
    chunks = chunks_of(text, pieces, min_chars)
    assert "".join(chunks) == text
    assert all(chunks)
    assert all(len(c) >= min_chars for c in chunks[:-1])
    # Each chunk ends where a delta ended.
    ends = {sum(len(p) for p in pieces[: i + 1]) for i in range(len(pieces))}
    position = 0
    for chunk in chunks:
        position += len(chunk)
        assert position in ends


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=50), min_size=1, max_size=8).filter(
    lambda ps: "".join(ps).strip()
))  # fmt: skip
def test_r7_2_committed_chunks_form_the_whole_body_with_the_last_final(pieces):
    text = "".join(pieces)
    conclusion, _, _ = run_turn({"a": Reply(text=text, pieces=tuple(pieces)), "b": answer()})
    chunks = conclusion.chunks
    assert "".join(c.text for c in chunks) == text
    assert [c.chunk_no for c in chunks] == list(range(1, len(chunks) + 1))
    assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert conclusion.facts[0].version == chunks[-1].version
    assert chunks == tuple(sorted(chunks, key=lambda c: c.chunk_no))
    assert [c.text for c in chunks] == chunks_of(text, pieces, CHUNK_MIN_CHARS)
    assert all(c.version >= 1 for c in chunks)


# =========================================================================== any stage


def test_r6_3_a_stage_after_a_user_cancel_starts_nothing():
    conclusion = conclude_stop(cancel_requested=True)
    assert conclusion.outcome == "stopped" and conclusion.facts == ()
    assert conclusion.next_work is None


def test_r6_1_a_stage_past_the_deadline_is_the_clocks_fact():
    conclusion = conclude_stop(cancel_requested=False)
    assert conclusion.timeout_name == "deadline_exceeded"
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind) == (Owner.CLOCK, FactKind.DEADLINE_EXCEEDED)
    assert lifecycle_after(conclusion).settlement.reason_code is ReasonCode.DEADLINE_EXCEEDED


@pytest.mark.parametrize("stage_kind", ["model_turn", "finalization"])
def test_r4_2_r4_4_a_broken_model_stage_is_a_turn_without_progress(stage_kind):
    conclusion = conclude_local_failure(stage_kind, 3, "KeyError: 'x'")
    assert conclusion.outcome == "error" and conclusion.detail == "KeyError: 'x'"
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind) == (Owner.PROVIDER, FactKind.TURN_WITHOUT_PROGRESS)
    assert "KeyError" in fact.detail
    assert lifecycle_after(conclusion).settlement.reason_code is ReasonCode.NO_ANSWER_PRODUCED


def test_r4_2_a_broken_tool_stage_is_that_operations_failure_not_a_veto():
    conclusion = conclude_local_failure("tool_call", 4, "ValueError: bad")
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind, fact.subject) == (
        Owner.EXECUTOR,
        FactKind.OPERATION_FAILED,
        "tool_call:4",
    )
    decision = lifecycle_after(conclusion)
    assert decision.path is Path.CONTINUE  # the run is not ended by one module
    assert any("tool_call:4 failed" in keep for keep in decision.must_keep)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("deadline_exceeded", FactKind.DEADLINE_EXCEEDED),
        ("no_progress", FactKind.NO_PROGRESS_TIMEOUT),
    ],
)
def test_r6_1_r6_2_watchdog_breach_is_the_clocks_fact_named_by_its_clock(name, kind):
    conclusion = conclude_breach(name)
    assert (conclusion.outcome, conclusion.timeout_name) == ("abandoned", name)
    (fact,) = conclusion.facts
    assert (fact.owner, fact.kind, fact.subject) == (Owner.CLOCK, kind, name)


# =========================================================================== follow-ups


def test_r6_3_bounded_recovery_resends_the_same_turn_once_the_breaker_may_half_open():
    soon = HealthVerdict(False, "open", T0 + timedelta(seconds=90), "open")
    conclusion, _, _ = run_turn({"a": answer(), "b": answer()}, health={"a": soon, "b": soon})
    decision = Decision(Path.BOUNDED_RECOVERY, "recover")
    follow = follow_up(
        decision,
        conclusion.next_work,
        last_increment=[TOOL_RESULT],
        finalization_started=False,
        recovery_delay_s=conclusion.recovery_delay_s,
        max_recovery_wait_s=60.0,
    )
    assert follow is not None and follow.kind == "model_turn"
    assert follow.payload == TurnPayload(increment=(TOOL_RESULT,), recovery=True)
    assert follow.countdown_s == 60.0  # capped: the deadline still bounds the run
    uncapped = follow_up(decision, None, last_increment=[TOOL_RESULT],
                            finalization_started=False,
                            recovery_delay_s=conclusion.recovery_delay_s)  # fmt: skip
    assert uncapped.countdown_s == 90.0


# =========================================================================== properties

REPLIES = st.sampled_from(
    [
        answer(),
        Reply(tool_calls=(SEARCH_CALL,)),
        Reply(text="", tool_calls=({"id": "z", "name": "nope", "arguments": {}},)),
        Reply(),
        Reply(REFUSAL),
        Reply(SERVER_ERROR),
        Reply(RATE_LIMITED),
        Reply(AUTH),
        Reply(BAD_REQUEST),
        Reply(TIMEOUT),
        Reply(NETWORK),
        Reply(INTERRUPTED),
        Reply(CUT, timeout_name="stage_timeout"),
        Reply(CUT, timeout_name="deadline_exceeded"),
        Reply(CUT, timeout_name="no_progress"),
    ]
)


def scripted(replies: list[Reply]) -> Callable[[str, int], Reply]:
    queue = list(replies)
    return lambda _kind, _level: queue.pop(0) if queue else Reply(REFUSAL)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(REPLIES, min_size=1, max_size=4),
    st.lists(REPLIES, min_size=1, max_size=4),
    st.booleans(),
    st.sampled_from([(TOOL_RESULT,), (USER,), ()]),
)
@example(  # a stage timeout on a, then the run's deadline cuts b
    [Reply(CUT, timeout_name="stage_timeout")],
    [Reply(CUT, timeout_name="deadline_exceeded")],
    False,
    (TOOL_RESULT,),
)
def test_r2_3_r4_4_r6_2_turn_conclusions_hold_their_invariants(a, b, final, increment):
    turn_facts = facts(increment, final=final)
    conclusion, shell, outcome = run_turn({"a": scripted(a), "b": scripted(b)}, turn_facts)
    calls = shell.calls
    assert conclusion.attempts == tuple(calls)
    # R2.3: health moves exactly for success, time-based classes and auth,
    # never for refusals, bad requests, interruptions or the run's own clock.
    assert [m.provider_id for m in conclusion.health] == [
        c.provider_id
        for c in calls
        if c.timeout_name not in RUN_CLOCK_CUTS
        and c.classification.failure_class in (TIME_BASED_CLASSES | {None, "auth"})
    ]
    # R2.3: only refused history-only requests and re-probes enter the turn memory.
    assert conclusion.turn_refusals == tuple(
        (c.provider_id, turn_memory_key(c.digest, SEGMENT))
        for c in calls
        if c.result == "refused" and c.kind in ("history_only", "re_probe")
    )
    # R4.1: no owner concludes for the run.
    run_level = {FactKind.RUN_FAILED, FactKind.RUN_COMPLETED, FactKind.ANSWER_CORRECT}
    assert not run_level & set(kinds(conclusion))
    # R4.4: progress is exactly a deliverable body or a valid tool call.
    progress_kinds = {FactKind.TURN_ANSWERED, FactKind.TURN_CALLED_TOOLS}
    assert conclusion.progress == bool(progress_kinds & set(kinds(conclusion)))
    if conclusion.progress:
        assert outcome.result == "accepted"
    if outcome.result == "accepted":
        accepted = next(c for c in reversed(calls) if c.result == "accepted")
        sent_input = list(accepted.parts[len(HISTORY) :])
        if conclusion.history:
            kept = list(conclusion.history[:-1])
            # R1.1/R1.3: history keeps exactly the input the accepted request sent
            # (the finalization instruction is not kept).
            assert kept == ([] if final else sent_input)
            assert conclusion.history[-1]["role"] == "assistant"
        if final:
            assert FactKind.TURN_CALLED_TOOLS not in kinds(conclusion)
    else:
        assert conclusion.history == () and conclusion.chunks == ()
        # R6.2: a turn the run's clock ended is named by that clock.
        if outcome.failure_class in RUN_CLOCK_CUTS:
            assert conclusion.timeout_name == outcome.failure_class
            assert [f.owner for f in conclusion.facts] == [Owner.CLOCK]
    if outcome.result == "interrupted":
        # R6.2: an interruption is no clock's cut.
        assert (conclusion.failure_class, conclusion.timeout_name) == ("interrupted", "")


def test_r5_3_retries_and_reprobes_draw_from_the_same_ledger_with_their_purpose():
    """R5.3: re-renders, re-probes and recoveries are model requests like the
    original; the purpose only says why."""
    from governance.rules.turns import ledger_purpose

    assert ledger_purpose("original", recovery=False) == "original"
    assert ledger_purpose("fallback", recovery=False) == "original"
    assert ledger_purpose("re_render", recovery=False) == "rerender"
    assert ledger_purpose("re_probe", recovery=False) == "reprobe"
    assert ledger_purpose("re_probe", recovery=True) == "recovery"


def test_r6_3_the_one_finalization_is_offered_no_tools():
    """R6.3: finalization uses accepted material only; a research turn is offered
    the segment's tool surface (R1.2)."""
    from governance.rules.turns import offered_tools

    assert offered_tools(("calculator", "kb_search"), final=False) == ("calculator", "kb_search")
    assert offered_tools(("calculator",), final=True) == ()


@pytest.mark.parametrize(
    ("cancel_requested", "now", "stops"),
    [
        (False, T0 - timedelta(microseconds=1), False),  # before the deadline
        (False, T0, True),  # reaching the deadline counts (as for the watchdog)
        (False, T0 + timedelta(seconds=1), True),
        (True, T0 - timedelta(hours=1), True),  # a stop asked for, deadline far
    ],
)
def test_r6_1_r6_3_a_stage_starts_nothing_after_a_cancel_or_at_the_deadline(
    cancel_requested, now, stops
):
    assert stage_must_stop(cancel_requested=cancel_requested, now=now, deadline_at=T0) is stops


def test_r3_1_rerender_level_counts_earlier_attempts_of_that_kind_at_that_provider():
    def call(pid: str, kind: str) -> TurnCall:
        return TurnCall(pid, "m", kind, (), T0, OK)

    calls = [call("a", "re_render"), call("a", "original"), call("b", "re_render")]
    calls.append(call("a", "re_render"))
    assert rerender_level([], "a", "re_render") == 1
    assert rerender_level(calls, "a", "re_render") == 3
    assert rerender_level(calls, "b", "re_render") == 2
    assert rerender_level(calls, "a", "history_only") == 1


def test_r2_3_turn_request_digests_match_what_the_memory_keeps():
    """The route asks the memory with the digests of the forms a turn is refused in:
    a refused history-only request and a refused re-probe (the request as is)."""
    conclusion, _, _ = run_turn({"a": refused(), "b": answer()})
    digests = turn_request_digests(HISTORY, [TOOL_RESULT], ["a", "b"], SEGMENT)
    assert conclusion.turn_refusals[0][1] in digests["a"]
    due = T0 + timedelta(minutes=15)
    probed, _, _ = run_turn({"a": refused(), "b": answer()},
                                refusals={"a": state(1)}, now=due)  # fmt: skip
    assert probed.turn_refusals[0][1] in digests["a"]
    assert set(digests["a"]).isdisjoint(digests["b"])  # a provider's memory is its own
    other_turn = turn_request_digests(
        HISTORY, [{"role": "user", "content": "else"}], ["a"], SEGMENT
    )
    assert set(other_turn["a"]).isdisjoint(digests["a"])
    other_thread = turn_request_digests(HISTORY, [TOOL_RESULT], ["a"], "other-segment")
    assert set(other_thread["a"]).isdisjoint(digests["a"])
