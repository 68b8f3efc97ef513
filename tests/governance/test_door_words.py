"""The OpenAI-compatible door's pure parts: what a refused turn's answer says
(R3.7) and where a client's history leaves the accepted one (R1.1)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

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


def test_r1_1_a_history_that_extends_the_accepted_one_has_not_diverged():
    accepted = [Message("user", "one"), Message("assistant", "Echo: one")]
    assert diverged_at(accepted, list(accepted)) is None
    assert diverged_at([], []) is None


def test_r1_1_an_edit_a_drop_or_an_addition_is_found_where_it_is():
    accepted = [Message("user", "one"), Message("assistant", "Echo: one")]
    assert diverged_at(accepted, [Message("user", "1"), accepted[1]]) == 1
    assert diverged_at(accepted, [Message("assistant", "one"), accepted[1]]) == 1
    assert diverged_at(accepted, accepted[:1]) == 2  # the answer dropped
    assert diverged_at(accepted, [*accepted, Message("user", "x")]) == 3  # more than accepted
