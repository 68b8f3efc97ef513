"""The three journeys of the dashboard in real Chromium (R8.2, R8.3, R8.4)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance import services, time_source
from governance.models import AuditEntry, Notification, Provider, SegmentRefusal
from governance.rules.refusal import ProviderRefusal, refusal_notice
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from tests import facts as written

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def frozen_segment():
    """A thread whose primary provider is frozen in its open segment, with the alert."""
    now = time_source.now()
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
    """R8.2: on-call acknowledges the critical freeze alert in one click; name and time recorded."""
    _thread, segment, alert = frozen_segment
    page = page_for(oncall.username)
    page.evaluate("window.__noReload = true")
    board = page.locator("#board")
    board.get_by_text("Incidents needing a person: 1").wait_for()
    assert segment.key in board.inner_text()
    shots(page, "1-overview-with-alert")
    board.get_by_role("button", name=f"Acknowledge incident #{alert.incident_id}").click()
    page.get_by_text("Nothing needs a person").wait_for()
    assert page.evaluate("window.__noReload") is True  # the same page, updated in place
    shots(page, "2-overview-after-ack")
    alert.refresh_from_db()
    assert alert.acked_by == oncall and alert.acked_at is not None
    assert AuditEntry.objects.filter(action="alert.acknowledge", actor=oncall.username).exists()
    assert AuditEntry.objects.filter(action="incident.acknowledge", actor=oncall.username).exists()


def test_r8_3_operator_forces_a_fresh_start_and_sees_every_provider_eligible(
    page_for, operator, frozen_segment, shots, live_server
):
    """R8.1, R8.3: the segment page shows the frozen provider; a fresh start with a reason
    opens a new segment where every provider is eligible, and the audit log has it."""
    _thread, segment, _alert = frozen_segment
    page = page_for(operator.username)
    page.locator("#board").get_by_role("link", name=segment.key).first.click()
    page.get_by_role("heading", name="Boundary actions").wait_for()
    assert "frozen" in page.locator("main").inner_text()
    shots(page, "1-frozen-segment")
    page.get_by_role("link", name="Fresh start…").click()
    page.get_by_label("Reason").fill("primary frozen on the customer's pasted report")
    shots(page, "2-confirm-fresh-start")
    page.get_by_role("button", name="Fresh start now").click()
    page.get_by_text("every provider is eligible again").first.wait_for()
    new_segment = services.open_segment(segment.thread)
    assert new_segment.key != segment.key and new_segment.segment_no == 1
    assert page.url.endswith(f"/segments/{new_segment.id}/")
    states = page.locator("main .state").all_inner_texts()
    assert "frozen" not in states and "cooling" not in states
    assert "eligible" in states
    shots(page, "3-new-segment-all-eligible")
    page.get_by_role("link", name="Audit log").click()
    log = page.locator("main").inner_text()
    assert operator.username in log and "primary frozen on the customer's pasted report" in log
    shots(page, "4-audit-log")


def test_r8_4_manager_filters_a_week_sees_discrepancies_and_downloads_the_csv(
    page_for, manager, shots, tmp_path
):
    """R8.4: a manager filters a week, sees the discrepancy and downloads the CSV."""
    import csv

    now = time_source.now()
    Provider.objects.create(provider_id="primary", kind="scripted", model="primary-model")
    thread = services.create_thread(provider_chain=["primary"], now=now)
    run, _stage, _ = services.submit_run(thread, input="report please", now=now - timedelta(days=2))
    services.commit_chunks(run, ["first part ", "second part"], now - timedelta(days=2))
    written.settle(
        run,
        Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "The model completed its answer."),
        now - timedelta(days=2),
    )
    page = page_for(manager.username)
    page.get_by_role("link", name="Delivery report").click()
    page.get_by_label("From (UTC)").fill((now - timedelta(days=6)).date().isoformat())
    page.get_by_label("To (UTC, inclusive)").fill(now.date().isoformat())
    page.get_by_role("button", name="Show report").click()
    discrepancies = page.locator("#discrepancies")
    discrepancies.get_by_text(str(run.id)[:8]).first.wait_for()
    shots(page, "1-report-week")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download CSV").click()
    target = tmp_path / "report.csv"
    download_info.value.save_as(target)
    rows = list(csv.reader(target.open(newline="")))
    flat = [cell for row in rows for cell in row]
    assert str(run.id) in flat
    assert any("never" in cell or "no_client_evidence" in cell for cell in flat)
