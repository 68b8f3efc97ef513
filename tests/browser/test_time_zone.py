"""Times in real Chromium: without a choice, the browser's own zone, labelled;
after choosing one from the header (on a phone), that zone on every page."""

from __future__ import annotations

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import expect

from governance import time_source
from governance.models import AuditEntry, ViewerPreference

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = {"width": 390, "height": 844}


def test_times_follow_the_browser_until_a_zone_is_chosen_from_the_header(
    page_for, live_server, oncall, shots
):
    at = time_source.now().replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=1)
    AuditEntry.objects.create(
        at=at, actor="oscar", action="boundary.fresh_start", target_type="segment",
        target_id="1", reason="zone walk",
    )  # fmt: skip
    page = page_for(oncall.username, timezone_id="America/New_York", **PHONE)
    page.goto(f"{live_server.url}/audit/")
    shown = page.locator("#audit-results time").first
    # Noon UTC is 07:00 EST in New York in winter, 08:00 EDT in summer.
    local = at.astimezone(ZoneInfo("America/New_York"))
    expect(shown).to_contain_text(f"{local:%I}:00")
    expect(shown).to_contain_text(f"{local:%Z}")
    expect(page.locator("header a.zone")).to_have_text("times: America/New_York (browser)")
    shots(page, "1-browser-zone-phone")

    page.locator("header a.zone").click()
    expect(page.get_by_role("heading", name="Your time zone")).to_be_visible()
    expect(page.locator("main")).to_contain_text("your browser's zone, America/New_York")
    shots(page, "2-the-zone-page-phone")
    page.get_by_label("Show times in").select_option("Asia/Tokyo")
    page.get_by_role("button", name="Save").click()
    page.wait_for_url(f"{live_server.url}/audit/")  # back where the person was
    expect(page.locator("#audit-results time").first).to_contain_text("GMT+9")
    expect(page.locator("header a.zone")).to_have_text("times: Asia/Tokyo")
    expect(page.get_by_role("status")).to_contain_text("Times now show in Asia/Tokyo.")
    assert ViewerPreference.objects.get(user=oncall).time_zone == "Asia/Tokyo"
    assert page.evaluate(
        "document.scrollingElement.scrollWidth <= document.documentElement.clientWidth + 1"
    )
    shots(page, "3-chosen-zone-phone")
