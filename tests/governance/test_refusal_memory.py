"""Tests for governance.rules.refusal_memory: R2.3, the turn-level refusal memory."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.refusal import REFUSAL_REPROBE_DELAYS, REFUSAL_SCOPE_TTL
from governance.rules.refusal_memory import (
    TurnRefusal,
    TurnRefusalMemory,
    remember_turn_refusal,
    turn_recently_refused,
)

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


# R2.3: turn-level refusal memory


def test_r2_3_scope_ttl_is_six_hours_and_the_last_reprobe_delay() -> None:
    assert timedelta(hours=6) == REFUSAL_SCOPE_TTL
    assert REFUSAL_REPROBE_DELAYS[-1] == REFUSAL_SCOPE_TTL


def test_r2_3_turn_refusal_remembered_for_the_ttl() -> None:
    memory = remember_turn_refusal(TurnRefusalMemory(), "openai-a", "sha:abc", T0)
    assert turn_recently_refused(memory, "openai-a", "sha:abc", T0)
    last_moment = T0 + REFUSAL_SCOPE_TTL - timedelta(microseconds=1)
    assert turn_recently_refused(memory, "openai-a", "sha:abc", last_moment)
    assert not turn_recently_refused(memory, "openai-a", "sha:abc", T0 + REFUSAL_SCOPE_TTL)


def test_r2_3_turn_refusal_is_per_provider_and_per_request() -> None:
    memory = remember_turn_refusal(TurnRefusalMemory(), "openai-a", "sha:abc", T0)
    assert not turn_recently_refused(memory, "anthropic-b", "sha:abc", T0)
    assert not turn_recently_refused(memory, "openai-a", "sha:other", T0)


def test_r2_3_turn_refusal_custom_ttl() -> None:
    memory = remember_turn_refusal(TurnRefusalMemory(), "p", "d", T0)
    ttl = timedelta(minutes=5)
    assert turn_recently_refused(memory, "p", "d", T0 + timedelta(minutes=4), ttl)
    assert not turn_recently_refused(memory, "p", "d", T0 + timedelta(minutes=5), ttl)


def test_r2_3_turn_memory_is_immutable_and_keeps_the_latest_refusal() -> None:
    empty = TurnRefusalMemory()
    first = remember_turn_refusal(empty, "p", "d", T0)
    later = T0 + timedelta(hours=5)
    second = remember_turn_refusal(first, "p", "d", later)
    assert len(empty) == 0
    assert first.refused_at("p", "d") == T0
    assert second.refused_at("p", "d") == later
    assert len(second) == 1
    # An out-of-order older report never moves the anchor back.
    assert remember_turn_refusal(second, "p", "d", T0).refused_at("p", "d") == later
    assert turn_recently_refused(second, "p", "d", T0 + timedelta(hours=10))


def test_r2_3_turn_memory_equality_does_not_depend_on_insertion_order() -> None:
    a = remember_turn_refusal(
        remember_turn_refusal(TurnRefusalMemory(), "x", "1", T0), "y", "2", T0
    )
    b = remember_turn_refusal(
        remember_turn_refusal(TurnRefusalMemory(), "y", "2", T0), "x", "1", T0
    )
    assert a == b


def test_r2_3_turn_memory_rejects_bad_input() -> None:
    """R2.3: the turn memory refuses malformed keys, TTLs and times."""
    memory = TurnRefusalMemory()
    with pytest.raises(ValueError, match="provider_id"):
        remember_turn_refusal(memory, "", "d", T0)
    with pytest.raises(ValueError, match="request_digest"):
        turn_recently_refused(memory, "p", "", T0)
    with pytest.raises(ValueError, match="ttl"):
        turn_recently_refused(memory, "p", "d", T0, timedelta(0))
    with pytest.raises(ValueError, match="timezone-aware"):
        remember_turn_refusal(memory, "p", "d", datetime(2025, 1, 1))
    with pytest.raises(ValueError, match="one entry per"):
        TurnRefusalMemory((TurnRefusal("p", "d", T0), TurnRefusal("p", "d", T0)))
    with pytest.raises(ValueError, match="tuple of TurnRefusal"):
        TurnRefusalMemory([("p", "d", T0)])  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    refusals=st.lists(
        st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 48 * 3600)), max_size=10
    ),
    probe=st.integers(0, 60 * 3600),
)
def test_r2_3_property_recently_refused_iff_latest_refusal_within_ttl(
    refusals: list[tuple[str, int]], probe: int
) -> None:
    """R2.3: a turn is recently refused iff its latest refusal is within the TTL."""
    memory = TurnRefusalMemory()
    for provider, offset in refusals:
        memory = remember_turn_refusal(memory, provider, "digest", T0 + timedelta(seconds=offset))
    now = T0 + timedelta(seconds=probe)
    for provider in ("a", "b"):
        offsets = [offset for p, offset in refusals if p == provider]
        expected = bool(offsets) and probe - max(offsets) < REFUSAL_SCOPE_TTL.total_seconds()
        assert turn_recently_refused(memory, provider, "digest", now) == expected
