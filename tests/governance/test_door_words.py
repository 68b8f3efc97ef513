"""The OpenAI-compatible door's pure parts: what a refused turn's answer says
(R3.7) and where a client's history leaves the accepted one (R1.1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from governance.models import HistoryItem
from governance.rules.refusal import (
    BOUNDARY_ACTIONS_TEXT,
    RULE_TEXT,
    ProviderRefusal,
    refusal_answer_text,
)
from governance.services.conversations import Message, diverged_at

T0 = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
DELAYS = (timedelta(minutes=15), timedelta(hours=1))


def test_r3_7_the_answer_names_each_provider_its_state_and_what_clears_it():
    refusals = {
        "b": ProviderRefusal("b", refusals=1, refused_at=T0),  # cooling
        "a": ProviderRefusal("a", refusals=3, refused_at=T0),  # sends used up: frozen
    }
    text = refusal_answer_text("s1-g1#1", refusals, T0 + timedelta(minutes=1), DELAYS)
    assert text == (
        f"Content refused in segment s1-g1#1 by a, b: {RULE_TEXT} "
        "(a: frozen since 2026-01-02 03:04 UTC; b: cooling until 2026-01-02 03:19 UTC). "
        f"A boundary clears it: {BOUNDARY_ACTIONS_TEXT}."
    )


def test_r3_7_no_refusal_state_says_no_provider_answered():
    assert refusal_answer_text("s1-g1#1", {}, T0, DELAYS) == (
        "No provider answered in segment s1-g1#1."
    )


def kept(message: Message, client_digest: str = "") -> HistoryItem:
    """An accepted history item (unsaved) holding ``message``."""
    item = message.as_item()
    return HistoryItem(
        role=item["role"], content=item["content"], tool_calls=item.get("tool_calls") or [],
        tool_call_id=item.get("tool_call_id") or "", client_digest=client_digest,
    )  # fmt: skip


def test_r1_1_a_history_that_extends_the_accepted_one_has_not_diverged():
    said = [Message.of("user", "one"), Message.of("assistant", "Echo: one")]
    assert diverged_at([kept(m) for m in said], said) is None
    assert diverged_at([], []) is None


def test_r1_1_an_edit_a_drop_or_an_addition_is_found_where_it_is():
    said = [Message.of("user", "one"), Message.of("assistant", "Echo: one")]
    accepted = [kept(m) for m in said]
    assert diverged_at(accepted, [Message.of("user", "1"), said[1]]) == 1
    assert diverged_at(accepted, [Message.of("assistant", "one"), said[1]]) == 1
    assert diverged_at(accepted, said[:1]) == 2  # the answer dropped
    assert diverged_at(accepted, [*said, Message.of("user", "x")]) == 3  # more than accepted


def test_r1_1_tool_calls_are_compared_by_value_not_by_their_texts_order():
    call = {"id": "c1", "name": "f", "arguments": {"a": 1, "b": 2}}
    accepted = [kept(Message.of("assistant", "", [call]))]
    reordered = {"id": "c1", "name": "f", "arguments": {"b": 2, "a": 1}}
    assert diverged_at(accepted, [Message.of("assistant", "", [reordered])]) is None
    other = {**call, "arguments": {"a": 2}}
    assert diverged_at(accepted, [Message.of("assistant", "", [other])]) == 1


def test_r3_1_a_result_accepted_reworded_still_matches_the_clients_own_bytes():
    sent = Message.of("tool", "raw page text", tool_call_id="c1")
    reworded = kept(Message.of("tool", "[tool content withheld]", tool_call_id="c1"), sent.digest)
    assert diverged_at([reworded], [sent]) is None
    assert diverged_at([reworded], [Message.of("tool", "other text", tool_call_id="c1")]) == 1
