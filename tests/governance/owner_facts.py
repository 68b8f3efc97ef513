"""Owners' facts and runs the lifecycle rule tests build (R4.1, R6.3).

Each builder makes a valid fact from the owner that may establish it; ``step``
records facts, asks the decision table and applies its answer, as the runner
does."""

from __future__ import annotations

import dataclasses

from governance.rules.answers import Answer
from governance.rules.authority import AUTHORITY, FactKind, Owner, OwnerFact
from governance.rules.decision_table import Decision, next_path
from governance.rules.recovery import RecoveryConditions, RunAuthorization
from governance.rules.run_facts import RunFacts, record_fact
from governance.rules.transitions import apply_decision

GOAL = "price of ACME today"
AUTH = RunAuthorization(run_id="run-1", scopes=frozenset({"web", "calc"}))

# ---------------------------------------------------------------------------
# Fact builders


def executor(kind: FactKind, subject: str = "op-1", key: str | None = None) -> OwnerFact:
    return OwnerFact(Owner.EXECUTOR, kind, subject, idempotency_key=key)


def tool_failed(subject: str = "search#1") -> OwnerFact:
    return executor(FactKind.OPERATION_FAILED, subject)


def unknown(key: str = "k1") -> OwnerFact:
    return executor(FactKind.EFFECT_UNKNOWN, f"op-{key}", key)


def verified(key: str = "k1", happened: bool = False) -> OwnerFact:
    kind = FactKind.EFFECT_HAPPENED if happened else FactKind.EFFECT_DID_NOT_HAPPEN
    return executor(kind, f"op-{key}", key)


def resource(kind: FactKind, name: str) -> OwnerFact:
    return OwnerFact(Owner.RESOURCE, kind, name)


def exhausted(name: str) -> OwnerFact:
    return resource(FactKind.RESOURCE_EXHAUSTED, name)


def committed(version: int = 1) -> OwnerFact:
    return OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "body-1", version=version)


def commit_failed() -> OwnerFact:
    return OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMIT_FAILED, "body-1")


def provider(kind: FactKind, **kw: object) -> OwnerFact:
    return OwnerFact(Owner.PROVIDER, kind, "openai", **kw)


def transient(failure_class: str = "server_error") -> OwnerFact:
    return provider(FactKind.TRANSIENT_FAILURE, failure_class=failure_class)


def answered(answer: Answer | None = None) -> OwnerFact:
    return provider(FactKind.TURN_ANSWERED, answer=answer or Answer(goal=GOAL))


def no_progress() -> OwnerFact:
    return provider(FactKind.TURN_WITHOUT_PROGRESS)


def tool_turn() -> OwnerFact:
    return provider(FactKind.TURN_CALLED_TOOLS)


def no_eligible() -> OwnerFact:
    return provider(FactKind.NO_ELIGIBLE_PROVIDER)


def cancel() -> OwnerFact:
    return OwnerFact(Owner.USER, FactKind.CANCEL_REQUESTED, "run-1")


def identity_invalid() -> OwnerFact:
    return OwnerFact(Owner.GUARD, FactKind.IDENTITY_INVALID, "lease-1")


def clock(kind: FactKind) -> OwnerFact:
    return OwnerFact(Owner.CLOCK, kind, "run-1")


def good_recovery(**changes: object) -> RecoveryConditions:
    base = RecoveryConditions(
        task_identity="task-1",
        resume_task_identity="task-1",
        checkpoint_usable=True,
        admitted_authorization=AUTH,
        resume_authorization=AUTH,
        remaining_balance=3,
        original_allows_safe_continuation=True,
    )
    return dataclasses.replace(base, **changes)


def run_with(*facts: OwnerFact, recovery: RecoveryConditions | None = None) -> RunFacts:
    return RunFacts(run_id="run-1", goal=GOAL, facts=tuple(facts), recovery=recovery)


def step(run: RunFacts, *facts: OwnerFact) -> tuple[RunFacts, Decision]:
    """Record facts, decide, apply: one lifecycle step as the runner would take it."""
    for fact in facts:
        run = record_fact(run, fact)
    decision = next_path(run)
    return apply_decision(run, decision), decision


def sample_fact(kind: FactKind) -> OwnerFact:
    """A valid fact of ``kind`` from its owner."""
    owner = next(o for o, kinds in AUTHORITY.items() if kind in kinds)
    extra: dict[str, object] = {}
    subject = "s-1"
    if kind in (FactKind.EFFECT_UNKNOWN, FactKind.EFFECT_HAPPENED, FactKind.EFFECT_DID_NOT_HAPPEN):
        extra["idempotency_key"] = "k1"
    if kind in (FactKind.RESOURCE_ADMITTED, FactKind.RESOURCE_EXHAUSTED):
        subject = "tool_calls"
    if kind is FactKind.BODY_COMMITTED:
        extra["version"] = 1
    if kind is FactKind.TRANSIENT_FAILURE:
        extra["failure_class"] = "timeout"
    if kind is FactKind.TURN_ANSWERED:
        extra["answer"] = Answer(goal=GOAL)
    return OwnerFact(owner, kind, subject, **extra)
