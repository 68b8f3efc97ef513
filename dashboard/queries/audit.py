"""Read-only queries for the audit log (who, what, target, reason, when — R8.3)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from django.db.models import QuerySet
from django.urls import reverse

from governance.models import AuditEntry, Segment

# Action names as people say them; unknown actions are shown as stored.
ACTION_WORDS = {
    "boundary.compact": "Compact (boundary)",
    "boundary.fresh_start": "Fresh start (boundary)",
    "boundary.model_switch": "Switch model (boundary)",
    "boundary.mode_change": "Mode change (boundary)",
    "boundary.tool_surface_change": "Tool surface change (boundary)",
    "boundary.prompt_change": "Prompt change (boundary)",
    "alert.acknowledge": "Acknowledge alert",
    "run.cancel": "Cancel run",
}


def action_words(action: str) -> str:
    return ACTION_WORDS.get(action, action)


def audit_entries(
    *,
    actor: str = "",
    action: str = "",
    target_type: str = "",
    date_from: date | None = None,
    date_to: date | None = None,
    tz=None,
) -> QuerySet[AuditEntry]:
    """Newest first; the date range is inclusive and read in ``tz`` (UTC by default)."""
    qs = AuditEntry.objects.all()
    if actor:
        qs = qs.filter(actor=actor)
    if action:
        qs = qs.filter(action=action)
    if target_type:
        qs = qs.filter(target_type=target_type)
    if date_from:
        qs = qs.filter(at__gte=datetime.combine(date_from, time.min, tzinfo=tz))
    if date_to:
        qs = qs.filter(at__lt=datetime.combine(date_to + timedelta(days=1), time.min, tzinfo=tz))
    return qs.order_by("-at", "-id")


def filter_choices() -> dict[str, list[str]]:
    """Distinct actors, actions and target types for the filter selects."""
    return {
        "actors": list(
            AuditEntry.objects.order_by("actor").values_list("actor", flat=True).distinct()
        ),
        "actions": list(
            AuditEntry.objects.order_by("action").values_list("action", flat=True).distinct()
        ),
        "target_types": list(
            AuditEntry.objects.order_by("target_type")
            .values_list("target_type", flat=True)
            .distinct()
        ),
    }


@dataclass(frozen=True)
class AuditRow:
    entry: AuditEntry
    action_words: str
    target_url: str | None
    opened_key: str | None
    opened_url: str | None


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        return False
    return True


def audit_rows(entries: Iterable[AuditEntry]) -> list[AuditRow]:
    """Entries with links to their targets: segments resolved by key in one query."""
    entries = list(entries)
    keys = set()
    for entry in entries:
        if entry.target_type == "segment":
            keys.add(entry.target_id)
        opened = (entry.detail or {}).get("opened") if isinstance(entry.detail, dict) else None
        if isinstance(opened, str):
            keys.add(opened)
    ids = dict(Segment.objects.filter(key__in=keys).values_list("key", "id")) if keys else {}

    def segment_url(key: str | None) -> str | None:
        return reverse("segment", args=[ids[key]]) if key in ids else None

    rows = []
    for entry in entries:
        target_url = None
        if entry.target_type == "segment":
            target_url = segment_url(entry.target_id)
        elif entry.target_type == "run" and _is_uuid(entry.target_id):
            target_url = reverse("run", args=[entry.target_id])
        elif entry.target_type == "notification":
            target_url = reverse("alerts")
        opened = entry.detail.get("opened") if isinstance(entry.detail, dict) else None
        opened = opened if isinstance(opened, str) else None
        rows.append(
            AuditRow(
                entry=entry,
                action_words=action_words(entry.action),
                target_url=target_url,
                opened_key=opened,
                opened_url=segment_url(opened),
            )
        )
    return rows
