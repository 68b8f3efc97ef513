"""R6.4: unknown external effects and what proves them (governance.rules.effects)."""

from __future__ import annotations

import pytest

from governance.rules.effects import (
    EffectEvidence,
    EffectState,
    EvidenceKind,
    ReplayAction,
    effect_state_after,
    replay_action,
)
from governance.rules.lifecycle_input import LifecycleError


@pytest.mark.parametrize(
    "kind",
    [
        EvidenceKind.TIMEOUT,
        EvidenceKind.READ_ONLY_LABEL,
        EvidenceKind.MODEL_SAYS_TRY_AGAIN,
        EvidenceKind.NO_RESPONSE,
    ],
)
def test_r6_4_timeout_label_or_model_retry_is_not_proof(kind: EvidenceKind) -> None:
    state = effect_state_after("k1", EffectEvidence(kind, idempotency_key="k1"))
    assert state is EffectState.UNKNOWN
    assert replay_action(state) is ReplayAction.VERIFY_FIRST
    with pytest.raises(LifecycleError, match="not proof"):
        EffectEvidence(kind, found=False)


@pytest.mark.parametrize(
    ("found", "state", "action"),
    [
        (True, EffectState.HAPPENED, ReplayAction.READ_BACK),
        (False, EffectState.DID_NOT_HAPPEN, ReplayAction.REPLAY_SAME_KEY),
    ],
)
def test_r6_4_executor_lookup_by_key_is_proof(
    found: bool, state: EffectState, action: ReplayAction
) -> None:
    evidence = EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, idempotency_key="k1", found=found)
    assert effect_state_after("k1", evidence) is state
    assert replay_action(state) is action


def test_r6_4_lookup_for_another_key_proves_nothing() -> None:
    evidence = EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, idempotency_key="k2", found=False)
    with pytest.raises(LifecycleError, match="another operation"):
        effect_state_after("k1", evidence)


@pytest.mark.parametrize(
    "build",
    [
        lambda: EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, found=True),  # no key
        lambda: EffectEvidence(EvidenceKind.EXECUTOR_LOOKUP, idempotency_key="k1"),  # no result
        lambda: EffectEvidence("hunch"),  # type: ignore[arg-type]
        lambda: effect_state_after("", EffectEvidence(EvidenceKind.TIMEOUT)),
        lambda: effect_state_after("k1", "timeout"),  # type: ignore[arg-type]
        lambda: replay_action("maybe"),  # type: ignore[arg-type]
    ],
)
def test_r6_4_bad_effect_evidence_is_rejected(build) -> None:
    with pytest.raises(LifecycleError):
        build()
