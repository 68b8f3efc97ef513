"""R6.3: moving a run along its decided path, and what that path starts.

``apply_decision`` changes the run's phase (finalization is one way, a
settlement is kept once, R6.5); ``follow_up`` names the one stage the path
starts, never one the decision does not allow (R4.5); a settled run continues
only through a new, linked run (``successor_run``, R6.4). Pure: no I/O, no
clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from governance.rules.decision_table import Decision, Path
from governance.rules.lifecycle_input import LifecycleError, require_text
from governance.rules.payloads import StagePayload, TurnPayload, VerifyEffectPayload
from governance.rules.run_facts import Phase, RunFacts
from governance.rules.settlement import Outcome, settle_once


class IllegalTransitionError(LifecycleError):
    """R6.3: a path the run may no longer take (finalization is one way; settled is final)."""


def apply_decision(run: RunFacts, decision: Decision) -> RunFacts:
    """R6.3/R6.5: move the run along the decided path.

    Finalization is one way: once entered, continue and bounded recovery are
    illegal, and re-deciding finalization keeps the original start (no second
    finalization). A settled run accepts only its own settlement again.
    """
    if not isinstance(decision, Decision):
        raise LifecycleError("decision must be a Decision")
    if decision.path is Path.SETTLE:
        assert decision.settlement is not None  # guaranteed by Decision validation
        settlement = settle_once(run.settlement, decision.settlement)
        return replace(run, phase=Phase.SETTLED, settlement=settlement)
    if run.phase is Phase.SETTLED:
        raise IllegalTransitionError(
            f"run {run.run_id} is settled; {decision.path!s} needs a new, linked run (R6.4)"
        )
    if decision.path is Path.FINALIZATION_ONLY:
        if run.phase is Phase.FINALIZATION:
            return run
        return replace(run, phase=Phase.FINALIZATION, finalization_from=len(run.facts))
    if decision.path in (Path.CONTINUE, Path.BOUNDED_RECOVERY) and run.phase is not (
        Phase.RESEARCH
    ):
        raise IllegalTransitionError(
            f"run {run.run_id} is in finalization, which is one way: {decision.path!s} "
            "would return it to research"
        )
    return run


@dataclass(frozen=True)
class SuccessorRun:
    """R6.4: a new run continuing after a settled one.

    It is causally linked to the old run and admitted independently: it carries
    no balance and no authorization from its predecessor.
    """

    run_id: str
    caused_by_run_id: str
    caused_by_outcome: Outcome
    reason: str


def successor_run(previous: RunFacts, new_run_id: str, reason: str) -> SuccessorRun:
    """R6.4: continuing after settlement needs a new run linked to the settled one."""
    if not isinstance(previous, RunFacts):
        raise LifecycleError("previous must be RunFacts")
    if previous.settlement is None:
        raise LifecycleError(
            f"run {previous.run_id} has not settled: it continues through its own lifecycle "
            "(recovery or finalization), not through a new run"
        )
    require_text("new_run_id", new_run_id)
    require_text("reason", reason)
    if new_run_id == previous.run_id:
        raise LifecycleError("a successor is a new run with its own id")
    return SuccessorRun(
        run_id=new_run_id,
        caused_by_run_id=previous.run_id,
        caused_by_outcome=previous.settlement.outcome,
        reason=reason,
    )


class Stage(StrEnum):
    """Work a runner might start next (R4.5)."""

    TOOLS = "tools"
    ANSWER = "answer"
    REVIEW = "review"


def allowed_stages(decision: Decision) -> frozenset[Stage]:
    """Which stages may start under ``decision``.

    Settling and verifying start none (so nothing follows ``planning_failed``,
    R4.5); finalization-only starts only the answer on the normal output path.
    """
    if not isinstance(decision, Decision):
        raise LifecycleError("decision must be a Decision")
    if decision.path in (Path.CONTINUE, Path.BOUNDED_RECOVERY):
        return frozenset(Stage)
    if decision.path is Path.FINALIZATION_ONLY:
        return frozenset({Stage.ANSWER})
    return frozenset()


STAGE_OF_KIND: Mapping[str, Stage] = MappingProxyType(
    {"model_turn": Stage.ANSWER, "finalization": Stage.ANSWER, "tool_call": Stage.TOOLS}
)
"""The runtime's stage kinds as the lifecycle's stages (a model turn answers or asks for tools)."""


@dataclass(frozen=True)
class FollowUp:
    """The stage a decision starts next, and how long its send waits."""

    kind: str
    payload: StagePayload  # stored by its own to_json (rules.payloads)
    countdown_s: float = 0.0


def follow_up(
    decision: Decision,
    next_work: Mapping[str, object] | None,
    *,
    last_increment: Sequence[Mapping[str, object]],
    finalization_started: bool,
    recovery_delay_s: float = 0.0,
    max_recovery_wait_s: float = 600.0,
    verify_delay_s: float = 0.0,
    verification: tuple[Mapping[str, object], int] | None = None,
) -> FollowUp | None:
    """R6.3: the one stage the decided path starts, or None.

    Verify → a verification stage (a repeated one keeps the original ways on and
    counts its attempt); finalization-only → the one finalization, never a second;
    bounded recovery → the same turn again inside the original mechanism, once a
    breaker may have half-opened (the deadline still bounds the run); continue →
    the next work. Every stage started is one the decision allows (R4.5).
    """
    if decision.path is Path.VERIFY_EFFECT:
        resume, attempt = verification if verification is not None else (next_work or {}, 0)
        return FollowUp(
            "verify_effect",
            VerifyEffectPayload(decision.verify_keys, dict(resume), attempt + 1),
            countdown_s=verify_delay_s,
        )
    if decision.path is Path.FINALIZATION_ONLY:
        follow = None if finalization_started else FollowUp("finalization", TurnPayload())
    elif decision.path is Path.BOUNDED_RECOVERY:
        follow = FollowUp(
            "model_turn",
            TurnPayload(tuple(dict(item) for item in last_increment), recovery=True),
            countdown_s=min(max(recovery_delay_s, 0.0), max_recovery_wait_s),
        )
    elif decision.path is Path.CONTINUE and next_work:
        follow = FollowUp(str(next_work["kind"]), next_work["payload"])  # type: ignore[arg-type]
    else:
        return None
    if follow is not None and STAGE_OF_KIND.get(follow.kind) not in allowed_stages(decision):
        raise IllegalTransitionError(f"{decision.path!s} does not allow a {follow.kind} stage")
    return follow
