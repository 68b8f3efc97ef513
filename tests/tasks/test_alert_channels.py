"""Alert channels that reach people (R3.6, R8.2), against real loopback HTTP servers.

Each channel gets each event exactly once (the outbox row is claimed with a
conditional update), transient failures retry, permanent ones disable the
channel, normal pushes respect the daily budget and critical ones bypass it,
unacknowledged critical alerts escalate tier by tier until acknowledged, and
PagerDuty hears trigger → acknowledge → resolve under one dedup_key.
"""

from __future__ import annotations

import socketserver
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core import mail
from django.template.loader import render_to_string

from dashboard.queries.providers import alert_channel_rows
from governance import services, time_source
from governance.models import (
    AlertChannel,
    AuditEntry,
    Notification,
    NotificationDelivery,
    Provider,
)
from governance.rules.refusal import ProviderRefusal, refusal_notice
from governance.services import alerts as services_alerts
from tasks import alerts
from tests.receivers import Receiver

State = NotificationDelivery.State
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


# --------------------------------------------------------------------------- loopback server


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def clock_at_start():
    the_clock = time_source.ManualClock(START)
    time_source.install(the_clock)
    yield the_clock
    time_source.install(None)


# --------------------------------------------------------------------------- helpers


def make_thread(now: datetime, title: str = "Refunds"):
    for provider_id in ("alpha", "beta"):
        Provider.objects.get_or_create(
            provider_id=provider_id, defaults={"kind": "scripted", "model": f"{provider_id}-1"}
        )
    return services.create_thread(provider_chain=["alpha", "beta"], now=now, title=title)


def emit(segment, severity: str, now: datetime, provider: str = "alpha") -> Notification:
    """Emit a real R3.6 notice through the service (as the runner does)."""
    refusals = 4 if severity == "critical" else 1
    state = ProviderRefusal(provider, f"{provider}-1", "policy", refusals, now)
    notice = refusal_notice(segment.key, [state], now)
    assert notice is not None and notice.severity == severity
    notification, created = services.emit_notice(notice, segment)
    assert created
    return notification


def channel(name: str, kind: str, target: str, **extra) -> AlertChannel:
    return AlertChannel.objects.create(name=name, kind=kind, target=target, **extra)


def deliveries(**filters) -> list[NotificationDelivery]:
    return list(NotificationDelivery.objects.filter(**filters).order_by("id"))


# --------------------------------------------------------------------------- exactly once


@pytest.mark.django_db(transaction=True)
def test_r8_2_two_concurrent_workers_deliver_each_event_exactly_once(receiver):
    """R8.2: two threads run the delivery function on the same rows at the same
    moment, twice over (a redelivery); the server receives each event once."""
    hook = channel("ops-hook", "webhook", receiver.url("/hook"))
    slack = channel("ops-slack", "slack", receiver.url("/slack"))
    thread = make_thread(START)
    now = datetime.now(UTC)
    emitted = []
    for index in range(4):
        seg = thread.segments.get(closed_at__isnull=True)
        emitted.append(emit(seg, "critical", now, provider="alpha"))
        services.apply_boundary(thread, "fresh_start", by="t", reason=f"round {index}", now=now)
    # 4 triggers + 4 resolves per channel; the broker may also be delivering
    # them (on-commit publish) — the claim keeps it at once each.
    ids = [d.id for d in deliveries()]
    assert len(ids) == 16
    receiver.delay = 0.05
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker():
        from django.db import connection

        try:
            barrier.wait()
            for _ in range(2):  # a redelivery of every message
                for delivery_id in ids:
                    alerts.deliver(delivery_id)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(receiver.at("/hook")) == 8
    assert len(receiver.at("/slack")) == 8
    seen = {(r["body"]["dedupe_key"], r["body"]["event"]) for r in receiver.at("/hook")}
    assert len(seen) == 8  # no event twice
    assert {n.dedupe_key for n in emitted} == {key for key, _ in seen}
    rows = deliveries()
    assert {d.state for d in rows} == {State.DELIVERED}
    assert all(d.attempts == 1 for d in rows)
    assert {d.channel_id for d in rows} == {hook.id, slack.id}


@pytest.mark.django_db(transaction=True)
def test_r8_2_celery_worker_concurrency_2_sends_each_event_once(receiver, worker):
    """R8.2: a real Celery worker (concurrency 2) gets every delivery message
    twice back to back, so both worker threads hold the same row at once; the
    server counts one request per row."""
    thread = make_thread(START)
    now = datetime.now(UTC)
    seg = thread.segments.get()
    first = emit(seg, "critical", now, provider="alpha")
    second = emit(seg, "critical", now, provider="beta")
    # The outbox rows as the hook writes them, but not yet published.
    hook = channel("ops-hook", "webhook", receiver.url("/hook"))
    rows = [
        NotificationDelivery.objects.create(
            notification=n, channel=hook, event="trigger", next_attempt_at=now, created_at=now
        )
        for n in (first, second)
    ]
    receiver.delay = 0.3
    for row in rows:
        alerts.deliver_alert.delay(row.id)
        alerts.deliver_alert.delay(row.id)  # a redelivery, next in the queue
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if NotificationDelivery.objects.filter(state=State.DELIVERED).count() == 2:
            break
        time.sleep(0.05)
    time.sleep(0.8)  # let any duplicate finish: it must not reach the server
    keys = sorted(r["body"]["dedupe_key"] for r in receiver.at("/hook"))
    assert keys == sorted([first.dedupe_key, second.dedupe_key])
    assert all(d.attempts == 1 and d.state == State.DELIVERED for d in deliveries())


# --------------------------------------------------------------------------- retry / permanent


@pytest.mark.django_db
def test_r8_2_retry_on_503_then_success_with_backoff(receiver, clock_at_start):
    """R8.2: a 503 is transient — the row waits out its backoff, then succeeds."""
    from tasks.work_metrics import DELIVERIES

    def counted(state: str) -> float:
        return DELIVERIES.labels("alert", "webhook", state)._value.get()

    before = {state: counted(state) for state in (State.RETRY, State.DELIVERED)}
    receiver.script["/hook"] = [503, 503]
    hook = channel("ops-hook", "webhook", receiver.url("/hook"))
    seg = make_thread(START).segments.get()
    emit(seg, "critical", START)
    (row,) = deliveries()
    assert alerts.deliver(row.id) == State.RETRY
    row.refresh_from_db()
    assert row.attempts == 1 and row.status_code == 503 and "503" in row.last_error
    assert row.next_attempt_at == START + timedelta(seconds=30)
    # Not due yet: the sweep leaves it alone and nothing is sent.
    assert alerts.deliver_all_due() == []
    assert alerts.deliver(row.id) == "skipped"
    clock_at_start.advance(seconds=30)
    assert alerts.deliver_all_due() == [State.RETRY]
    row.refresh_from_db()
    assert row.next_attempt_at == START + timedelta(seconds=30 + 60)  # doubled
    clock_at_start.advance(seconds=60)
    assert alerts.deliver_all_due() == [State.DELIVERED]
    row.refresh_from_db()
    assert row.state == State.DELIVERED and row.attempts == 3 and row.status_code == 200
    assert len(receiver.at("/hook")) == 3
    # For Prometheus: two retries and one delivery of a webhook alert.
    assert counted(State.RETRY) - before[State.RETRY] == 2
    assert counted(State.DELIVERED) - before[State.DELIVERED] == 1
    hook.refresh_from_db()
    assert hook.enabled


@pytest.mark.django_db
def test_r8_2_network_error_is_transient(clock_at_start):
    """R8.2: nobody listening (connection refused) is retried, never disables."""
    dead = Receiver()
    url = dead.url("/hook")
    dead.close()
    hook = channel("ops-hook", "webhook", url)
    emit(make_thread(START).segments.get(), "critical", START)
    (row,) = deliveries()
    assert alerts.deliver(row.id) == State.RETRY
    hook.refresh_from_db()
    assert hook.enabled


@pytest.mark.django_db
def test_r8_2_no_retry_on_400_and_the_channel_is_disabled(receiver, clock_at_start):
    """R8.2: a 400 is permanent — no retry, the channel is disabled with the
    reason and time, and the providers page card says so."""
    receiver.script["/slack"] = [400]
    slack = channel("ops-slack", "slack", receiver.url("/slack"))
    seg = make_thread(START).segments.get()
    emit(seg, "critical", START)
    (row,) = deliveries()
    assert alerts.deliver(row.id) == State.FAILED
    row.refresh_from_db()
    assert row.state == State.FAILED and row.status_code == 400
    slack.refresh_from_db()
    assert not slack.enabled and slack.disabled_at == START
    assert "HTTP 400" in slack.disabled_reason
    assert AuditEntry.objects.filter(action="alert_channel.disable").count() == 1
    clock_at_start.advance(hours=2)
    assert alerts.deliver_all_due() == []
    assert alerts.deliver(row.id) == "skipped"
    assert len(receiver.at("/slack")) == 1  # never retried
    # A later alert does not go to a disabled channel at all.
    emit(seg, "critical", START, provider="beta")
    assert len(deliveries()) == 1

    rows = alert_channel_rows(time_source.now())
    assert [(r.state, r.disabled_by, r.failed_24h) for r in rows] == [("disabled", "failure", 1)]
    html = render_to_string(
        "providers/list.html", {"alert_channels": rows, "total": 0, "recent_hours": 24}
    )
    assert 'id="alert-channel-' in html and "ops-slack" in html
    assert "Disabled" in html and "HTTP 400" in html


@pytest.mark.django_db
def test_r8_2_pagerduty_without_routing_key_is_bad_config(receiver, monkeypatch, clock_at_start):
    """R8.2: a PagerDuty channel whose routing-key env var is unset is a
    permanent configuration error: disabled, nothing sent."""
    monkeypatch.delenv("GOVERNANCE_KEY_PD_MISSING", raising=False)
    pd = channel(
        "pager", "pagerduty", receiver.url("/pd"), routing_key_env="GOVERNANCE_KEY_PD_MISSING"
    )
    emit(make_thread(START).segments.get(), "critical", START)
    (row,) = deliveries()
    assert alerts.deliver(row.id) == State.FAILED
    pd.refresh_from_db()
    assert not pd.enabled and "GOVERNANCE_KEY_PD_MISSING" in pd.disabled_reason
    assert receiver.requests == []


@pytest.mark.django_db
def test_r8_2_pagerduty_routing_key_from_a_file(receiver, monkeypatch, tmp_path, clock_at_start):
    """The routing key is read by services.secrets.named_secret, which honours
    NAME_FILE like every other secret (mounted secrets, no key in the env)."""
    key_file = tmp_path / "pd-key"
    key_file.write_text("file-routing-key\n")
    monkeypatch.delenv("GOVERNANCE_KEY_PD_MOUNTED", raising=False)
    monkeypatch.setenv("GOVERNANCE_KEY_PD_MOUNTED_FILE", str(key_file))
    channel("pager", "pagerduty", receiver.url("/pd"), routing_key_env="GOVERNANCE_KEY_PD_MOUNTED")
    emit(make_thread(START).segments.get(), "critical", START)
    (row,) = deliveries()
    assert alerts.deliver(row.id) == State.DELIVERED
    assert [r["body"]["routing_key"] for r in receiver.at("/pd")] == ["file-routing-key"]


@pytest.mark.django_db
def test_r8_2_pagerduty_routing_key_env_that_is_no_variable_name_is_bad_config(
    receiver, clock_at_start
):
    """A routing-key env "name" that cannot be a variable name is a permanent
    configuration error: disabled, nothing sent."""
    pd = channel("pager", "pagerduty", receiver.url("/pd"), routing_key_env="PD-KEY")
    emit(make_thread(START).segments.get(), "critical", START)
    (row,) = deliveries()
    assert alerts.deliver(row.id) == State.FAILED
    pd.refresh_from_db()
    assert not pd.enabled and "the NAME of an environment variable" in pd.disabled_reason
    assert receiver.requests == []


# --------------------------------------------------------------------------- budget


@pytest.mark.django_db
def test_r3_6_normal_pushes_dropped_past_the_daily_budget_critical_bypass(receiver, clock_at_start):
    """R3.6: normal notifications count against the channel's daily budget and
    are dropped (recorded) past it; critical ones bypass it; a new UTC day
    starts a new budget."""
    channel("ops-hook", "webhook", receiver.url("/hook"), daily_budget=2)
    thread = make_thread(START)
    seg = thread.segments.get()
    normals = [emit(seg, "normal", START, provider=p) for p in ("p1", "p2", "p3", "p4")]
    results = alerts.deliver_all_due()
    assert results == [State.DELIVERED, State.DELIVERED, "skipped", "skipped"]
    dropped = deliveries(state=State.DROPPED)
    assert [d.notification_id for d in dropped] == [n.id for n in normals[2:]]
    assert all("daily budget" in d.last_error for d in dropped)
    assert len(receiver.at("/hook")) == 2
    # The boundary's resolve goes where the alert arrived, and is not a new push.
    services.apply_boundary(thread, "fresh_start", by="t", reason="next", now=START)
    alerts.deliver_all_due()
    resolved = [r["body"]["dedupe_key"] for r in receiver.at("/hook")[2:]]
    assert [r["body"]["event"] for r in receiver.at("/hook")[2:]] == ["resolve", "resolve"]
    assert resolved == [n.dedupe_key for n in normals[:2]]
    # Critical alerts bypass the budget.
    seg = thread.segments.get(closed_at__isnull=True)
    critical = emit(seg, "critical", START)
    assert alerts.deliver_all_due() == [State.DELIVERED]
    assert receiver.at("/hook")[-1]["body"]["dedupe_key"] == critical.dedupe_key
    # The next UTC day has a fresh budget.
    clock_at_start.set(START.replace(hour=0) + timedelta(days=1, minutes=1))
    services.apply_boundary(thread, "fresh_start", by="t", reason="new day", now=time_source.now())
    seg = thread.segments.get(closed_at__isnull=True)
    emit(seg, "normal", time_source.now())
    assert State.DELIVERED in alerts.deliver_all_due()
    (row,) = alert_channel_rows(time_source.now())
    assert row.dropped_today == 0


# --------------------------------------------------------------------------- escalation


@pytest.mark.django_db
def test_r8_2_escalation_every_15_minutes_to_the_next_tier_until_acknowledged(
    receiver, clock_at_start, oncall, settings
):
    """R8.2: an unacknowledged critical alert re-notifies every 15 minutes
    (the default) to the next tier; acknowledgement stops it at once."""
    assert settings.GOVERNANCE_ESCALATION_MINUTES == 15
    channel("first", "webhook", receiver.url("/first"), escalation_order=0)
    channel("second", "webhook", receiver.url("/second"), escalation_order=1)
    channel("third", "slack", receiver.url("/third"), escalation_order=2)
    seg = make_thread(START).segments.get()
    critical = emit(seg, "critical", START)
    emit(seg, "normal", START, provider="beta")  # normal alerts never escalate
    alerts.deliver_all_due()
    assert [len(receiver.at(p)) for p in ("/first", "/second", "/third")] == [2, 0, 0]

    clock_at_start.advance(minutes=14, seconds=59)
    assert services_alerts.escalate_due(time_source.now()) == []
    clock_at_start.advance(seconds=1)
    assert services_alerts.escalate_due(time_source.now()) == [critical.id]
    alerts.deliver_all_due()
    assert [len(receiver.at(p)) for p in ("/first", "/second", "/third")] == [2, 1, 0]
    body = receiver.at("/second")[0]["body"]
    assert body["delivery_event"] == "escalate-1" and body["dedupe_key"] == critical.dedupe_key
    assert services_alerts.escalate_due(time_source.now()) == []  # once per interval

    clock_at_start.advance(minutes=15)
    assert services_alerts.escalate_due(time_source.now()) == [critical.id]
    alerts.deliver_all_due()
    assert [len(receiver.at(p)) for p in ("/first", "/second", "/third")] == [2, 1, 1]
    assert "escalation 2" in receiver.at("/third")[0]["body"]["text"]

    # The next escalation is queued but not sent yet when on-call acknowledges.
    clock_at_start.advance(minutes=15)
    assert services_alerts.escalate_due(time_source.now()) == [critical.id]
    (queued,) = deliveries(event="escalate-3")
    services.acknowledge_notification(critical.id, user=oncall, now=time_source.now())
    queued.refresh_from_db()
    assert queued.state == State.DROPPED  # stopped at once, before any call
    alerts.deliver_all_due()
    assert len(receiver.at("/third")) == 2  # the acknowledgement, not escalation 3
    assert receiver.at("/third")[-1]["body"]["text"].startswith("[acknowledged] by olive-oncall")
    for _ in range(4):
        clock_at_start.advance(minutes=15)
        assert services_alerts.escalate_due(time_source.now()) == []
    critical.refresh_from_db()
    assert critical.escalation_level == 3 and critical.acked_by == oncall


@pytest.mark.django_db
def test_r8_2_escalation_claim_rechecks_the_acknowledgement(
    receiver, clock_at_start, oncall, monkeypatch
):
    """R8.2: an acknowledgement that lands between the job's read of due
    alerts and its claim wins: the conditional update re-checks acked_at."""
    from django.db import transaction

    channel("first", "webhook", receiver.url("/first"))
    seg = make_thread(START).segments.get()
    critical = emit(seg, "critical", START)
    clock_at_start.advance(minutes=15)
    acked = []

    class AckFirst:
        on_commit = staticmethod(transaction.on_commit)

        @staticmethod
        def atomic(*args, **kwargs):
            if not acked:  # on-call clicks just before the claim
                acked.append(services.acknowledge_notification(critical.id, user=oncall, now=START))
            return transaction.atomic(*args, **kwargs)

    monkeypatch.setattr(services_alerts, "transaction", AckFirst)
    assert services_alerts.escalate_due(time_source.now()) == []
    assert acked and acked[0][1] is True
    assert deliveries(event="escalate-1") == []
    critical.refresh_from_db()
    assert critical.escalation_level == 0


# --------------------------------------------------------------------------- PagerDuty


@pytest.mark.django_db
def test_r8_2_pagerduty_trigger_acknowledge_resolve_with_a_stable_dedup_key(
    receiver, clock_at_start, oncall, monkeypatch
):
    """R8.2: through the real services — a critical notice triggers, the
    dashboard acknowledgement acknowledges, a boundary resolves — PagerDuty
    hears all three under our dedupe key; normal notices never page."""
    monkeypatch.setenv("GOVERNANCE_KEY_PD_ROUTING_TEST", "r0uting-key-123")
    channel(
        "pager",
        "pagerduty",
        receiver.url("/v2/enqueue"),
        routing_key_env="GOVERNANCE_KEY_PD_ROUTING_TEST",
    )
    thread = make_thread(START)
    seg = thread.segments.get()
    emit(seg, "normal", START, provider="beta")  # not for PagerDuty
    critical = emit(seg, "critical", START)
    alerts.deliver_all_due()
    clock_at_start.advance(minutes=3)
    _, changed = services.acknowledge_notification(critical.id, user=oncall, now=time_source.now())
    assert changed
    services.acknowledge_notification(
        critical.id, user=oncall, now=time_source.now()
    )  # a double click
    alerts.deliver_all_due()
    clock_at_start.advance(minutes=5)
    services.apply_boundary(
        thread, "compact", by="olive-oncall", reason="unfreeze", now=time_source.now()
    )
    alerts.deliver_all_due()

    sent = [r["body"] for r in receiver.at("/v2/enqueue")]
    assert [b["event_action"] for b in sent] == ["trigger", "acknowledge", "resolve"]
    # PagerDuty groups by the incident: the segment's alerts are one page (R8.2).
    critical.refresh_from_db()
    assert {b["dedup_key"] for b in sent} == {critical.incident.key} == {f"incident:{seg.key}:1"}
    assert sent[0]["payload"]["custom_details"]["alert"] == critical.dedupe_key
    assert all(b["routing_key"] == "r0uting-key-123" for b in sent)
    payload = sent[0]["payload"]
    assert payload["severity"] == "critical" and payload["summary"] == critical.text[:1024]
    assert seg.key in payload["source"]
    critical.refresh_from_db()
    assert critical.resolved_at == time_source.now()
    assert services_alerts.escalate_due(time_source.now() + timedelta(hours=1)) == []


@pytest.mark.django_db
def test_r8_2_unacknowledged_alert_resolved_by_a_boundary_stops_escalating(
    receiver, clock_at_start
):
    """R8.2: a boundary resolves the closed segment's alerts; a resolved alert
    no longer escalates."""
    channel("first", "webhook", receiver.url("/first"))
    thread = make_thread(START)
    critical = emit(thread.segments.get(), "critical", START)
    alerts.deliver_all_due()
    services.apply_boundary(thread, "fresh_start", by="t", reason="clear", now=START)
    alerts.deliver_all_due()
    assert [r["body"]["event"] for r in receiver.at("/first")] == ["trigger", "resolve"]
    clock_at_start.advance(hours=1)
    assert services_alerts.escalate_due(time_source.now()) == []
    critical.refresh_from_db()
    assert critical.resolved_at == START


# --------------------------------------------------------------------------- e-mail and shapes


@pytest.mark.django_db
def test_r8_2_email_channel_through_djangos_locmem_outbox(clock_at_start, settings):
    """R8.2: e-mail goes through Django's e-mail backend (locmem in tests)."""
    assert settings.EMAIL_BACKEND == "django.core.mail.backends.locmem.EmailBackend"
    channel("oncall-mail", "email", "oncall@example.org, lead@example.org")
    seg = make_thread(START).segments.get()
    critical = emit(seg, "critical", START)
    assert alerts.deliver_all_due() == [State.DELIVERED]
    (message,) = mail.outbox
    assert message.to == ["oncall@example.org", "lead@example.org"]
    assert message.subject.startswith("[CRITICAL]")
    assert critical.text in message.body and critical.dedupe_key in message.body


@pytest.mark.django_db
def test_r8_2_bad_email_address_disables_the_channel(clock_at_start):
    """R8.2: an address that cannot work is a permanent configuration error."""
    mailbox = channel("oncall-mail", "email", "not-an-address")
    emit(make_thread(START).segments.get(), "critical", START)
    assert alerts.deliver_all_due() == [State.FAILED]
    mailbox.refresh_from_db()
    assert not mailbox.enabled and "not-an-address" in mailbox.disabled_reason
    assert mail.outbox == []


@pytest.mark.django_db
def test_r8_2_a_worker_lost_on_the_last_attempt_makes_no_attempt_beyond_the_limit(
    receiver, clock_at_start, settings
):
    """rules.redelivery.may_attempt, as for callbacks: the last attempt's worker died
    (its row stays ``sending`` past the lease); nothing is sent again."""
    settings.GOVERNANCE_ALERT_MAX_ATTEMPTS = 2
    channel("ops-hook", "webhook", receiver.url("/hook"))
    emit(make_thread(START).segments.get(), "critical", START)
    (row,) = deliveries()
    NotificationDelivery.objects.filter(id=row.id).update(
        state=State.SENDING, attempts=2, claimed_at=START
    )  # attempt 2 of 2 claimed, then its worker died
    clock_at_start.advance(timedelta(hours=1))
    assert services_alerts.claim_delivery(row.id, time_source.now()) is None
    row.refresh_from_db()
    assert row.state == State.FAILED and row.attempts == 2
    assert "gave up after 2 attempts" in row.last_error
    assert receiver.requests == []


class SmtpServer:
    """A real SMTP server on 127.0.0.1 (RFC 5321's commands, one line each) that
    answers MAIL FROM and RCPT TO with scripted reply codes and accepts the rest."""

    def __init__(self) -> None:
        self.mail_from = 250
        self.rcpt_to = 250
        self.messages = 0
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def reply(self, line: str) -> None:
                self.wfile.write(f"{line}\r\n".encode())

            def handle(self):
                self.reply("220 loopback ESMTP")
                in_data = False
                for raw in self.rfile:
                    line = raw.decode().rstrip("\r\n")
                    if in_data:
                        if line == ".":
                            in_data = False
                            server.messages += 1
                            self.reply("250 queued")
                        continue
                    verb = line[:4].upper()
                    if verb in ("EHLO", "HELO"):
                        self.reply("250 loopback")
                    elif verb == "MAIL":
                        self.reply(f"{server.mail_from} sender {server.mail_from}")
                    elif verb == "RCPT":
                        self.reply(f"{server.rcpt_to} recipient {server.rcpt_to}")
                    elif verb == "DATA":
                        in_data = True
                        self.reply("354 go ahead")
                    elif verb == "QUIT":
                        self.reply("221 bye")
                        return
                    else:
                        self.reply("250 ok")

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def smtp_server(settings):
    server = SmtpServer()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
    yield server
    server.close()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("step", "code", "state", "enabled"),
    [
        ("rcpt_to", 450, State.RETRY, True),  # mailbox busy: try again later
        ("rcpt_to", 550, State.FAILED, False),  # no such mailbox: it will not work
        ("mail_from", 451, State.RETRY, True),  # local error in processing
        ("mail_from", 553, State.FAILED, False),  # sender address not allowed
    ],
)
def test_r8_2_smtp_replies_are_read_by_the_redelivery_rule(
    smtp_server, clock_at_start, step, code, state, enabled
):
    """RFC 5321: a 4yz reply is transient (the channel stays, the alert is retried),
    a 5yz one permanent (the channel is disabled); a real SMTP server answers."""
    mailbox = channel("oncall-mail", "email", "oncall@example.org")
    setattr(smtp_server, step, code)
    emit(make_thread(START).segments.get(), "critical", START)
    assert alerts.deliver_all_due() == [state]
    mailbox.refresh_from_db()
    assert mailbox.enabled is enabled
    delivery = NotificationDelivery.objects.get()
    assert str(code) in delivery.last_error
    assert smtp_server.messages == 0


@pytest.mark.django_db
def test_r8_2_an_smtp_server_that_accepts_delivers(smtp_server, clock_at_start):
    channel("oncall-mail", "email", "oncall@example.org")
    emit(make_thread(START).segments.get(), "critical", START)
    assert alerts.deliver_all_due() == [State.DELIVERED]
    assert smtp_server.messages == 1


@pytest.mark.django_db
def test_r8_2_webhook_and_slack_bodies(receiver, clock_at_start, settings):
    """R8.2: the generic webhook carries dedupe key, severity, text, segment and
    event; Slack gets {"text": …} with the severity and a link."""
    settings.GOVERNANCE_DASHBOARD_URL = "https://governance.example.org"
    channel("ops-hook", "webhook", receiver.url("/hook"))
    channel("ops-slack", "slack", receiver.url("/slack"))
    seg = make_thread(START).segments.get()
    normal = emit(seg, "normal", START)
    alerts.deliver_all_due()
    (hook,) = receiver.at("/hook")
    assert {k: hook["body"][k] for k in ("dedupe_key", "severity", "text", "segment", "event")} == {
        "dedupe_key": normal.dedupe_key,
        "severity": "normal",
        "text": normal.text,
        "segment": seg.key,
        "event": "trigger",
    }
    assert hook["headers"]["Idempotency-Key"] == f"{normal.dedupe_key}:trigger"
    (slack,) = receiver.at("/slack")
    assert set(slack["body"]) == {"text"}
    text = slack["body"]["text"]
    assert text.startswith("[normal]") and normal.text in text
    assert f"<https://governance.example.org/alerts/#alert-{normal.id}|" in text


@pytest.mark.django_db
def test_r8_2_no_channels_means_no_outbox_rows(clock_at_start):
    """R8.2: without configured channels the inbox is the only destination."""
    emit(make_thread(START).segments.get(), "critical", START)
    assert NotificationDelivery.objects.count() == 0
    assert alert_channel_rows(time_source.now()) == []


@pytest.mark.django_db
def test_r8_2_admin_configures_channels_and_shows_their_state(client, django_user_model):
    """R8.2: channels are configured in the admin; the list shows each one's
    state, the reason of a disabled one is read-only, bad targets are refused,
    and re-enabling clears the old failure."""
    admin_user = django_user_model.objects.create_superuser("ada", password="pw-for-tests-1")
    client.force_login(admin_user)
    add = "/admin/governance/alertchannel/add/"
    assert client.get(add).status_code == 200
    refused = client.post(
        add, {"name": "hook", "kind": "webhook", "target": "ftp://x", "escalation_order": 0,
              "daily_budget": 5, "enabled": "on"},
    )  # fmt: skip
    assert refused.status_code == 200 and "give the http(s) URL" in refused.content.decode()
    pd = client.post(
        add, {"name": "pager", "kind": "pagerduty", "target": "", "routing_key_env": "",
              "escalation_order": 1, "daily_budget": 5, "enabled": "on"},
    )  # fmt: skip
    assert "name the environment variable" in pd.content.decode()
    broken = AlertChannel.objects.create(
        name="ops-slack", kind="slack", target="http://127.0.0.1:9/x", enabled=False,
        disabled_reason="trigger of notification 1 failed permanently (HTTP 404)",
        disabled_at=START,
    )  # fmt: skip
    listing = client.get("/admin/governance/alertchannel/").content.decode()
    assert "disabled: trigger of notification 1 failed permanently (HTTP 404)" in listing
    change = f"/admin/governance/alertchannel/{broken.pk}/change/"
    page = client.get(change).content.decode()
    assert 'name="disabled_reason"' not in page and "HTTP 404" in page  # read-only
    saved = client.post(
        change, {"name": "ops-slack", "kind": "slack", "target": "http://127.0.0.1:9/x",
                 "escalation_order": 0, "daily_budget": 50, "enabled": "on"},
    )  # fmt: skip
    assert saved.status_code == 302
    broken.refresh_from_db()
    assert broken.enabled and broken.disabled_reason == "" and broken.disabled_at is None
