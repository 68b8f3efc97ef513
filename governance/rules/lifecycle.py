"""Termination authority and the run lifecycle (R4.1–R4.5, R6.3–R6.5).

Who may say "no", and what the run does next. Owners (tools, resource ledgers,
publication, providers, the user, identity guards, clocks) report *facts about
their own effect* (R4.1). Only this module turns those facts into the run's next
path: continue, bounded recovery, finalization-only, verify an unknown effect, or
settle (R6.3). A local "no" never ends the run by itself (R4.2); advisory inputs
never block (R4.3); a turn that produced nothing ends the run honestly (R4.4);
degrading narrows the promise, never swaps the goal (R4.5); recovery needs all
five conditions (R6.4); the settlement is written once (R6.5).

Pure rules: no I/O, no clock. The runner gathers facts, asks ``next_path`` and
records the decision through the services.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from governance.rules.classification import TIME_BASED_CLASSES
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT

# ---------------------------------------------------------------------------
# Errors


class LifecycleError(ValueError):
    """Illegal input to a lifecycle rule (R4, R6)."""


class OutsideAuthorityError(LifecycleError):
    """R4.1: an owner claimed something outside its own effect."""


class IllegalTransitionError(LifecycleError):
    """R6.3: a path the run may no longer take (finalization is one way; settled is final)."""


class SettlementConflictError(LifecycleError):
    """R6.5: a second, different settlement for a run that is already settled."""


# ---------------------------------------------------------------------------
# R4.1 Owners and the facts they may establish


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

# R5.2: the run's resources, each with its own ledger.
RESOURCES = frozenset(
    {
        "model_requests",
        "tool_calls",
        "web_searches",
        "provider_concurrency",
        "body_revisions",
        "output_reserve",
    }
)
ORDINARY_RESEARCH_RESOURCE = "model_requests"
OUTPUT_RESERVE = "output_reserve"

# R2.1: the classes that time repairs (one set with the health rule). Refusal
# (R3), auth and bad_request are not transient.
TRANSIENT_FAILURE_CLASSES = TIME_BASED_CLASSES
# R6.2: a stream that broke after its headers with no clock run out. A model
# request has no external effect, so the turn may be retried like a transient
# failure, but it is named for what it is: not a timeout, not a network failure.
INTERRUPTED = "interrupted"
RETRYABLE_FAILURE_CLASSES = TRANSIENT_FAILURE_CLASSES | {INTERRUPTED}

# The short name of a failure class where a page lists facts (R6.2).
FAILURE_LABELS = {
    INTERRUPTED: "interrupted (effect unknown)",
    "network": "network failure",
    "timeout": "provider timeout",
    "rate_limited": "rate limited",
    "server_error": "provider error",
}


def failure_label(failure_class: str) -> str:
    return FAILURE_LABELS.get(failure_class, failure_class.replace("_", " "))


# How the lifecycle's reasons name a provider failure (R6.2: words from the facts).
FAILURE_WORDS = {
    INTERRUPTED: (
        "the provider's stream broke off after its headers before any clock ran out "
        "(interrupted: the request may have been served, effect unknown)"
    ),
    "network": "the provider could not be reached (network)",
    "timeout": "the provider did not answer in time (timeout)",
    "rate_limited": "the provider is rate limiting (rate_limited)",
    "server_error": "the provider failed on its side (server_error)",
}

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
class Answer:
    """R4.5: what a proposed completion claims to answer.

    ``goal`` is the identity of the question the body addresses; a degraded
    (``narrowed``) answer must say what it leaves out in ``stated_gaps``.
    """

    goal: str
    stated_gaps: tuple[str, ...] = ()
    narrowed: bool = False

    def __post_init__(self) -> None:
        _require_text("answer goal", self.goal)
        if not isinstance(self.stated_gaps, tuple):
            raise LifecycleError("stated_gaps must be a tuple of strings")
        for gap in self.stated_gaps:
            _require_text("stated gap", gap)
        if self.narrowed and not self.stated_gaps:
            raise LifecycleError("a narrowed (fallback) answer must state the gap it leaves (R4.5)")


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
        _require_text("fact subject", self.subject)
        check_authority(owner, kind, self.subject, self.reporter)
        if kind in _EFFECT_KINDS and not _is_text(self.idempotency_key):
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
            if not _is_int(self.version) or self.version < 1:
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


# ---------------------------------------------------------------------------
# R4.4 No-progress rule


NO_ANSWER_TEXT = (
    "No answer was produced: the model turn returned neither a deliverable body nor a "
    "valid tool call, so the run ended here."
)


def classify_turn(deliverable_body: str, valid_tool_calls: int) -> FactKind:
    """R4.4: classify a model turn by the business progress it made.

    Only a deliverable body or a valid tool call is progress; reasoning
    fragments, usage events and heartbeats are not (R6.1) and are not inputs.
    """
    if not isinstance(deliverable_body, str):
        raise LifecycleError("deliverable_body must be a string (empty when there is none)")
    if not _is_int(valid_tool_calls) or valid_tool_calls < 0:
        raise LifecycleError("valid_tool_calls must be an int >= 0")
    if valid_tool_calls > 0:
        return FactKind.TURN_CALLED_TOOLS
    if deliverable_body.strip():
        return FactKind.TURN_ANSWERED
    return FactKind.TURN_WITHOUT_PROGRESS


# ---------------------------------------------------------------------------
# R4.3 Advisory inputs never block


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


# ---------------------------------------------------------------------------
# R6.5 Settlement


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
        _require_text("settlement reason", self.reason)
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


def answer_settlement(goal: str, answer: Answer) -> Settlement:
    """R4.5: settle a proposed completion by what it claims to answer.

    A different goal is a swapped question: never completed. Stated gaps narrow
    the promise: partial. Otherwise completed (a record, not a quality seal).
    """
    _require_text("run goal", goal)
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


# ---------------------------------------------------------------------------
# R6.4 Recovery eligibility, unknown effects, successor runs


@dataclass(frozen=True)
class RunAuthorization:
    """The authorization recorded for a run at admission (R6.4)."""

    run_id: str
    scopes: frozenset[str]

    def __post_init__(self) -> None:
        _require_text("authorization run_id", self.run_id)
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
        _require_text("task_identity", self.task_identity)
        _require_text("resume_task_identity", self.resume_task_identity)
        for name in ("checkpoint_usable", "original_allows_safe_continuation"):
            if not isinstance(getattr(self, name), bool):
                raise LifecycleError(f"{name} must be a bool")
        for name in ("admitted_authorization", "resume_authorization"):
            if not isinstance(getattr(self, name), RunAuthorization):
                raise LifecycleError(f"{name} must be a RunAuthorization")
        if not _is_int(self.remaining_balance) or self.remaining_balance < 0:
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


class EffectState(StrEnum):
    """Whether an external effect happened, as far as its executor has proven (R6.4)."""

    UNKNOWN = "unknown"
    HAPPENED = "happened"
    DID_NOT_HAPPEN = "did_not_happen"


class EvidenceKind(StrEnum):
    """What is offered as evidence about an unknown effect (R6.4)."""

    EXECUTOR_LOOKUP = "executor_lookup"  # the executor looked the idempotency key up: proof
    TIMEOUT = "timeout"  # no answer is not "nothing happened"
    READ_ONLY_LABEL = "read_only_label"  # a label is a claim, not a receipt
    MODEL_SAYS_TRY_AGAIN = "model_says_try_again"  # a model is not the executor
    NO_RESPONSE = "no_response"


@dataclass(frozen=True)
class EffectEvidence:
    """Evidence about one effect. Only an executor lookup carries a result (``found``)."""

    kind: EvidenceKind
    idempotency_key: str | None = None
    found: bool | None = None

    def __post_init__(self) -> None:
        try:
            kind = EvidenceKind(self.kind)
        except ValueError:
            raise LifecycleError(f"unknown evidence kind {self.kind!r}") from None
        object.__setattr__(self, "kind", kind)
        if kind is EvidenceKind.EXECUTOR_LOOKUP:
            if not _is_text(self.idempotency_key) or not isinstance(self.found, bool):
                raise LifecycleError(
                    "an executor lookup names the idempotency key it looked up and whether "
                    "the effect was found"
                )
        elif self.found is not None:
            raise LifecycleError(
                f"{kind!s} is not proof and cannot say whether the effect happened"
            )


def effect_state_after(idempotency_key: str, evidence: EffectEvidence) -> EffectState:
    """R6.4: the state of an unknown effect after ``evidence``.

    Only the executor's lookup by the same idempotency key resolves it; a
    timeout, a read-only label or a model saying "try again" leaves it unknown.
    """
    _require_text("idempotency_key", idempotency_key)
    if not isinstance(evidence, EffectEvidence):
        raise LifecycleError("evidence must be EffectEvidence")
    if evidence.kind is not EvidenceKind.EXECUTOR_LOOKUP:
        return EffectState.UNKNOWN
    if evidence.idempotency_key != idempotency_key:
        raise LifecycleError(
            f"the lookup was for {evidence.idempotency_key!r}, not {idempotency_key!r}: "
            "evidence about another operation proves nothing here"
        )
    return EffectState.HAPPENED if evidence.found else EffectState.DID_NOT_HAPPEN


class ReplayAction(StrEnum):
    """What recovery may do with an operation, given its proven effect state (R6.4)."""

    VERIFY_FIRST = "verify_first"  # ask the executor by idempotency key; no blind replay
    READ_BACK = "read_back"  # the effect exists: read its receipt back by identity
    REPLAY_SAME_KEY = "replay_same_key"  # proven absent: replay with the same key and balance


def replay_action(state: EffectState) -> ReplayAction:
    """R6.4: never replay an unknown effect; never re-invent one that happened."""
    try:
        state = EffectState(state)
    except ValueError:
        raise LifecycleError(f"unknown effect state {state!r}") from None
    if state is EffectState.UNKNOWN:
        return ReplayAction.VERIFY_FIRST
    if state is EffectState.HAPPENED:
        return ReplayAction.READ_BACK
    return ReplayAction.REPLAY_SAME_KEY


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


# ---------------------------------------------------------------------------
# R6.3 Decision table


class Phase(StrEnum):
    """Where a run is. RESEARCH → FINALIZATION is one way; SETTLED is final."""

    RESEARCH = "research"
    FINALIZATION = "finalization"
    SETTLED = "settled"


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
        _require_text("decision reason", self.reason)
        if not isinstance(self.must_keep, tuple) or not isinstance(self.verify_keys, tuple):
            raise LifecycleError("must_keep and verify_keys must be tuples")
        if self.settlement is not None and not isinstance(self.settlement, Settlement):
            raise LifecycleError("settlement must be a Settlement")
        if (path is Path.SETTLE) != (self.settlement is not None):
            raise LifecycleError("a settlement comes with the settle path and only with it")
        if (path is Path.VERIFY_EFFECT) != bool(self.verify_keys):
            raise LifecycleError("verify_effect names the idempotency keys to verify, only it")
        if self.critical_alert and not _is_text(self.boundary_action_needed):
            raise LifecycleError("a critical alert must name the boundary action needed")

    @property
    def dispatches(self) -> bool:
        """Whether this path sends new work (R6.3: settling sends none "to be graceful")."""
        return self.path in DISPATCHING_PATHS


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
        _require_text("run_id", self.run_id)
        _require_text("goal", self.goal)
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
            not _is_int(self.finalization_from)
            or not 0 <= self.finalization_from <= len(self.facts)
        ):
            raise LifecycleError("finalization_from must index into the recorded facts")
        if self.recovery is not None and not isinstance(self.recovery, RecoveryConditions):
            raise LifecycleError("recovery must be RecoveryConditions or None")


def record_fact(run: RunFacts, fact: OwnerFact) -> RunFacts:
    """Append an owner's fact (already authority-checked, R4.1). Late facts are kept too."""
    if not isinstance(fact, OwnerFact):
        raise LifecycleError("only an OwnerFact can be recorded")
    return replace(run, facts=(*run.facts, fact))


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


def successor_run(previous: RunFacts, new_run_id: str, reason: str) -> SuccessorRun:
    """R6.4: continuing after settlement needs a new run linked to the settled one."""
    if not isinstance(previous, RunFacts):
        raise LifecycleError("previous must be RunFacts")
    if previous.settlement is None:
        raise LifecycleError(
            f"run {previous.run_id} has not settled: it continues through its own lifecycle "
            "(recovery or finalization), not through a new run"
        )
    _require_text("new_run_id", new_run_id)
    _require_text("reason", reason)
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
    payload: Mapping[str, object]
    countdown_s: float = 0.0


def needs_recovery_conditions(facts: Sequence[OwnerFact]) -> bool:
    """Whether :func:`next_path` may consult the R6.4 conditions: only when the
    latest provider fact is a transient failure (gathering them costs reads)."""
    latest = _latest(tuple(facts), AUTHORITY[Owner.PROVIDER])
    return latest is not None and latest.kind is FactKind.TRANSIENT_FAILURE


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
            {"keys": list(decision.verify_keys), "resume": dict(resume), "attempt": attempt + 1},
            countdown_s=verify_delay_s,
        )
    if decision.path is Path.FINALIZATION_ONLY:
        follow = None if finalization_started else FollowUp("finalization", {"increment": []})
    elif decision.path is Path.BOUNDED_RECOVERY:
        follow = FollowUp(
            "model_turn",
            {"increment": [dict(item) for item in last_increment], "recovery": True},
            countdown_s=min(max(recovery_delay_s, 0.0), max_recovery_wait_s),
        )
    elif decision.path is Path.CONTINUE and next_work:
        follow = FollowUp(str(next_work["kind"]), dict(next_work["payload"]))  # type: ignore[arg-type]
    else:
        return None
    if follow is not None and STAGE_OF_KIND.get(follow.kind) not in allowed_stages(decision):
        raise IllegalTransitionError(f"{decision.path!s} does not allow a {follow.kind} stage")
    return follow


# ---------------------------------------------------------------------------
# Helpers


def _is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_text(name: str, value: object) -> None:
    if not _is_text(value):
        raise LifecycleError(f"{name} must be a non-empty string")


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


RECOVERY_REFUSAL_WORDS = {
    RecoveryCondition.SAME_TASK_IDENTITY: "the recovery would carry on another task",
    RecoveryCondition.USABLE_CHECKPOINT: "no usable checkpoint to resume from",
    RecoveryCondition.SAME_RUN_AUTHORIZATION: "the authorization differs from the admission",
    RecoveryCondition.REMAINING_BALANCE: f"the {ORDINARY_RESEARCH_RESOURCE} budget is used up",
    RecoveryCondition.SAFE_CONTINUATION: "an unknown tool effect makes resending unsafe",
}


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
