"""R6.4: unknown external effects.

Whether an effect happened is proven only by its executor's lookup of the
same idempotency key; a timeout, a read-only label or a model asking to retry
leaves it unknown. Recovery never replays an unknown effect and never
re-invents one that happened. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from governance.rules.lifecycle_input import LifecycleError, is_text, require_text


class EffectState(StrEnum):
    """Whether an external effect happened, as far as its executor has proven (R6.4)."""

    UNKNOWN = "unknown"
    HAPPENED = "happened"
    DID_NOT_HAPPEN = "did_not_happen"


class EvidenceKind(StrEnum):
    """What is offered as evidence about an unknown effect (R6.4)."""

    EXECUTOR_LOOKUP = "executor_lookup"  # the executor looked the idempotency key up: proof
    TIMEOUT = "timeout"  # no answer is not "nothing happened"
    READ_ONLY_LABEL = "read_only_label"  # a label is a claim, not a receipt
    MODEL_SAYS_TRY_AGAIN = "model_says_try_again"  # a model is not the executor
    NO_RESPONSE = "no_response"


@dataclass(frozen=True)
class EffectEvidence:
    """Evidence about one effect. Only an executor lookup carries a result (``found``)."""

    kind: EvidenceKind
    idempotency_key: str | None = None
    found: bool | None = None

    def __post_init__(self) -> None:
        try:
            kind = EvidenceKind(self.kind)
        except ValueError:
            raise LifecycleError(f"unknown evidence kind {self.kind!r}") from None
        object.__setattr__(self, "kind", kind)
        if kind is EvidenceKind.EXECUTOR_LOOKUP:
            if not is_text(self.idempotency_key) or not isinstance(self.found, bool):
                raise LifecycleError(
                    "an executor lookup names the idempotency key it looked up and whether "
                    "the effect was found"
                )
        elif self.found is not None:
            raise LifecycleError(
                f"{kind!s} is not proof and cannot say whether the effect happened"
            )


def effect_state_after(idempotency_key: str, evidence: EffectEvidence) -> EffectState:
    """R6.4: the state of an unknown effect after ``evidence``.

    Only the executor's lookup by the same idempotency key resolves it; a
    timeout, a read-only label or a model saying "try again" leaves it unknown.
    """
    require_text("idempotency_key", idempotency_key)
    if not isinstance(evidence, EffectEvidence):
        raise LifecycleError("evidence must be EffectEvidence")
    if evidence.kind is not EvidenceKind.EXECUTOR_LOOKUP:
        return EffectState.UNKNOWN
    if evidence.idempotency_key != idempotency_key:
        raise LifecycleError(
            f"the lookup was for {evidence.idempotency_key!r}, not {idempotency_key!r}: "
            "evidence about another operation proves nothing here"
        )
    return EffectState.HAPPENED if evidence.found else EffectState.DID_NOT_HAPPEN


class ReplayAction(StrEnum):
    """What recovery may do with an operation, given its proven effect state (R6.4)."""

    VERIFY_FIRST = "verify_first"  # ask the executor by idempotency key; no blind replay
    READ_BACK = "read_back"  # the effect exists: read its receipt back by identity
    REPLAY_SAME_KEY = "replay_same_key"  # proven absent: replay with the same key and balance


def replay_action(state: EffectState) -> ReplayAction:
    """R6.4: never replay an unknown effect; never re-invent one that happened."""
    try:
        state = EffectState(state)
    except ValueError:
        raise LifecycleError(f"unknown effect state {state!r}") from None
    if state is EffectState.UNKNOWN:
        return ReplayAction.VERIFY_FIRST
    if state is EffectState.HAPPENED:
        return ReplayAction.READ_BACK
    return ReplayAction.REPLAY_SAME_KEY
