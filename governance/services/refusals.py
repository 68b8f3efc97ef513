"""A segment's refusal state, its fallback cards and notices (R3), the turn memory (R2.3)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from django.conf import settings

from governance.models import (
    Notification,
    Provider,
    ProviderAttempt,
    Run,
    RunEvent,
    Segment,
    SegmentRefusal,
    Stage,
    TurnRefusalMemo,
)
from governance.rules import refusal_memory
from governance.rules.refusal import (
    REFUSAL_SCOPE_TTL,
    ProviderRefusal,
    ReprobeSchedules,
    ScheduleChoice,
    card_entry,
    delays_from_seconds,
    delays_seconds,
    max_sends,
    refusal_verdict,
    schedule_of,
)
from governance.rules.refusal import refused_at_datetime as refusal_datetime
from governance.rules.routing import TurnOutcome
from governance.rules.turns import TurnCall
from governance.services import statements as sql
from governance.services.events import new_event
from governance.services.incidents import emit_notice


def reprobe_delays() -> tuple[timedelta, ...]:
    """R3.2's default schedule (``GOVERNANCE_REFUSAL_REPROBE_DELAYS``)."""
    return tuple(settings.GOVERNANCE_REFUSAL_REPROBE_DELAYS)


def schedule_choice(provider: Provider) -> ScheduleChoice | None:
    """A provider's own schedule (R3.2), as stored by ``services.providers``;
    None when it has none (R3.2's default)."""
    stored = provider.refusal_schedule or {}
    own = delays_from_seconds(stored.get("delays_s"))
    by_category = {
        category: delays
        for category, seconds in (stored.get("categories") or {}).items()
        if (delays := delays_from_seconds(seconds)) is not None
    }
    if own is None and not by_category:
        return None
    return ScheduleChoice(own, by_category)


def reprobe_schedules(providers: Iterable[Provider]) -> ReprobeSchedules:
    """R3.2's default with each provider's own schedule, from providers already read
    (no query): a refusal starts under its provider's schedule and keeps it."""
    chosen = {
        provider.provider_id: choice
        for provider in providers
        if (choice := schedule_choice(provider)) is not None
    }
    return ReprobeSchedules(reprobe_delays(), chosen)


def refusal_of(row: SegmentRefusal) -> ProviderRefusal:
    """A fast-read row as the R3.2 value the rules read."""
    return ProviderRefusal(
        provider_id=row.provider_id,
        model=row.model or None,
        category=row.category or None,
        refusals=row.refusals,
        refused_at=row.refused_at,
        delays=delays_from_seconds(row.delays_s),
    )


def segment_refusals(segment: Segment) -> dict[str, ProviderRefusal]:
    """R3.2 state of a segment, from the fast-read rows kept with the cards
    (the rows a page prefetched with ``prefetch_related("refusals")``, if any)."""
    if "refusals" in getattr(segment, "_prefetched_objects_cache", {}):
        return {row.provider_id: refusal_of(row) for row in segment.refusals.all()}
    return segment_refusals_later(segment).value()


def segment_refusals_later(segment: Segment) -> sql.Later[dict[str, ProviderRefusal]]:
    """:func:`segment_refusals`, read with others (``statements.together``)."""
    shape = sql.columns(SegmentRefusal, "f")
    return sql.Later(
        f"SELECT {shape.sql} FROM {sql.table(SegmentRefusal)} f WHERE f.segment_id = %s",
        [segment.id],
        lambda found: {row.provider_id: refusal_of(row) for row in map(shape.load, found)},
    )


def record_turn(
    *,
    run: Run,
    stage: Stage,
    segment: Segment,
    outcome: TurnOutcome,
    attempts: Sequence[dict[str, Any]],
    now: datetime,
    events: list[RunEvent] | None = None,
) -> list[Notification]:
    """Store one model turn's facts (R3.3, R3.5, R3.6). Call inside the stage's
    closing transaction: the refusal state, its card and the notices move together.

    Only actual refusals (``outcome.recorded``) write refusal state; skipped
    providers are read onto the card and never written.
    """
    sql.insert(
        [ProviderAttempt(run=run, stage=stage, segment=segment, **attempt) for attempt in attempts]
    )
    for refusal in outcome.recorded:
        SegmentRefusal.objects.update_or_create(
            segment=segment,
            provider_id=refusal.provider_id,
            defaults={
                "model": refusal.model or "",
                "category": refusal.category or "",
                "refusals": refusal.refusals,
                "refused_at": refusal.refused_at,
                "delays_s": delays_seconds(refusal.delays) if refusal.delays else None,
            },
        )
    if outcome.cleared:
        SegmentRefusal.objects.filter(segment=segment, provider_id__in=outcome.cleared).delete()
    if outcome.fallback_card is not None:
        card = new_event(
            run, "llm-fallback", now, outcome.fallback_card, segment=segment, stage=stage
        )
        if events is None:
            card.save()
        else:
            events.append(card)
    created = []
    for notice in outcome.notices:
        notification, is_new = emit_notice(notice, segment)
        if is_new:
            created.append(notification)
    return created


def attempt_rows(calls: Sequence[TurnCall], providers: dict[str, Provider]) -> list[dict[str, Any]]:
    """One model turn's requests as ProviderAttempt fields."""
    return [
        {
            "provider": providers[call.provider_id],
            "model": call.model,
            "kind": call.kind,
            "request_digest": call.digest,
            "started_at": call.started_at,
            "latency_ms": call.latency_ms,
            "result": call.result,
            "failure_class": call.classification.failure_class or "",
            "refusal_category": call.classification.refusal_category or "",
            "status_code": call.status_code,
            "finish_reason": call.finish_reason,
            "usage": dict(call.usage),
            "error": call.error,
            "tool_names": dict(call.tool_names),  # which wire name stood for which tool
        }
        for call in calls
    ]


def remember_turn_refusal(provider: Provider, request_digest: str, now: datetime) -> None:
    TurnRefusalMemo.objects.update_or_create(
        provider=provider, request_digest=request_digest, defaults={"refused_at": now}
    )


def turn_memory(
    provider_ids: Sequence[str], now: datetime
) -> sql.Later[refusal_memory.TurnRefusalMemory]:
    """R2.3: the requests each provider refused recently (the turn-level memory)."""
    shape = _memo_columns()
    since = now - REFUSAL_SCOPE_TTL

    def remembered(rows: list) -> refusal_memory.TurnRefusalMemory:
        memory = refusal_memory.TurnRefusalMemory()
        for row in rows:
            request_digest, refused_at = shape.values(row, 1)
            memory = refusal_memory.remember_turn_refusal(
                memory, row[0], request_digest, refused_at
            )
        return memory

    return sql.Later(
        f"SELECT p.provider_id, {shape.sql} FROM {sql.table(TurnRefusalMemo)} m"
        f" JOIN {sql.table(Provider)} p ON p.id = m.provider_id"
        f" WHERE {sql.is_in('p.provider_id', len(provider_ids))} AND m.refused_at > %s",
        [*provider_ids, sql.value(TurnRefusalMemo, "refused_at", since)],
        remembered,
    )


@cache
def _memo_columns() -> sql.Columns:
    return sql.Columns(TurnRefusalMemo, "m", only=("request_digest", "refused_at"))


def refusal_rows_view(segment: Segment, now: datetime) -> list[dict[str, Any]]:
    """Each provider of the thread's chain with its verdict in this segment (R8.1)."""
    refusals = segment_refusals(segment)
    rows = []
    for provider_id in segment.thread.provider_chain:
        refusal = refusals.get(provider_id)
        verdict = refusal_verdict(refusal, now, reprobe_delays())
        entry = (
            card_entry(refusal, now, reprobe_delays())
            if refusal
            else {"provider_id": provider_id, "refusals": 0, "refused_at": None}
        )
        refused_at = refusal_datetime(refusal) if refusal else None
        entry.update(
            refused_at=refused_at.isoformat() if refused_at else None,
            state=verdict.state,
            reprobes=verdict.reprobes,
            next_probe_at=verdict.next_probe_at.isoformat() if verdict.next_probe_at else None,
            max_sends=max_sends(schedule_of(refusal, reprobe_delays())),
        )
        rows.append(entry)
    return rows
