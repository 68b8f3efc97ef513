"""R3.1, R3.2, R3.5: which providers a turn may try, in what order, and how.

Routing reads two independent facts per provider — its health (R2, time
based) and its refusal state in this segment (R3, about the bytes) — and
never lets one stand in for the other. A refused provider is skipped in this
segment for now (bounded re-probes; frozen in this segment once used up).

:func:`drive_turn` runs the refusal protocol of one turn with the sending
injected, so the sequence of requests is decided here and the runner only
performs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from governance.rules.breaker import HealthVerdict
from governance.rules.refusal import (
    REFUSAL_REPROBE_DELAYS,
    RULE_TEXT,
    Notice,
    ProviderRefusal,
    as_utc,
    card_entry,
    record_refusal,
    refusal_notices,
    refusal_verdict,
    reprobe_due,
    starting_schedule,
)
from governance.rules.refusal_memory import TurnRefusalMemory, turn_recently_refused

MAX_RERENDERS = 2  # R3.1

AttemptKind = Literal["original", "re_render", "history_only", "re_probe", "fallback"]
SkipReason = Literal["cooling", "frozen", "breaker_open", "disabled", "turn_refused"]
AttemptResult = Literal["accepted", "refused", "failed"]
TurnResult = Literal["accepted", "failed", "interrupted", "no_provider"]


class RoutingError(ValueError):
    """Bad input to routing."""


@dataclass(frozen=True)
class ChainEntry:
    provider_id: str
    model: str | None = None


@dataclass(frozen=True)
class Candidate:
    provider_id: str
    model: str | None
    reprobe: bool  # R3.2: a due re-probe — one send, no re-render
    refusal: ProviderRefusal | None


@dataclass(frozen=True)
class Skip:
    provider_id: str
    model: str | None
    reason: SkipReason
    until: datetime | None  # next_probe_at (cooling) or retry_at (breaker open)
    detail: str
    refusal: ProviderRefusal | None = None


@dataclass(frozen=True)
class TurnRoute:
    candidates: tuple[Candidate, ...]
    skipped: tuple[Skip, ...]


def route_turn(
    chain: Sequence[ChainEntry],
    *,
    now: datetime,
    health: Mapping[str, HealthVerdict],
    refusals: Mapping[str, ProviderRefusal],
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
    turn_memory: TurnRefusalMemory | None = None,
    request_digests: Mapping[str, Sequence[str]] | None = None,
) -> TurnRoute:
    """The providers to try this turn, in chain order, and the skipped ones.

    Refusal state is checked first: a frozen or cooling provider is skipped
    whatever its health, and a healthy breaker never makes refused bytes
    acceptable. Then R2.3's turn memory: a provider that refused one of this
    turn's requests (``request_digests``: provider → the digests of the forms
    this turn would send it) within ``REFUSAL_SCOPE_TTL`` is not sent the same
    turn again. A provider without a health verdict is taken as available.
    """
    if not chain:
        raise RoutingError("the provider chain is empty")
    ids = [entry.provider_id for entry in chain]
    if len(set(ids)) != len(ids):
        raise RoutingError(f"a provider appears twice in the chain: {ids}")
    now = as_utc(now)
    candidates: list[Candidate] = []
    skipped: list[Skip] = []
    for entry in chain:
        refusal = refusals.get(entry.provider_id)
        verdict = refusal_verdict(refusal, now, delays)
        if verdict.state == "frozen":
            skipped.append(Skip(entry.provider_id, entry.model, "frozen", None, RULE_TEXT, refusal))
            continue
        if verdict.state == "cooling":
            skipped.append(
                Skip(
                    entry.provider_id,
                    entry.model,
                    "cooling",
                    verdict.next_probe_at,
                    RULE_TEXT,
                    refusal,
                )
            )
            continue
        if turn_memory and any(
            turn_recently_refused(turn_memory, entry.provider_id, digest, now)
            for digest in (request_digests or {}).get(entry.provider_id, ())
        ):
            skipped.append(
                Skip(
                    entry.provider_id,
                    entry.model,
                    "turn_refused",
                    None,
                    "this exact request was refused by this provider recently",
                    refusal,
                )
            )
            continue
        provider_health = health.get(entry.provider_id)
        if provider_health is not None and not provider_health.available:
            reason: SkipReason = (
                "disabled" if provider_health.state == "disabled" else "breaker_open"
            )
            skipped.append(
                Skip(
                    entry.provider_id,
                    entry.model,
                    reason,
                    provider_health.retry_at,
                    provider_health.reason,
                    refusal,
                )
            )
            continue
        has_state = reprobe_due(verdict.state, refusal.refusals if refusal else 0)
        candidates.append(Candidate(entry.provider_id, entry.model, has_state, refusal))
    return TurnRoute(tuple(candidates), tuple(skipped))


def attempt_plan(
    candidate: Candidate,
    *,
    has_unaccepted_increment: bool,
    first_in_turn: bool,
    max_rerenders: int = MAX_RERENDERS,
) -> tuple[AttemptKind, ...]:
    """R3.1/R3.2: the sends one provider gets on this turn at most.

    A due re-probe is one send. Otherwise a request carrying a new,
    not-yet-accepted increment is quarantined before the segment is blamed:
    the original, ``max_rerenders`` neutral re-renders of the increment, then
    the accepted history alone. Only a refusal of that last request is a
    segment refusal.
    """
    if candidate.reprobe:
        return ("re_probe",)
    opening: AttemptKind = "original" if first_in_turn else "fallback"
    if not has_unaccepted_increment:
        return (opening,)
    return (opening, *(["re_render"] * max_rerenders), "history_only")


@dataclass(frozen=True)
class AttemptOutcome:
    result: AttemptResult
    refusal_category: str | None = None
    failure_class: str | None = None
    at: datetime | None = None  # when the answer came; a refusal is anchored here (R3.2)


@dataclass(frozen=True)
class AttemptRecord:
    provider_id: str
    model: str | None
    kind: AttemptKind
    outcome: AttemptOutcome


@dataclass(frozen=True)
class TurnOutcome:
    result: TurnResult
    accepted_by: str | None
    accepted_kind: AttemptKind | None  # re_render: increment re-rendered; history_only: withheld
    attempts: tuple[AttemptRecord, ...]
    refusals: dict[str, ProviderRefusal]  # segment refusal state after the turn
    recorded: tuple[ProviderRefusal, ...]  # actual segment refusals of this turn (R3.3)
    cleared: tuple[str, ...]  # providers whose re-probe was accepted
    notices: tuple[Notice, ...]
    fallback_card: dict[str, Any] | None  # R3.5, None when nothing was skipped or refused
    failure_class: str | None = None
    skipped: tuple[Skip, ...] = field(default_factory=tuple)


# A failure of these classes ends the turn instead of falling back: a bad
# request is the request's fault (R2.1), an interrupted stream has an unknown
# effect that the lifecycle must judge, not a blind resend (R6.2), an
# exhausted request budget refuses every new send, on any provider (R5.2),
# and the run's own deadline or no-progress clock is not one provider's
# problem that the next provider could fix (R6.1).
_TURN_ENDING_FAILURES = {
    "bad_request": "failed",
    "cancelled": "failed",  # the user's stop blocks every further send (R4.3, R6.3)
    "not_permitted": "failed",
    "interrupted": "interrupted",
    "budget_exhausted": "failed",
    "deadline_exceeded": "failed",
    "no_progress": "failed",
}


def first_send(
    route: TurnRoute, *, has_unaccepted_increment: bool
) -> tuple[Candidate, AttemptKind] | None:
    """The request :func:`drive_turn` sends first over ``route``: its first
    candidate's first attempt (None: no candidate, nothing is sent). Known
    before the turn runs, so its ledger draw can be admitted with the claim."""
    if not route.candidates:
        return None
    candidate = route.candidates[0]
    plan = attempt_plan(
        candidate, has_unaccepted_increment=has_unaccepted_increment, first_in_turn=True
    )
    return candidate, plan[0]


def drive_turn(
    route: TurnRoute,
    send: Callable[[Candidate, AttemptKind], AttemptOutcome],
    *,
    segment_key: str,
    refusals: Mapping[str, ProviderRefusal],
    has_unaccepted_increment: bool,
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> TurnOutcome:
    """Run one turn's refusal protocol over ``route`` (R3.1–R3.3, R3.5, R3.6).

    ``send`` performs one request and reports what happened; health
    bookkeeping for time-based failures is the caller's business. Refusal
    state moves only here, on an actual segment refusal, and an accepted
    re-probe clears it.
    """
    now = as_utc(now)
    state = dict(refusals)
    attempts: list[AttemptRecord] = []
    recorded: list[ProviderRefusal] = []
    cleared: list[str] = []
    result: TurnResult = "no_provider"
    accepted_by: str | None = None
    accepted_kind: AttemptKind | None = None
    failure_class: str | None = None
    for position, candidate in enumerate(route.candidates):
        plan = attempt_plan(
            candidate,
            has_unaccepted_increment=has_unaccepted_increment,
            first_in_turn=position == 0,
        )
        for step, kind in enumerate(plan):
            outcome = send(candidate, kind)
            if outcome.result not in ("accepted", "refused", "failed"):
                raise RoutingError(f"unknown attempt result {outcome.result!r}")
            attempts.append(AttemptRecord(candidate.provider_id, candidate.model, kind, outcome))
            if outcome.result == "accepted":
                result, accepted_by, accepted_kind = "accepted", candidate.provider_id, kind
                if state.pop(candidate.provider_id, None) is not None:
                    cleared.append(candidate.provider_id)
                break
            if outcome.result == "failed":
                failure_class = outcome.failure_class
                if failure_class in _TURN_ENDING_FAILURES:
                    result = _TURN_ENDING_FAILURES[failure_class]  # type: ignore[assignment]
                break  # time-based failure: fall back to the next provider
            if step == len(plan) - 1:
                # The accepted history itself was refused: a segment refusal.
                # Anchor on the refusal itself, not on the turn's start (R3.3).
                updated = record_refusal(
                    state.get(candidate.provider_id),
                    provider_id=candidate.provider_id,
                    model=candidate.model,
                    category=outcome.refusal_category,
                    now=as_utc(outcome.at) if outcome.at else now,
                    # A new refusal starts under its provider's (or category's) schedule.
                    schedule=starting_schedule(
                        delays, candidate.provider_id, outcome.refusal_category
                    ),
                )
                state[candidate.provider_id] = updated
                recorded.append(updated)
        if result != "no_provider":
            break
    if result == "no_provider" and failure_class is not None:
        result = "failed"
    notices = tuple(refusal_notices(segment_key, recorded, now, delays)) if recorded else ()
    card = fallback_card(route.skipped, recorded, accepted_by, now, delays)
    return TurnOutcome(
        result=result,
        accepted_by=accepted_by,
        accepted_kind=accepted_kind,
        attempts=tuple(attempts),
        refusals=state,
        recorded=tuple(recorded),
        cleared=tuple(cleared),
        notices=notices,
        fallback_card=card,
        failure_class=failure_class if result != "accepted" else None,
        skipped=route.skipped,
    )


def fallback_card(
    skipped: Sequence[Skip],
    refused_now: Sequence[ProviderRefusal],
    fallback_to: str | None,
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> dict[str, Any] | None:
    """R3.5: metadata of the ``llm-fallback`` event for a turn that skipped or
    fell back from a provider. It reads refusal state and never changes it
    (R3.3), so any number of skipped turns cannot move the clock.
    """
    refusal_entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    for refusal in refused_now:
        refusal_entries.append(card_entry(refusal, now, delays))
        seen.add(refusal.provider_id)
    health_entries: list[dict[str, Any]] = []
    for skip in skipped:
        if skip.reason in ("cooling", "frozen") and skip.refusal is not None:
            if skip.provider_id not in seen:
                refusal_entries.append(card_entry(skip.refusal, now, delays))
                seen.add(skip.provider_id)
        else:
            health_entries.append(
                {
                    "provider_id": skip.provider_id,
                    "model": skip.model,
                    "state": skip.reason,
                    "until": skip.until.isoformat() if skip.until else None,
                    "detail": skip.detail,
                }
            )
    if not refusal_entries and not health_entries:
        return None
    lines = [f"Provider {entry['provider_id']}: {RULE_TEXT}." for entry in refusal_entries]
    lines += [f"Provider {entry['provider_id']}: {entry['detail']}." for entry in health_entries]
    return {
        "refusal": refusal_entries,
        "health": health_entries,
        "fallback_to": fallback_to,
        "text": " ".join(lines),
    }


NoCandidateCause = Literal["refused", "breaker_open", "unavailable"]


def why_no_candidate(
    skipped: Sequence[Skip], refused_now: Sequence[str] = ()
) -> tuple[NoCandidateCause, datetime | None]:
    """R6.3: why a turn found no provider to answer it, and when time may help.

    ``refused``: every provider was skipped or refused for this segment's
    bytes (R3; ``refused_now`` are the providers whose request was refused in
    this very turn) — only the re-probe schedule or a boundary helps.
    ``breaker_open``: at least one provider waits for its breaker (R2.2) — time
    helps, so this is a transient failure to recover from at the earliest
    ``until``. ``unavailable``: the rest (disabled by configuration, the same
    request refused recently) — neither waiting nor a boundary is known to help.
    """
    waits = [skip.until for skip in skipped if skip.reason == "breaker_open"]
    if waits:
        return "breaker_open", min((w for w in waits if w is not None), default=None)
    reasons = [skip.reason for skip in skipped] + ["refused"] * len(refused_now)
    if reasons and all(reason in ("frozen", "cooling", "refused") for reason in reasons):
        return "refused", None
    return "unavailable", None


def turn_chain(
    chain_ids: Sequence[str], provider_models: Mapping[str, str], segment_model: str
) -> tuple[ChainEntry, ...]:
    """R1.2/R8.3: the segment's model goes to the provider that serves it (a
    model switch moves that provider first); other providers keep their
    configured model. Unknown providers are left out."""
    ordered = list(chain_ids)
    serving = [pid for pid in ordered if provider_models.get(pid) == segment_model]
    if serving:
        ordered.remove(serving[0])
        ordered.insert(0, serving[0])
    entries = []
    for pid in ordered:
        if pid not in provider_models:
            continue
        model = segment_model if pid == ordered[0] and segment_model else provider_models[pid]
        entries.append(ChainEntry(pid, model))
    return tuple(entries)
