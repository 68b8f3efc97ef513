"""The Insights page in real Chromium: the state first, the chart,
the table and the CSV link, on the hand-made refusal timeline of
tests/dashboard/test_insights.py (screenshot checked)."""

from __future__ import annotations

import pytest

from tests.dashboard.test_insights import EXPECTED, fixed_clock, timeline  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_manager_reads_the_reprobe_outcomes(page_for, manager, timeline, shots):  # noqa: F811
    page = page_for(manager.username)
    page.get_by_role("link", name="Insights").click()
    page.get_by_label("From (UTC)").fill("2025-03-01")
    page.get_by_label("To (UTC, inclusive)").fill("2025-03-08")
    page.get_by_role("button", name="Show").click()
    headline = page.locator(".summary .headline")
    assert "17 refusal-related sends" in headline.inner_text()
    bars = page.locator(".tier-chart .tier")
    assert bars.count() == len(EXPECTED)
    assert "re-probe 3" in bars.nth(5).inner_text() and "50.0%" in bars.nth(5).inner_text()
    bar = page.locator(".tier-chart .tier").nth(5).locator(".tier-bar")
    track = page.locator(".tier-chart .tier").nth(5).locator(".tier-track")
    ratio = bar.bounding_box()["width"] / track.bounding_box()["width"]
    assert ratio == pytest.approx(0.5, abs=0.02)
    table = page.locator("#tier-table tbody tr")
    assert table.count() == len(EXPECTED)
    assert (
        page.get_by_role("link", name="Download CSV")
        .get_attribute("href")
        .startswith("/insights/reprobes.csv?")
    )
    shots(page, "insights")
    narrow = page_for(manager.username, width=390, height=844)
    narrow.goto(page.url)
    assert narrow.locator(".tier-chart .tier").count() == len(EXPECTED)
    shots(narrow, "insights-phone")
