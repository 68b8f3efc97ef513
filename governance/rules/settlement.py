"""R6.5: the run's one settlement, written once.

Outcomes record what happened, not answer quality; the reason code is stable
for reports (R7.4); a repeat of the same settlement is idempotent and a
different one is refused. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from governance.rules.lifecycle_input import LifecycleError, require_text


class SettlementConflictError(LifecycleError):
    """R6.5: a second, different settlement for a run that is already settled."""


class Outcome(StrEnum):
    """R6.5 settlement outcomes. They record what happened, not answer quality."""

    COMPLETED = "completed"
    PARTIAL = "partial"
    FAILED = "failed"
    CANCELLED = "cancelled"


class ReasonCode(StrEnum):
    """Why a run settled, as a stable code for reports (R6.5, R7.4)."""

    ANSWERED = "answered"
    ANSWERED_WITH_GAPS = "answered_with_gaps"
    GOAL_SWAPPED = "goal_swapped"
    NO_BODY_COMMITTED = "no_body_committed"
    BODY_SAVE_PARTIAL = "body_save_partial"
    CANCELLED = "cancelled"
    IDENTITY_INVALID = "identity_invalid"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    HARD_LIMIT = "hard_limit"
    PLANNING_FAILED = "planning_failed"
    NO_ELIGIBLE_PROVIDER = "no_eligible_provider"
    NO_ANSWER_PRODUCED = "no_answer_produced"
    FINALIZATION_FAILED = "finalization_failed"
    WORK_CANNOT_CONTINUE = "work_cannot_continue"


@dataclass(frozen=True)
class Settlement:
    """R6.5: the run's one settlement: outcome, reason, and effects left unknown.

    ``unknown_effects`` lists idempotency keys whose effect was never verified,
    so the delivery report can flag them (R7.4); a completed run has none.
    """

    outcome: Outcome
    reason_code: ReasonCode
    reason: str
    unknown_effects: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            outcome, code = Outcome(self.outcome), ReasonCode(self.reason_code)
        except ValueError as exc:
            raise LifecycleError(f"unknown settlement outcome or reason: {exc}") from None
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "reason_code", code)
        require_text("settlement reason", self.reason)
        if not isinstance(self.unknown_effects, tuple):
            raise LifecycleError("unknown_effects must be a tuple of idempotency keys")
        if (outcome is Outcome.CANCELLED) != (code is ReasonCode.CANCELLED):
            raise LifecycleError("only a user cancel settles as cancelled, and it always does")
        if outcome is Outcome.COMPLETED:
            if code is not ReasonCode.ANSWERED:
                raise LifecycleError(
                    f"a run settled for {code!s} is never completed (R4.4, R4.5, R6.3)"
                )
            if self.unknown_effects:
                raise LifecycleError(
                    "a run with unverified effects is never settled completed (R6.3)"
                )


def settle_once(existing: Settlement | None, new: Settlement) -> Settlement:
    """R6.5: write the settlement once; an identical repeat returns it unchanged.

    Raises ``SettlementConflictError`` for a second, different settlement:
    at-least-once delivery may repeat the write, but nothing may rewrite it.
    """
    if not isinstance(new, Settlement):
        raise LifecycleError("new must be a Settlement")
    if existing is None:
        return new
    if existing == new:
        return existing
    raise SettlementConflictError(
        f"the run is already settled {existing.outcome!s} ({existing.reason_code!s}); "
        f"refusing to rewrite it as {new.outcome!s} ({new.reason_code!s}). "
        "Continuing needs a new run, causally linked to this one (R6.4)."
    )
