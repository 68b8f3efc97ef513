"""Alert channels that reach people (R3.6, R8.2): the outbox of notification deliveries.

Every transaction that changes an ``AlertChannel`` or a ``NotificationDelivery``
lives here; ``governance.services`` calls the three hooks below from inside
its own transactions, and ``tasks.alerts`` claims rows, makes the call and
records the result through this module.

- One row per (notification, channel, event): the unique constraint makes a
  hook that runs twice a no-op.
- A row is claimed with a conditional update and only the worker whose update
  changed exactly one row calls out ("another worker got there first"), so
  each channel gets each event once, whatever the number of workers or
  broker redeliveries. The attempt is written (``sending``) before the call.
- Transient failures (429, 5xx, network) retry with capped backoff; permanent
  ones (other 4xx, bad configuration) disable the channel, with the reason.
- Normal notifications count against the channel's daily budget (their
  trigger; the acknowledge/resolve follow-ups of an alert the channel did
  receive are not new pushes); critical ones bypass it (R3.6).
- Escalation tiers are the distinct ``escalation_order`` values, lowest first:
  a notification triggers the first tier; each escalation of an unacknowledged
  critical notification goes to the next tier (the last tier keeps being
  re-notified). Acknowledgement stops it at once.

The broker is reached by task *name* (``send_task``), so governance never
imports the execution layer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from governance.models import (
    AlertChannel,
    IncidentStep,
    Notification,
    NotificationDelivery,
    Segment,
)
from governance.rules.incidents import escalation_tier
from governance.rules.redelivery import RetryPolicy, Verdict, after_attempt, may_attempt
from governance.rules.refusal import counts_against_daily_budget, within_daily_budget
from governance.services.audit import audit
from governance.services.broker import send_by_name
from governance.services.outbound import Resolver, check_outbound_url

log = logging.getLogger(__name__)

TRIGGER = "trigger"
ACKNOWLEDGE = "acknowledge"
RESOLVE = "resolve"
ESCALATE = "escalate-"  # escalate-1, escalate-2, …
DELIVER_TASK = "tasks.alerts.deliver_alert"

State = NotificationDelivery.State
# Rows that told the channel about the alert (so it also hears acknowledge/resolve).
HEARD = (State.PENDING, State.SENDING, State.RETRY, State.DELIVERED)


@dataclass(frozen=True)
class DeliveryResult:
    """What one call out said, as ``rules.redelivery`` reads it: delivered, retry
    (transient) or failed (permanent)."""

    kind: Verdict
    status_code: int | None = None
    error: str = ""
    retry_after_s: float | None = None

    DELIVERED = Verdict.DELIVERED
    TRANSIENT = Verdict.RETRY
    PERMANENT = Verdict.FAILED


# --------------------------------------------------------------------------- settings


def escalation_interval() -> timedelta:
    return timedelta(minutes=settings.GOVERNANCE_ESCALATION_MINUTES)


def _claim_lease() -> timedelta:
    # A row left in "sending" longer than this belongs to a worker that died.
    return timedelta(seconds=settings.GOVERNANCE_ALERT_CLAIM_LEASE_SECONDS)


def retry_policy() -> RetryPolicy:
    """R8.2's sender: the settings' backoff and attempts; a Retry-After is honoured
    only up to the backoff's own cap (a page must not wait a receiver's day)."""
    cap = settings.GOVERNANCE_ALERT_RETRY_MAX_SECONDS
    return RetryPolicy(
        base_s=settings.GOVERNANCE_ALERT_RETRY_BASE_SECONDS,
        cap_s=cap,
        max_attempts=settings.GOVERNANCE_ALERT_MAX_ATTEMPTS,
        retry_after_cap_s=cap,
    )


def channel_target_problem(
    kind: str, target: str, *, resolver: Resolver | None = None
) -> str | None:
    """Input time: why this channel's target URL would be refused
    when sending (which disables the channel), or None. E-mail targets are not
    URLs; an empty PagerDuty target means PagerDuty's public Events API."""
    url = (target or "").strip()
    if kind == AlertChannel.Kind.EMAIL or not url:
        return None
    return check_outbound_url(url, resolver=resolver)


# --------------------------------------------------------------------------- routing


def tiers() -> list[list[AlertChannel]]:
    """Enabled channels grouped by escalation order, lowest first."""
    grouped: dict[int, list[AlertChannel]] = {}
    for channel in AlertChannel.objects.filter(enabled=True).order_by("escalation_order", "name"):
        grouped.setdefault(channel.escalation_order, []).append(channel)
    return [grouped[order] for order in sorted(grouped)]


def wants(channel: AlertChannel, notification: Notification) -> bool:
    """PagerDuty pages people: only critical notifications go there."""
    return (
        channel.kind != AlertChannel.Kind.PAGERDUTY
        or notification.severity == Notification.Severity.CRITICAL
    )


def _publish(delivery_ids: list[int]) -> None:
    """Send the new rows to the broker once the transaction commits. If the
    broker is down the beat sweep (``due_deliveries``) still finds them."""
    if not delivery_ids:
        return

    def send() -> None:
        for delivery_id in delivery_ids:
            send_by_name(DELIVER_TASK, [delivery_id])

    transaction.on_commit(send, robust=True)


def _create(
    notification: Notification, channels: list[AlertChannel], event: str, now: datetime
) -> list[int]:
    created_ids = []
    for channel in channels:
        if not channel.enabled or not wants(channel, notification):
            continue
        row, created = NotificationDelivery.objects.get_or_create(
            notification=notification,
            channel=channel,
            event=event,
            defaults={"next_attempt_at": now, "created_at": now},
        )
        if created:
            created_ids.append(row.id)
    _publish(created_ids)
    return created_ids


def _heard(notification: Notification) -> list[AlertChannel]:
    """Enabled channels that were told about this notification."""
    channel_ids = (
        NotificationDelivery.objects.filter(notification=notification, state__in=HEARD)
        .filter(Q(event=TRIGGER) | Q(event__startswith=ESCALATE))
        .values_list("channel_id", flat=True)
    )
    return list(AlertChannel.objects.filter(id__in=set(channel_ids), enabled=True))


def _stop_escalations(notification: Notification, why: str, now: datetime) -> None:
    NotificationDelivery.objects.filter(
        notification=notification,
        event__startswith=ESCALATE,
        state__in=(State.PENDING, State.RETRY),
    ).update(state=State.DROPPED, last_error=why, claimed_at=None)


# --------------------------------------------------------------------------- hooks


def notification_created(notification: Notification) -> list[int]:
    """Hook of ``services.incidents.emit_notice``: trigger the first tier."""
    all_tiers = tiers()
    tier = escalation_tier(0, len(all_tiers))
    if tier is None:
        return []
    return _create(notification, all_tiers[tier], TRIGGER, notification.created_at)


def notification_acknowledged(notification: Notification, now: datetime) -> list[int]:
    """Hook of ``services.incidents``' acknowledgement: escalation stops at once,
    and every channel that heard the alert hears the acknowledgement."""
    _stop_escalations(notification, "acknowledged before this escalation was sent", now)
    return _create(notification, _heard(notification), ACKNOWLEDGE, now)


def notification_resolved(notification: Notification, now: datetime, why: str) -> list[int]:
    """The notification's trouble is over: escalation stops and every channel
    that heard it hears the resolution (once: a claim by conditional update)."""
    changed = Notification.objects.filter(id=notification.id, resolved_at__isnull=True).update(
        resolved_at=now
    )
    if not changed:
        return []
    notification.resolved_at = now
    _stop_escalations(notification, f"{why} before this escalation was sent", now)
    return _create(notification, _heard(notification), RESOLVE, now)


def segment_closed(segment: Segment, now: datetime) -> list[int]:
    """Hook of ``services.incidents.segment_trouble_cleared``: the boundary
    clears the closed segment's alerts (R8.2)."""
    created = []
    for notification in Notification.objects.filter(segment=segment, resolved_at__isnull=True):
        created += notification_resolved(notification, now, "resolved by a boundary")
    return created


# --------------------------------------------------------------------------- claim and record


def _day_start(now: datetime) -> datetime:
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


def non_critical_used_today(channel: AlertChannel, now: datetime, *, exclude: int | None = None):
    """Non-critical pushes delivered or in flight on this channel today (UTC)."""
    day = _day_start(now)
    rows = NotificationDelivery.objects.filter(
        channel=channel, event=TRIGGER, notification__severity=Notification.Severity.NORMAL
    ).filter(
        Q(state=State.DELIVERED, delivered_at__gte=day)
        | Q(state=State.SENDING, claimed_at__gte=day)
    )
    if exclude is not None:
        rows = rows.exclude(id=exclude)
    return rows.count()


def _settle(delivery: NotificationDelivery, state: str, why: str, now: datetime) -> None:
    NotificationDelivery.objects.filter(id=delivery.id, attempts=delivery.attempts).update(
        state=state, last_error=why, claimed_at=None
    )
    delivery.state, delivery.last_error, delivery.claimed_at = state, why, None


def _was_told(delivery: NotificationDelivery) -> bool:
    """A follow-up (acknowledge, resolve) only makes sense where the alert arrived."""
    return (
        NotificationDelivery.objects.filter(
            notification_id=delivery.notification_id,
            channel_id=delivery.channel_id,
            state__in=(State.DELIVERED, State.SENDING, State.RETRY, State.PENDING),
        )
        .filter(Q(event=TRIGGER) | Q(event__startswith=ESCALATE))
        .exists()
    )


def claim_delivery(delivery_id: int, now: datetime) -> NotificationDelivery | None:
    """Claim one due row for sending, or None (not due, gone, claimed by
    another worker, dropped over budget, escalation acknowledged meanwhile,
    channel disabled). The returned row is already ``sending``: the attempt
    is written before the effect."""
    with transaction.atomic():
        found = (
            NotificationDelivery.objects.filter(id=delivery_id)
            .values_list("channel_id", "attempts")
            .first()
        )
        if found is None:
            return None
        channel_id, attempts = found
        if not may_attempt(attempts, retry_policy()):
            # The last attempt's worker died before it recorded an answer.
            NotificationDelivery.objects.filter(
                id=delivery_id, state=State.SENDING, claimed_at__lt=now - _claim_lease()
            ).update(
                state=State.FAILED,
                claimed_at=None,
                last_error=f"gave up after {attempts} attempts (the last one never answered)",
            )
            return None
        # One claim per channel at a time, so the budget count cannot be
        # passed by two workers at once. NO KEY UPDATE: inserting new rows
        # that reference the channel (hooks) does not wait for it.
        channel = AlertChannel.objects.select_for_update(no_key=True).get(pk=channel_id)
        changed = (
            NotificationDelivery.objects.filter(id=delivery_id, next_attempt_at__lte=now)
            .filter(
                Q(state__in=(State.PENDING, State.RETRY))
                | Q(state=State.SENDING, claimed_at__lt=now - _claim_lease())
            )
            .update(state=State.SENDING, claimed_at=now, attempts=F("attempts") + 1)
        )
        if changed != 1:
            return None  # another worker got there first, or it is not due
        delivery = NotificationDelivery.objects.select_related(
            "notification",
            "notification__segment",
            "notification__acked_by",
            "notification__incident",
        ).get(id=delivery_id)
        delivery.channel = channel
        notification = delivery.notification
        if not channel.enabled:
            _settle(delivery, State.FAILED, f"channel disabled: {channel.disabled_reason}", now)
            return None
        stopped = notification.acked_at or notification.resolved_at
        if delivery.event.startswith(ESCALATE) and stopped:
            # Acknowledgement stops escalation at once, even one already queued.
            _settle(delivery, State.DROPPED, "acknowledged or resolved before it was sent", now)
            return None
        if delivery.event in (ACKNOWLEDGE, RESOLVE) and not _was_told(delivery):
            _settle(delivery, State.DROPPED, "the channel never received this alert", now)
            return None
        if delivery.event == TRIGGER and counts_against_daily_budget(notification.severity):
            used = non_critical_used_today(channel, now, exclude=delivery.id)
            if not within_daily_budget(used, channel.daily_budget):
                _settle(
                    delivery,
                    State.DROPPED,
                    f"over the daily budget: {used} of {channel.daily_budget} non-critical "
                    "pushes already sent today (critical ones bypass it, R3.6)",
                    now,
                )
                return None
        return delivery


def record_result(delivery: NotificationDelivery, result: DeliveryResult, now: datetime) -> str:
    """Record the call's result on the row claimed by ``claim_delivery``; a
    permanent failure disables the channel. Returns the row's new state."""
    mine = NotificationDelivery.objects.filter(
        id=delivery.id, state=State.SENDING, attempts=delivery.attempts
    )
    step = after_attempt(result.kind, delivery.attempts, result.retry_after_s, retry_policy())
    if step.state is Verdict.DELIVERED:
        mine.update(
            state=State.DELIVERED,
            delivered_at=now,
            status_code=result.status_code,
            last_error="",
            claimed_at=None,
        )
        return State.DELIVERED
    if step.gave_up:
        mine.update(
            state=State.FAILED,
            status_code=result.status_code,
            last_error=f"gave up after {delivery.attempts} attempts: {result.error}"[:2000],
            claimed_at=None,
        )
        return State.FAILED
    if step.state is Verdict.RETRY:
        mine.update(
            state=State.RETRY,
            status_code=result.status_code,
            last_error=result.error[:2000],
            next_attempt_at=now + timedelta(seconds=step.retry_in_s or 0.0),
            claimed_at=None,
        )
        return State.RETRY
    reason = (
        f"{delivery.event} of notification {delivery.notification_id} failed permanently"
        f"{f' (HTTP {result.status_code})' if result.status_code else ''}: {result.error}"
    )[:2000]
    with transaction.atomic():
        mine.update(
            state=State.FAILED,
            status_code=result.status_code,
            last_error=result.error[:2000],
            claimed_at=None,
        )
        disabled = AlertChannel.objects.filter(id=delivery.channel_id, enabled=True).update(
            enabled=False, disabled_reason=reason, disabled_at=now
        )
        if disabled:
            audit(
                actor="system",
                action="alert_channel.disable",
                target_type="alert_channel",
                target_id=str(delivery.channel_id),
                reason=reason,
                detail={"delivery": delivery.id, "status_code": result.status_code},
                now=now,
            )
    return State.FAILED


def due_deliveries(now: datetime, limit: int = 500) -> list[int]:
    """Rows the sweep should try: due pending/retry rows and stale claims."""
    return list(
        NotificationDelivery.objects.filter(next_attempt_at__lte=now)
        .filter(
            Q(state__in=(State.PENDING, State.RETRY))
            | Q(state=State.SENDING, claimed_at__lt=now - _claim_lease())
        )
        .order_by("next_attempt_at", "id")
        .values_list("id", flat=True)[:limit]
    )


# --------------------------------------------------------------------------- escalation


def escalate_due(now: datetime) -> list[int]:
    """R8.2: re-notify each unacknowledged critical notification whose last
    notice is at least one interval old, to the next tier. Returns the ids
    of the escalated notifications."""
    interval = escalation_interval()
    cutoff = now - interval
    quiet_long_enough = Q(last_escalated_at__lte=cutoff) | Q(
        last_escalated_at__isnull=True, created_at__lte=cutoff
    )
    # An incident escalates through its lead notification only: one page per
    # escalation, however many alerts joined it.
    open_critical = Notification.objects.filter(
        severity=Notification.Severity.CRITICAL, acked_at__isnull=True, resolved_at__isnull=True
    ).filter(Q(incident__isnull=True) | Q(leads_incident=True))
    candidates = list(
        open_critical.filter(quiet_long_enough).values_list("id", "escalation_level")[:500]
    )
    escalated = []
    for notification_id, level in candidates:
        with transaction.atomic():
            # The claim re-checks acked_at: an acknowledgement committed since
            # the read above stops this escalation.
            changed = (
                open_critical.filter(id=notification_id, escalation_level=level)
                .filter(quiet_long_enough)
                .update(escalation_level=F("escalation_level") + 1, last_escalated_at=now)
            )
            if changed != 1:
                continue  # acknowledged meanwhile, or another beat got there first
            escalated.append(notification_id)
            notification = Notification.objects.select_related("segment").get(id=notification_id)
            if notification.incident_id is not None:
                IncidentStep.objects.create(
                    incident_id=notification.incident_id,
                    kind=IncidentStep.Kind.ESCALATED,
                    at=now,
                    actor="system",
                    notification=notification,
                    escalation_level=level + 1,
                )
            all_tiers = tiers()
            tier = escalation_tier(level + 1, len(all_tiers))
            if tier is None:
                continue
            _create(notification, all_tiers[tier], f"{ESCALATE}{level + 1}", now)
    return escalated
