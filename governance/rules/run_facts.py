"""What the lifecycle knows about one run: its owners' facts and its own record.

The owners' facts in the order recorded (R4.1), the run's phase (research →
finalization is one way, settled is final, R6.3), where finalization began,
its one settlement (R6.5) and the R6.4 recovery conditions when the runner
has read them. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from governance.rules._checks import is_int
from governance.rules.authority import OwnerFact
from governance.rules.lifecycle_input import LifecycleError, require_text
from governance.rules.recovery import RecoveryConditions
from governance.rules.settlement import Settlement


class Phase(StrEnum):
    """Where a run is. RESEARCH → FINALIZATION is one way; SETTLED is final."""

    RESEARCH = "research"
    FINALIZATION = "finalization"
    SETTLED = "settled"


@dataclass(frozen=True)
class RunFacts:
    """What the lifecycle knows about one run: its owners' facts, in the order recorded.

    ``phase``, ``finalization_from`` (index of the first fact recorded during
    finalization) and ``settlement`` are the lifecycle's own record. ``recovery``
    holds the R6.4 conditions as read from their owners, when the runner has them.
    """

    run_id: str
    goal: str
    facts: tuple[OwnerFact, ...] = ()
    phase: Phase = Phase.RESEARCH
    finalization_from: int | None = None
    settlement: Settlement | None = None
    recovery: RecoveryConditions | None = None

    def __post_init__(self) -> None:
        require_text("run_id", self.run_id)
        require_text("goal", self.goal)
        if not isinstance(self.facts, tuple) or not all(
            isinstance(f, OwnerFact) for f in self.facts
        ):
            raise LifecycleError("facts must be a tuple of OwnerFact")
        try:
            phase = Phase(self.phase)
        except ValueError:
            raise LifecycleError(f"unknown phase {self.phase!r}") from None
        object.__setattr__(self, "phase", phase)
        if self.settlement is not None and not isinstance(self.settlement, Settlement):
            raise LifecycleError("settlement must be a Settlement")
        if (phase is Phase.SETTLED) != (self.settlement is not None):
            raise LifecycleError("a run is settled exactly when it has a settlement")
        if phase is Phase.RESEARCH and self.finalization_from is not None:
            raise LifecycleError("a run in research has not entered finalization")
        if phase is Phase.FINALIZATION and self.finalization_from is None:
            raise LifecycleError("a run in finalization records where finalization began")
        if self.finalization_from is not None and (
            not is_int(self.finalization_from) or not 0 <= self.finalization_from <= len(self.facts)
        ):
            raise LifecycleError("finalization_from must index into the recorded facts")
        if self.recovery is not None and not isinstance(self.recovery, RecoveryConditions):
            raise LifecycleError("recovery must be RecoveryConditions or None")


def record_fact(run: RunFacts, fact: OwnerFact) -> RunFacts:
    """Append an owner's fact (already authority-checked, R4.1). Late facts are kept too."""
    if not isinstance(fact, OwnerFact):
        raise LifecycleError("only an OwnerFact can be recorded")
    return replace(run, facts=(*run.facts, fact))
