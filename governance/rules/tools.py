"""What a tool call and an effect verification conclude: pure (R4.1, R5.2, R6.4).

The executor owns its operation's fact: succeeded, failed, refused or unknown
(R4.1). A receipt is written before the effect; on redelivery the receipt is
read back, or — when the effect may have happened — verified by its
idempotency key, never replayed blindly (R6.4).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from governance.rules import lifecycle as lc
from governance.rules.turns import ReceiptClose, StageConclusion

EFFECT_FACT_KINDS: Mapping[str, lc.FactKind] = {
    "succeeded": lc.FactKind.OPERATION_SUCCEEDED,
    "failed": lc.FactKind.OPERATION_FAILED,
    "refused": lc.FactKind.OPERATION_REFUSED,
    "unknown": lc.FactKind.EFFECT_UNKNOWN,
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
    if name in tool_surface:
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
        state = lc.EffectState.HAPPENED
    elif receipt_effect is None or not external:
        return "perform"
    elif verified_replay:
        state = lc.EffectState.DID_NOT_HAPPEN
    else:
        state = lc.EffectState.UNKNOWN
    action = lc.replay_action(state)
    return {
        lc.ReplayAction.READ_BACK: "read_back",
        lc.ReplayAction.VERIFY_FIRST: "verify",
        lc.ReplayAction.REPLAY_SAME_KEY: "perform",
    }[action]


def tool_message(name: str, effect: str, output: Any, error: str) -> str:
    """The tool result as the model will read it (the unaccepted increment, R3.1)."""
    if effect == "succeeded":
        return json.dumps(output, ensure_ascii=False, default=str)[:TOOL_MESSAGE_MAX_CHARS]
    if effect == "unknown":
        return f"{name}: the effect is unknown; it is being verified before anything else."
    return f"{name} {effect}: {error or 'no detail'}"


def conclude_tool_call(
    payload: Mapping[str, Any],
    *,
    effect: str,
    output: Any,
    error: str,
    key: str,
    close_receipt: bool = True,
) -> StageConclusion:
    """R4.1/R6.3: the executor's fact about one call, and the work that follows:
    the next call of the turn, or the model turn that reads the results."""
    call = payload["calls"][payload["index"]]
    results = [
        *payload.get("results", []),
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": tool_message(call["name"], effect, output, error),
        },
    ]
    if payload["index"] + 1 < len(payload["calls"]):
        next_work: dict[str, Any] = {
            "kind": "tool_call",
            "payload": {
                **payload,
                "index": payload["index"] + 1,
                "results": results,
                "replay": False,
            },
        }
    else:
        next_work = {"kind": "model_turn", "payload": {"increment": results}}
    if effect == "unknown":
        # The lifecycle asks for verification first; both ways on are carried.
        next_work = {
            "next": next_work,
            "replay": {"kind": "tool_call", "payload": {**payload, "replay": True}},
        }
    fact = lc.OwnerFact(
        lc.Owner.EXECUTOR,
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
    state: lc.EffectState
    output: Any = None


def effect_evidence(key: str, lookup_effect: str) -> lc.EffectEvidence:
    """The executor's lookup by key as R6.4 evidence: found, proven absent, or no answer."""
    if lookup_effect == "succeeded":
        return lc.EffectEvidence(lc.EvidenceKind.EXECUTOR_LOOKUP, key, True)
    if lookup_effect == "failed":
        return lc.EffectEvidence(lc.EvidenceKind.EXECUTOR_LOOKUP, key, False)
    return lc.EffectEvidence(lc.EvidenceKind.NO_RESPONSE)


def conclude_verification(
    payload: Mapping[str, Any], verdicts: Sequence[ReceiptVerdict]
) -> StageConclusion:
    """R6.4: happened → the receipt becomes a success and work resumes; proven
    not performed → the same call is replayed with the SAME key; still unknown
    → verify again later, at most MAX_VERIFICATIONS times, then a hard limit
    settles the run with the effect listed as unknown. Never a blind replay."""
    attempt = payload.get("attempt", 1)
    resume = payload.get("resume") or {}
    next_work = resume.get("next")
    facts = []
    receipts = []
    still_unknown = []
    for verdict in verdicts:
        action = lc.replay_action(verdict.state)
        if action is lc.ReplayAction.READ_BACK:
            kind = lc.FactKind.EFFECT_HAPPENED
            receipts.append(ReceiptClose(verdict.key, "succeeded", verdict.output, verified=True))
        elif action is lc.ReplayAction.REPLAY_SAME_KEY:
            kind = lc.FactKind.EFFECT_DID_NOT_HAPPEN
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
            continue
        facts.append(
            lc.OwnerFact(lc.Owner.EXECUTOR, kind, verdict.tool, idempotency_key=verdict.key)
        )
    if still_unknown and attempt >= MAX_VERIFICATIONS:
        facts.append(
            lc.OwnerFact(
                lc.Owner.RESOURCE,
                lc.FactKind.HARD_LIMIT_REACHED,
                "tool_calls",
                detail=f"effect still unknown after {attempt} verifications",
            )
        )
    return StageConclusion(
        outcome="still_unknown" if still_unknown else "verified",
        facts=tuple(facts),
        next_work=next_work,
        receipts=tuple(receipts),
    )
