"""Tests for governance.rules.payloads: each stage kind's payload, typed, and the
stages already stored before the payloads had a version (R6.3 the next work a
decision starts, R6.4 a verification and its ways on).

``STORED`` holds the payloads exactly as the code before the typed payloads
wrote them (no version key), copied from its writers: ``services.runs
.submit_run``, ``rules.turns`` (a turn that called tools), ``rules.tools
.conclude_tool_call`` (the next call, the results for the model, the replay)
and ``rules.lifecycle.follow_up`` (verification, finalization, recovery).
Every one of them must still load.
"""

from __future__ import annotations

from typing import Any

import pytest

from governance.rules.payloads import (
    PAYLOAD_VERSION,
    PayloadError,
    ToolCallPayload,
    TurnPayload,
    VerifyEffectPayload,
    load_payload,
)

SEARCH = {"id": "c1", "name": "kb_search", "arguments": {"q": "x"}}
HOOK = {"id": "c2", "name": "webhook", "arguments": {"url": "https://e.test", "payload": {"a": 1}}}
FIRST_RESULT = {"role": "tool", "tool_call_id": "c1", "content": '{"n": 1}'}
UNKNOWN_RESULT = {
    "role": "tool",
    "tool_call_id": "c2",
    "content": "webhook: the effect is unknown; it is being verified before anything else.",
}
# The tool stage that met the unknown effect, and its ways on (rules.tools).
REPLAY = {
    "calls": [SEARCH, HOOK],
    "index": 1,
    "results": [FIRST_RESULT],
    "turn_stage": 7,
    "replay": True,
}
WAYS = {
    "next": {"kind": "model_turn", "payload": {"increment": [FIRST_RESULT, UNKNOWN_RESULT]}},
    "replay": {"kind": "tool_call", "payload": REPLAY},
}

STORED: dict[str, tuple[str, dict[str, Any]]] = {
    "submitted turn": (
        "model_turn",
        {"increment": [{"role": "user", "content": "What is six times seven?"}]},
    ),
    "first call of a turn": (
        "tool_call",
        {"calls": [SEARCH, HOOK], "index": 0, "results": [], "turn_stage": 7},
    ),
    "next call": (
        "tool_call",
        {
            "calls": [SEARCH, HOOK],
            "index": 1,
            "results": [FIRST_RESULT],
            "turn_stage": 7,
            "replay": False,
        },
    ),
    "replayed call": ("tool_call", REPLAY),
    "turn reading the results": ("model_turn", {"increment": [FIRST_RESULT, UNKNOWN_RESULT]}),
    "verification": ("verify_effect", {"keys": ["run:r:turn7:1:c2"], "resume": WAYS, "attempt": 2}),
    "finalization": ("finalization", {"increment": []}),
    "recovery": ("model_turn", {"increment": [FIRST_RESULT], "recovery": True}),
    # rows the dashboard's tests and older fixtures made: kinds with an empty payload
    "empty turn": ("model_turn", {}),
}


@pytest.mark.parametrize("name", STORED)
def test_r6_3_a_stage_stored_before_the_version_key_loads(name):
    kind, stored = STORED[name]
    payload = load_payload(kind, stored)
    assert payload.version == PAYLOAD_VERSION
    # What it writes back is what was stored, with the version key (and a tool
    # call's replay flag, which read as False when absent).
    # What it writes back keeps every stored key's value; it adds the version
    # and spells out defaults (a tool call's replay flag, an empty increment).
    written = payload.to_json()
    assert written["version"] == PAYLOAD_VERSION
    assert {key: _unversioned(written[key]) for key in stored} == stored
    assert set(written) - set(stored) <= {"version", "replay", "increment"}
    assert load_payload(kind, written) == payload


def _unversioned(value: Any) -> Any:
    """A written value without the version keys its nested payloads gained."""
    if isinstance(value, dict):
        return {k: _unversioned(v) for k, v in value.items() if k != "version"}
    if isinstance(value, list):
        return [_unversioned(v) for v in value]
    return value


def test_r6_3_the_stored_fields_are_read_as_attributes():
    submitted = load_payload(*STORED["submitted turn"])
    assert submitted == TurnPayload(
        increment=({"role": "user", "content": "What is six times seven?"},)
    )
    assert submitted.recovery is False
    assert load_payload(*STORED["recovery"]).recovery is True
    assert load_payload(*STORED["finalization"]) == TurnPayload()

    first = load_payload(*STORED["first call of a turn"])
    assert isinstance(first, ToolCallPayload)
    assert (first.index, first.call, first.results, first.turn_stage) == (0, SEARCH, (), 7)
    assert first.replay is False
    replayed = load_payload(*STORED["replayed call"])
    assert (replayed.index, replayed.call, replayed.replay) == (1, HOOK, True)
    assert replayed.results == (FIRST_RESULT,)
    # A call stored without the turn that asked: its key names the stage itself.
    assert load_payload("tool_call", {"calls": [SEARCH], "index": 0}).turn_stage is None


def test_r6_4_a_stored_verification_keeps_its_ways_on_typed():
    verify = load_payload(*STORED["verification"])
    assert isinstance(verify, VerifyEffectPayload)
    assert (verify.keys, verify.attempt) == (("run:r:turn7:1:c2",), 2)
    assert verify.resume["next"] == {
        "kind": "model_turn",
        "payload": TurnPayload(increment=(FIRST_RESULT, UNKNOWN_RESULT)),
    }
    replay = verify.resume["replay"]["payload"]
    assert isinstance(replay, ToolCallPayload) and replay.replay is True
    # Without an attempt or ways on (R6.4's first verification from a bare fact).
    bare = load_payload("verify_effect", {"keys": ["k1"]})
    assert (bare.resume, bare.attempt) == ({}, 1)


@pytest.mark.parametrize(
    "payload",
    [
        TurnPayload(),
        TurnPayload(increment=({"role": "user", "content": "hi"},), recovery=True),
        ToolCallPayload(calls=(SEARCH, HOOK), index=1, results=(FIRST_RESULT,), turn_stage=3),
        ToolCallPayload(calls=(SEARCH,), replay=True),
        VerifyEffectPayload(
            keys=("k1", "k2"),
            resume={
                "next": {"kind": "model_turn", "payload": TurnPayload(increment=(FIRST_RESULT,))},
                "replay": {"kind": "tool_call", "payload": ToolCallPayload(calls=(HOOK,))},
            },
            attempt=3,
        ),
    ],
)
def test_r6_3_what_is_written_loads_as_it_was(payload):
    kind = {TurnPayload: "model_turn", ToolCallPayload: "tool_call"}.get(
        type(payload), "verify_effect"
    )
    written = payload.to_json()
    assert written["version"] == PAYLOAD_VERSION
    assert load_payload(kind, written) == payload


def test_r4_2_a_payload_of_an_unknown_version_or_kind_is_refused_not_guessed():
    """A stage written by newer code is not misread: reading it raises, and the
    stage records that as its own failure, a fact (R4.2)."""
    with pytest.raises(PayloadError):
        load_payload("model_turn", {"version": PAYLOAD_VERSION + 1, "increment": []})
    with pytest.raises(PayloadError):
        load_payload("review", {})


@pytest.mark.django_db
@pytest.mark.parametrize("name", STORED)
def test_r6_3_a_stored_row_of_the_old_shape_loads_from_the_database(name):
    """The same payloads stored in a Stage row and read back: what a worker
    after the deploy reads for a stage queued before it."""
    from governance import services, time_source
    from governance.models import Provider, Stage

    kind, stored = STORED[name]
    now = time_source.now()
    Provider.objects.create(provider_id="p", kind="scripted", model="m")
    thread = services.create_thread(provider_chain=["p"], now=now)
    run, _, _ = services.submit_run(thread, input="hi", now=now)
    Stage.objects.create(run=run, seq=2, kind=kind, payload=stored, enqueued_at=now)
    row = Stage.objects.get(run=run, seq=2)
    assert row.typed_payload == load_payload(kind, stored)
