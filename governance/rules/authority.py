"""R4.1: each effect has one owner, and an owner's "no" covers only its own effect.

Owners (tools, resource ledgers, publication, providers, the user, identity
guards, clocks) report *facts about their own effect*; the run lifecycle
(``decision_table.next_path``) alone turns them into the run's next path.
This module holds the owners, the kinds of fact each may establish, the
authority check and the validated fact itself. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from governance.rules._checks import is_int
from governance.rules.answers import Answer
from governance.rules.budget import RESOURCES
from governance.rules.lifecycle_input import LifecycleError, is_text, require_text
from governance.rules.provider_failures import RETRYABLE_FAILURE_CLASSES


class OutsideAuthorityError(LifecycleError):
    """R4.1: an owner claimed something outside its own effect."""


class Owner(StrEnum):
    """Who reports a fact (R4.1). The run lifecycle decides; it reports no facts."""

    EXECUTOR = "executor"  # tools, sources, executors (also the planning stage)
    RESOURCE = "resource"  # one ledger per resource (R5.1)
    PUBLICATION = "publication"  # the body: commits and versions (R7.2)
    PROVIDER = "provider"  # model turns and provider eligibility (R2, R3)
    USER = "user"  # only an explicit user stop cancels (R7.1)
    GUARD = "guard"  # protective identity: account, scope, content identity, lease fence
    CLOCK = "clock"  # the R6.1 clocks


class FactKind(StrEnum):
    """Confirmed facts (R4.1) plus the run-level conclusions no owner may report."""

    # Executors: this operation was refused / failed / succeeded / has an unknown effect.
    OPERATION_SUCCEEDED = "operation_succeeded"
    OPERATION_FAILED = "operation_failed"
    OPERATION_REFUSED = "operation_refused"
    EFFECT_UNKNOWN = "effect_unknown"
    # The executor looked the idempotency key up (R6.4): the only proof for an unknown effect.
    EFFECT_HAPPENED = "effect_happened"
    EFFECT_DID_NOT_HAPPEN = "effect_did_not_happen"
    # The planning operation produced no valid plan (R4.5).
    PLANNING_FAILED = "planning_failed"
    # Resource owners: admission, consumption and balance of their own resource (R5).
    RESOURCE_ADMITTED = "resource_admitted"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    HARD_LIMIT_REACHED = "hard_limit_reached"
    # Publication: whether a body is committed, and its exact version (R7.2).
    BODY_COMMITTED = "body_committed"
    BODY_COMMIT_FAILED = "body_commit_failed"
    # Provider: what a model turn produced, and whether any provider may be asked.
    TURN_CALLED_TOOLS = "turn_called_tools"
    TURN_ANSWERED = "turn_answered"  # a deliverable body and no tool call: a proposed completion
    TURN_WITHOUT_PROGRESS = "turn_without_progress"  # R4.4
    TRANSIENT_FAILURE = "transient_failure"
    NO_ELIGIBLE_PROVIDER = "no_eligible_provider"  # every provider frozen in this segment (R3.2)
    # User.
    CANCEL_REQUESTED = "cancel_requested"
    # Guard.
    IDENTITY_INVALID = "identity_invalid"
    # Clocks (R6.1).
    DEADLINE_EXCEEDED = "deadline_exceeded"
    NO_PROGRESS_TIMEOUT = "no_progress_timeout"
    # Conclusions: the lifecycle draws the first two through a Settlement; nobody may
    # report any of them as a fact (R4.1 "may NOT conclude" column).
    RUN_FAILED = "run_failed"
    RUN_COMPLETED = "run_completed"
    ANSWER_CORRECT = "answer_correct"
    PERMISSION_GRANTED = "permission_granted"
    RECEIPT_REWRITTEN = "receipt_rewritten"


AUTHORITY: Mapping[Owner, frozenset[FactKind]] = MappingProxyType(
    {
        Owner.EXECUTOR: frozenset(
            {
                FactKind.OPERATION_SUCCEEDED,
                FactKind.OPERATION_FAILED,
                FactKind.OPERATION_REFUSED,
                FactKind.EFFECT_UNKNOWN,
                FactKind.EFFECT_HAPPENED,
                FactKind.EFFECT_DID_NOT_HAPPEN,
                FactKind.PLANNING_FAILED,
            }
        ),
        Owner.RESOURCE: frozenset(
            {
                FactKind.RESOURCE_ADMITTED,
                FactKind.RESOURCE_EXHAUSTED,
                FactKind.HARD_LIMIT_REACHED,
            }
        ),
        Owner.PUBLICATION: frozenset({FactKind.BODY_COMMITTED, FactKind.BODY_COMMIT_FAILED}),
        Owner.PROVIDER: frozenset(
            {
                FactKind.TURN_CALLED_TOOLS,
                FactKind.TURN_ANSWERED,
                FactKind.TURN_WITHOUT_PROGRESS,
                FactKind.TRANSIENT_FAILURE,
                FactKind.NO_ELIGIBLE_PROVIDER,
            }
        ),
        Owner.USER: frozenset({FactKind.CANCEL_REQUESTED}),
        Owner.GUARD: frozenset({FactKind.IDENTITY_INVALID}),
        Owner.CLOCK: frozenset({FactKind.DEADLINE_EXCEEDED, FactKind.NO_PROGRESS_TIMEOUT}),
    }
)
"""R4.1: the facts each owner may establish. A kind absent here is nobody's to report."""


_EFFECT_KINDS = frozenset(
    {FactKind.EFFECT_UNKNOWN, FactKind.EFFECT_HAPPENED, FactKind.EFFECT_DID_NOT_HAPPEN}
)


def check_authority(
    owner: Owner, kind: FactKind, subject: str, reporter: str | None = None
) -> None:
    """R4.1: raise ``OutsideAuthorityError`` unless ``owner`` may establish ``kind``.

    An owner's "no" covers only its own effect: a tool may say its operation
    failed, never that the run failed; a resource ledger speaks only for its own
    resource (``reporter``, when given, must be that resource).
    """
    try:
        owner, kind = Owner(owner), FactKind(kind)
    except ValueError as exc:
        raise LifecycleError(f"unknown owner or fact kind: {exc}") from None
    allowed = AUTHORITY.get(owner, frozenset())
    if kind not in allowed:
        may = ", ".join(sorted(allowed))
        raise OutsideAuthorityError(
            f"{owner} may not report {kind!s}: it may establish only its own effect ({may}); "
            "continuing, finalizing or settling the run is the run lifecycle's decision"
        )
    if owner is Owner.RESOURCE and reporter is not None and reporter != subject:
        raise OutsideAuthorityError(
            f"the {reporter} ledger may not report on {subject}: a resource owner speaks "
            "only for its own resource (R4.1, R5.2)"
        )


@dataclass(frozen=True)
class OwnerFact:
    """A confirmed fact reported by its owner about its own effect (R4.1).

    ``subject`` names the effect: an operation id, a resource name, a body id, a
    provider id, a run id. Kind-specific fields: ``idempotency_key`` (required for
    effect facts, R5.4/R6.4), ``version`` (committed bodies), ``failure_class``
    (transient provider failures, R2.1), ``answer`` (proposed completions, R4.5).
    """

    owner: Owner
    kind: FactKind
    subject: str
    detail: str = ""
    reporter: str | None = None
    idempotency_key: str | None = None
    version: int | None = None
    failure_class: str | None = None
    answer: Answer | None = None

    def __post_init__(self) -> None:
        try:
            owner, kind = Owner(self.owner), FactKind(self.kind)
        except ValueError as exc:
            raise LifecycleError(f"unknown owner or fact kind: {exc}") from None
        # Normalise plain strings so identity comparisons on the enums hold.
        object.__setattr__(self, "owner", owner)
        object.__setattr__(self, "kind", kind)
        require_text("fact subject", self.subject)
        check_authority(owner, kind, self.subject, self.reporter)
        if kind in _EFFECT_KINDS and not is_text(self.idempotency_key):
            raise LifecycleError(
                f"{kind!s} needs the operation's idempotency key: unknown effects are "
                "verified by key (R6.4)"
            )
        if kind in (FactKind.RESOURCE_ADMITTED, FactKind.RESOURCE_EXHAUSTED) and (
            self.subject not in RESOURCES
        ):
            raise LifecycleError(
                f"unknown resource {self.subject!r}; expected one of {sorted(RESOURCES)}"
            )
        if kind is FactKind.BODY_COMMITTED:
            if not is_int(self.version) or self.version < 1:
                raise LifecycleError("a committed body needs its exact version (an int >= 1)")
        elif self.version is not None:
            raise LifecycleError("only a committed body carries a version")
        if kind is FactKind.TRANSIENT_FAILURE:
            if self.failure_class not in RETRYABLE_FAILURE_CLASSES:
                raise LifecycleError(
                    f"{self.failure_class!r} is not a transient failure class; expected one of "
                    f"{sorted(RETRYABLE_FAILURE_CLASSES)} (refusals follow R3, auth needs "
                    "configuration)"
                )
        elif self.failure_class is not None:
            raise LifecycleError("only a transient provider failure carries a failure class")
        if kind is FactKind.TURN_ANSWERED:
            if not isinstance(self.answer, Answer):
                raise LifecycleError("a proposed completion must say what it answers (R4.5)")
        elif self.answer is not None:
            raise LifecycleError("only an answered turn carries an answer")
