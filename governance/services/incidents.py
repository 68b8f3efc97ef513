"""Notifications and the incidents on-call works from (R3.6, R8.2).

Every transaction that creates a ``Notification`` or changes an ``Incident``
lives here (the outbox of what channels are told is ``services.alerts``):

- ``emit_notice``: R3.6's dedupe key is the notification's identity (the
  same key is never emitted twice); a segment's critical notifications join
  its open incident, or open one (``rules.incidents``).
- ``acknowledge_incident``: a named person, once, with an optional note; it
  acknowledges every notification of the incident (escalation stops, the
  channels that heard them hear the acknowledgement).
- ``resolve_incident`` by hand, and ``segment_trouble_cleared`` when a
  boundary closes the segment: the incident says which boundary and who.
"""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from governance.models import Incident, IncidentStep, Notification, Segment
from governance.rules.incidents import (
    IncidentState,
    groups_into_incident,
    incident_key,
    may_acknowledge,
    may_resolve,
)
from governance.rules.segments import boundary_words
from governance.services import alerts
from governance.services.audit import audit

SYSTEM = "system"


def _states(allowed) -> list[str]:
    return [state.value for state in IncidentState if allowed(state)]


def _step(incident: Incident, kind: str, at: datetime, actor: str, **extra) -> IncidentStep:
    return IncidentStep.objects.create(incident=incident, kind=kind, at=at, actor=actor, **extra)


def _open_incident(segment: Segment, at: datetime) -> tuple[Incident, bool]:
    """The segment's open incident, or a new one opened at ``at``. Returns
    (incident, opened). Two stages of one segment racing both end up in the
    one the ``one_open_incident`` constraint let through."""
    found = Incident.objects.filter(segment=segment, resolved_at__isnull=True).first()
    if found is not None:
        return found, False
    ordinal = Incident.objects.filter(segment=segment).count() + 1
    try:
        with transaction.atomic():
            return Incident.objects.create(
                key=incident_key(segment.key, ordinal), segment=segment, opened_at=at
            ), True
    except IntegrityError:
        return Incident.objects.get(segment=segment, resolved_at__isnull=True), False


def emit_notice(notice, segment: Segment | None) -> tuple[Notification, bool]:
    """R3.6: the same dedupe key is never emitted twice (a repeat is a no-op).
    A critical notice of a segment joins (or opens) its incident (R8.2)."""
    try:
        with transaction.atomic():
            incident, opened = None, False
            if segment is not None and groups_into_incident(notice.severity, segment.key):
                incident, opened = _open_incident(segment, notice.created_at)
            acked = incident is not None and incident.acked_at is not None
            notification = Notification.objects.create(
                dedupe_key=notice.dedupe_key,
                severity=notice.severity,
                text=notice.text,
                segment=segment,
                provider_ids=list(notice.provider_ids),
                reprobes=notice.reprobes,
                created_at=notice.created_at,
                incident=incident,
                leads_incident=opened,
                # Joining an incident a person already took: covered by that acknowledgement.
                acked_by_id=incident.acked_by_id if acked else None,
                acked_at=incident.acked_at if acked else None,
            )
            if incident is not None:
                kind = IncidentStep.Kind.TRIGGERED if opened else IncidentStep.Kind.JOINED
                _step(incident, kind, notice.created_at, SYSTEM, notification=notification)
            alerts.notification_created(notification)  # outbox rows (R8.2)
            return notification, True
    except IntegrityError:
        return Notification.objects.get(dedupe_key=notice.dedupe_key), False


def _acknowledge_one(notification_id: int, *, user, now: datetime) -> bool:
    """One notification, once (a claim by conditional update), with its audit
    entry; escalation stops and the channels that heard it are told."""
    changed = Notification.objects.filter(id=notification_id, acked_at__isnull=True).update(
        acked_by=user, acked_at=now
    )
    if changed:
        notification = Notification.objects.select_related("segment").get(id=notification_id)
        audit(
            actor=user.get_username(),
            action="alert.acknowledge",
            target_type="notification",
            target_id=str(notification.id),
            reason="",
            detail={"dedupe_key": notification.dedupe_key, "severity": notification.severity},
            now=now,
        )
        alerts.notification_acknowledged(notification, now)
    return bool(changed)


def acknowledge_incident(
    incident_id: int, *, user, now: datetime, note: str = ""
) -> tuple[Incident, bool]:
    """R8.2: a named person acknowledges the incident, once: every notification
    of it is acknowledged with it. Returns (incident, changed); a second
    acknowledgement (or one of a resolved incident) changes nothing and keeps
    the first person and time. Raises Incident.DoesNotExist."""
    with transaction.atomic():
        changed = Incident.objects.filter(
            id=incident_id, state__in=_states(may_acknowledge)
        ).update(state=IncidentState.ACKNOWLEDGED, acked_by=user, acked_at=now)
        incident = Incident.objects.select_related("acked_by", "segment").get(id=incident_id)
        if changed:
            _step(incident, IncidentStep.Kind.ACKNOWLEDGED, now, user.get_username(), note=note)
            audit(
                actor=user.get_username(),
                action="incident.acknowledge",
                target_type="incident",
                target_id=str(incident.id),
                reason=note,
                detail={"key": incident.key, "segment": incident.segment.key},
                now=now,
            )
            for notification_id in incident.notifications.filter(acked_at__isnull=True).values_list(
                "id", flat=True
            ):
                _acknowledge_one(notification_id, user=user, now=now)
    return incident, bool(changed)


def acknowledge_notification(
    notification_id: int, *, user, now: datetime
) -> tuple[Notification, bool]:
    """R8.2: a named person acknowledges an alert, once. An alert of an
    incident acknowledges the whole incident (its other alerts with it).

    Returns (notification, changed). A second acknowledgement changes nothing
    and keeps the first person and time ("another on-call got there first").
    Raises Notification.DoesNotExist.
    """
    incident_id = Notification.objects.values_list("incident_id", flat=True).get(id=notification_id)
    if incident_id is not None:
        _incident, changed = acknowledge_incident(incident_id, user=user, now=now)
    else:
        changed = _acknowledge_one(notification_id, user=user, now=now)
    notification = Notification.objects.select_related("acked_by", "segment").get(
        id=notification_id
    )
    return notification, changed


def _resolve(incident: Incident, *, by: str, how: str, note: str, now: datetime) -> bool:
    changed = Incident.objects.filter(id=incident.id, state__in=_states(may_resolve)).update(
        state=IncidentState.RESOLVED, resolved_at=now, resolved_by=by, resolved_how=how
    )
    if not changed:
        return False
    incident.state, incident.resolved_at = IncidentState.RESOLVED, now
    incident.resolved_by, incident.resolved_how = by, how
    _step(incident, IncidentStep.Kind.RESOLVED, now, by, note=note)
    for notification in incident.notifications.filter(resolved_at__isnull=True):
        alerts.notification_resolved(notification, now, f"resolved {how}")
    return True


def resolve_incident(
    incident_id: int, *, user, now: datetime, note: str = ""
) -> tuple[Incident, bool]:
    """R8.2: a person resolves the incident by hand (the trouble is over, or
    handled elsewhere); its notifications stop escalating and the channels
    that heard them are told. Returns (incident, changed); resolving a
    resolved incident changes nothing. Raises Incident.DoesNotExist."""
    with transaction.atomic():
        incident = Incident.objects.select_related("segment").get(id=incident_id)
        changed = _resolve(incident, by=user.get_username(), how="by hand", note=note, now=now)
        if changed:
            audit(
                actor=user.get_username(),
                action="incident.resolve",
                target_type="incident",
                target_id=str(incident.id),
                reason=note,
                detail={"key": incident.key, "segment": incident.segment.key},
                now=now,
            )
        incident = Incident.objects.select_related("acked_by", "segment").get(id=incident_id)
    return incident, changed


def segment_trouble_cleared(
    segment: Segment, *, kind: str, by: str, reason: str, now: datetime
) -> None:
    """Hook of ``services.apply_boundary``: the boundary clears the closed
    segment's trouble. Its incident is resolved, saying which boundary and by
    whom, and every alert of the segment is resolved with it."""
    how = f"by a {boundary_words(kind)}"
    for incident in Incident.objects.filter(segment=segment, resolved_at__isnull=True):
        _resolve(incident, by=by, how=how, note=reason, now=now)
    alerts.segment_closed(segment, now)
