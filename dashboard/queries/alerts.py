"""Reads for the alerts inbox (R8.2, R3.6). Read-only: acknowledging goes
through ``governance.services.acknowledge_notification``."""

from __future__ import annotations

from django.db.models import Case, IntegerField, QuerySet, Value, When

from governance.models import Notification

STATE_CHOICES = (
    ("all", "All"),
    ("unacknowledged", "Unacknowledged"),
    ("acknowledged", "Acknowledged"),
)
SEVERITY_CHOICES = (
    ("all", "All"),
    ("critical", "Critical (frozen)"),
    ("normal", "Normal (first refusal)"),
)


def _rows() -> QuerySet[Notification]:
    # The row shows the segment (open or closed, and what replaced it) and who acknowledged.
    return Notification.objects.select_related(
        "segment", "segment__next_segment", "acked_by", "incident"
    )


def inbox(state: str = "all", severity: str = "all") -> QuerySet[Notification]:
    """Critical freeze alerts first, unacknowledged on top, then newest first.

    Normal (first-refusal) notifications come below every critical one.
    """
    rows = _rows()
    if state == "unacknowledged":
        rows = rows.filter(acked_at__isnull=True)
    elif state == "acknowledged":
        rows = rows.filter(acked_at__isnull=False)
    if severity in (Notification.Severity.CRITICAL, Notification.Severity.NORMAL):
        rows = rows.filter(severity=severity)
    return rows.annotate(
        severity_rank=Case(
            When(severity=Notification.Severity.CRITICAL, then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        ),
        ack_rank=Case(
            When(acked_at__isnull=True, then=Value(0)),
            default=Value(1),
            output_field=IntegerField(),
        ),
    ).order_by("severity_rank", "ack_rank", "-created_at", "-id")


def alert(notification_id: int) -> Notification:
    """One alert with everything its row shows; raises Notification.DoesNotExist."""
    return _rows().get(pk=notification_id)


def critical_unacknowledged_count() -> int:
    """The live number the overview polls (R8.2)."""
    return Notification.objects.filter(
        severity=Notification.Severity.CRITICAL, acked_at__isnull=True
    ).count()
