"""R8.2: incidents — one segment's trouble as on-call works it.

A segment's critical notifications (its freeze, its "no eligible provider")
are one incident with one lifecycle: triggered → (escalated) → acknowledged
→ resolved. The notifications keep their R3.6 dedupe keys; the incident is
what a person acknowledges once and what a pager sees once (its key is the
PagerDuty ``dedup_key``). A boundary that closes the segment clears the
cause and resolves the incident; a resolved incident never asks for a person.

Escalation: while an incident is triggered (nobody acknowledged it), its
first notification is re-sent one interval after the last notice, each time
to the next tier of channels (the last tier keeps being re-notified).

Pure: the caller supplies the states, the times and the interval.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum


class IncidentState(StrEnum):
    TRIGGERED = "triggered"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


def groups_into_incident(severity: str, segment_key: str | None) -> bool:
    """Only a segment's critical notifications call for a person: a first
    refusal (normal) re-probes by itself and is told, not worked."""
    return severity == "critical" and bool(segment_key)


def incident_key(segment_key: str, ordinal: int) -> str:
    """The incident's identity outside (PagerDuty's ``dedup_key``): the
    segment and the how-manieth incident of it (one resolved by hand while
    the segment stays frozen may be followed by another)."""
    if ordinal < 1:
        raise ValueError("an incident's ordinal starts at 1")
    return f"incident:{segment_key}:{ordinal}"


def needs_a_person(state: str) -> bool:
    """Triggered and not yet acknowledged; an acknowledged or resolved one does not."""
    return state == IncidentState.TRIGGERED


def may_acknowledge(state: str) -> bool:
    return state == IncidentState.TRIGGERED


def may_resolve(state: str) -> bool:
    return state != IncidentState.RESOLVED


def next_escalation_at(
    state: str, *, notified_at: datetime, last_escalated_at: datetime | None, interval: timedelta
) -> datetime | None:
    """When the next escalation fires: one interval after the last notice
    (the trigger, or the last escalation), only while nobody acknowledged."""
    if not needs_a_person(state):
        return None
    return (last_escalated_at or notified_at) + interval


def escalation_tier(level: int, tier_count: int) -> int | None:
    """The tier (index, lowest first) the notice of escalation ``level`` goes to:
    the trigger (level 0) to the first tier, each escalation to the next, the
    last tier again once they are used up; None without any channel."""
    if tier_count < 1:
        return None
    if level < 0:
        raise ValueError("an escalation level is never negative")
    return min(level, tier_count - 1)
