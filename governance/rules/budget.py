"""R5: the arithmetic of one run's budget ledger.

One ledger per run holds every admission fact for every resource (R5.1). It is
a frozen value: :func:`admit` and :func:`release` return a new ledger with one
entry appended, and a refusal returns the very same ledger. The persistence
layer locks the run's ledger row, rebuilds a :class:`Ledger` from it, calls
these functions and writes back the new entry — so admission stays atomic and
the runtime only ever reads :func:`balance`, never a second ledger.

Resources (R5.2) each have their own limit, and exhausting one refuses only
new uses of that one. ``provider_concurrency`` is a gauge (acquire with
:func:`admit`, give back with :func:`release`); all others are cumulative and
never refunded. ``output_reserve`` is a pool of model requests set aside for
finalization: only ``admit(..., MODEL_REQUESTS, ..., for_finalization=True)``
draws from it, and ordinary model requests can never reach it.

Retries, re-probes, re-renders, continuations and recoveries are labelled by
``purpose`` but draw from the same balance as the original (R5.3); nothing here
knows about stages, so no stage can grant itself a fresh allowance, and there
is no "free" flag for read-only work. Every admission carries an idempotency
key; the same key admitted twice consumes once (R5.4).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from enum import StrEnum


class Resource(StrEnum):
    """The budgeted resources of a run (R5.2)."""

    MODEL_REQUESTS = "model_requests"
    TOOL_CALLS = "tool_calls"
    WEB_SEARCHES = "web_searches"
    PROVIDER_CONCURRENCY = "provider_concurrency"
    BODY_REVISIONS = "body_revisions"
    OUTPUT_RESERVE = "output_reserve"


class Purpose(StrEnum):
    """Why a use is requested (R5.3). A label only: every purpose draws from
    the same balance as the original operation."""

    ORIGINAL = "original"
    RETRY = "retry"
    REPROBE = "reprobe"
    RERENDER = "rerender"
    CONTINUATION = "continuation"
    RECOVERY = "recovery"


class EntryKind(StrEnum):
    ADMIT = "admit"
    RELEASE = "release"


class RefusalReason(StrEnum):
    """Why an admission was refused (R5.2). Refusals are facts, not errors."""

    EXHAUSTED = "exhausted"  # nothing left in the pool
    INSUFFICIENT = "insufficient"  # something left, but less than asked


# The gauge resource: held slots come back on release; all others only grow.
RELEASABLE: frozenset[Resource] = frozenset({Resource.PROVIDER_CONCURRENCY})

# R5.2: the run's resources, each with its own ledger (their names, as facts carry them).
RESOURCES = frozenset(resource.value for resource in Resource)
ORDINARY_RESEARCH_RESOURCE = Resource.MODEL_REQUESTS.value
OUTPUT_RESERVE = Resource.OUTPUT_RESERVE.value


class BudgetError(ValueError):
    """Illegal input to the ledger arithmetic (not a refusal)."""


class IdempotencyConflict(BudgetError):
    """R5.4: an idempotency key reused for a different use."""


@dataclass(frozen=True)
class BudgetLimits:
    """Per-resource limits of one run (R5.2); zero means none granted."""

    model_requests: int
    tool_calls: int
    web_searches: int
    provider_concurrency: int
    body_revisions: int
    output_reserve: int

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise BudgetError(f"limit {f.name} must be an int, got {value!r}")
            if value < 0:
                raise BudgetError(f"limit {f.name} must be >= 0, got {value}")

    def of(self, resource: Resource) -> int:
        return getattr(self, Resource(resource).value)


@dataclass(frozen=True)
class LedgerEntry:
    """One append-only fact (R5.1).

    ``resource`` is the use asked for; ``pool`` is the balance it drew from
    (``output_reserve`` for a finalization model request, else ``resource``).
    A ``release`` entry carries the key of the acquisition it gives back.
    """

    kind: EntryKind
    idempotency_key: str
    resource: Resource
    pool: Resource
    amount: int
    purpose: Purpose
    for_finalization: bool = False

    def __post_init__(self) -> None:
        # Rows read back from storage carry plain strings: normalise them here
        # so one malformed row fails loudly instead of skewing a balance.
        try:
            kind = EntryKind(self.kind)
        except ValueError:
            raise BudgetError(f"unknown ledger entry kind {self.kind!r}") from None
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "idempotency_key", _key(self.idempotency_key))
        object.__setattr__(self, "resource", _resource(self.resource))
        object.__setattr__(self, "pool", _resource(self.pool))
        object.__setattr__(self, "purpose", _purpose(self.purpose))
        _require_amount(self.amount)
        if not isinstance(self.for_finalization, bool):
            raise BudgetError("for_finalization must be a bool")
        if self.pool is not _pool(self.resource, self.for_finalization):
            raise BudgetError(
                f"entry {self.idempotency_key!r}: {self.resource} "
                f"(for_finalization={self.for_finalization}) cannot draw from {self.pool}"
            )


@dataclass(frozen=True)
class Balance:
    """R5.1 view of one resource: ``remaining == limit - used``."""

    limit: int
    used: int
    remaining: int


@dataclass(frozen=True)
class Draw:
    """One request's draw on the run's ledger (R5.1, R5.3, R5.4): what
    :func:`admit` is asked for it."""

    resource: str
    amount: int
    key: str
    purpose: str
    for_finalization: bool


@dataclass(frozen=True)
class Admission:
    """The answer to one :func:`admit` call (R5.2, R5.4).

    ``remaining`` is the balance of ``pool`` after this answer. ``duplicate``
    is true when the key had already been admitted: nothing new was consumed.
    """

    admitted: bool
    resource: Resource
    pool: Resource
    amount: int
    idempotency_key: str
    purpose: Purpose
    remaining: int
    duplicate: bool = False
    reason: RefusalReason | None = None


@dataclass(frozen=True)
class Ledger:
    """One run's budget ledger: limits plus an append-only tuple of entries.

    Constructing it checks the entries are consistent (one admission per key,
    releases only of held concurrency slots, no pool over its limit), so a
    ledger rebuilt from stored rows cannot silently be over budget.
    """

    limits: BudgetLimits
    entries: tuple[LedgerEntry, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.limits, BudgetLimits):
            raise BudgetError("limits must be a BudgetLimits")
        if not isinstance(self.entries, tuple):
            raise BudgetError("entries must be a tuple (the ledger is append-only)")
        admitted: dict[str, LedgerEntry] = {}
        released: set[str] = set()
        used = dict.fromkeys(Resource, 0)
        for entry in self.entries:
            if not isinstance(entry, LedgerEntry):
                raise BudgetError(f"ledger entries must be LedgerEntry, got {type(entry).__name__}")
            key = entry.idempotency_key
            if entry.kind is EntryKind.ADMIT:
                if key in admitted:
                    raise BudgetError(f"idempotency key {key!r} admitted twice in the ledger")
                admitted[key] = entry
                used[entry.pool] += entry.amount
                if used[entry.pool] > self.limits.of(entry.pool):
                    raise BudgetError(f"ledger entries exceed the {entry.pool} limit")
            else:
                held = admitted.get(key)
                if held is None or held.pool not in RELEASABLE or key in released:
                    raise BudgetError(f"release of {key!r} does not match a held slot")
                released.add(key)
                used[held.pool] -= held.amount

    @classmethod
    def open(cls, limits: BudgetLimits) -> Ledger:
        """A new run's empty ledger."""
        return cls(limits=limits)


# --------------------------------------------------------------------------- reading


def _admissions(ledger: Ledger) -> Iterator[LedgerEntry]:
    return (e for e in ledger.entries if e.kind is EntryKind.ADMIT)


def _released_keys(ledger: Ledger) -> set[str]:
    return {e.idempotency_key for e in ledger.entries if e.kind is EntryKind.RELEASE}


def find_admission(ledger: Ledger, idempotency_key: str) -> LedgerEntry | None:
    """R5.4/R6.4: the admission recorded under a key, if any (used to verify
    an operation by its key before any replay)."""
    for entry in _admissions(ledger):
        if entry.idempotency_key == idempotency_key:
            return entry
    return None


def balance(ledger: Ledger) -> dict[Resource, Balance]:
    """R5.1: the view of every resource, read from the one ledger.

    For ``provider_concurrency`` ``used`` is the slots held now (acquired minus
    released); for every other resource it is the total ever admitted.
    """
    used = dict.fromkeys(Resource, 0)
    released = _released_keys(ledger)
    for entry in _admissions(ledger):
        if entry.pool in RELEASABLE and entry.idempotency_key in released:
            continue
        used[entry.pool] += entry.amount
    view = {}
    for resource in Resource:
        limit = ledger.limits.of(resource)
        view[resource] = Balance(limit=limit, used=used[resource], remaining=limit - used[resource])
    return view


# --------------------------------------------------------------------------- changing


def _resource(resource: Resource | str) -> Resource:
    try:
        return Resource(resource)
    except ValueError:
        known = ", ".join(r.value for r in Resource)
        raise BudgetError(f"unknown resource {resource!r}; known: {known}") from None


def _purpose(purpose: Purpose | str) -> Purpose:
    try:
        return Purpose(purpose)
    except ValueError:
        known = ", ".join(p.value for p in Purpose)
        raise BudgetError(f"unknown purpose {purpose!r}; known: {known}") from None


def _key(idempotency_key: str) -> str:
    if not isinstance(idempotency_key, str) or not idempotency_key.strip():
        raise BudgetError("idempotency_key must be a non-empty string (R5.4)")
    return idempotency_key


def _require_amount(amount: int) -> None:
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise BudgetError(f"amount must be a positive int, got {amount!r}")


def _pool(resource: Resource, for_finalization: bool) -> Resource:
    if resource is Resource.OUTPUT_RESERVE:
        raise BudgetError(
            "output_reserve is not admitted directly: admit model_requests with "
            "for_finalization=True"
        )
    if not for_finalization:
        return resource
    if resource is not Resource.MODEL_REQUESTS:
        raise BudgetError(
            f"only model_requests draw from the output reserve; {resource} has its own "
            "balance even during finalization"
        )
    return Resource.OUTPUT_RESERVE


def admit(
    ledger: Ledger,
    resource: Resource | str,
    amount: int,
    idempotency_key: str,
    purpose: Purpose | str,
    *,
    for_finalization: bool = False,
) -> tuple[Ledger, Admission]:
    """R5.2–R5.4: admit ``amount`` uses of ``resource`` under ``idempotency_key``.

    Returns the new ledger and the admission. A refusal (pool too low) returns
    the same ledger unchanged and a refused :class:`Admission`; it refuses only
    this resource's pool. A key already admitted returns the same ledger and a
    ``duplicate`` admission (consumes once, R5.4); the same key with a
    different resource, amount, purpose or finalization flag raises
    :class:`IdempotencyConflict`. Unknown resource or purpose, ``amount <= 0``,
    or an empty key raise :class:`BudgetError` (a ``ValueError``).
    """
    use = _resource(resource)
    why = _purpose(purpose)
    key = _key(idempotency_key)
    _require_amount(amount)
    if not isinstance(for_finalization, bool):
        raise BudgetError("for_finalization must be a bool")
    pool = _pool(use, for_finalization)

    before = find_admission(ledger, key)
    if before is not None:
        asked = (use, pool, amount, why, for_finalization)
        had = (before.resource, before.pool, before.amount, before.purpose, before.for_finalization)
        if asked != had:
            raise IdempotencyConflict(
                f"idempotency key {key!r} was admitted for {before.amount} {before.resource} "
                f"({before.purpose}, pool {before.pool}); now asked for {amount} {use} "
                f"({why}, pool {pool})"
            )
        return ledger, Admission(
            admitted=True,
            resource=use,
            pool=pool,
            amount=amount,
            idempotency_key=key,
            purpose=why,
            remaining=balance(ledger)[pool].remaining,
            duplicate=True,
        )

    remaining = balance(ledger)[pool].remaining
    if amount > remaining:
        reason = RefusalReason.EXHAUSTED if remaining <= 0 else RefusalReason.INSUFFICIENT
        return ledger, Admission(
            admitted=False,
            resource=use,
            pool=pool,
            amount=amount,
            idempotency_key=key,
            purpose=why,
            remaining=remaining,
            reason=reason,
        )

    entry = LedgerEntry(
        kind=EntryKind.ADMIT,
        idempotency_key=key,
        resource=use,
        pool=pool,
        amount=amount,
        purpose=why,
        for_finalization=for_finalization,
    )
    return replace(ledger, entries=(*ledger.entries, entry)), Admission(
        admitted=True,
        resource=use,
        pool=pool,
        amount=amount,
        idempotency_key=key,
        purpose=why,
        remaining=remaining - amount,
    )


def release(ledger: Ledger, idempotency_key: str) -> Ledger:
    """R5.2: give back the provider-concurrency slot acquired under a key.

    A released key stays spent: admitting it again is a duplicate (R5.4) and
    holds nothing, so a new acquisition needs a new key. Idempotent
    (at-least-once delivery may release twice): a slot already released
    returns the same ledger. Releasing a key that never acquired a
    concurrency slot raises :class:`BudgetError`; cumulative resources are
    never refunded (a retry or read-only use was still a use, R5.3).
    """
    key = _key(idempotency_key)
    held = find_admission(ledger, key)
    if held is None:
        raise BudgetError(f"no admission under idempotency key {key!r} to release")
    if held.pool not in RELEASABLE:
        raise BudgetError(f"{held.pool} is not released: only provider_concurrency slots are")
    if key in _released_keys(ledger):
        return ledger
    entry = replace(held, kind=EntryKind.RELEASE)
    return replace(ledger, entries=(*ledger.entries, entry))
