"""The demo data (``manage.py demo``, seeded once: it takes a while) in real
Chromium: the Insights page answers on it, its what-if replays it, the delivery
report shows a mix of acknowledged, partly acknowledged and unacknowledged runs
and callbacks delivered, retried and failed — not every run flagged — and
axe-core (from npm, injected by the test) finds no serious or critical
violation on any page, on a desktop (1440×900) and a phone (390×844)
(screenshots checked)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from governance.models import Incident, Run, Segment
from tests.browser.conftest import axe_problems

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo_data(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("demo", stdout=StringIO())


SIZES = {"desktop": {"width": 1440, "height": 900}, "phone": {"width": 390, "height": 844}}


def test_the_demo_data_on_insights_the_report_and_every_page_for_axe(
    page_for, manager, make_user, demo_data, shots, browser, live_server, axe_source
):
    page = page_for(manager.username)
    insights_and_what_if(page, shots)
    page.goto(f"{live_server.url}/")
    delivery_report_is_a_mix(page, shots)
    admin = make_user("ada-admin", is_staff=True, is_superuser=True)
    problems = []
    for size in SIZES.values():
        problems += axe_on_every_page(page_for(admin.username, **size), live_server.url, axe_source)
    assert problems == [], "\n".join(problems)


def every_page() -> list[str]:
    incident = Incident.objects.order_by("id").first()
    segment = Segment.objects.filter(closed_at__isnull=True, refusals__isnull=False).first()
    run = Run.objects.filter(settlement__isnull=False).order_by("created_at").first()
    assert incident and segment and run, "the demo makes an incident, a frozen segment, runs"
    return [
        "/", "/incidents/", f"/incidents/{incident.id}/", "/alerts/", "/segments/",
        f"/segments/{segment.id}/", "/runs/", f"/runs/{run.id}/", f"/runs/{run.id}/watch",
        "/providers/", "/tools/", "/insights/", "/reports/delivery/", "/audit/",
        "/docs/api/", "/tokens/", "/me/time-zone", "/approvals/",
    ]  # fmt: skip


def axe_on_every_page(page, base: str, axe_source: str) -> list[str]:
    problems = []
    for path in every_page():
        response = page.goto(f"{base}{path}")
        assert response.ok, f"{path}: {response.status}"
        page.wait_for_load_state("load")
        problems += axe_problems(page, axe_source)
    page.context.clear_cookies()  # signed out: the login page too
    page.goto(f"{base}/login/")
    return problems + axe_problems(page, axe_source)


def insights_and_what_if(page, shots):
    page.get_by_role("link", name="Insights").click()
    headline = page.locator(".summary .headline")
    assert "refusal-related send" in headline.inner_text()
    labels = page.locator(".tier-chart .tier .tier-name").all_inner_texts()
    assert labels[:3] == ["original refused send", "re-render", "history-only"]
    assert {"re-probe 1", "re-probe 2", "re-probe 3"} <= set(labels)
    shots(page, "insights-demo")
    page.get_by_label("Re-probes").fill("2")
    page.get_by_label("Delays after each refusal").fill("10m, 2h")
    page.get_by_role("button", name="Replay").click()
    what_if = page.locator("#what-if")
    assert "An estimate from recorded data" in what_if.inner_text()
    rows = page.locator("#what-if-table tbody tr")
    assert rows.nth(0).inner_text().split("\t")[-1].strip() == "10 min, 2 h"
    # Three refusal timelines: incident (sentinel), triage (sentinel and vigil).
    assert "3 refusal timelines" in page.locator("[data-testid=what-if-headline]").inner_text()
    assert "answered" in page.locator(".what-if-rates").inner_text()
    assert page.locator("#what-if-segments tbody tr").count() == 3
    shots(page, "insights-what-if-demo")
    page.get_by_label("Delays after each refusal").fill("2h, 10m")
    page.get_by_role("button", name="Replay").click()
    error = page.locator("#what-if .form-error").inner_text()
    assert "re-probe 2's delay must be longer than re-probe 1's" in error


def delivery_report_is_a_mix(page, shots):
    page.get_by_role("link", name="Delivery report").click()
    page.get_by_role("link", name="last 7 days").click()
    body = page.locator("#report").inner_text()
    assert "with discrepancies" in body
    table = page.locator("#aggregate tfoot").inner_text()
    cells = table.split("\t")
    runs, flagged = int(cells[1]), int(cells[13])
    assert 0 < flagged < runs
    assert page.locator("[data-testid=cost]").count() == 1
    callbacks = page.locator("#discrepancy-table .c-callback").all_inner_texts()
    assert "failed" in callbacks
    shots(page, "delivery-report-demo")
