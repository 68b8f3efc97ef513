"""Tests for governance.rules.segments: threads, sessions, segments and boundaries
(R1.1–R1.4)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.segments import (
    NEW_SESSION_KINDS,
    OPERATOR_BOUNDARY_KINDS,
    BoundaryKind,
    BoundaryTransition,
    ClosedSegment,
    History,
    Segment,
    SegmentConfig,
    SegmentError,
    apply_boundary,
    config_changes,
    first_segment,
    history_after_boundary,
    request_parts,
)
from governance.rules.tools import client_tool_list, client_tools_of

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
BASE = SegmentConfig(
    model="model-a", mode="default", tool_surface=("search", "calc"), system_prompt="be brief"
)
CONFIG_KINDS = (
    BoundaryKind.MODEL_SWITCH,
    BoundaryKind.MODE_CHANGE,
    BoundaryKind.TOOL_SURFACE_CHANGE,
    BoundaryKind.PROMPT_CHANGE,
)


def changed(config: SegmentConfig, kind: BoundaryKind) -> SegmentConfig:
    """A configuration that differs from ``config`` exactly in what ``kind`` names."""
    if kind is BoundaryKind.MODEL_SWITCH:
        return dataclasses.replace(config, model=config.model + "+")
    if kind is BoundaryKind.MODE_CHANGE:
        return dataclasses.replace(config, mode=config.mode + "+")
    if kind is BoundaryKind.TOOL_SURFACE_CHANGE:
        return dataclasses.replace(
            config, tool_surface=(*config.tool_surface, f"tool{len(config.tool_surface)}")
        )
    if kind is BoundaryKind.PROMPT_CHANGE:
        return dataclasses.replace(config, system_prompt=config.system_prompt + "+")
    raise AssertionError(kind)


def segment(session_id: str = "s1", config: SegmentConfig = BASE) -> Segment:
    return first_segment(session_id, config, T0)


def boundary(current: Segment, kind: BoundaryKind, **overrides) -> BoundaryTransition:
    arguments = {"at": T0 + timedelta(minutes=5), "by": "operator", "reason": "stuck"}
    if kind in NEW_SESSION_KINDS:
        arguments["new_session_id"] = current.session_id + "-next"
    else:
        arguments["new_config"] = changed(current.config, kind)
    arguments.update(overrides)
    return apply_boundary(current, kind, **arguments)


# --------------------------------------------------------------------------- R1.1


def test_r1_1_request_is_system_then_history_then_new_input():
    history = History(("user: hi", "assistant: hello"))
    parts = request_parts("SYSTEM", history, ["user: next", "tool: result"])
    assert parts == ("SYSTEM", "user: hi", "assistant: hello", "user: next", "tool: result")


def test_r1_1_empty_history_and_input_leave_only_the_system_prompt():
    assert request_parts("SYSTEM", History(), []) == ("SYSTEM",)
    assert request_parts("SYSTEM", History(), ("x",)) == ("SYSTEM", "x")


def test_r1_1_history_is_replayed_verbatim_on_every_turn():
    history = History(("user: the refused text",))
    first = request_parts("S", history, ["user: try again"])
    history = history.append("user: try again", "assistant: no")
    second = request_parts("S", history, ["user: please"])
    # The earlier accepted bytes stay in the prefix, unchanged, turn after turn.
    assert second[: len(first)] == first
    assert "user: the refused text" in second


@given(
    system=st.text(max_size=5),
    history=st.lists(st.text(max_size=5), max_size=6),
    new_input=st.lists(st.text(max_size=5), max_size=4),
)
@settings(max_examples=200, deadline=None)
def test_r1_1_property_layout_order_and_lengths(system, history, new_input):
    parts = request_parts(system, History(tuple(history)), new_input)
    assert len(parts) == 1 + len(history) + len(new_input)
    assert parts[0] == system
    assert list(parts[1 : 1 + len(history)]) == history
    assert list(parts[1 + len(history) :]) == new_input


@given(
    turns=st.lists(
        st.tuples(
            st.lists(st.text(max_size=4), max_size=3), st.lists(st.text(max_size=4), max_size=3)
        ),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=200, deadline=None)
def test_r1_1_property_each_turn_request_extends_the_previous_prefix(turns):
    history = History()
    previous_prefix: tuple[str, ...] | None = None
    for new_input, reply in turns:
        parts = request_parts("SYS", history, new_input)
        prefix = parts[: 1 + len(history.items)]
        if previous_prefix is not None:
            assert prefix[: len(previous_prefix)] == previous_prefix
        previous_prefix = prefix
        history = history.append(*new_input, *reply)


# --------------------------------------------------------------------------- R1.2


def test_r1_2_first_segment_is_number_one_with_key_session_hash_number():
    opened = segment("thread-7.gen-1")
    assert opened.segment_no == 1
    assert opened.key == "thread-7.gen-1#1"
    assert opened.config == BASE
    assert opened.opened_at == T0


def test_r1_2_segment_key_follows_session_and_number():
    assert Segment("abc", 12, BASE, T0).key == "abc#12"


def test_r1_2_first_segment_treats_naive_times_as_utc_and_converts_aware_ones():
    naive = first_segment("s", BASE, datetime(2024, 5, 1, 12, 0))
    assert naive.opened_at == T0 and naive.opened_at.tzinfo == UTC
    plus_two = timezone(timedelta(hours=2))
    aware = first_segment("s", BASE, datetime(2024, 5, 1, 14, 0, tzinfo=plus_two))
    assert aware.opened_at == T0 and aware.opened_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize("bad_id", ["", "has#hash", None, 5])
def test_r1_2_first_segment_rejects_bad_session_ids(bad_id):
    with pytest.raises(SegmentError):
        first_segment(bad_id, BASE, T0)


@pytest.mark.parametrize("kind", sorted(NEW_SESSION_KINDS))
def test_r1_2_compact_and_fresh_start_open_segment_one_of_a_new_session(kind):
    current = Segment("s1", 4, BASE, T0)
    transition = boundary(current, kind, new_session_id="s2")
    assert transition.new_session is True
    assert transition.opened.session_id == "s2"
    assert transition.opened.segment_no == 1
    assert transition.opened.key == "s2#1"
    assert transition.opened.config == BASE  # configuration carries over unless changed


def test_r1_2_new_session_boundary_may_also_change_configuration():
    new_config = changed(BASE, BoundaryKind.MODEL_SWITCH)
    transition = boundary(segment(), BoundaryKind.COMPACT, new_config=new_config)
    assert transition.opened.config == new_config
    assert transition.opened.segment_no == 1


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_r1_2_any_configuration_change_increments_the_segment_number(kind):
    current = Segment("s1", 3, BASE, T0)
    new_config = changed(BASE, kind)
    transition = boundary(current, kind, new_config=new_config)
    assert transition.new_session is False
    assert transition.opened.session_id == "s1"
    assert transition.opened.segment_no == 4
    assert transition.opened.key == "s1#4"
    assert transition.opened.config == new_config


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_r1_2_config_boundary_may_name_its_own_session_explicitly(kind):
    transition = boundary(segment("s1"), kind, new_session_id="s1")
    assert transition.opened.key == "s1#2"


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_r1_2_config_changes_names_each_single_field_change(kind):
    assert config_changes(BASE, changed(BASE, kind)) == (kind,)


def test_r1_2_config_changes_lists_every_changed_field_and_nothing_for_equal():
    everything = SegmentConfig("model-b", "plan", ("shell",), "other prompt")
    assert set(config_changes(BASE, everything)) == set(CONFIG_KINDS)
    assert config_changes(BASE, dataclasses.replace(BASE)) == ()


def test_r1_2_combined_change_is_one_boundary_one_increment():
    both = dataclasses.replace(BASE, model="model-b", mode="plan")
    transition = boundary(segment(), BoundaryKind.MODEL_SWITCH, new_config=both)
    assert transition.opened.segment_no == 2
    # The same configuration also counts as a mode change.
    transition = boundary(segment(), BoundaryKind.MODE_CHANGE, new_config=both)
    assert transition.opened.segment_no == 2


def test_r1_2_tool_surface_order_and_duplicates_do_not_fake_a_change():
    reordered = SegmentConfig(BASE.model, BASE.mode, ("calc", "search", "calc"), BASE.system_prompt)
    assert reordered == BASE
    assert reordered.tool_surface == ("calc", "search")
    assert reordered.fingerprint() == BASE.fingerprint()
    assert config_changes(BASE, reordered) == ()
    with pytest.raises(SegmentError, match="tool_surface_change"):
        apply_boundary(
            segment(),
            BoundaryKind.TOOL_SURFACE_CHANGE,
            at=T0,
            by="system",
            reason="tools reloaded",
            new_config=reordered,
        )


@given(tools=st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), max_size=8), data=st.data())
@settings(max_examples=200, deadline=None)
def test_r1_2_property_tool_surface_is_a_set(tools, data):
    shuffled = data.draw(st.permutations(tools))
    extra = data.draw(st.lists(st.sampled_from(tools), max_size=3)) if tools else []
    one = SegmentConfig("m", tool_surface=tuple(tools))
    other = SegmentConfig("m", tool_surface=(*shuffled, *extra))
    assert one == other
    assert one.fingerprint() == other.fingerprint()
    assert config_changes(one, other) == ()
    assert list(one.tool_surface) == sorted(set(tools))


configs = st.builds(
    SegmentConfig,
    model=st.sampled_from(["m1", "m2"]),
    mode=st.sampled_from(["default", "plan"]),
    tool_surface=st.lists(st.sampled_from(["x", "y", "z"]), max_size=3).map(tuple),
    system_prompt=st.sampled_from(["", "p", "q"]),
)


@given(old=configs, new=configs)
@settings(max_examples=200, deadline=None)
def test_r1_2_property_change_detected_iff_configs_differ(old, new):
    changes = config_changes(old, new)
    assert (changes == ()) == (old == new)
    assert (old.fingerprint() == new.fingerprint()) == (old == new)
    assert (BoundaryKind.MODEL_SWITCH in changes) == (old.model != new.model)
    assert (BoundaryKind.MODE_CHANGE in changes) == (old.mode != new.mode)
    assert (BoundaryKind.TOOL_SURFACE_CHANGE in changes) == (
        set(old.tool_surface) != set(new.tool_surface)
    )
    assert (BoundaryKind.PROMPT_CHANGE in changes) == (old.system_prompt != new.system_prompt)


def test_r1_2_fingerprint_separates_fields_and_is_stable():
    # Moving text between fields must not collide.
    one = SegmentConfig("ab", "c")
    other = SegmentConfig("a", "bc")
    assert one.fingerprint() != other.fingerprint()
    assert one.fingerprint() == SegmentConfig("ab", "c").fingerprint()
    assert len(one.fingerprint()) == 16


def test_r1_2_a_segment_needs_a_model():
    with pytest.raises(SegmentError, match="model"):
        SegmentConfig("")


# --------------------------------------------------------------------------- R1.3


def test_r1_3_the_boundary_kinds_are_exactly_the_six_in_the_spec():
    assert {kind.value for kind in BoundaryKind} == {
        "compact",
        "fresh_start",
        "model_switch",
        "mode_change",
        "tool_surface_change",
        "prompt_change",
    }
    assert {BoundaryKind.COMPACT, BoundaryKind.FRESH_START} == NEW_SESSION_KINDS


def test_r1_3_operators_can_force_exactly_compact_fresh_start_and_model_switch():
    assert len(OPERATOR_BOUNDARY_KINDS) == 3
    assert set(OPERATOR_BOUNDARY_KINDS) == {
        BoundaryKind.COMPACT,
        BoundaryKind.FRESH_START,
        BoundaryKind.MODEL_SWITCH,
    }
    for kind in (BoundaryKind.MODE_CHANGE, BoundaryKind.TOOL_SURFACE_CHANGE):
        assert kind not in OPERATOR_BOUNDARY_KINDS
    assert BoundaryKind.PROMPT_CHANGE not in OPERATOR_BOUNDARY_KINDS


def test_r1_3_every_non_operator_kind_comes_from_a_configuration_change():
    for kind in set(BoundaryKind) - set(OPERATOR_BOUNDARY_KINDS):
        assert kind in config_changes(BASE, changed(BASE, kind))


def test_r1_3_history_is_frozen():
    history = History(("a",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        history.items = ()  # type: ignore[misc]


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_r1_3_configuration_boundaries_keep_the_history(kind):
    transition = boundary(segment(), kind)
    assert transition.history == "keep"
    history = History(("a", "b"))
    assert history_after_boundary(history, transition) == history


def test_r1_3_compact_replaces_the_history_with_a_summary():
    transition = boundary(segment(), BoundaryKind.COMPACT)
    assert transition.history == "summarize"
    after = history_after_boundary(History(("a", "refused", "c")), transition, "summary of a, c")
    assert after.items == ("summary of a, c",)
    assert "refused" not in after.items


@pytest.mark.parametrize("summary", [None, ""])
def test_r1_3_compact_without_a_summary_is_rejected(summary):
    transition = boundary(segment(), BoundaryKind.COMPACT)
    with pytest.raises(SegmentError, match="summary"):
        history_after_boundary(History(("a",)), transition, summary)


def test_r1_3_fresh_start_drops_the_history():
    transition = boundary(segment(), BoundaryKind.FRESH_START)
    assert transition.history == "drop"
    assert history_after_boundary(History(("a", "b")), transition, "ignored") == History()


# --------------------------------------------------------------------------- R1.4


def test_r1_4_boundary_closes_the_old_segment_with_who_why_and_when():
    current = segment("s1")
    at = T0 + timedelta(hours=1)
    transition = boundary(
        current, BoundaryKind.MODEL_SWITCH, at=at, by="alice", reason="  refusals froze it  "
    )
    assert transition.closed == ClosedSegment(
        key="s1#1",
        kind=BoundaryKind.MODEL_SWITCH,
        closed_by="alice",
        reason="refusals froze it",
        closed_at=at,
    )
    assert transition.opened.opened_at == at  # the next segment opens when the old one closes


@pytest.mark.parametrize("kind", list(BoundaryKind))
def test_r1_4_boundary_never_edits_the_old_segment(kind):
    current = Segment("s1", 2, BASE, T0)
    snapshot = dataclasses.replace(current)
    transition = boundary(current, kind)
    assert current == snapshot
    assert current.key == "s1#2"
    assert transition.closed.key == current.key
    assert transition.opened.key != current.key
    assert transition.opened is not current


def test_r1_4_segment_and_records_are_frozen():
    current = segment()
    transition = boundary(current, BoundaryKind.COMPACT)
    with pytest.raises(dataclasses.FrozenInstanceError):
        current.segment_no = 9  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        transition.closed.reason = "rewritten"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BASE.model = "other"  # type: ignore[misc]


def test_r1_4_kind_may_be_given_as_its_string_value():
    transition = boundary(segment(), "fresh_start", new_session_id="s9")
    assert transition.closed.kind is BoundaryKind.FRESH_START
    assert transition.opened.key == "s9#1"


def test_r1_4_close_time_is_normalised_to_utc():
    plus_two = timezone(timedelta(hours=2))
    at = datetime(2024, 5, 1, 15, 0, tzinfo=plus_two)  # 13:00 UTC
    transition = boundary(segment(), BoundaryKind.COMPACT, at=at)
    assert transition.closed.closed_at == T0 + timedelta(hours=1)
    assert transition.closed.closed_at.utcoffset() == timedelta(0)
    naive = boundary(segment(), BoundaryKind.COMPACT, at=datetime(2024, 5, 1, 13, 0))
    assert naive.closed.closed_at == T0 + timedelta(hours=1)


def test_r1_4_closing_at_the_opening_instant_is_allowed():
    transition = boundary(segment(), BoundaryKind.PROMPT_CHANGE, at=T0)
    assert transition.closed.closed_at == T0 == transition.opened.opened_at


def test_r1_4_closing_before_opening_is_rejected():
    with pytest.raises(SegmentError, match="before it opened"):
        boundary(segment(), BoundaryKind.COMPACT, at=T0 - timedelta(microseconds=1))
    # Same instant written in another zone is not "before".
    plus_two = timezone(timedelta(hours=2))
    same_instant = boundary(segment(), BoundaryKind.COMPACT, at=T0.astimezone(plus_two))
    assert same_instant.closed.closed_at == T0


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("kind", ["rollover", "COMPACT", "", None, 3])
def test_r1_3_unknown_boundary_kind_is_rejected(kind):
    with pytest.raises(SegmentError, match="unknown boundary kind"):
        apply_boundary(segment(), kind, at=T0, by="op", reason="why", new_session_id="s2")


@pytest.mark.parametrize("by", ["", "   ", None])
def test_r1_4_boundary_without_who_is_rejected(by):
    with pytest.raises(SegmentError, match="who"):
        boundary(segment(), BoundaryKind.COMPACT, by=by)


@pytest.mark.parametrize("reason", ["", "  \n\t", None, 5])
def test_r1_4_boundary_without_why_is_rejected(reason):
    with pytest.raises(SegmentError, match="why"):
        boundary(segment(), BoundaryKind.COMPACT, reason=reason)


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_r1_2_config_boundary_without_a_configuration_change_is_rejected(kind):
    current = segment()
    for same in (None, current.config, dataclasses.replace(current.config)):
        with pytest.raises(SegmentError, match="needs a configuration that changes it"):
            boundary(current, kind, new_config=same)


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_r1_2_config_boundary_must_change_what_its_kind_names(kind):
    other = next(k for k in CONFIG_KINDS if k is not kind)
    with pytest.raises(SegmentError, match=kind.value):
        boundary(segment(), kind, new_config=changed(BASE, other))


@pytest.mark.parametrize("kind", CONFIG_KINDS)
def test_r1_2_config_boundary_cannot_move_to_another_session(kind):
    with pytest.raises(SegmentError, match="same session"):
        boundary(segment("s1"), kind, new_session_id="s2")


@pytest.mark.parametrize("kind", sorted(NEW_SESSION_KINDS))
@pytest.mark.parametrize("new_session_id", [None, "", "s1"])
def test_r1_2_new_session_boundary_needs_a_new_session_id(kind, new_session_id):
    with pytest.raises(SegmentError, match="new session"):
        boundary(segment("s1"), kind, new_session_id=new_session_id)


@pytest.mark.parametrize("kind", sorted(NEW_SESSION_KINDS))
def test_r1_2_new_session_id_must_be_a_valid_session_id(kind):
    with pytest.raises(SegmentError, match="session_id"):
        boundary(segment("s1"), kind, new_session_id="s2#1")


# ------------------------------------------------------------------ properties

operations = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.lists(st.text(max_size=3), min_size=1, max_size=3)),
        st.tuples(
            st.sampled_from(list(BoundaryKind)),
            st.integers(min_value=0, max_value=10_000),  # seconds until the boundary
        ),
    ),
    max_size=30,
)


@given(ops=operations)
@settings(max_examples=200, deadline=None)
def test_r1_2_r1_3_r1_4_property_any_boundary_sequence(ops):
    """R1.2–R1.4: numbers rise by one within a session, restart at 1 in a new
    one, keys never repeat, history only grows between boundaries, old
    segments are never edited."""
    current = first_segment("gen0", BASE, T0)
    history = History()
    seen_keys = {current.key}
    sessions = 1
    for op, argument in ops:
        if op == "append":
            grown = history.append(*argument)
            assert grown.items[: len(history.items)] == history.items  # only grows
            assert len(grown.items) == len(history.items) + len(argument)
            history = grown
            continue
        kind = op
        snapshot = dataclasses.replace(current)
        at = current.opened_at + timedelta(seconds=argument)
        if kind in NEW_SESSION_KINDS:
            transition = apply_boundary(
                current, kind, at=at, by="op", reason="r", new_session_id=f"gen{sessions}"
            )
            sessions += 1
            assert transition.new_session
            assert transition.opened.session_id != current.session_id
            assert transition.opened.segment_no == 1
        else:
            transition = apply_boundary(
                current, kind, at=at, by="op", reason="r", new_config=changed(current.config, kind)
            )
            assert not transition.new_session
            assert transition.opened.session_id == current.session_id
            assert transition.opened.segment_no == current.segment_no + 1
            assert kind in config_changes(current.config, transition.opened.config)
        # R1.4: the old segment is closed, not edited.
        assert current == snapshot
        assert transition.closed.key == current.key
        assert transition.closed.kind is kind
        assert transition.closed.closed_at == at == transition.opened.opened_at
        assert transition.opened.opened_at >= current.opened_at
        # Keys never repeat across the whole thread.
        assert transition.opened.key not in seen_keys
        seen_keys.add(transition.opened.key)
        # R1.3: only boundaries remove bytes, and only as their policy says.
        summary = f"summary of {current.key}"
        next_history = history_after_boundary(history, transition, summary)
        if transition.history == "keep":
            assert next_history == history
        elif transition.history == "summarize":
            assert kind is BoundaryKind.COMPACT
            assert next_history.items == (summary,)
        else:
            assert kind is BoundaryKind.FRESH_START
            assert next_history == History()
        current, history = transition.opened, next_history
    boundaries = sum(1 for op, _ in ops if op != "append")
    assert len(seen_keys) == boundaries + 1


def test_r1_2_what_each_boundary_does_with_the_session_and_the_history():
    from governance.rules.segments import BoundaryKind, history_policy, starts_new_session

    assert (history_policy("compact"), starts_new_session("compact")) == ("summarize", True)
    assert (history_policy("fresh_start"), starts_new_session("fresh_start")) == ("drop", True)
    for kind in ("model_switch", "mode_change", "tool_surface_change", "prompt_change"):
        assert (history_policy(kind), starts_new_session(BoundaryKind(kind))) == ("keep", False)


def test_r1_3_another_client_tool_list_is_a_tool_surface_change():
    listed = client_tool_list([{"name": "b"}, {"name": "a", "parameters": {"type": "object"}}])
    same = client_tool_list([{"name": "a", "parameters": {"type": "object"}}, {"name": "b"}])
    assert listed == same  # the order the client lists them in is no change
    before = SegmentConfig(model="m", client_tools=listed)
    after = SegmentConfig(model="m", client_tools=client_tool_list([{"name": "a"}]))
    assert config_changes(before, after) == (BoundaryKind.TOOL_SURFACE_CHANGE,)
    assert before.fingerprint() != after.fingerprint()
    # Without client tools a segment's key is what it always was.
    assert (
        SegmentConfig(model="m").fingerprint()
        == SegmentConfig(model="m", client_tools="").fingerprint()
    )
    assert [t["name"] for t in client_tools_of(listed)] == ["a", "b"]
    assert client_tools_of("") == [] and client_tool_list([]) == ""
