"""The pure rules of registry tools: effect classes from MCP
annotations (R4.1, R6.4), outcomes as effects (R6.2), surfaces with
``server.*`` (R1.2), schema fingerprints and reversible wire names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from governance.rules import tools as rules
from governance.rules.authority import FactKind
from governance.rules.effects import EffectState
from governance.rules.payloads import VerifyEffectPayload
from governance.rules.segments import SegmentConfig, config_changes, surface_allows


@pytest.mark.parametrize(
    ("annotations", "override", "expected"),
    [
        ({"readOnlyHint": True}, None, "read_only"),
        ({"readOnlyHint": False}, None, "external_effect"),
        ({"destructiveHint": False}, None, "external_effect"),  # not destructive still acts
        ({"idempotentHint": True}, None, "external_effect"),  # idempotent is no proof (R6.4)
        (None, None, "external_effect"),  # MCP's default: may act
        ({"readOnlyHint": True}, "external_effect", "external_effect"),  # the registry wins
        ({}, "read_only", "read_only"),
        ({}, "bogus", "external_effect"),
    ],
)
def test_r6_4_effect_class_from_annotations_and_overrides(annotations, override, expected):
    assert rules.effect_class(annotations, override) == expected


@pytest.mark.parametrize(
    ("end", "external", "read_only"),
    [
        ("result", "succeeded", "succeeded"),
        ("tool_error", "failed", "failed"),
        ("server_error", "failed", "failed"),
        ("not_sent", "failed", "failed"),
        ("no_answer", "unknown", "failed"),
    ],
)
def test_r6_2_call_ends_as_effects(end, external, read_only):
    assert rules.call_effect(end, "external_effect") == external
    assert rules.call_effect(end, "read_only") == read_only


@pytest.mark.parametrize(
    ("status", "end"),
    [(200, "result"), (204, "result"), (404, "tool_error"), (500, "tool_error"),
     (502, "no_answer"), (504, "no_answer"), (302, "no_answer")],
)  # fmt: skip
def test_r6_2_http_status_reads_like_the_webhook_table(status, end):
    assert rules.http_status_end(status) == end


def test_r1_2_surfaces_name_tools_alone_or_a_server_with_its_wildcard():
    surface = ["calculator", "files.*", "web.fetch"]
    assert surface_allows("files.read", surface) and surface_allows("calculator", surface)
    assert surface_allows("web.fetch", surface) and not surface_allows("web.post", surface)
    assert not surface_allows("kb_search", surface) and not surface_allows(".*", surface)
    assert rules.surface_refusal("web.post", surface) == (
        "web.post is not in this segment's tool surface"
    )
    listed = {"files": ["read", "write"]}
    assert rules.surface_names(surface, listed) == (
        "calculator", "files.read", "files.write", "web.fetch",
    )  # fmt: skip


def test_r1_3_same_names_other_schemas_is_a_tool_surface_change():
    old = SegmentConfig(model="m", tool_surface=("files.*",), tool_schemas="a")
    new = SegmentConfig(model="m", tool_surface=("files.*",), tool_schemas="b")
    assert config_changes(old, new) == ("tool_surface_change",)
    assert old.fingerprint() != new.fingerprint()
    # Without registry tools the fingerprint is what it always was.
    assert SegmentConfig(model="m").fingerprint() == SegmentConfig(model="m").fingerprint()


def test_r1_3_schema_fingerprint_ignores_order_and_sees_every_schema_change():
    a = {"name": "a", "input_schema": {"type": "object"}}
    b = {"name": "b", "input_schema": {"type": "object"}}
    assert rules.schema_fingerprint([a, b]) == rules.schema_fingerprint([b, a])
    changed = {**b, "input_schema": {"type": "object", "required": ["x"]}}
    assert rules.schema_fingerprint([a, b]) != rules.schema_fingerprint([a, changed])
    hinted = {**b, "annotations": {"readOnlyHint": True}}
    assert rules.schema_fingerprint([a, b]) != rules.schema_fingerprint([a, hinted])


def test_r1_1_wire_names_keep_readable_names_and_read_back():
    mapping = rules.wire_names(["calculator", "files.read", "files.list-all", "git.log/tail"])
    assert mapping["calculator"] == "calculator"
    assert mapping["files.read"] == "files__read"
    assert mapping["files.list-all"] == "files__list-all"
    assert rules.WIRE_NAME.fullmatch(mapping["git.log/tail"])
    for name, wire in mapping.items():
        assert rules.tool_name_of(wire, mapping) == name
    assert rules.tool_name_of("not_offered", mapping) == "not_offered"


@given(st.lists(st.text(min_size=1, max_size=150), max_size=20))
def test_r1_1_wire_names_are_always_valid_distinct_and_reversible(names):
    mapping = rules.wire_names(names)
    assert set(mapping) == set(names)
    assert len(set(mapping.values())) == len(mapping)
    for name, wire in mapping.items():
        assert rules.WIRE_NAME.fullmatch(wire)
        assert rules.tool_name_of(wire, mapping) == name


def test_r6_4_an_unknown_effect_without_a_verification_contract_settles_at_once():
    unverifiable = rules.ReceiptVerdict("k", "files.write", EffectState.UNKNOWN, None, False)
    conclusion = rules.conclude_verification(VerifyEffectPayload(attempt=1), [unverifiable])
    assert conclusion.outcome == "still_unknown"
    (fact,) = conclusion.facts
    assert fact.kind is FactKind.HARD_LIMIT_REACHED and "no verification contract" in (fact.detail)
    # One that can be asked is asked again later instead (up to MAX_VERIFICATIONS).
    askable = rules.ReceiptVerdict("k", "notify", EffectState.UNKNOWN)
    assert rules.conclude_verification(VerifyEffectPayload(attempt=1), [askable]).facts == ()
