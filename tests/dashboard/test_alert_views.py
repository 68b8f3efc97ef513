"""Alerts inbox (R8.2, R3.6): critical freeze alerts first, acknowledged once by a
named person with a time, visible to everyone; acknowledging needs the permission."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from governance import services, time_source
from governance.models import AuditEntry, Notification, Provider
from governance.rules.refusal import RULE_TEXT

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 2, 3, 0, tzinfo=UTC)
HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def fixed_clock():
    time_source.install(time_source.ManualClock(NOW))
    yield
    time_source.install(None)


@pytest.fixture
def segment():
    for provider_id in ("alpha", "beta"):
        Provider.objects.create(provider_id=provider_id, kind="scripted", model=f"{provider_id}-1")
    thread = services.create_thread(
        provider_chain=["alpha", "beta"], now=NOW - timedelta(days=1), title="Refunds"
    )
    return thread.segments.get()


def notify(segment, severity, *, minutes_ago, acked_by=None, reprobes=None, provider="alpha"):
    reprobes = (3 if severity == "critical" else 0) if reprobes is None else reprobes
    return Notification.objects.create(
        dedupe_key=f"provider-refusal:{segment.key}:{reprobes}:{provider}:{minutes_ago}",
        severity=severity,
        text=f"Content refused in segment {segment.key} by {provider}: {RULE_TEXT}.",
        segment=segment,
        provider_ids=[provider],
        reprobes=reprobes,
        created_at=NOW - timedelta(minutes=minutes_ago),
        acked_by=acked_by,
        acked_at=NOW - timedelta(minutes=minutes_ago - 1) if acked_by else None,
    )


def order_of(body: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<article id="alert-(\d+)"', body)]


def ack_button(notification) -> str:
    return f'action="{reverse("alert-ack", args=[notification.pk])}"'


# --------------------------------------------------------------------------- access


def test_r8_2_anonymous_is_sent_to_login_and_cannot_acknowledge(client, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    for response in (
        client.get(reverse("alerts")),
        client.get(reverse("alerts"), {"fragment": "critical"}),
        client.post(reverse("alert-ack", args=[alert.pk])),
    ):
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))
    alert.refresh_from_db()
    assert alert.acked_at is None and not AuditEntry.objects.exists()


@pytest.mark.parametrize("role", ["manager", "outsider"])
def test_r8_2_without_the_permission_no_button_and_a_forged_post_is_403(
    client, request, segment, role
):
    user = request.getfixturevalue(role)
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(user)
    body = client.get(reverse("alerts")).content.decode()
    assert f'id="alert-{alert.pk}"' in body  # every logged-in role reads the inbox
    assert ack_button(alert) not in body
    assert "Waiting for on-call to acknowledge." in body
    for headers in ({}, HTMX):
        response = client.post(reverse("alert-ack", args=[alert.pk]), headers=headers)
        assert response.status_code == 403
    alert.refresh_from_db()
    assert alert.acked_at is None and alert.acked_by is None
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("role", ["oncall", "operator"])
def test_r8_2_on_call_and_operators_see_the_acknowledge_button(client, request, segment, role):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(request.getfixturevalue(role))
    body = client.get(reverse("alerts")).content.decode()
    assert ack_button(alert) in body
    assert f'hx-post="{reverse("alert-ack", args=[alert.pk])}"' in body


def test_r8_2_acknowledge_is_post_only(client, oncall, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(oncall)
    assert client.get(reverse("alert-ack", args=[alert.pk])).status_code == 405
    assert client.post(reverse("alerts")).status_code == 405
    alert.refresh_from_db()
    assert alert.acked_at is None


def test_r8_2_unknown_alert_is_404_and_changes_nothing(client, oncall, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(oncall)
    assert client.post(reverse("alert-ack", args=[alert.pk + 1000])).status_code == 404
    assert (
        client.post(reverse("alert-ack", args=[alert.pk + 1000]), headers=HTMX).status_code == 404
    )
    assert not AuditEntry.objects.exists()


# --------------------------------------------------------------------------- the list


def test_r8_2_critical_unacknowledged_first_then_newest_normal_below(client, oncall, segment):
    """R8.2/R3.6: critical before normal; inside each, unacknowledged on top, newest first."""
    critical_acked_newest = notify(segment, "critical", minutes_ago=1, acked_by=oncall)
    normal_unacked_newest = notify(segment, "normal", minutes_ago=2)
    critical_unacked_old = notify(segment, "critical", minutes_ago=300)
    critical_unacked_new = notify(segment, "critical", minutes_ago=30)
    normal_acked = notify(segment, "normal", minutes_ago=3, acked_by=oncall)
    normal_unacked_old = notify(segment, "normal", minutes_ago=400)
    client.force_login(oncall)
    body = client.get(reverse("alerts")).content.decode()
    assert order_of(body) == [
        critical_unacked_new.pk,
        critical_unacked_old.pk,
        critical_acked_newest.pk,
        normal_unacked_newest.pk,
        normal_unacked_old.pk,
        normal_acked.pk,
    ]
    critical_heading = body.index("Critical — frozen, a boundary action is needed")
    normal_heading = body.index("Normal — first refusal")
    assert critical_heading < body.index(f'id="alert-{critical_unacked_new.pk}"')
    assert body.index(f'id="alert-{critical_acked_newest.pk}"') < normal_heading
    assert '<span class="state critical">2 critical unacknowledged</span>' in body


def test_r8_2_each_alert_says_state_text_segment_providers_and_who_acknowledged(
    client, manager, oncall, segment
):
    acked = notify(segment, "critical", minutes_ago=20, acked_by=oncall)
    waiting = notify(segment, "normal", minutes_ago=10, provider="beta")
    client.force_login(manager)
    body = client.get(reverse("alerts")).content.decode()
    segment_url = reverse("segment", args=[segment.pk])
    assert f'<a class="mono" href="{segment_url}">{segment.key}</a>' in body
    assert (
        "the boundary actions (compact, fresh start or switch model) are on the segment page"
        in body
    )
    assert f'href="{segment_url}">Open segment {segment.key} — boundary actions</a>' in body
    assert RULE_TEXT in body  # R3.7: the copy says the rule in its one voice
    assert '<span class="state critical">Critical</span>' in body
    assert '<span class="state normal">Normal</span>' in body
    assert '<span class="state acknowledged">Acknowledged</span>' in body
    assert '<span class="state unacknowledged">Unacknowledged</span>' in body
    assert f'href="{reverse("providers")}#provider-beta">beta</a>' in body
    # Acknowledged by NAME at TIME, for everyone to see.
    assert "by <strong>olive-oncall</strong> at <time" in body
    assert f'datetime="{acked.acked_at.isoformat()}"' in body
    assert f'datetime="{waiting.created_at.isoformat()}"' in body


def test_r8_2_alert_of_a_closed_segment_points_to_the_new_one(client, oncall, segment):
    """R3.8: after a boundary every provider is eligible again in the new segment."""
    notify(segment, "critical", minutes_ago=60)
    opened, _ = services.apply_boundary(
        segment.thread, "fresh_start", by="oscar", reason="frozen", now=NOW - timedelta(minutes=5)
    )
    client.force_login(oncall)
    body = client.get(reverse("alerts")).content.decode()
    assert "closed by a fresh start" in body
    assert f'href="{reverse("segment", args=[opened.pk])}">{opened.key}</a>' in body
    assert "every provider eligible again" in body
    assert "Open segment" not in body  # no boundary to take on a closed segment


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"state": "unacknowledged"}, {"crit_open", "norm_open"}),
        ({"state": "acknowledged"}, {"crit_done", "norm_done"}),
        ({"severity": "critical"}, {"crit_open", "crit_done"}),
        ({"severity": "normal", "state": "all"}, {"norm_open", "norm_done"}),
        ({"state": "unacknowledged", "severity": "critical"}, {"crit_open"}),
        ({"state": "acknowledged", "severity": "normal"}, {"norm_done"}),
        ({}, {"crit_open", "crit_done", "norm_open", "norm_done"}),
    ],
)
def test_r8_2_filter_by_state_and_severity(client, oncall, segment, query, expected):
    alerts = {
        "crit_open": notify(segment, "critical", minutes_ago=5),
        "crit_done": notify(segment, "critical", minutes_ago=6, acked_by=oncall),
        "norm_open": notify(segment, "normal", minutes_ago=7),
        "norm_done": notify(segment, "normal", minutes_ago=8, acked_by=oncall),
    }
    client.force_login(oncall)
    response = client.get(reverse("alerts"), query)
    assert response.status_code == 200
    shown = set(order_of(response.content.decode()))
    assert shown == {alerts[name].pk for name in expected}


def test_r8_2_bad_filter_is_a_form_error_with_400(client, oncall, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(oncall)
    response = client.get(reverse("alerts"), {"state": "snoozed", "severity": "loud"})
    body = response.content.decode()
    assert response.status_code == 400
    assert 'role="alert"' in body and "Select a valid choice" in body
    assert order_of(body) == [alert.pk]  # the list falls back to everything
    alert.refresh_from_db()
    assert alert.acked_at is None


def test_r8_2_htmx_filter_gets_only_the_inbox_fragment(client, oncall, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(oncall)
    response = client.get(reverse("alerts"), {"severity": "critical"}, headers=HTMX)
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="alert-inbox"')
    assert "<html" not in body and order_of(body) == [alert.pk]
    assert "HX-Request" in response["Vary"]
    # The inbox refreshes itself with its filters: a new alert shows without a reload.
    assert 'hx-get="/alerts/?severity=critical"' in body and 'hx-trigger="every 15s"' in body
    newer = notify(segment, "critical", minutes_ago=1)
    again = client.get(reverse("alerts"), {"severity": "critical"}, headers=HTMX)
    assert order_of(again.content.decode()) == [newer.pk, alert.pk]


def test_r8_2_pagination_25_per_page_keeps_filters_and_no_n_plus_1(
    client, oncall, segment, django_assert_max_num_queries
):
    for minutes in range(1, 31):
        notify(segment, "critical", minutes_ago=minutes, acked_by=oncall if minutes % 2 else None)
    client.force_login(oncall)
    with django_assert_max_num_queries(7):
        first = client.get(reverse("alerts"), {"severity": "critical"})
    body = first.content.decode()
    assert len(order_of(body)) == 25
    assert "Page 1 of 2 (30 in all)" in body
    assert 'href="?severity=critical&amp;page=2"' in body
    with django_assert_max_num_queries(7):
        second = client.get(reverse("alerts"), {"severity": "critical", "page": 2})
    assert len(order_of(second.content.decode())) == 5
    assert set(order_of(body)).isdisjoint(order_of(second.content.decode()))


def test_r8_2_empty_inbox_explains_what_will_appear(client, manager):
    client.force_login(manager)
    body = client.get(reverse("alerts")).content.decode()
    assert (
        "No alerts. Freeze alerts appear here when a provider's re-probes are used up in a segment."
        in body
    )
    assert '<span class="state ok">No critical alert waiting</span>' in body


def test_r8_2_filtered_empty_inbox_offers_to_show_all(client, oncall, segment):
    notify(segment, "normal", minutes_ago=5)
    client.force_login(oncall)
    body = client.get(reverse("alerts"), {"severity": "critical"}).content.decode()
    assert "No alerts match these filters." in body
    assert f'<a href="{reverse("alerts")}">Show all alerts</a>' in body


def test_r8_2_live_critical_count_fragment(client, manager, oncall, segment):
    """The overview polls /alerts/?fragment=critical for the unacknowledged critical count."""
    notify(segment, "critical", minutes_ago=5)
    notify(segment, "critical", minutes_ago=6)
    notify(segment, "critical", minutes_ago=7, acked_by=oncall)
    notify(segment, "normal", minutes_ago=8)
    client.force_login(manager)
    response = client.get(reverse("alerts"), {"fragment": "critical"}, headers=HTMX)
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<a id="critical-count"')
    assert "<html" not in body and "2 critical unacknowledged" in body
    assert 'hx-trigger="every 15s, alerts-changed from:body"' in body
    assert 'href="/alerts/?state=unacknowledged&amp;severity=critical"' in body


# --------------------------------------------------------------------------- acknowledge


def test_r8_2_one_click_htmx_ack_swaps_the_row_and_records_who_and_when(client, oncall, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    other = notify(segment, "critical", minutes_ago=6)
    client.force_login(oncall)
    response = client.post(reverse("alert-ack", args=[alert.pk]), headers=HTMX)
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith(f'<article id="alert-{alert.pk}"')
    assert "<html" not in body and f'id="alert-{other.pk}"' not in body
    assert '<span class="state acknowledged">Acknowledged</span>' in body
    assert "by <strong>olive-oncall</strong> at <time" in body
    assert ack_button(alert) not in body  # done: the button is gone
    assert response["HX-Trigger"] == "alerts-changed"
    alert.refresh_from_db()
    assert alert.acked_by == oncall and alert.acked_at == NOW
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.target_type, entry.target_id, entry.at) == (
        "alert.acknowledge",
        "olive-oncall",
        "notification",
        str(alert.pk),
        NOW,
    )
    other.refresh_from_db()
    assert other.acked_at is None
    count = client.get(reverse("alerts"), {"fragment": "critical"}).content.decode()
    assert "1 critical unacknowledged" in count


def test_r8_2_second_ack_keeps_the_first_person_and_time(client, oncall, operator, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(oncall)
    client.post(reverse("alert-ack", args=[alert.pk]), headers=HTMX)
    time_source.current().advance(minutes=3)
    client.force_login(operator)
    response = client.post(reverse("alert-ack", args=[alert.pk]), headers=HTMX)
    body = response.content.decode()
    assert response.status_code == 200
    assert "Already acknowledged by olive-oncall at <time" in body
    assert "your click changed nothing" in body
    alert.refresh_from_db()
    assert alert.acked_by == oncall and alert.acked_at == NOW
    assert AuditEntry.objects.count() == 1
    # The plain form says the same in a message.
    response = client.post(reverse("alert-ack", args=[alert.pk]), follow=True)
    assert (
        f"Alert #{alert.pk} was already acknowledged by olive-oncall at "
        f"{NOW:%Y-%m-%d %H:%M} UTC; nothing changed." in response.content.decode()
    )
    assert AuditEntry.objects.count() == 1


def test_r8_2_plain_form_ack_redirects_back_keeping_the_filters(client, oncall, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(oncall)
    response = client.post(
        reverse("alert-ack", args=[alert.pk]),
        {"state": "unacknowledged", "severity": "critical", "page": "2"},
    )
    assert response.status_code == 302
    assert response["Location"] == (
        f"{reverse('alerts')}?state=unacknowledged&severity=critical&page=2#alert-{alert.pk}"
    )
    alert.refresh_from_db()
    assert alert.acked_by == oncall
    page = client.get(response["Location"]).content.decode()
    assert f"Alert #{alert.pk} acknowledged by you at {NOW:%Y-%m-%d %H:%M} UTC." in page


def test_r8_2_ack_redirect_drops_anything_but_known_filters(client, oncall, segment):
    alert = notify(segment, "normal", minutes_ago=5)
    client.force_login(oncall)
    response = client.post(
        reverse("alert-ack", args=[alert.pk]),
        {"state": "//evil.example", "severity": "x", "page": "2;drop", "next": "https://evil"},
    )
    assert response["Location"] == f"{reverse('alerts')}#alert-{alert.pk}"


def test_r8_2_ack_form_carries_the_current_filters(client, oncall, segment):
    alert = notify(segment, "critical", minutes_ago=5)
    client.force_login(oncall)
    body = client.get(
        reverse("alerts"), {"state": "unacknowledged", "severity": "critical"}
    ).content.decode()
    form = body[
        body.index(ack_button(alert)) : body.index("</form>", body.index(ack_button(alert)))
    ]
    assert '<input type="hidden" name="state" value="unacknowledged">' in form
    assert '<input type="hidden" name="severity" value="critical">' in form
    assert 'name="csrfmiddlewaretoken"' in form


def test_r8_2_an_alert_channel_aimed_at_the_metadata_address_is_a_form_error():
    """The admin form refuses a target the send would refuse (and disable the channel for)."""
    from governance.admin import AlertChannelForm

    data = {"name": "meta", "kind": "webhook", "target": "http://169.254.169.254/latest"}
    data |= {"routing_key_env": "", "escalation_order": 1, "daily_budget": 10, "enabled": True}
    form = AlertChannelForm(data=data)
    assert not form.is_valid()
    assert "the cloud metadata service" in " ".join(form.errors["target"])
