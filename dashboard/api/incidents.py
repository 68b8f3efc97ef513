"""Incidents over the API (R8.2): the list on-call works from, one incident
with its steps and pages, acknowledge and resolve with a note."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import reverse

from dashboard.api.base import ApiError, api_view, iso, page, parse_body, parse_query
from dashboard.api.schemas import IncidentAction, IncidentQuery
from dashboard.queries import incidents as queries
from dashboard.site import permissions
from governance import services, time_source
from governance.models import Incident
from governance.rules.incidents import needs_a_person


def _incident_pk(value: str) -> int:
    """An incident id as the database can hold it; ValueError otherwise."""
    if not (isinstance(value, str) and value.isascii() and value.isdigit()):
        raise ValueError(value)
    number = int(value)
    _low, high = connection.ops.integer_field_range(Incident._meta.pk.get_internal_type())
    if high is not None and number > high:
        raise ValueError(value)
    return number


def incident_json(request: HttpRequest, incident: Incident) -> dict[str, Any]:
    segment = incident.segment
    return {
        "id": incident.id,
        "key": incident.key,
        "state": incident.state,
        "needs_a_person": needs_a_person(incident.state),
        "segment": segment.key,
        "thread_id": str(segment.thread_id),
        "thread_title": segment.thread.title,
        "opened_at": incident.opened_at.isoformat(),
        "acknowledged_by": incident.acked_by.get_username() if incident.acked_by else None,
        "acknowledged_at": iso(incident.acked_at),
        "resolved_at": iso(incident.resolved_at),
        "resolved_by": incident.resolved_by or None,
        "resolved_how": incident.resolved_how or None,
        "notification_ids": sorted(n.id for n in incident.notifications.all()),
        "url": request.build_absolute_uri(reverse("incident", args=[incident.id])),
    }


def detail_json(request: HttpRequest, incident_id: int) -> dict[str, Any]:
    view = queries.detail(incident_id)
    return {
        **incident_json(request, view.incident),
        "steps": [
            {
                "kind": step.kind,
                "at": step.at.isoformat(),
                "actor": step.actor,
                "note": step.note,
                "notification_id": step.notification_id,
                "escalation_level": step.escalation_level,
            }
            for step in view.steps
        ],
        "pages": [
            {
                "channel": row.channel.name,
                "channel_kind": row.channel.kind,
                "event": row.event,
                "state": row.state,
                "attempts": row.attempts,
                "status_code": row.status_code,
                "delivered_at": iso(row.delivered_at),
                "last_error": row.last_error,
            }
            for row in view.pages
        ],
        "escalation_level": view.escalation_level,
        "next_escalation_at": iso(view.next_escalation_at),
    }


def _visible(request: HttpRequest):
    # A service account sees the incidents of its own threads' segments.
    return permissions.visible(
        Incident.objects.select_related("segment", "segment__thread", "acked_by"),
        request.api_user, request.api_scopes, owner="segment__thread__created_by",
    )  # fmt: skip


def _found(request: HttpRequest, incident_id: str) -> int:
    try:
        pk = _incident_pk(incident_id)
    except ValueError:
        raise ApiError(404, None, "no such incident") from None
    if not _visible(request).filter(pk=pk).exists():
        raise ApiError(404, None, "no such incident")
    return pk


@api_view(("GET",))
def incidents(request: HttpRequest) -> JsonResponse:
    query = parse_query(request, IncidentQuery)
    rows = _visible(request).prefetch_related("notifications")
    if query.state == "open":
        rows = rows.exclude(state=Incident.State.RESOLVED)
    elif query.state != "all":
        rows = rows.filter(state=query.state)
    items, next_cursor = page(rows, query, _incident_pk, at="opened_at")
    return JsonResponse(
        {"items": [incident_json(request, i) for i in items], "next_cursor": next_cursor}
    )


@api_view(("GET",))
def incident(request: HttpRequest, incident_id: str) -> JsonResponse:
    return JsonResponse(detail_json(request, _found(request, incident_id)))


@api_view(("POST",), permission=permissions.ACKNOWLEDGE, atomic=True)
def acknowledge(request: HttpRequest, incident_id: str) -> JsonResponse:
    """Once, with an optional note; again answers who was first (``changed``: false)."""
    body = parse_body(request, IncidentAction)
    pk = _found(request, incident_id)
    _incident, changed = services.acknowledge_incident(
        pk, user=request.api_user, now=time_source.now(), note=body.note
    )
    return JsonResponse({**detail_json(request, pk), "changed": changed})


@api_view(("POST",), permission=permissions.ACKNOWLEDGE, atomic=True)
def resolve(request: HttpRequest, incident_id: str) -> JsonResponse:
    """By hand, with an optional note; a resolved incident answers ``changed``: false."""
    body = parse_body(request, IncidentAction)
    pk = _found(request, incident_id)
    _incident, changed = services.resolve_incident(
        pk, user=request.api_user, now=time_source.now(), note=body.note
    )
    return JsonResponse({**detail_json(request, pk), "changed": changed})
