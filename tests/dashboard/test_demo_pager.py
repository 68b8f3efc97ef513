"""The demo's pager (R8.2): a fresh `make run` pages someone — the web's own
sink takes the alert channel's webhook, says so in the console, keeps nothing;
off in production."""

from __future__ import annotations

import logging

import pytest

from governance import services, time_source
from governance.models import AlertChannel, NotificationDelivery, Provider
from governance.rules.refusal import ProviderRefusal, refusal_notice
from tasks import alerts

pytestmark = pytest.mark.django_db(transaction=True)


def test_r8_2_the_demo_channel_pages_the_demo_pager_and_it_is_delivered(
    live_server, settings, caplog
):
    settings.GOVERNANCE_DEMO_PAGER = True
    settings.GOVERNANCE_DASHBOARD_URL = live_server.url
    AlertChannel.objects.create(
        name="demo pager (local sink)", kind="webhook", target=f"{live_server.url}/demo/pager"
    )
    Provider.objects.create(provider_id="alpha", kind="scripted", model="a-1")
    now = time_source.now()
    thread = services.create_thread(provider_chain=["alpha"], title="demo bot", now=now)
    segment = services.open_segment(thread)
    notice = refusal_notice(
        segment.key, [ProviderRefusal("alpha", refusals=4, refused_at=now)], now
    )
    services.emit_notice(notice, segment)
    with caplog.at_level(logging.WARNING, logger="dashboard.pages.demo_pager"):
        assert alerts.deliver_all_due() == ["delivered"]
    row = NotificationDelivery.objects.get()
    assert (row.state, row.status_code) == ("delivered", 200)
    said = [r.getMessage() for r in caplog.records if r.name == "dashboard.pages.demo_pager"]
    assert len(said) == 1 and "[CRITICAL]" in said[0] and "/incidents/" in said[0]


def test_the_demo_pager_refuses_what_is_not_a_webhook_and_is_off_in_production(client, settings):
    settings.GOVERNANCE_DEMO_PAGER = True
    bad = client.post("/demo/pager", data=b"{not json", content_type="application/json")
    assert bad.status_code == 400 and "error" in bad.json()
    assert (
        client.post("/demo/pager", data=b"[1]", content_type="application/json").status_code == 400
    )
    assert client.get("/demo/pager").status_code == 405
    settings.GOVERNANCE_DEMO_PAGER = False
    off = client.post("/demo/pager", data=b"{}", content_type="application/json")
    assert off.status_code == 404
