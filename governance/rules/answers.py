"""R4.5: degrading may narrow the promise, never swap the goal.

What a proposed completion claims to answer, and the settlement that claim
earns: another question is never completed, stated gaps are partial. Pure:
no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from governance.rules.lifecycle_input import LifecycleError, require_text
from governance.rules.settlement import Outcome, ReasonCode, Settlement


@dataclass(frozen=True)
class Answer:
    """R4.5: what a proposed completion claims to answer.

    ``goal`` is the identity of the question the body addresses; a degraded
    (``narrowed``) answer must say what it leaves out in ``stated_gaps``.
    """

    goal: str
    stated_gaps: tuple[str, ...] = ()
    narrowed: bool = False

    def __post_init__(self) -> None:
        require_text("answer goal", self.goal)
        if not isinstance(self.stated_gaps, tuple):
            raise LifecycleError("stated_gaps must be a tuple of strings")
        for gap in self.stated_gaps:
            require_text("stated gap", gap)
        if self.narrowed and not self.stated_gaps:
            raise LifecycleError("a narrowed (fallback) answer must state the gap it leaves (R4.5)")


def answer_settlement(goal: str, answer: Answer) -> Settlement:
    """R4.5: settle a proposed completion by what it claims to answer.

    A different goal is a swapped question: never completed. Stated gaps narrow
    the promise: partial. Otherwise completed (a record, not a quality seal).
    """
    require_text("run goal", goal)
    if not isinstance(answer, Answer):
        raise LifecycleError("answer must be an Answer")
    if answer.goal != goal:
        return Settlement(
            Outcome.FAILED,
            ReasonCode.GOAL_SWAPPED,
            f"The answer addresses {answer.goal!r}, not the question asked ({goal!r}); "
            "a substituted question is never completed.",
        )
    if answer.stated_gaps:
        return Settlement(
            Outcome.PARTIAL,
            ReasonCode.ANSWERED_WITH_GAPS,
            "Answered with stated gaps: " + "; ".join(answer.stated_gaps) + ".",
        )
    return Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "The model completed its answer.")
