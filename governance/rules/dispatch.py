"""R4.3: advisory inputs never block dispatch.

Only objective limits (a user cancel, permission, the resource owner's
admission) block a prepared request; a changed research-needs list is noted,
never a veto. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from governance.rules.lifecycle_input import LifecycleError


@dataclass(frozen=True)
class DispatchVerdict:
    """R4.3: whether a prepared request may be dispatched, and why not."""

    allowed: bool
    blocked_by: tuple[str, ...]
    advisories: tuple[str, ...]


def dispatch_allowed(
    *,
    prepared_needs: Sequence[str],
    current_needs: Sequence[str],
    cancel_requested: bool,
    permitted: bool,
    budget_admitted: bool,
) -> DispatchVerdict:
    """R4.3: only objective limits block dispatch; a changed research-needs list does not.

    The needs list is the model's own work list: it owns no source and proves
    nothing, so a change between preparation and dispatch is noted, never a veto.
    Cancel, permissions and budget stay with their owners and do block.
    """
    for name, needs in (("prepared_needs", prepared_needs), ("current_needs", current_needs)):
        if isinstance(needs, str) or not all(isinstance(n, str) for n in needs):
            raise LifecycleError(f"{name} must be a sequence of strings")
    for name, flag in (
        ("cancel_requested", cancel_requested),
        ("permitted", permitted),
        ("budget_admitted", budget_admitted),
    ):
        if not isinstance(flag, bool):
            raise LifecycleError(f"{name} must be a bool")
    blocked: list[str] = []
    if cancel_requested:
        blocked.append("the user asked to stop")
    if not permitted:
        blocked.append("the run is not permitted to make this request")
    if not budget_admitted:
        blocked.append("the resource owner did not admit this request")
    advisories: tuple[str, ...] = ()
    if tuple(prepared_needs) != tuple(current_needs):
        advisories = (
            "research needs changed since the request was prepared (advisory: does not block)",
        )
    return DispatchVerdict(allowed=not blocked, blocked_by=tuple(blocked), advisories=advisories)
