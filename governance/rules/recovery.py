"""R6.4: recovery eligibility.

Bounded recovery needs all five conditions: the same task identity, a usable
checkpoint, the authorization recorded at admission, a remaining balance and
a safe continuation. Every failed condition is named, in words the decision's
reason uses. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from governance.rules._checks import is_int
from governance.rules.budget import ORDINARY_RESEARCH_RESOURCE
from governance.rules.lifecycle_input import LifecycleError, require_text


@dataclass(frozen=True)
class RunAuthorization:
    """The authorization recorded for a run at admission (R6.4)."""

    run_id: str
    scopes: frozenset[str]

    def __post_init__(self) -> None:
        require_text("authorization run_id", self.run_id)
        if not isinstance(self.scopes, frozenset):
            raise LifecycleError("scopes must be a frozenset")


class RecoveryCondition(StrEnum):
    """The five conditions of R6.4; recovery needs all of them."""

    SAME_TASK_IDENTITY = "same_task_identity"
    USABLE_CHECKPOINT = "usable_checkpoint"
    SAME_RUN_AUTHORIZATION = "same_run_authorization"
    REMAINING_BALANCE = "remaining_balance"
    SAFE_CONTINUATION = "safe_continuation"


@dataclass(frozen=True)
class RecoveryConditions:
    """The facts R6.4 judges, as read from their owners.

    ``permission_table_now`` is carried for the record and deliberately never
    consulted: a running run keeps the authorization recorded at admission, so a
    changed permission table cannot re-judge it.
    """

    task_identity: str  # recorded at admission
    resume_task_identity: str  # what the recovery would carry on
    checkpoint_usable: bool
    admitted_authorization: RunAuthorization
    resume_authorization: RunAuthorization
    remaining_balance: int  # read from the resource owner's view (R5.1), never a fresh grant
    original_allows_safe_continuation: bool
    unknown_effect_keys: tuple[str, ...] = ()
    permission_table_now: frozenset[str] | None = None

    def __post_init__(self) -> None:
        require_text("task_identity", self.task_identity)
        require_text("resume_task_identity", self.resume_task_identity)
        for name in ("checkpoint_usable", "original_allows_safe_continuation"):
            if not isinstance(getattr(self, name), bool):
                raise LifecycleError(f"{name} must be a bool")
        for name in ("admitted_authorization", "resume_authorization"):
            if not isinstance(getattr(self, name), RunAuthorization):
                raise LifecycleError(f"{name} must be a RunAuthorization")
        if not is_int(self.remaining_balance) or self.remaining_balance < 0:
            raise LifecycleError("remaining_balance must be an int >= 0")
        if not isinstance(self.unknown_effect_keys, tuple):
            raise LifecycleError("unknown_effect_keys must be a tuple")


@dataclass(frozen=True)
class RecoveryEligibility:
    """R6.4 verdict: eligible only when no condition failed."""

    eligible: bool
    failed: tuple[RecoveryCondition, ...]


def recovery_eligibility(conditions: RecoveryConditions) -> RecoveryEligibility:
    """R6.4: check all five conditions and name every one that failed.

    A "transient" label is not enough on its own; an unknown effect makes
    continuation unsafe until its executor has verified it.
    """
    if not isinstance(conditions, RecoveryConditions):
        raise LifecycleError("conditions must be RecoveryConditions")
    c = conditions
    checks = (
        (RecoveryCondition.SAME_TASK_IDENTITY, c.task_identity == c.resume_task_identity),
        (RecoveryCondition.USABLE_CHECKPOINT, c.checkpoint_usable),
        # Compared with the admission record only, never with today's permission table.
        (
            RecoveryCondition.SAME_RUN_AUTHORIZATION,
            c.resume_authorization == c.admitted_authorization,
        ),
        (RecoveryCondition.REMAINING_BALANCE, c.remaining_balance > 0),
        (
            RecoveryCondition.SAFE_CONTINUATION,
            c.original_allows_safe_continuation and not c.unknown_effect_keys,
        ),
    )
    failed = tuple(condition for condition, holds in checks if not holds)
    return RecoveryEligibility(eligible=not failed, failed=failed)


RECOVERY_REFUSAL_WORDS = {
    RecoveryCondition.SAME_TASK_IDENTITY: "the recovery would carry on another task",
    RecoveryCondition.USABLE_CHECKPOINT: "no usable checkpoint to resume from",
    RecoveryCondition.SAME_RUN_AUTHORIZATION: "the authorization differs from the admission",
    RecoveryCondition.REMAINING_BALANCE: f"the {ORDINARY_RESEARCH_RESOURCE} budget is used up",
    RecoveryCondition.SAFE_CONTINUATION: "an unknown tool effect makes resending unsafe",
}
