"""The demo data (``manage.py demo``) in real Chromium: the Insights page
answers on it, its what-if replays it, and the delivery report shows a mix of
acknowledged, partly acknowledged and unacknowledged runs and callbacks delivered,
retried and failed — not every run flagged (screenshots checked)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def demo_data(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("demo", stdout=StringIO())


def test_the_insights_page_and_its_what_if_on_the_demo_data(page_for, manager, demo_data, shots):
    page = page_for(manager.username)
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


def test_the_delivery_report_on_the_demo_data_is_a_mix(page_for, manager, demo_data, shots):
    page = page_for(manager.username)
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
