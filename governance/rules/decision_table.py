"""R6.3: the decision table, from the owners' confirmed facts to the run's next path.

Only this module turns the owners' facts (R4.1) into the run's next path:
continue, bounded recovery, finalization-only, verify an unknown effect, or
settle. A local "no" never ends the run by itself (R4.2); a turn that
produced nothing ends the run honestly (R4.4); an answer settles on what it
answers (R4.5); recovery needs the R6.4 conditions; a settled run gets its
one settlement again (R6.5).

Pure rules: no I/O, no clock. The runner gathers facts, asks ``next_path`` and
records the decision through the services (``transitions`` moves the run
along it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from governance.rules.answers import answer_settlement
from governance.rules.authority import AUTHORITY, FactKind, Owner, OwnerFact
from governance.rules.budget import ORDINARY_RESEARCH_RESOURCE, OUTPUT_RESERVE, RESOURCES
from governance.rules.lifecycle_input import LifecycleError, is_text, require_text
from governance.rules.progress import NO_ANSWER_TEXT
from governance.rules.provider_failures import FAILURE_WORDS
from governance.rules.recovery import RECOVERY_REFUSAL_WORDS, recovery_eligibility
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT
from governance.rules.run_facts import Phase, RunFacts
from governance.rules.settlement import Outcome, ReasonCode, Settlement


class Path(StrEnum):
    """The next paths of R6.3."""

    CONTINUE = "continue"
    BOUNDED_RECOVERY = "bounded_recovery"
    FINALIZATION_ONLY = "finalization_only"
    SETTLE = "settle"
    VERIFY_EFFECT = "verify_effect"


DISPATCHING_PATHS = frozenset({Path.CONTINUE, Path.BOUNDED_RECOVERY, Path.FINALIZATION_ONLY})
"""Paths that send new work to a model or tool. Settling and verifying send none."""


# R3.7: the one voice for segment-scoped refusals, from the refusal rule itself.
SEGMENT_SKIP_WORDS = RULE_TEXT


@dataclass(frozen=True)
class Decision:
    """The lifecycle's answer (R6.3): the next path, in plain words, and what must be kept.

    ``settlement`` is set exactly when settling; ``verify_keys`` exactly when
    verifying; a critical alert always names the boundary action needed.
    """

    path: Path
    reason: str
    must_keep: tuple[str, ...] = ()
    settlement: Settlement | None = None
    critical_alert: bool = False
    boundary_action_needed: str | None = None
    verify_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        try:
            path = Path(self.path)
        except ValueError:
            raise LifecycleError(f"unknown path {self.path!r}") from None
        object.__setattr__(self, "path", path)
        require_text("decision reason", self.reason)
        if not isinstance(self.must_keep, tuple) or not isinstance(self.verify_keys, tuple):
            raise LifecycleError("must_keep and verify_keys must be tuples")
        if self.settlement is not None and not isinstance(self.settlement, Settlement):
            raise LifecycleError("settlement must be a Settlement")
        if (path is Path.SETTLE) != (self.settlement is not None):
            raise LifecycleError("a settlement comes with the settle path and only with it")
        if (path is Path.VERIFY_EFFECT) != bool(self.verify_keys):
            raise LifecycleError("verify_effect names the idempotency keys to verify, only it")
        if self.critical_alert and not is_text(self.boundary_action_needed):
            raise LifecycleError("a critical alert must name the boundary action needed")

    @property
    def dispatches(self) -> bool:
        """Whether this path sends new work (R6.3: settling sends none "to be graceful")."""
        return self.path in DISPATCHING_PATHS


# Objective stops, in precedence order after a user cancel. They are limits owned
# elsewhere (R4.3): the lifecycle only honours them.
_OBJECTIVE_STOPS: tuple[tuple[FactKind, ReasonCode, str], ...] = (
    (
        FactKind.IDENTITY_INVALID,
        ReasonCode.IDENTITY_INVALID,
        "A protective identity no longer holds, so the run stops and settles.",
    ),
    (
        FactKind.DEADLINE_EXCEEDED,
        ReasonCode.DEADLINE_EXCEEDED,
        "The run's overall deadline has passed, so the run stops and settles.",
    ),
    (
        FactKind.HARD_LIMIT_REACHED,
        ReasonCode.HARD_LIMIT,
        "A hard limit of the run was reached, so the run stops and settles.",
    ),
)


_ENDING_TURNS = frozenset({FactKind.TURN_ANSWERED, FactKind.TURN_WITHOUT_PROGRESS})


# Facts that, once finalization has begun, mean the one finalization failed.
_FINALIZATION_FAILURES = frozenset(
    {
        FactKind.TRANSIENT_FAILURE,
        FactKind.TURN_WITHOUT_PROGRESS,
        FactKind.TURN_CALLED_TOOLS,  # finalization uses accepted material only
        FactKind.BODY_COMMIT_FAILED,
        FactKind.NO_PROGRESS_TIMEOUT,
    }
)


def next_path(run: RunFacts) -> Decision:
    """R6.3: pick the next path still allowed, from the owners' confirmed facts.

    Precedence, first match wins, and why:
      1. Already settled → the same settlement again (R6.5: written once).
      2. User cancel → settle cancelled. The user's explicit stop outranks every
         other fact; nothing new is dispatched "to be graceful".
      3. Objective stops (identity invalid, overall deadline, hard limit) and a
         failed plan (R4.5) → settle. These limits belong to other owners; no
         verification or finalization may run past them.
      4. An unknown external effect → verify it by its executor. Anything else that
         dispatches (recovery, research, even finalization) could replay it blindly.
         Effects left unknown by steps 2–3 are listed in the settlement, never
         counted as success.
      5. No provider eligible in this segment → settle honestly with a critical
         alert naming the boundary action. No model can serve finalization either,
         and only a boundary (not this run's to take) makes providers eligible again.
      6. In finalization: the first finalization outcome decides — an answer
         settles, a failure settles partial/failed; otherwise the one finalization
         proceeds. Never back to research, never a second finalization.
      7. In research: the first turn that ends research decides — a turn without
         progress settles (R4.4), a proposed completion settles on its answer (R4.5);
         ordinary work that cannot continue goes to finalization-only while the
         output reserve holds; a transient provider failure recovers when R6.4
         holds; otherwise continue — a failed or refused operation is kept as a
         failure, never an empty success (R4.2).
    """
    if not isinstance(run, RunFacts):
        raise LifecycleError("next_path needs RunFacts")
    if run.settlement is not None:
        return Decision(
            path=Path.SETTLE,
            reason=f"Already settled {run.settlement.outcome!s}: {run.settlement.reason}",
            must_keep=("the settlement is written once; continuing needs a new linked run",),
            settlement=run.settlement,
        )
    facts = run.facts
    unknown = _outstanding_unknown_keys(facts)

    stop = _stop_decision(run, unknown)
    if stop is not None:
        return stop

    if unknown:
        return Decision(
            path=Path.VERIFY_EFFECT,
            reason=(
                "Whether an external effect happened is unknown; its executor must verify it "
                "by idempotency key before anything else is sent."
            ),
            must_keep=(
                "no blind replay: a timeout, a read-only label or a model asking to retry is "
                "not proof",
                "the effect is never marked success before it is verified",
            ),
            verify_keys=unknown,
        )

    # Sticky: frozen providers come back only with a boundary, which is not this run's to take.
    if _has(facts, FactKind.NO_ELIGIBLE_PROVIDER):
        return _settle(
            run,
            _stop_outcome(facts),
            ReasonCode.NO_ELIGIBLE_PROVIDER,
            (
                "No provider is eligible in this segment: each was "
                f"{SEGMENT_SKIP_WORDS}. The run settles honestly; a boundary "
                f"({BOUNDARY_ACTIONS_TEXT}) makes every provider eligible again."
            ),
            (),
            critical_alert=True,
            boundary_action_needed=(
                f"{BOUNDARY_ACTIONS_TEXT}: a new segment makes every provider eligible again"
            ),
        )

    if run.phase is Phase.FINALIZATION:
        return _finalization_path(run)
    return _research_path(run)


def _stop_decision(run: RunFacts, unknown: tuple[str, ...]) -> Decision | None:
    """Steps 2–3 of :func:`next_path`: a user cancel, an objective stop or a failed
    plan settles the run, listing the effects left unknown."""
    facts = run.facts
    if _has(facts, FactKind.CANCEL_REQUESTED):
        return _settle(
            run,
            Outcome.CANCELLED,
            ReasonCode.CANCELLED,
            "The user asked to stop. The run settles as cancelled; nothing new is sent.",
            unknown,
        )
    for kind, code, text in _OBJECTIVE_STOPS:
        if _has(facts, kind):
            if unknown:  # R6.4: said plainly, never counted as done
                text += (
                    f" {len(unknown)} effect(s) stay unknown and were not replayed: "
                    + ", ".join(unknown)
                    + "."
                )
            return _settle(run, _stop_outcome(facts), code, text, unknown)
    if _has(facts, FactKind.PLANNING_FAILED):
        return _settle(
            run,
            Outcome.FAILED,
            ReasonCode.PLANNING_FAILED,
            "Planning failed (planning_failed): no tools, answer or review follow it.",
            unknown,
        )
    return None


def _finalization_path(run: RunFacts) -> Decision:
    assert run.finalization_from is not None  # guaranteed by RunFacts validation
    for fact in run.facts[run.finalization_from :]:
        if fact.kind is FactKind.TURN_ANSWERED:
            return _answer_decision(run, fact)
        if fact.kind in _FINALIZATION_FAILURES or (
            fact.kind is FactKind.RESOURCE_EXHAUSTED and fact.subject == OUTPUT_RESERVE
        ):
            return _settle(
                run,
                _stop_outcome(run.facts),
                ReasonCode.FINALIZATION_FAILED,
                f"Finalization failed ({fact.kind!s}). The run settles with what was "
                "committed; it does not return to research or try a second finalization.",
                (),
            )
    return _finalization_decision(
        "Finalization is under way: the one finalization continues on the normal output path."
    )


def _research_path(run: RunFacts) -> Decision:
    facts = run.facts
    # The first turn that ends research decides: a turn without progress ends the run
    # (R4.4) and a proposed completion settles it; nothing recorded later can undo that.
    ending_turn = _first(facts, _ENDING_TURNS)
    if ending_turn is not None and ending_turn.kind is FactKind.TURN_WITHOUT_PROGRESS:
        return _settle(run, _stop_outcome(facts), ReasonCode.NO_ANSWER_PRODUCED, NO_ANSWER_TEXT, ())
    if ending_turn is not None:
        return _answer_decision(run, ending_turn)
    latest_provider = _latest(facts, AUTHORITY[Owner.PROVIDER])

    reserve_holds = not _exhausted(facts, OUTPUT_RESERVE)
    if _exhausted(facts, ORDINARY_RESEARCH_RESOURCE) or _has(facts, FactKind.NO_PROGRESS_TIMEOUT):
        why = (
            "the research budget is used up"
            if _exhausted(facts, ORDINARY_RESEARCH_RESOURCE)
            else "the work stopped making progress"
        )
        return _cannot_continue(run, why, reserve_holds)

    if latest_provider is not None and latest_provider.kind is FactKind.TRANSIENT_FAILURE:
        what = _provider_failure_words(latest_provider)
        retries = _retries_so_far(facts)
        if run.recovery is None:
            return _cannot_continue(
                run, f"{what}, and no recovery conditions are recorded", reserve_holds
            )
        verdict = recovery_eligibility(run.recovery)
        if not verdict.eligible:
            why = "; ".join(RECOVERY_REFUSAL_WORDS[c] for c in verdict.failed)
            tried = f" after {retries} retr{'y' if retries == 1 else 'ies'}" if retries else ""
            return _cannot_continue(run, f"{what}; it is not retried{tried}: {why}", reserve_holds)
        return Decision(
            path=Path.BOUNDED_RECOVERY,
            reason=(
                f"{what[0].upper()}{what[1:]}. The recovery conditions hold, so the turn is "
                f"retried inside the original mechanism: retry {retries + 1}, drawn from "
                f"{ORDINARY_RESEARCH_RESOURCE} ({run.recovery.remaining_balance} left)."
            ),
            must_keep=(
                f"same task identity ({run.recovery.task_identity})",
                "no new quota: the recovery draws from the same balance",
                "the authorization recorded at admission, not today's permission table",
                *_committed_keep(facts),
            ),
        )

    keep = [
        f"{fact.subject} {_failure_words(fact.kind)}: kept as a failure, never turned into an "
        "empty success"
        for fact in facts
        if fact.kind in (FactKind.OPERATION_FAILED, FactKind.OPERATION_REFUSED)
    ]
    keep += [
        f"{resource} is exhausted: only new uses of it are refused; what it already produced "
        "stays usable"
        for resource in sorted(RESOURCES)
        if _exhausted(facts, resource)
    ]
    return Decision(
        path=Path.CONTINUE,
        reason="Research continues: no fact stops the run; local failures stay local.",
        must_keep=tuple(keep),
    )


def _cannot_continue(run: RunFacts, why: str, reserve_holds: bool) -> Decision:
    if reserve_holds:
        return _finalization_decision(
            f"Ordinary work cannot continue ({why}); the output reserve holds, so the run "
            "moves to finalization only."
        )
    return _settle(
        run,
        _stop_outcome(run.facts),
        ReasonCode.WORK_CANNOT_CONTINUE,
        f"Ordinary work cannot continue ({why}) and the output reserve is used up; the run "
        "settles with what was committed.",
        (),
    )


def _finalization_decision(reason: str) -> Decision:
    return Decision(
        path=Path.FINALIZATION_ONLY,
        reason=reason,
        must_keep=(
            "uses accepted material only and states what is not done",
            "the normal output path and the original output reserve",
            "one way: never back to research, never a second finalization",
        ),
    )


def _answer_decision(run: RunFacts, answered: OwnerFact) -> Decision:
    assert answered.answer is not None  # guaranteed by OwnerFact validation
    settlement = answer_settlement(run.goal, answered.answer)
    committed = _committed_versions(run.facts)
    latest_publication = _latest(run.facts, AUTHORITY[Owner.PUBLICATION])
    if settlement.outcome is not Outcome.FAILED:
        # Publication owns the body: an answer nobody committed was not delivered, and a
        # save that ended partial is reported partial, never the earlier "complete" (R7.3).
        if not committed:
            settlement = Settlement(
                Outcome.FAILED,
                ReasonCode.NO_BODY_COMMITTED,
                "The model answered but no body was committed, so nothing was delivered.",
            )
        elif latest_publication is not None and (
            latest_publication.kind is FactKind.BODY_COMMIT_FAILED
        ):
            settlement = Settlement(
                Outcome.PARTIAL,
                ReasonCode.BODY_SAVE_PARTIAL,
                f"The answer was only partly saved (committed up to version {max(committed)}).",
            )
    return Decision(
        path=Path.SETTLE,
        reason=settlement.reason,
        must_keep=("no new dispatch", *_committed_keep(run.facts)),
        settlement=settlement,
    )


def _settle(
    run: RunFacts,
    outcome: Outcome,
    code: ReasonCode,
    reason: str,
    unknown: tuple[str, ...],
    *,
    critical_alert: bool = False,
    boundary_action_needed: str | None = None,
) -> Decision:
    keep = ["no new dispatch, not even to end gracefully", *_committed_keep(run.facts)]
    keep += [f"effect {key} stays unknown for its executor to verify" for key in unknown]
    return Decision(
        path=Path.SETTLE,
        reason=reason,
        must_keep=tuple(keep),
        settlement=Settlement(outcome, code, reason, unknown_effects=unknown),
        critical_alert=critical_alert,
        boundary_action_needed=boundary_action_needed,
    )


def needs_recovery_conditions(facts: Sequence[OwnerFact]) -> bool:
    """Whether :func:`next_path` may consult the R6.4 conditions: only when the
    latest provider fact is a transient failure (gathering them costs reads)."""
    latest = _latest(tuple(facts), AUTHORITY[Owner.PROVIDER])
    return latest is not None and latest.kind is FactKind.TRANSIENT_FAILURE


def _has(facts: tuple[OwnerFact, ...], kind: FactKind) -> bool:
    return any(fact.kind is kind for fact in facts)


def _first(facts: tuple[OwnerFact, ...], kinds: frozenset[FactKind]) -> OwnerFact | None:
    for fact in facts:
        if fact.kind in kinds:
            return fact
    return None


def _latest(facts: tuple[OwnerFact, ...], kinds: frozenset[FactKind]) -> OwnerFact | None:
    for fact in reversed(facts):
        if fact.kind in kinds:
            return fact
    return None


def _exhausted(facts: tuple[OwnerFact, ...], resource: str) -> bool:
    # The resource's own ledger speaks last: its latest admission/exhaustion fact wins.
    for fact in reversed(facts):
        if fact.subject == resource and fact.kind in (
            FactKind.RESOURCE_ADMITTED,
            FactKind.RESOURCE_EXHAUSTED,
        ):
            return fact.kind is FactKind.RESOURCE_EXHAUSTED
    return False


def _outstanding_unknown_keys(facts: tuple[OwnerFact, ...]) -> tuple[str, ...]:
    # Only the executor's proof resolves an unknown effect: a lookup by key, or its own
    # success receipt for that key. A failure report does not prove "nothing happened".
    outstanding: dict[str, None] = {}
    for fact in facts:
        key = fact.idempotency_key
        if key is None:
            continue
        if fact.kind is FactKind.EFFECT_UNKNOWN:
            outstanding[key] = None
        elif fact.kind in (
            FactKind.EFFECT_HAPPENED,
            FactKind.EFFECT_DID_NOT_HAPPEN,
            FactKind.OPERATION_SUCCEEDED,
        ):
            outstanding.pop(key, None)
    return tuple(outstanding)


def _committed_versions(facts: tuple[OwnerFact, ...]) -> tuple[int, ...]:
    return tuple(
        fact.version
        for fact in facts
        if fact.kind is FactKind.BODY_COMMITTED and fact.version is not None
    )


def _committed_keep(facts: tuple[OwnerFact, ...]) -> tuple[str, ...]:
    versions = _committed_versions(facts)
    if not versions:
        return ()
    return (
        f"committed body versions {', '.join(map(str, versions))} stay as committed and are "
        "read back by identity",
    )


def _stop_outcome(facts: tuple[OwnerFact, ...]) -> Outcome:
    # A stop records what happened: a committed body was delivered in part.
    return Outcome.PARTIAL if _committed_versions(facts) else Outcome.FAILED


def _provider_failure_words(fact: OwnerFact) -> str:
    """R6.2: what a provider failure fact says, in the lifecycle's words (its detail
    names the provider and what was seen)."""
    words = FAILURE_WORDS.get(
        fact.failure_class or "", f"a provider failure ({fact.failure_class})"
    )
    return f"{words}; {fact.detail}" if fact.detail else words


def _retries_so_far(facts: Sequence[OwnerFact]) -> int:
    """How many times this turn was already retried: the provider failures
    recorded since the provider last reported anything else."""
    latest = [f for f in facts if f.owner is Owner.PROVIDER]
    count = 0
    for fact in reversed(latest):
        if fact.kind is not FactKind.TRANSIENT_FAILURE:
            break
        count += 1
    return max(count - 1, 0)


def _failure_words(kind: FactKind) -> str:
    return "was refused" if kind is FactKind.OPERATION_REFUSED else "failed"
