"""The three journeys of the dashboard in real Chromium (R8.2, R8.3, R8.4)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance import clock, services
from governance.models import AuditEntry, Notification, Provider, SegmentRefusal
from governance.refusal import ProviderRefusal, refusal_notice

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def frozen_segment():
    """A thread whose primary provider is frozen in its open segment, with the alert."""
    now = clock.now()
    for pid in ("primary", "backup"):
        Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-model")
    thread = services.create_thread(
        provider_chain=["primary", "backup"], title="Customer research", now=now
    )
    segment = services.open_segment(thread)
    SegmentRefusal.objects.create(
        segment=segment, provider_id="primary", model="primary-model", category="policy",
        refusals=4, refused_at=now - timedelta(hours=2),
    )  # fmt: skip
    notice = refusal_notice(
        segment.key,
        [ProviderRefusal("primary", "primary-model", "policy", 4, now - timedelta(hours=2))],
        now,
    )
    services.emit_notice(notice, segment)
    return thread, segment, Notification.objects.get(dedupe_key=notice.dedupe_key)


def test_r8_2_on_call_acknowledges_the_critical_alert_without_a_reload(
    page_for, oncall, frozen_segment, shots
):
    _thread, segment, alert = frozen_segment
    page = page_for(oncall.username)
    page.evaluate("window.__noReload = true")
    board = page.locator("#board")
    board.get_by_text("1 unacknowledged").wait_for()
    assert segment.key in board.inner_text()
    shots(page, "1-overview-with-alert")
    board.get_by_role("button", name="Acknowledge").click()
    page.get_by_text("No unacknowledged critical alerts").wait_for()
    assert page.evaluate("window.__noReload") is True  # the same page, updated in place
    shots(page, "2-overview-after-ack")
    alert.refresh_from_db()
    assert alert.acked_by == oncall and alert.acked_at is not None
    assert AuditEntry.objects.filter(action="alert.acknowledge", actor=oncall.username).exists()
