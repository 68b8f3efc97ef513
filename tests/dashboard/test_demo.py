"""`manage.py demo`: a realistic scenario seeded through the real engine.

No worker is needed: the command runs every stage inline (Celery eager) under
its own manual clock, and must leave both as it found them.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from io import StringIO
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from governance import services, time_source
from governance.models import (
    AuditEntry,
    Notification,
    ProviderAttempt,
    ProviderHealthState,
    Run,
    RunCallback,
    RunEvent,
    RunViewer,
    SegmentRefusal,
    Settlement,
    SpanRecord,
    Stage,
    Thread,
    ToolApproval,
    ToolReceipt,
)
from tasks import celery_app
from tasks.span_store import span_store_enabled

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def var_dir(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    return tmp_path


def demo(*args: str) -> str:
    out = StringIO()
    call_command("demo", *args, stdout=out)
    return out.getvalue()


def demo_thread(title: str) -> Thread:
    return Thread.objects.get(title=f"demo: {title}")


def test_demo_seeds_the_scenario_through_the_engine(var_dir):
    started = datetime.now(UTC)
    output = demo()
    finished = datetime.now(UTC)

    # Several threads with different chains and tool surfaces, every run settled.
    threads = Thread.objects.filter(title__startswith="demo:")
    assert threads.count() >= 4
    assert len({tuple(t.provider_chain) for t in threads}) >= 4
    assert len({tuple(t.tool_surface) for t in threads}) >= 3
    runs = Run.objects.filter(thread__in=threads)
    assert runs.count() >= 20
    # Every run settled but one: its call waits for an operator's yes in Approvals.
    (waiting,) = runs.exclude(status=Run.Status.SETTLED)
    request = ToolApproval.objects.get(run=waiting, state="pending")
    assert request.tool == "ops-notify" and request.arguments["headline"] == "Release 4.2 is live"
    assert request.approver_role == "operator"

    # Someone is paged: the demo's channel goes to the web's own demo pager (R8.2),
    # and the demo's frozen segments are incidents needing a person.
    from governance.models import AlertChannel, Incident

    pager = AlertChannel.objects.get(name="demo pager (local sink)")
    assert pager.enabled and pager.target.endswith("/demo/pager")
    assert Incident.objects.filter(state="triggered").exists()

    # Produced by the engine: attempts, stages, fallback cards, spans.
    assert ProviderAttempt.objects.filter(kind="fallback").exists()
    assert RunEvent.objects.filter(kind="llm-fallback").count() >= 5
    assert Stage.objects.filter(kind="tool_call").exists()
    # Every stage finished but the call parked for a person's answer.
    (parked,) = Stage.objects.filter(finished_at__isnull=True)
    assert parked.kind == "tool_call" and parked.parked_at is not None
    if span_store_enabled():
        assert SpanRecord.objects.filter(run_id__in=runs.values("id")).exists()

    # The data spans several hours and ends at about "now".
    first = runs.order_by("created_at").first().created_at
    last = Settlement.objects.order_by("-settled_at").first().settled_at
    assert timedelta(hours=8) <= started - first <= timedelta(hours=10)
    assert started - timedelta(minutes=30) <= last <= finished

    # The refusal storm: 4 requests on the first refused turn, one re-probe at
    # +15 min, +1 h and +6 h, then frozen with a critical, unacknowledged alert.
    segment = services.open_segment(demo_thread("incident cost review"))
    state = SegmentRefusal.objects.get(segment=segment, provider_id="demo-sentinel")
    assert state.refusals == 4
    refused = ProviderAttempt.objects.filter(
        segment=segment, provider__provider_id="demo-sentinel", result="refused"
    )
    assert refused.count() == 4 + 3
    assert refused.filter(kind="re_probe").count() == 3
    key = f"provider-refusal:{segment.key}:3:demo-sentinel"
    alert = Notification.objects.get(dedupe_key=key)
    assert alert.severity == "critical" and alert.acked_at is None
    assert Notification.objects.get(dedupe_key=f"provider-refusal:{segment.key}:0:demo-sentinel")
    # A second thread frozen on both of its providers: its runs settle failed,
    # and the alert names the boundary action needed.
    triage = services.open_segment(demo_thread("vendor breach triage"))
    assert Notification.objects.filter(
        dedupe_key=f"provider-refusal:{triage.key}:3:demo-sentinel,demo-vigil",
        severity="critical",
    ).exists()
    no_provider = Notification.objects.get(dedupe_key=f"no-eligible-provider:{triage.key}")
    assert "fresh start" in no_provider.text
    assert Settlement.objects.filter(reason_code="no_eligible_provider").exists()

    # The outage: 503s opened breakers; one recovered, one is still tripped.
    assert (
        ProviderAttempt.objects.filter(failure_class="server_error", status_code=503).count() >= 6
    )
    tripped = ProviderHealthState.objects.filter(trips__gte=1)
    assert tripped.exists()
    assert tripped.filter(provider__provider_id="demo-orion", breaker="open").exists()
    meridian = ProviderHealthState.objects.get(provider__provider_id="demo-meridian")
    assert meridian.breaker == "closed" and meridian.last_failure_class == "server_error"
    assert any(
        entry.get("state") == "breaker_open"
        for card in RunEvent.objects.filter(kind="llm-fallback")
        for entry in card.metadata.get("health", [])
    )

    # Runs of every outcome.
    outcomes = set(Settlement.objects.values_list("outcome", flat=True))
    assert {"completed", "partial", "cancelled", "failed"} <= outcomes
    partial = Settlement.objects.filter(outcome="partial").first().run
    assert partial.stages.filter(kind="finalization").exists()
    cancelled = Settlement.objects.get(outcome="cancelled").run
    assert cancelled.attempts.count() == 0
    assert Settlement.objects.filter(reason_code="deadline_exceeded").exists()
    assert Stage.objects.filter(timeout_name="deadline_exceeded").exists()

    # An unknown webhook effect, verified up to the limit, listed on the settlement.
    receipt = ToolReceipt.objects.get(tool="webhook", effect="unknown")
    assert receipt.run.stages.filter(kind="verify_effect").count() == 3
    assert receipt.idempotency_key in receipt.run.settlement.unknown_effects
    assert receipt.run.settlement.outcome != "completed"

    # Delivery (R7.2–R7.4): streamed runs watched with all, part or none of the
    # chunks acknowledged; callbacks delivered, delivered after a retry, failed,
    # and one still retrying — the report shows a mix, not every run flagged.
    from dashboard.queries.report import ReportQuery, delivery_report
    from governance.services.deliveries import judge_unjudged

    query = ReportQuery(start=first, end=finished + timedelta(minutes=1))
    judge_unjudged(start=query.start, end=query.end)
    report = delivery_report(query)
    evidence = report.total.evidence
    assert evidence["client_received_all_committed"] >= 3
    assert evidence["client_received_part"] >= 2
    assert evidence["no_client_evidence"] >= 2
    assert report.runs_with_discrepancies < report.runs
    assert report.total.cost.total["USD"] > 0  # refused sends report no usage: unknown
    callbacks = RunCallback.objects.filter(run__thread__title__startswith="demo:")
    states = Counter(callbacks.values_list("state", flat=True))
    assert states["delivered"] >= 4 and states["failed"] >= 2 and states["retry"] == 1
    assert callbacks.filter(state="delivered", attempts__gte=2).exists()  # after a retry
    assert callbacks.filter(state="delivered", attempts=1).exists()
    assert RunViewer.objects.filter(run__thread__title__startswith="demo:").count() >= 9
    assert "callbacks delivered" in output and "runs watched" in output

    # Insights answer on the demo data: the refusing provider's original
    # sends and its re-probes are counted, over the API and on the page alike.
    from governance.models import ApiToken
    from governance.services.tokens import token_digest

    manager = get_user_model().objects.get(username="demo-manager")
    ApiToken.objects.create(user=manager, name="demo-check", key_digest=token_digest("d" * 32))
    period = urlencode(
        {"since": first.isoformat(), "until": (finished + timedelta(minutes=1)).isoformat()}
    )
    answer = Client().get(
        f"/api/v1/insights/reprobes?{period}", headers={"Authorization": f"Bearer {'d' * 32}"}
    )
    assert answer.status_code == 200, answer.content
    tiers = {row["label"]: row for row in answer.json()["totals"]}
    assert tiers["original refused send"]["refused"] >= 1
    assert tiers["re-probe 1"]["sends"] >= 1
    assert all(row["sends"] == row["accepted"] + row["refused"] + row["failed"]
               for row in tiers.values())  # fmt: skip
    browser = Client()
    browser.force_login(manager)
    page = browser.get(f"/insights/?{period}", headers={"X-Forwarded-Proto": "https"})
    assert page.status_code == 200
    assert "re-probe 1" in page.content.decode()

    # Boundaries in the audit log, by the demo operator, with a reason.
    boundary = AuditEntry.objects.get(action="boundary.fresh_start")
    assert boundary.actor == "demo-operator" and boundary.reason
    assert AuditEntry.objects.filter(action__startswith="boundary.").count() >= 2

    # The three role users, with the passwords kept in var/ and printed.
    users = get_user_model().objects
    for username, group in (
        ("demo-operator", "operator"),
        ("demo-oncall", "on-call"),
        ("demo-manager", "manager"),
    ):
        user = users.get(username=username)
        assert list(user.groups.values_list("name", flat=True)) == [group]
        password = (var_dir / f"{username}-password").read_text().strip()
        assert user.check_password(password)
        assert f"user: {username}  password: {password}" in output
    assert users.get(username="demo-operator").has_perm("governance.apply_boundary")
    assert users.get(username="demo-oncall").has_perm("governance.acknowledge_notification")
    assert not users.get(username="demo-manager").has_perm("governance.apply_boundary")

    assert "runs by outcome:" in output and "cancelled 1" in output

    # The command leaves the process as it found it.
    assert celery_app.conf.task_always_eager is False
    assert abs(time_source.now() - datetime.now(UTC)) < timedelta(minutes=1)

    # Running it again adds nothing.
    counts = (Thread.objects.count(), Run.objects.count(), Notification.objects.count())
    again = demo()
    assert "demo data already present" in again
    assert (Thread.objects.count(), Run.objects.count(), Notification.objects.count()) == counts

    # --force adds another round (here rather than in a test of its own: a round
    # takes a while to seed).
    threads, runs = Thread.objects.count(), Run.objects.count()
    passwords = {p.name: p.read_text() for p in var_dir.glob("demo-*-password")}
    output = demo("--force")
    assert "Demo round 2" in output
    assert Thread.objects.count() == 2 * threads
    assert Run.objects.count() > runs
    # Each round leaves one call waiting for a person.
    assert Run.objects.exclude(status=Run.Status.SETTLED).count() == 2
    assert ToolApproval.objects.filter(state="pending").count() == 2
    # The new round has its own refusal storm, frozen again.
    second = services.open_segment(Thread.objects.get(title="demo: incident cost review (round 2)"))
    assert SegmentRefusal.objects.get(segment=second, provider_id="demo-sentinel").refusals == 4
    # The users are the same, with the same passwords.
    assert {p.name: p.read_text() for p in var_dir.glob("demo-*-password")} == passwords
    assert get_user_model().objects.filter(username__startswith="demo-").count() == 3
