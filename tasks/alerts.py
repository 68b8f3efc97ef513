"""Outbound alert delivery (R3.6, R8.2): the calls that reach people.

It decides nothing on its own: ``governance.services.alerts`` claims the
outbox row (written ``sending`` before the call), this module makes the call
and reads what came back by ``governance.rules.redelivery``, and the service
records it — retry with backoff when transient (408, 425, 429, 5xx, network),
disable the channel when
permanent (other 4xx, bad configuration — which includes a target the
outbound check refuses at send time: loopback, private, metadata addresses,
plain http in production; ``tasks.outbound``).

Channel kinds: generic webhook (JSON), Slack-compatible incoming webhook,
e-mail (Django's e-mail backend) and PagerDuty Events API v2, whose
``dedup_key`` is the incident's key (R8.2; an alert outside any incident:
its R3.6 dedupe key): trigger, acknowledge, resolve.
"""

from __future__ import annotations

import logging
import smtplib
from datetime import datetime
from typing import Any

import httpx
from celery import shared_task
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.mail import send_mail
from django.core.validators import validate_email
from django.urls import NoReverseMatch, reverse

from governance import time_source
from governance.models import AlertChannel, Notification, NotificationDelivery
from governance.rules.redelivery import (
    Verdict,
    attempt_verdict,
    smtp_recipients_verdict,
    smtp_reply_verdict,
)
from governance.rules.retry_after import parse_retry_after
from governance.services import alerts as services_alerts
from governance.services.alerts import DeliveryResult
from governance.services.secrets import named_secret
from tasks import outbound, work_metrics

log = logging.getLogger(__name__)

PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"
SOURCE = "agent-governance"
TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class BadConfig(Exception):
    """The channel's configuration cannot work: a permanent failure."""


# --------------------------------------------------------------------------- tasks


@shared_task(name="tasks.alerts.deliver_alert", ignore_result=True, acks_late=True)
def deliver_alert(delivery_id: int) -> str:
    return deliver(delivery_id)


@shared_task(name="tasks.alerts.deliver_due", ignore_result=True)
def deliver_due() -> int:
    """Beat: re-send due retries and rows whose publish was lost. A claim is a
    conditional update, so a duplicate send is harmless."""
    ids = services_alerts.due_deliveries(time_source.now())
    for delivery_id in ids:
        deliver_alert.delay(delivery_id)
    return len(ids)


@shared_task(name="tasks.alerts.escalate_alerts", ignore_result=True)
def escalate_alerts() -> int:
    """Beat: re-notify unacknowledged critical alerts to the next tier (R8.2)."""
    return len(services_alerts.escalate_due(time_source.now()))


def deliver_all_due(now: datetime | None = None) -> list[str]:
    """Deliver every due row in this process (the sweep without the broker)."""
    return [deliver(i) for i in services_alerts.due_deliveries(now or time_source.now())]


def deliver(delivery_id: int) -> str:
    """Claim, call, record. Returns the row's new state, or "skipped" when
    another worker holds it or it needs no call."""
    delivery = services_alerts.claim_delivery(delivery_id, time_source.now())
    if delivery is None:
        return "skipped"
    try:
        result = send(delivery)
    except Exception as exc:  # a bug here must not lose the alert: retry, and say why
        log.exception("alert delivery %s crashed", delivery_id)
        result = DeliveryResult(DeliveryResult.TRANSIENT, None, f"{type(exc).__name__}: {exc}")
    state = services_alerts.record_result(delivery, result, time_source.now())
    work_metrics.delivery("alert", delivery.channel.kind, state)
    return state


# --------------------------------------------------------------------------- messages


def _action(event: str) -> str:
    if event.startswith(services_alerts.ESCALATE):
        return services_alerts.TRIGGER
    return event


def dashboard_link(notification: Notification) -> str:
    """The incident's page when the alert belongs to one (R8.2), else the inbox."""
    base = settings.GOVERNANCE_DASHBOARD_URL.rstrip("/")
    if notification.incident_id is not None:
        try:
            return f"{base}{reverse('incident', args=[notification.incident_id])}"
        except NoReverseMatch:
            return f"{base}/incidents/{notification.incident_id}/"
    try:
        path = reverse("alerts")
    except NoReverseMatch:
        path = "/alerts/"
    return f"{base}{path}#alert-{notification.id}"


def dedup_key(notification: Notification) -> str:
    """What a pager groups by: the incident's key, so the freeze and the "no
    eligible provider" of one segment are one page (R8.2); the notification's
    own R3.6 key for an alert outside any incident."""
    return notification.incident.key if notification.incident_id else notification.dedupe_key


def headline(delivery: NotificationDelivery) -> str:
    n = delivery.notification
    severity = "CRITICAL" if n.severity == Notification.Severity.CRITICAL else "normal"
    event = delivery.event
    if event.startswith(services_alerts.ESCALATE):
        level = event.removeprefix(services_alerts.ESCALATE)
        return f"[{severity}] escalation {level}: still unacknowledged"
    if event == services_alerts.ACKNOWLEDGE:
        who = n.acked_by.get_username() if n.acked_by else "someone"
        at = f" at {n.acked_at:%Y-%m-%d %H:%M} UTC" if n.acked_at else ""
        return f"[acknowledged] by {who}{at}"
    if event == services_alerts.RESOLVE:
        at = f" at {n.resolved_at:%Y-%m-%d %H:%M} UTC" if n.resolved_at else ""
        if n.incident_id and n.incident.resolved_how:
            return f"[resolved] {n.incident.resolved_how} ({n.incident.resolved_by}){at}"
        return f"[resolved] a boundary closed the segment{at}"
    return f"[{severity}]"


def webhook_body(delivery: NotificationDelivery) -> dict[str, Any]:
    n = delivery.notification
    return {
        "dedupe_key": n.dedupe_key,
        "event": _action(delivery.event),
        "delivery_event": delivery.event,
        "severity": n.severity,
        "text": n.text,
        "headline": headline(delivery),
        "segment": n.segment.key if n.segment else None,
        "provider_ids": list(n.provider_ids),
        "notification_id": n.id,
        "escalation_level": n.escalation_level,
        "created_at": n.created_at.isoformat(),
        "acked_by": n.acked_by.get_username() if n.acked_by else None,
        "acked_at": n.acked_at.isoformat() if n.acked_at else None,
        "resolved_at": n.resolved_at.isoformat() if n.resolved_at else None,
        "url": dashboard_link(n),
        "incident": _incident_json(n),
    }


def _incident_json(n: Notification) -> dict[str, Any] | None:
    if n.incident_id is None:
        return None
    incident = n.incident
    return {
        "id": incident.id,
        "key": incident.key,
        "state": incident.state,
        "opened_at": incident.opened_at.isoformat(),
    }


def slack_body(delivery: NotificationDelivery) -> dict[str, Any]:
    n = delivery.notification
    return {"text": f"{headline(delivery)} {n.text}\n<{dashboard_link(n)}|Open the alert>"}


def pagerduty_body(delivery: NotificationDelivery, routing_key: str) -> dict[str, Any]:
    n = delivery.notification
    body: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": _action(delivery.event),
        "dedup_key": dedup_key(n),
    }
    if body["event_action"] == services_alerts.TRIGGER:
        body["payload"] = {
            "summary": n.text[:1024],
            "source": f"{SOURCE} segment {n.segment.key}" if n.segment else SOURCE,
            "severity": "critical" if n.severity == Notification.Severity.CRITICAL else "warning",
            "component": SOURCE,
            "custom_details": {
                "segment": n.segment.key if n.segment else None,
                "alert": n.dedupe_key,
                "provider_ids": list(n.provider_ids),
                "escalation_level": n.escalation_level,
            },
        }
        body["links"] = [{"href": dashboard_link(n), "text": "Open the alert"}]
    return body


# --------------------------------------------------------------------------- transports


def send(delivery: NotificationDelivery) -> DeliveryResult:
    channel = delivery.channel
    try:
        if channel.kind == AlertChannel.Kind.EMAIL:
            return _send_email(delivery)
        if channel.kind == AlertChannel.Kind.PAGERDUTY:
            env_name = channel.routing_key_env.strip()
            if not env_name:
                raise BadConfig("no routing key env var is configured")
            try:
                routing_key = named_secret(env_name, "routing_key_env")
            except ImproperlyConfigured as exc:  # not allowed, or unreadable: nothing is sent
                raise BadConfig(f"routing key: {exc}") from None
            if not routing_key:
                raise BadConfig(
                    f"env var {env_name} (or {env_name}_FILE, the routing key) is not set"
                )
            url = channel.target.strip() or PAGERDUTY_EVENTS_URL
            return _post(url, pagerduty_body(delivery, routing_key), delivery)
        if channel.kind == AlertChannel.Kind.SLACK:
            return _post(channel.target.strip(), slack_body(delivery), delivery)
        if channel.kind == AlertChannel.Kind.WEBHOOK:
            return _post(channel.target.strip(), webhook_body(delivery), delivery)
        raise BadConfig(f"unknown channel kind {channel.kind!r}")
    except BadConfig as exc:
        return DeliveryResult(DeliveryResult.PERMANENT, None, f"bad configuration: {exc}")


def classify_response(response: httpx.Response) -> DeliveryResult:
    code = response.status_code
    verdict = attempt_verdict(code)
    if verdict is Verdict.DELIVERED:
        return DeliveryResult(verdict, code)
    snippet = response.text[:300] if response.content else ""
    error = f"HTTP {code} {response.reason_phrase}: {snippet}".strip().rstrip(":")
    if verdict is Verdict.RETRY:
        wait = parse_retry_after(response.headers.get("Retry-After"), time_source.now())
        return DeliveryResult(verdict, code, error, wait)
    return DeliveryResult(verdict, code, error)


def _post(url: str, body: dict[str, Any], delivery: NotificationDelivery) -> DeliveryResult:
    if not url:
        raise BadConfig("no target URL is configured")
    if not url.startswith(("http://", "https://")):
        raise BadConfig(f"target {url!r} is not an http(s) URL")
    headers = {
        "User-Agent": f"{SOURCE}/alerts",
        # The receiver can drop a repeat (a worker that died after the call).
        "Idempotency-Key": f"{delivery.notification.dedupe_key}:{delivery.event}",
    }
    try:
        with httpx.Client(timeout=TIMEOUT, follow_redirects=False) as client:
            # Checked again now and pinned to the checked address (no DNS rebinding).
            response = outbound.request(client, "POST", url, json=body, headers=headers)
    except outbound.OutboundRefused as exc:
        raise BadConfig(f"target refused: {exc.reason}") from None
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise BadConfig(f"target {url!r}: {exc}") from None
    except httpx.TransportError as exc:
        return DeliveryResult(attempt_verdict(None), None, f"{type(exc).__name__}: {exc}")
    return classify_response(response)


def _send_email(delivery: NotificationDelivery) -> DeliveryResult:
    recipients = [a.strip() for a in delivery.channel.target.split(",") if a.strip()]
    if not recipients:
        raise BadConfig("no e-mail addresses are configured")
    for address in recipients:
        try:
            validate_email(address)
        except ValidationError:
            raise BadConfig(f"{address!r} is not an e-mail address") from None
    n = delivery.notification
    subject = f"{headline(delivery)} {n.text}"[:150].replace("\n", " ")
    body = f"{headline(delivery)}\n\n{n.text}\n\nDedupe key: {n.dedupe_key}\n{dashboard_link(n)}\n"
    try:
        send_mail(subject, body, None, recipients, fail_silently=False)
    except smtplib.SMTPRecipientsRefused as exc:
        kind = smtp_recipients_verdict(code for code, _message in exc.recipients.values())
        return DeliveryResult(kind, None, f"{type(exc).__name__}: {exc}")
    except smtplib.SMTPResponseException as exc:  # sender refused, auth failed, any reply
        kind = smtp_reply_verdict(exc.smtp_code)
        return DeliveryResult(
            kind, exc.smtp_code, f"{type(exc).__name__} {exc.smtp_code}: {exc.smtp_error!r}"
        )
    except (smtplib.SMTPException, OSError) as exc:  # no reply to read: as no HTTP answer
        return DeliveryResult(attempt_verdict(None), None, f"{type(exc).__name__}: {exc}")
    return DeliveryResult(DeliveryResult.DELIVERED, None)
