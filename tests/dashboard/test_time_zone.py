"""The viewer's own time zone: chosen once, kept with the user, and every
absolute time on every page shown in it with its zone, the relative words
beside it. Without a choice the server writes UTC and the page script the
browser's zone (tests/browser/test_time_zone.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from governance import time_source
from governance.models import AuditEntry, ViewerPreference

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)


def body_of(response) -> str:
    return response.content.decode()


@pytest.fixture
def clock():
    manual = time_source.ManualClock(T0)
    time_source.install(manual)
    yield manual
    time_source.install(None)


@pytest.fixture
def entry(clock):
    """An audit entry an hour old: the Audit log shows its time."""
    return AuditEntry.objects.create(
        at=T0 - timedelta(hours=1), actor="oscar", action="boundary.fresh_start",
        target_type="segment", target_id="1", reason="why",
    )  # fmt: skip


def test_without_a_choice_times_are_written_in_utc_and_the_page_asks_the_browser(
    client, oncall, entry
):
    client.force_login(oncall)
    body = body_of(client.get(reverse("audit")))
    assert "data-time-zone" not in body.split("<head>", 1)[0]
    assert (
        'data-format="short" title="2026-01-15 11:00:00 UTC">Jan 15 11:00 UTC</time> '
        '<span class="relative">(1 h ago)</span>' in body
    )
    assert '<span data-browser-zone="name">browser\'s zone</span>' in body


def test_a_chosen_zone_is_kept_and_every_page_shows_it_labelled(client, oncall, entry):
    client.force_login(oncall)
    response = client.post(
        reverse("time-zone"), {"time_zone": "Europe/Berlin", "next": reverse("audit")}
    )
    assert response.status_code == 302 and response["Location"] == reverse("audit")
    assert ViewerPreference.objects.get(user=oncall).time_zone == "Europe/Berlin"
    body = body_of(client.get(reverse("audit")))
    assert '<html lang="en" data-time-zone="Europe/Berlin">' in body
    assert 'title="2026-01-15 12:00:00 CET">Jan 15 12:00 CET</time>' in body
    assert "times: Europe/Berlin" in body
    assert "Times now show in Europe/Berlin." in body

    # Another session of the same person (a phone) gets it at login.
    client.logout()
    client.force_login(oncall)
    assert 'title="2026-01-15 12:00:00 CET"' in body_of(client.get(reverse("audit")))


def test_back_to_the_browsers_zone(client, oncall, entry):
    ViewerPreference.objects.create(user=oncall, time_zone="Asia/Tokyo")
    client.force_login(oncall)
    assert "Jan 15 20:00 JST" in body_of(client.get(reverse("audit")))
    response = client.post(reverse("time-zone"), {"time_zone": ""}, follow=True)
    assert "Times now show in your browser&#x27;s zone." in body_of(response)
    assert ViewerPreference.objects.get(user=oncall).time_zone == ""
    assert "Jan 15 11:00 UTC" in body_of(client.get(reverse("audit")))


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../../etc/passwd", "UTC; DROP", "x" * 300])
def test_an_unknown_zone_is_a_form_error_and_changes_nothing(client, oncall, zone):
    client.force_login(oncall)
    response = client.post(reverse("time-zone"), {"time_zone": zone})
    assert response.status_code == 400
    assert 'role="alert"' in body_of(response) and "is not one of the available" in body_of(
        response
    )
    assert not ViewerPreference.objects.exists()


def test_next_must_stay_on_this_site(client, oncall):
    client.force_login(oncall)
    response = client.post(
        reverse("time-zone"), {"time_zone": "UTC", "next": "https://evil.example/"}
    )
    assert response.status_code == 302 and response["Location"] == reverse("time-zone")


def test_the_page_offers_the_browsers_zone_first_then_every_zone(client, oncall):
    client.force_login(oncall)
    body = body_of(client.get(reverse("time-zone") + "?next=/runs/"))
    assert body.index("Your browser&#x27;s zone") < body.index('value="Africa/Abidjan"')
    assert '<optgroup label="Europe">' in body and 'value="America/New_York"' in body
    assert 'name="next" value="/runs/"' in body


def test_signed_out_is_sent_to_log_in(client):
    response = client.post(reverse("time-zone"), {"time_zone": "UTC"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    assert not ViewerPreference.objects.exists()


def test_a_page_pays_no_query_for_the_zone(client, oncall, entry):
    """Read at login into the session: a page's queries are the same with a choice as without."""
    client.force_login(oncall)
    client.get(reverse("audit"))
    with CaptureQueriesContext(connection) as without:
        client.get(reverse("audit"))
    client.post(reverse("time-zone"), {"time_zone": "Europe/Berlin"})
    client.get(reverse("audit"))
    with CaptureQueriesContext(connection) as chosen:
        client.get(reverse("audit"))
    assert len(chosen) == len(without)
    assert not any("viewerpreference" in q["sql"] for q in chosen.captured_queries)
