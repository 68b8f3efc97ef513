"""Reads for incidents (R8.2), shared by the page and the API. Read-only:
acknowledging and resolving go through ``governance.services.incidents``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, Count, IntegerField, Q, QuerySet, Value, When

from governance.models import (
    Incident,
    IncidentStep,
    Notification,
    NotificationDelivery,
    ProviderAttempt,
    Run,
)
from governance.rules.incidents import (
    IncidentState,
    escalation_tier,
    needs_a_person,
    next_escalation_at,
)
from governance.rules.settlement import Outcome
from governance.services import alerts as services_alerts

STATE_CHOICES = (
    ("open", "Open (triggered or acknowledged)"),
    ("triggered", "Needing a person"),
    ("acknowledged", "Acknowledged"),
    ("resolved", "Resolved"),
    ("all", "All"),
)
NEEDS_A_PERSON = [state.value for state in IncidentState if needs_a_person(state)]


def rows(state: str = "open") -> QuerySet[Incident]:
    """Needing a person first, then acknowledged, then resolved; newest first in each."""
    found = Incident.objects.select_related("segment", "segment__thread", "acked_by").annotate(
        alert_count=Count("notifications"),
        rank=Case(
            When(state__in=NEEDS_A_PERSON, then=Value(0)),
            When(state=IncidentState.ACKNOWLEDGED, then=Value(1)),
            default=Value(2),
            output_field=IntegerField(),
        ),
    )
    if state == "open":
        found = found.exclude(state=IncidentState.RESOLVED)
    elif state in {s.value for s in IncidentState}:
        found = found.filter(state=state)
    return found.order_by("rank", "-opened_at", "-id")


def needing_a_person_count() -> int:
    """The number in the nav, the tab title and the Overview."""
    return Incident.objects.filter(state__in=NEEDS_A_PERSON).count()


@dataclass(frozen=True)
class Tier:
    number: int  # 1-based, as people count
    channels: list[Any]
    first_used_by: str  # "the trigger" or "escalation 2"


@dataclass(frozen=True)
class Refusal:
    provider_id: str
    category: str
    said: str  # the provider's own words, when it gave any
    at: datetime


@dataclass(frozen=True)
class IncidentView:
    incident: Incident
    steps: list[IncidentStep]
    alerts: list[Notification]
    pages: list[NotificationDelivery]
    tiers: list[Tier]
    escalation_minutes: int
    escalation_level: int
    next_escalation_at: datetime | None
    next_tier: Tier | None
    refusals: list[Refusal]
    runs: list[Run]
    run_count: int
    unanswered_count: int
    needs_a_person: bool


def _tiers(escalation_minutes: int) -> list[Tier]:
    grouped = services_alerts.tiers()
    described = []
    for index, channels in enumerate(grouped):
        first = next(
            level for level in range(len(grouped)) if escalation_tier(level, len(grouped)) == index
        )
        used_by = (
            "the trigger"
            if first == 0
            else f"escalation {first}, {first * escalation_minutes} min after the trigger"
        )
        described.append(Tier(index + 1, channels, used_by))
    return described


def detail(incident_id: int) -> IncidentView:
    """One incident with its steps, alerts, pages, escalation and impact;
    raises Incident.DoesNotExist."""
    incident = Incident.objects.select_related("segment", "segment__thread", "acked_by").get(
        id=incident_id
    )
    alerts = list(incident.notifications.select_related("acked_by").order_by("created_at", "id"))
    lead = next((n for n in alerts if n.leads_incident), alerts[0] if alerts else None)
    pages = list(
        NotificationDelivery.objects.filter(notification__incident=incident)
        .select_related("channel")
        .order_by("created_at", "id")
    )
    interval = services_alerts.escalation_interval()
    escalation_minutes = int(interval.total_seconds() // 60)
    tiers = _tiers(escalation_minutes)
    level = lead.escalation_level if lead else 0
    next_at = (
        next_escalation_at(
            incident.state,
            notified_at=lead.created_at,
            last_escalated_at=lead.last_escalated_at,
            interval=interval,
        )
        if lead
        else None
    )
    tier_index = escalation_tier(level + 1, len(tiers))
    segment = incident.segment
    refused = (
        ProviderAttempt.objects.filter(segment=segment, result="refused")
        .select_related("provider")
        .order_by("-started_at", "-id")[:20]
    )
    seen: dict[str, Refusal] = {}
    for attempt in refused:  # the latest refusal of each provider
        seen.setdefault(
            attempt.provider.provider_id,
            Refusal(
                attempt.provider.provider_id,
                attempt.refusal_category,
                attempt.error,
                attempt.started_at,
            ),
        )
    runs = Run.objects.filter(segment=segment)
    counts = runs.aggregate(
        total=Count("id"),
        unanswered=Count(
            "id", filter=Q(settlement__isnull=False) & ~Q(settlement__outcome=Outcome.COMPLETED)
        ),
    )
    return IncidentView(
        incident=incident,
        steps=list(incident.steps.select_related("notification").order_by("at", "id")),
        alerts=alerts,
        pages=pages,
        tiers=tiers,
        escalation_minutes=escalation_minutes,
        escalation_level=level,
        next_escalation_at=next_at,
        next_tier=tiers[tier_index] if tier_index is not None and next_at else None,
        refusals=sorted(seen.values(), key=lambda r: r.provider_id),
        runs=list(runs.order_by("-created_at")[:10]),
        run_count=counts["total"],
        unanswered_count=counts["unanswered"],
        needs_a_person=needs_a_person(incident.state),
    )
