"""The notifications inbox over the API and its acknowledgement (R8.2), paged newest first."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import HttpRequest, JsonResponse

from dashboard.api.base import ApiError, api_view, iso, page, parse_query
from dashboard.api.schemas import NotificationQuery
from dashboard.site import permissions
from governance import services, time_source
from governance.models import Notification


def _notification_pk(value: str) -> int:
    """A notification id as the database can hold it; ValueError otherwise."""
    if not (isinstance(value, str) and value.isascii() and value.isdigit()):
        raise ValueError(value)
    number = int(value)
    field = Notification._meta.pk
    _low, high = connection.ops.integer_field_range(field.get_internal_type())
    if high is not None and number > high:
        raise ValueError(value)
    return number


def notification_json(notification: Notification) -> dict[str, Any]:
    acked_by = notification.acked_by
    return {
        "id": notification.id,
        "dedupe_key": notification.dedupe_key,
        "severity": notification.severity,
        "text": notification.text,
        "segment": notification.segment.key if notification.segment_id else None,
        "provider_ids": list(notification.provider_ids or []),
        "reprobes": notification.reprobes,
        "escalation_level": notification.escalation_level,
        "created_at": notification.created_at.isoformat(),
        "acknowledged_by": acked_by.get_username() if acked_by else None,
        "acknowledged_at": iso(notification.acked_at),
        "resolved_at": iso(notification.resolved_at),
    }


@api_view(("GET",))
def notifications(request: HttpRequest) -> JsonResponse:
    query = parse_query(request, NotificationQuery)
    # A service account reads the alerts of its own threads' segments.
    rows = permissions.visible(
        Notification.objects.select_related("segment", "acked_by"),
        request.api_user, request.api_scopes, owner="segment__thread__created_by",
    )  # fmt: skip
    if query.state == "unacknowledged":
        rows = rows.filter(acked_at__isnull=True)
    elif query.state == "acknowledged":
        rows = rows.filter(acked_at__isnull=False)
    if query.severity != "all":
        rows = rows.filter(severity=query.severity)
    if query.segment is not None:
        rows = rows.filter(segment__key=query.segment)
    if query.since is not None:
        rows = rows.filter(created_at__gte=query.since)
    items, next_cursor = page(rows, query, _notification_pk)
    return JsonResponse(
        {"items": [notification_json(n) for n in items], "next_cursor": next_cursor}
    )


@api_view(("POST",), permission=permissions.ACKNOWLEDGE, atomic=True)
def acknowledge_notification(request: HttpRequest, notification_id: str) -> JsonResponse:
    """R8.2 over the API, as the inbox's button: once; a second answers who was first."""
    try:
        notification, changed = services.acknowledge_notification(
            _notification_pk(notification_id), user=request.api_user, now=time_source.now()
        )
    except (ValueError, Notification.DoesNotExist):
        raise ApiError(404, None, "no such notification") from None
    return JsonResponse({**notification_json(notification), "acknowledged_now": changed})
