"""What a stage of each kind carries (its ``Stage.payload``), typed: pure.

The rules build these (``rules.turns`` and ``rules.tools`` name the next work,
``rules.lifecycle.follow_up`` the stage a decision starts, R6.3) and read them
(``rules.tools`` concludes a tool call or a verification, R4.1, R6.4); the
services keep them as JSON. Each type has one writer, its ``to_json``, and
there is one reader, :func:`load_payload`.

Versions: a payload written since the key existed says ``"version": 1``. One
without it was written before (an older worker, a stage already queued):
version 1's shape without the key, every missing key taking its default.
A version this code does not know is refused (:class:`PayloadError`), not
guessed at: the stage fails, and the failure is its fact (R4.2).

Frozen dataclasses, not pydantic: the rules' other values are frozen
dataclasses, this layer imports nothing outside the standard library, and a
payload is built per stage on the hot path, where a plain ``__init__`` costs
less than a validating model. The edges (the API's pydantic models) validate
what comes from outside; a payload comes from this code's own writers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PAYLOAD_VERSION = 1

Message = Mapping[str, Any]


class PayloadError(ValueError):
    """A stored payload this code cannot read (an unknown kind or version)."""


def _version(data: Mapping[str, Any]) -> int:
    version = data.get("version", PAYLOAD_VERSION)  # absent: written before the key existed
    if version != PAYLOAD_VERSION:
        raise PayloadError(f"a stage payload of version {version!r}: this code reads 1")
    return version


@dataclass(frozen=True, slots=True)
class TurnPayload:
    """A model turn's or the finalization's: the increment it brings (R3.1: not
    accepted until a provider accepts it) and whether it is a bounded recovery
    of an earlier turn (R6.3, its ledger draws keyed apart, R5.3)."""

    increment: tuple[Message, ...] = ()
    recovery: bool = False
    version: int = PAYLOAD_VERSION

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"version": self.version, "increment": list(self.increment)}
        if self.recovery:  # absent reads as False: the shape older stages have
            data["recovery"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TurnPayload:
        return cls(
            increment=tuple(data.get("increment", ())),
            recovery=bool(data.get("recovery")),
            version=_version(data),
        )


@dataclass(frozen=True, slots=True)
class ToolCallPayload:
    """One call of the calls a turn asked for (R4.1): all of them, this one's
    position, the results of the earlier ones (the next turn's increment), the
    turn that asked (its stage id names the call's key, R5.4) and whether the
    executor proved the call not performed and asked for it again (R6.4)."""

    calls: tuple[Mapping[str, Any], ...] = ()
    index: int = 0
    results: tuple[Message, ...] = ()
    turn_stage: int | None = None  # None: an older stage; its key names the stage itself
    replay: bool = False
    version: int = PAYLOAD_VERSION

    @property
    def call(self) -> Mapping[str, Any]:
        """The call this stage makes."""
        return self.calls[self.index]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "version": self.version,
            "calls": list(self.calls),
            "index": self.index,
            "results": list(self.results),
            "replay": self.replay,
        }
        if self.turn_stage is not None:
            data["turn_stage"] = self.turn_stage
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolCallPayload:
        return cls(
            calls=tuple(data.get("calls", ())),
            index=data.get("index", 0),
            results=tuple(data.get("results", ())),
            turn_stage=data.get("turn_stage"),
            replay=bool(data.get("replay")),
            version=_version(data),
        )


@dataclass(frozen=True, slots=True)
class VerifyEffectPayload:
    """A verification of unknown effects by their keys (R6.4): the ways on the
    stage that met them concluded (its next work: ``{"next", "replay"}`` for a
    tool call, each ``{"kind", "payload"}``), kept across repeated
    verifications, and which verification this is (bounded, R6.4)."""

    keys: tuple[str, ...] = ()
    resume: Mapping[str, Any] = field(default_factory=dict)
    attempt: int = 1
    version: int = PAYLOAD_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "keys": list(self.keys),
            "resume": _work_to_json(self.resume),
            "attempt": self.attempt,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerifyEffectPayload:
        return cls(
            keys=tuple(data.get("keys", ())),
            resume=_work_from_json(data.get("resume") or {}),
            attempt=data.get("attempt", 1),
            version=_version(data),
        )


StagePayload = TurnPayload | ToolCallPayload | VerifyEffectPayload

PAYLOAD_TYPES: Mapping[str, type[TurnPayload | ToolCallPayload | VerifyEffectPayload]] = {
    "model_turn": TurnPayload,
    "finalization": TurnPayload,
    "tool_call": ToolCallPayload,
    "verify_effect": VerifyEffectPayload,
}


def load_payload(kind: str, data: Mapping[str, Any] | None) -> StagePayload:
    """A stage's stored payload as its kind's type: the one reader, for what
    this code writes and for what older code wrote (no version key)."""
    try:
        payload_type = PAYLOAD_TYPES[kind]
    except KeyError:
        raise PayloadError(f"no payload type for a {kind!r} stage") from None
    return payload_type.from_json(data or {})


def _work_to_json(work: Mapping[str, Any]) -> dict[str, Any]:
    """A next work (``{"kind", "payload"}``) or an unknown effect's ways on
    (``{"next", "replay"}``) as JSON: each payload by its own ``to_json``."""
    out: dict[str, Any] = {}
    for name, value in work.items():
        if isinstance(value, TurnPayload | ToolCallPayload | VerifyEffectPayload):
            value = value.to_json()
        elif isinstance(value, Mapping):
            value = _work_to_json(value)
        out[name] = value
    return out


def _work_from_json(work: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`_work_to_json`: each work's payload as its kind's type."""
    out: dict[str, Any] = {}
    for name, value in work.items():
        if name == "payload" and isinstance(value, Mapping) and "kind" in work:
            value = load_payload(work["kind"], value)
        elif isinstance(value, Mapping):
            value = _work_from_json(value)
        out[name] = value
    return out
