"""What a tool call and an effect verification conclude: pure (R4.1, R5.2, R6.4).

The executor owns its operation's fact: succeeded, failed, refused or unknown
(R4.1). A receipt is written before the effect; on redelivery the receipt is
read back, or — when the effect may have happened — verified by its
idempotency key, never replayed blindly (R6.4).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from governance.rules.authority import FactKind, Owner, OwnerFact
from governance.rules.effects import (
    EffectEvidence,
    EffectState,
    EvidenceKind,
    ReplayAction,
    replay_action,
)
from governance.rules.payloads import ToolCallPayload, TurnPayload, VerifyEffectPayload
from governance.rules.segments import SURFACE_WILDCARD, surface_allows
from governance.rules.turns import ReceiptClose, StageConclusion

EFFECT_FACT_KINDS: Mapping[str, FactKind] = {
    "succeeded": FactKind.OPERATION_SUCCEEDED,
    "failed": FactKind.OPERATION_FAILED,
    "refused": FactKind.OPERATION_REFUSED,
    "unknown": FactKind.EFFECT_UNKNOWN,
}
TOOL_MESSAGE_MAX_CHARS = 8000
MAX_VERIFICATIONS = 3


def tool_key(run_id: str, turn_stage: int, index: int, call_id: str) -> str:
    """R5.4/R6.4: a call's idempotency key, stable across redelivery.

    Call ids are not unique (servers may omit them, scripts fix them): the key
    names the turn that asked and the call's position in it.
    """
    return f"run:{run_id}:turn{turn_stage}:{index}:{call_id}"


# R5.2: a search also draws from the run's own search quota.
SEARCH_TOOLS = frozenset({"kb_search"})


@dataclass(frozen=True)
class ToolAdmission:
    """What a call must be admitted for before it is made (R5.2): its resources,
    each with the ledger key suffix and the words when it is refused."""

    resource: str
    key_suffix: str
    refused_words: str


def tool_admissions(name: str) -> tuple[ToolAdmission, ...]:
    """R5.2: every call draws a tool call; a search also draws from the search
    quota (exhausted, it refuses new searches, not results already fetched)."""
    admissions = [ToolAdmission("tool_calls", "tool", "the tool-call budget is used up")]
    if name in SEARCH_TOOLS:
        admissions.append(
            ToolAdmission("web_searches", "search", "the search quota is used up (R5.2)")
        )
    return tuple(admissions)


def surface_refusal(name: str, tool_surface: Sequence[str]) -> str | None:
    """R1.2: a call outside the segment's tool surface is refused by its executor."""
    if surface_allows(name, tool_surface):
        return None
    return f"{name} is not in this segment's tool surface"


ReceiptStep = Literal["read_back", "verify", "perform"]


def receipt_step(
    receipt_effect: str | None, *, external: bool, verified_replay: bool
) -> ReceiptStep:
    """R6.4: what a delivery of a tool call does with the call's receipt.

    ``receipt_effect`` is None when this delivery wrote the receipt. A closed
    receipt is read back by identity. A pending one left by an earlier delivery
    of an external tool may have had its effect: verify first — unless the
    executor verified it did not happen (``verified_replay``), then the same
    key is replayed. Built-in read-only tools have no external effect to repeat.
    """
    if receipt_effect is not None and receipt_effect != "pending":
        state = EffectState.HAPPENED
    elif receipt_effect is None or not external:
        return "perform"
    elif verified_replay:
        state = EffectState.DID_NOT_HAPPEN
    else:
        state = EffectState.UNKNOWN
    action = replay_action(state)
    return {
        ReplayAction.READ_BACK: "read_back",
        ReplayAction.VERIFY_FIRST: "verify",
        ReplayAction.REPLAY_SAME_KEY: "perform",
    }[action]


def tool_message(name: str, effect: str, output: Any, error: str) -> str:
    """The tool result as the model will read it (the unaccepted increment, R3.1)."""
    if effect == "succeeded":
        return json.dumps(output, ensure_ascii=False, default=str)[:TOOL_MESSAGE_MAX_CHARS]
    if effect == "unknown":
        return f"{name}: the effect is unknown; it is being verified before anything else."
    return f"{name} {effect}: {error or 'no detail'}"


def conclude_tool_call(
    payload: ToolCallPayload,
    *,
    effect: str,
    output: Any,
    error: str,
    key: str,
    close_receipt: bool = True,
) -> StageConclusion:
    """R4.1/R6.3: the executor's fact about one call, and the work that follows:
    the next call of the turn, or the model turn that reads the results."""
    call = payload.call
    results = (
        *payload.results,
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": tool_message(call["name"], effect, output, error),
        },
    )
    if payload.index + 1 < len(payload.calls):
        following = replace(payload, index=payload.index + 1, results=results, replay=False)
        next_work: dict[str, Any] = {"kind": "tool_call", "payload": following}
    else:
        next_work = {"kind": "model_turn", "payload": TurnPayload(increment=results)}
    if effect == "unknown":
        # The lifecycle asks for verification first; both ways on are carried.
        next_work = {
            "next": next_work,
            "replay": {"kind": "tool_call", "payload": replace(payload, replay=True)},
        }
    fact = OwnerFact(
        Owner.EXECUTOR,
        EFFECT_FACT_KINDS[effect],
        f"{call['name']}:{call['id']}",
        detail=error,
        idempotency_key=key if effect == "unknown" else None,
    )
    return StageConclusion(
        outcome=effect,
        facts=(fact,),
        detail=error,
        progress=effect == "succeeded",  # a tool receipt is business progress (R6.1)
        next_work=next_work,
        receipts=(ReceiptClose(key, effect, output, error),) if close_receipt else (),
    )


@dataclass(frozen=True)
class ReceiptVerdict:
    """What the executor's lookup proved about one unknown effect (R6.4)."""

    key: str
    tool: str
    state: EffectState
    output: Any = None
    # False: the executor has no way to ask (an MCP tool, an HTTP tool without
    # a verification URL); asking again later cannot prove anything either.
    verifiable: bool = True


def effect_evidence(key: str, lookup_effect: str) -> EffectEvidence:
    """The executor's lookup by key as R6.4 evidence: found, proven absent, or no answer."""
    if lookup_effect == "succeeded":
        return EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, key, True)
    if lookup_effect == "failed":
        return EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, key, False)
    return EffectEvidence(EvidenceKind.NO_RESPONSE)


def conclude_verification(
    payload: VerifyEffectPayload, verdicts: Sequence[ReceiptVerdict]
) -> StageConclusion:
    """R6.4: happened → the receipt becomes a success and work resumes; proven
    not performed → the same call is replayed with the SAME key; still unknown
    → verify again later, at most MAX_VERIFICATIONS times, then a hard limit
    settles the run with the effect listed as unknown — at once when the tool
    has no verification contract (nothing later could prove it). Never a blind
    replay."""
    attempt = payload.attempt
    resume = payload.resume  # the ways on, as the stage that met the effect concluded them
    next_work = resume.get("next")
    facts = []
    receipts = []
    still_unknown = []
    unverifiable = False
    for verdict in verdicts:
        action = replay_action(verdict.state)
        if action is ReplayAction.READ_BACK:
            kind = FactKind.EFFECT_HAPPENED
            receipts.append(ReceiptClose(verdict.key, "succeeded", verdict.output, verified=True))
        elif action is ReplayAction.REPLAY_SAME_KEY:
            kind = FactKind.EFFECT_DID_NOT_HAPPEN
            next_work = resume.get("replay") or next_work
            receipts.append(
                ReceiptClose(
                    verdict.key,
                    "pending",
                    error="verified: not performed; replaying with the same key",
                    verified=True,
                )
            )
        else:
            still_unknown.append(verdict.key)
            unverifiable = unverifiable or not verdict.verifiable
            continue
        facts.append(OwnerFact(Owner.EXECUTOR, kind, verdict.tool, idempotency_key=verdict.key))
    if still_unknown and (attempt >= MAX_VERIFICATIONS or unverifiable):
        detail = (
            "the effect stays unknown: the tool has no verification contract"
            if unverifiable
            else f"effect still unknown after {attempt} verifications"
        )
        facts.append(
            OwnerFact(Owner.RESOURCE, FactKind.HARD_LIMIT_REACHED, "tool_calls", detail=detail)
        )
    return StageConclusion(
        outcome="still_unknown" if still_unknown else "verified",
        facts=tuple(facts),
        next_work=next_work,
        receipts=tuple(receipts),
    )


# ---------------------------------------------------------------------------
# Registry tools: MCP servers and HTTP endpoints under the same rules.

ToolEffectClass = Literal["read_only", "external_effect"]
EFFECT_CLASSES: tuple[str, ...] = ("read_only", "external_effect")


# R4.1/R6.4: the built-in tools that act outside (the webhook POSTs to a receiver);
# the others (calculator, knowledge-base search) only read.
BUILTIN_EXTERNAL_TOOLS: frozenset[str] = frozenset({"webhook"})


def builtin_effect_class(name: str) -> str:
    """The effect class of a built-in tool (a registry tool's comes with its listing)."""
    return "external_effect" if name in BUILTIN_EXTERNAL_TOOLS else "read_only"


def has_external_effect(name: str, recorded_class: str) -> bool:
    """R6.4: whether a call may have acted outside — a built-in that does, or a
    registry tool whose receipt recorded ``external_effect`` (the class recorded
    with the receipt decides, even if the registry changed since)."""
    return name in BUILTIN_EXTERNAL_TOOLS or recorded_class == "external_effect"


def registry_tool_name(server: str, tool: str) -> str:
    """An MCP server's tool as the surface, the model and the receipts name it."""
    return f"{server}.{tool}"


def split_tool_name(name: str) -> tuple[str, str | None]:
    """``"files.read"`` → ("files", "read"); an HTTP tool or a built-in: (name, None)."""
    server, dot, tool = name.partition(".")
    return (server, tool) if dot else (name, None)


def effect_class(annotations: Mapping[str, Any] | None, override: str | None = None) -> str:
    """R4.1/R6.4: which effect class an MCP tool has. The registry's override
    wins; else the server's ``readOnlyHint: true`` makes it ``read_only``; any
    other tool may act outside (MCP's own default is ``destructiveHint: true``),
    so ``external_effect``. ``destructiveHint`` and ``idempotentHint`` describe
    the kind of effect, not its absence: an idempotent tool still acts, and an
    unknown outcome is verified, never replayed on the hint alone (R6.4)."""
    if override in EFFECT_CLASSES:
        return override
    hints = annotations or {}
    read_only = hints.get("readOnlyHint", hints.get("read_only_hint"))
    return "read_only" if read_only is True else "external_effect"


def uncertain_effect(effect_class_: str) -> str:
    """R6.2/R6.4: a call whose request left but whose answer did not come back
    (timeout, reset, a gateway speaking for the origin): the effect of an
    ``external_effect`` tool is unknown (verify, never replay blindly); a
    ``read_only`` tool changed nothing, so the call simply failed."""
    return "unknown" if effect_class_ == "external_effect" else "failed"


CallEnd = Literal["result", "tool_error", "server_error", "not_sent", "no_answer"]


def call_effect(end: CallEnd, effect_class_: str) -> str:
    """R4.1/R6.2: what one registry call's end says about its effect.

    ``result`` → succeeded; ``tool_error`` (MCP ``isError``, HTTP 4xx/5xx) is
    the tool's own fact → failed, and the run goes on (R4.2); ``server_error``
    (the server answered with a protocol error: it did not run the call) →
    failed; ``not_sent`` (connecting, handshake, outbound check) → failed:
    nothing left; ``no_answer`` (timeout or transport failure after the
    request was sent) → :func:`uncertain_effect`."""
    if end == "result":
        return "succeeded"
    if end == "no_answer":
        return uncertain_effect(effect_class_)
    return "failed"


def http_status_end(status: int) -> CallEnd:
    """An HTTP tool's answer, as the webhook table reads it (tasks/tools.py):
    2xx result; 4xx and 5xx other than 502/504 are the receiver's own failure;
    502/504, 1xx and 3xx speak for an origin that may have acted."""
    if 200 <= status < 300:
        return "result"
    if 400 <= status < 500 or (status >= 500 and status not in (502, 504)):
        return "tool_error"
    return "no_answer"


def surface_names(
    tool_surface: Sequence[str], listed: Mapping[str, Sequence[str]]
) -> tuple[str, ...]:
    """R1.2: the tool names a surface offers, with each ``"{server}.*"``
    expanded to the server's listed tools. ``listed`` maps an MCP server to its
    tool names; an HTTP tool or a built-in is its own name. Sorted, no repeats."""
    names: set[str] = set()
    for entry in tool_surface:
        if entry.endswith(SURFACE_WILDCARD):
            server = entry[: -len(SURFACE_WILDCARD)]
            names.update(registry_tool_name(server, tool) for tool in listed.get(server, ()))
        else:
            names.add(entry)
    return tuple(sorted(names))


def schema_fingerprint(tools: Iterable[Mapping[str, Any]]) -> str:
    """The identity of a listing's schemas: names, descriptions, argument
    schemas and annotations, in name order (the server's order is no change)."""
    rows = sorted(
        (
            [
                t.get("name", ""),
                t.get("description", ""),
                t.get("input_schema", {}),
                t.get("annotations") or {},
            ]
            for t in tools
        ),
        key=lambda row: row[0],
    )
    payload = json.dumps(rows, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def client_tool_list(tools: Iterable[Mapping[str, Any]]) -> str:
    """A client's own tools ({"name", "description", "parameters"}) as the one
    text its segment keeps (R1.3): in name order with sorted keys, so the same
    tools sent in another order are no change; "" for none."""
    rows = sorted(
        (
            {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            }
            for t in tools
        ),
        key=lambda row: row["name"],
    )
    return json.dumps(rows, sort_keys=True, ensure_ascii=False) if rows else ""


def client_tools_of(listed: str) -> list[dict[str, Any]]:
    """The client's tools a segment keeps (:func:`client_tool_list`'s text)."""
    return json.loads(listed) if listed else []


# OpenAI's function names (Anthropic's tool names follow the same pattern).
WIRE_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_WIRE_SEPARATOR = "__"  # stands for the "." of "{server}.{tool}"; server names never hold it


def wire_name(name: str) -> str:
    """One tool name as a provider allows it (``[a-zA-Z0-9_-]{1,64}``).

    A valid name without ``__`` stays; ``"{server}.{tool}"`` becomes
    ``"{server}__{tool}"`` when that is valid (server names hold neither "."
    nor "__", so it reads back unambiguously); anything else keeps a readable
    prefix and a digest of the whole name."""
    if WIRE_NAME.fullmatch(name) and _WIRE_SEPARATOR not in name:
        return name
    server, tool = split_tool_name(name)
    if tool is not None:
        joined = f"{server}{_WIRE_SEPARATOR}{tool}"
        if WIRE_NAME.fullmatch(joined) and _WIRE_SEPARATOR not in tool:
            return joined
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    readable = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:50]
    return f"{readable}-{digest}"


def wire_names(names: Iterable[str]) -> dict[str, str]:
    """The reversible map from tool names to wire names for one request: every
    wire name valid and distinct (a clash gets a digest of its own)."""
    mapping: dict[str, str] = {}
    used: set[str] = set()
    for name in sorted(set(names)):
        wire = wire_name(name)
        if wire in used:
            wire = f"{wire[:40]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        used.add(wire)
        mapping[name] = wire
    return mapping


def tool_name_of(wire: str, mapping: Mapping[str, str]) -> str:
    """The tool name a model's call means: the map's inverse, else the name as sent
    (a name that was not offered is then refused by the surface, R1.2)."""
    for name, offered in mapping.items():
        if offered == wire:
            return name
    return wire
