"""Incidents (R8.2): a segment's freeze and "no eligible provider" alerts are one
incident, acknowledged once with a note, resolved by the boundary that clears
the cause (saying which and by whom) or by hand; escalation goes through the
incident's lead alert only. The service, the API and the pages."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from governance import services, time_source
from governance.models import (
    AlertChannel,
    ApiToken,
    AuditEntry,
    Incident,
    IncidentStep,
    Notification,
    NotificationDelivery,
    Provider,
)
from governance.rules.refusal import (
    ProviderRefusal,
    no_eligible_provider_notice,
    refusal_notice,
)
from governance.services import alerts
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db

T0 = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
TOKEN = "incident-api-token-" + "i" * 24


@pytest.fixture
def clock():
    the_clock = time_source.ManualClock(T0)
    time_source.install(the_clock)
    yield the_clock
    time_source.install(None)


def frozen_segment(title: str = "refund bot", at: datetime = T0):
    for pid in ("alpha", "beta"):
        Provider.objects.get_or_create(
            provider_id=pid, defaults={"kind": "scripted", "model": f"{pid}-m"}
        )
    thread = services.create_thread(provider_chain=["alpha", "beta"], title=title, now=at)
    return thread, services.open_segment(thread)


def freeze(segment, at: datetime, provider: str = "alpha") -> Notification:
    """The freeze alert (critical, R3.6) of ``segment``'s provider, refused at ``at``."""
    refusal = ProviderRefusal(provider, refusals=4, refused_at=at, category="content_filter")
    notice = refusal_notice(segment.key, [refusal], at + timedelta(seconds=30))
    assert notice.severity == "critical"
    notification, created = services.emit_notice(notice, segment)
    assert created
    return notification


def no_eligible_provider(segment, at: datetime) -> Notification:
    refusals = {
        pid: ProviderRefusal(pid, refusals=4, refused_at=at - timedelta(minutes=1))
        for pid in ("alpha", "beta")
    }
    notice = no_eligible_provider_notice(
        run_id="run-1", segment_key=segment.key, provider_ids=["alpha", "beta"],
        refusals=refusals, now=at, boundary_action_needed="A boundary action is needed",
    )  # fmt: skip
    notification, created = services.emit_notice(notice, segment)
    assert created
    return notification


# --------------------------------------------------------------------------- the service


def test_r8_2_a_segments_critical_alerts_are_one_incident_acknowledged_once(clock, oncall):
    _thread, segment = frozen_segment()
    first = freeze(segment, T0)
    second = no_eligible_provider(segment, T0 + timedelta(minutes=2))
    incident = Incident.objects.get()
    assert {first.incident_id, second.incident_id} == {incident.id}
    assert (first.leads_incident, second.leads_incident) == (True, False)
    assert incident.key == f"incident:{segment.key}:1" and incident.state == "triggered"
    # The incident opens at its fact's time: the refusal, not the turn's later moment.
    assert incident.opened_at == T0

    _same, changed = services.acknowledge_incident(
        incident.id, user=oncall, now=T0 + timedelta(minutes=5), note="looking at the prompt"
    )
    assert changed
    for alert in (first, second):
        alert.refresh_from_db()
        assert (alert.acked_by, alert.acked_at) == (oncall, T0 + timedelta(minutes=5))
    step = IncidentStep.objects.get(kind="acknowledged")
    assert (step.actor, step.note) == (oncall.username, "looking at the prompt")
    entry = AuditEntry.objects.get(action="incident.acknowledge")
    assert entry.reason == "looking at the prompt" and entry.target_id == str(incident.id)

    # A second acknowledgement changes nothing and keeps the first person.
    again, changed = services.acknowledge_incident(
        incident.id, user=oncall, now=T0 + timedelta(minutes=9)
    )
    assert not changed and again.acked_at == T0 + timedelta(minutes=5)


def test_r8_2_acknowledging_one_alert_acknowledges_its_incident_and_siblings(clock, oncall):
    _thread, segment = frozen_segment()
    first = freeze(segment, T0)
    second = no_eligible_provider(segment, T0 + timedelta(minutes=1))
    _alert, changed = services.acknowledge_notification(second.id, user=oncall, now=T0)
    assert changed
    first.refresh_from_db()
    assert first.acked_at == T0
    assert Incident.objects.get().state == "acknowledged"
    # An alert joining an incident someone already took is covered by that acknowledgement.
    late = freeze(segment, T0 + timedelta(minutes=3), provider="beta")
    late.refresh_from_db()
    assert late.acked_by == oncall and late.incident_id == first.incident_id
    assert Incident.objects.count() == 1


def test_r8_2_a_boundary_resolves_the_incident_and_says_which_and_who(clock, operator, oncall):
    thread, segment = frozen_segment()
    alert = freeze(segment, T0)
    services.apply_boundary(
        thread, "fresh_start", by=operator.username, reason="drop the refused history",
        now=T0 + timedelta(minutes=10),
    )  # fmt: skip
    incident = Incident.objects.get()
    assert incident.state == "resolved" and incident.resolved_at == T0 + timedelta(minutes=10)
    assert (incident.resolved_how, incident.resolved_by) == ("by a fresh start", operator.username)
    step = incident.steps.get(kind="resolved")
    assert (step.actor, step.note) == (operator.username, "drop the refused history")
    alert.refresh_from_db()
    assert alert.resolved_at == T0 + timedelta(minutes=10)
    # A resolved incident never asks for a person, and cannot be acknowledged any more.
    _same, changed = services.acknowledge_incident(incident.id, user=oncall, now=T0)
    assert not changed and Incident.objects.get().state == "resolved"


def test_r8_2_resolved_by_hand_a_new_freeze_opens_a_second_incident(clock, oncall):
    _thread, segment = frozen_segment()
    freeze(segment, T0)
    first = Incident.objects.get()
    _inc, changed = services.resolve_incident(first.id, user=oncall, now=T0, note="handled")
    assert changed
    assert not services.resolve_incident(first.id, user=oncall, now=T0)[1]
    no_eligible_provider(segment, T0 + timedelta(minutes=1))
    second = Incident.objects.exclude(id=first.id).get()
    assert second.key == f"incident:{segment.key}:2" and second.state == "triggered"


def test_r8_2_an_incident_escalates_through_its_lead_alert_only(clock, settings, oncall):
    settings.GOVERNANCE_ESCALATION_MINUTES = 15
    AlertChannel.objects.create(name="first", kind="webhook", target="https://a.example/h")
    AlertChannel.objects.create(
        name="second", kind="webhook", target="https://b.example/h", escalation_order=1
    )
    _thread, segment = frozen_segment()
    lead = freeze(segment, T0)
    joined = no_eligible_provider(segment, T0 + timedelta(minutes=1))
    escalated = alerts.escalate_due(T0 + timedelta(minutes=16))
    assert escalated == [lead.id]
    rows = NotificationDelivery.objects.filter(event="escalate-1")
    assert [(r.notification_id, r.channel.name) for r in rows] == [(lead.id, "second")]
    step = IncidentStep.objects.get(kind="escalated")
    assert (step.escalation_level, step.notification_id) == (1, lead.id)
    assert joined.id not in alerts.escalate_due(T0 + timedelta(hours=2))
    services.acknowledge_incident(lead.incident_id, user=oncall, now=T0 + timedelta(hours=2))
    assert alerts.escalate_due(T0 + timedelta(hours=5)) == []


# --------------------------------------------------------------------------- the API


def _token_user(django_user_model, name: str, token: str, *codenames: str):
    user = django_user_model.objects.create_user(name)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(token))
    return {"Authorization": f"Bearer {token}"}


def _post(client, path: str, body, headers):
    return client.post(
        path, data=json.dumps(body), content_type="application/json", headers=headers
    )


def test_r8_2_incident_api_lists_acknowledges_with_a_note_and_resolves(
    client, clock, django_user_model
):
    auth = _token_user(
        django_user_model, "pager-bot", TOKEN, "acknowledge_notification", "see_all_runs"
    )
    _thread, segment = frozen_segment()
    alert = freeze(segment, T0)
    for n in range(3):  # older incidents, resolved: not in the default (open) list
        _t, other = frozen_segment(f"old {n}", at=T0 - timedelta(days=1))
        freeze(other, T0 - timedelta(days=1, minutes=n))
        services.resolve_incident(
            other.incidents.get().id, user=django_user_model.objects.get(), now=T0
        )
    listed = client.get("/api/v1/incidents", headers=auth).json()
    assert [i["id"] for i in listed["items"]] == [alert.incident_id]
    item = listed["items"][0]
    assert item["needs_a_person"] and item["thread_title"] == "refund bot"
    assert item["url"].endswith(f"/incidents/{alert.incident_id}/")
    # Every state, paged by the cursor.
    first = client.get("/api/v1/incidents?state=all&limit=2", headers=auth).json()
    rest = client.get(
        f"/api/v1/incidents?state=all&limit=2&cursor={first['next_cursor']}", headers=auth
    ).json()
    assert len(first["items"]) == 2 and len(rest["items"]) == 2 and rest["next_cursor"] is None
    assert len({i["id"] for i in first["items"] + rest["items"]}) == 4

    path = f"/api/v1/incidents/{alert.incident_id}"
    acked = _post(client, f"{path}/ack", {"note": "on it"}, auth)
    assert acked.status_code == 200, acked.content
    body = acked.json()
    assert body["changed"] and body["state"] == "acknowledged"
    assert body["acknowledged_by"] == "pager-bot" and not body["needs_a_person"]
    assert [s["kind"] for s in body["steps"]] == ["triggered", "acknowledged"]
    assert body["steps"][1]["note"] == "on it"
    assert not _post(client, f"{path}/ack", {}, auth).json()["changed"]

    resolved = _post(client, f"{path}/resolve", {"note": "prompt fixed upstream"}, auth).json()
    assert resolved["changed"] and resolved["resolved_how"] == "by hand"
    assert client.get("/api/v1/incidents", headers=auth).json()["items"] == []


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("/api/v1/incidents/99999/ack", {}, 404, None),
        ("/api/v1/incidents/nope/ack", {}, 404, None),
        ("/api/v1/incidents/{id}/ack", {"note": "x" * 2001}, 400, "note"),
        ("/api/v1/incidents/{id}/ack", {"notes": "typo"}, 400, "notes"),
        ("/api/v1/incidents/{id}/resolve", {"note": 5}, 400, "note"),
    ],
)
def test_r8_2_incident_api_refuses_bad_input_and_changes_nothing(
    client, clock, django_user_model, path, body, status, field
):
    auth = _token_user(
        django_user_model, "pager-bot", TOKEN, "acknowledge_notification", "see_all_runs"
    )
    _thread, segment = frozen_segment()
    alert = freeze(segment, T0)
    response = _post(client, path.format(id=alert.incident_id), body, auth)
    assert response.status_code == status
    assert response.json()["error"]["field"] == field
    assert (
        Incident.objects.get().state == "triggered"
        and not IncidentStep.objects.filter(kind__in=["acknowledged", "resolved"]).exists()
    )


def test_r8_2_incident_api_needs_the_permission_and_hides_others_incidents(
    client, clock, django_user_model
):
    reader = _token_user(django_user_model, "reader", "reader-token-" + "r" * 24)
    _thread, segment = frozen_segment()
    alert = freeze(segment, T0)
    refused = _post(client, f"/api/v1/incidents/{alert.incident_id}/ack", {}, reader)
    assert refused.status_code == 403 and "acknowledge_notification" in refused.content.decode()
    # A service account (no see_all_runs) sees only its own threads' incidents.
    assert client.get("/api/v1/incidents", headers=reader).json()["items"] == []
    assert client.get(f"/api/v1/incidents/{alert.incident_id}", headers=reader).status_code == 404
    assert Incident.objects.get().state == "triggered"


# --------------------------------------------------------------------------- the pages


def test_r8_2_incident_page_shows_why_escalation_and_pages_then_acks_with_a_note(
    client, clock, oncall
):
    _thread, segment = frozen_segment("billing assistant")
    alert = freeze(segment, T0)
    client.force_login(oncall)
    page = client.get(reverse("incident", args=[alert.incident_id])).content.decode()
    assert f"Incident #{alert.incident_id}: billing assistant" in page
    assert "No alert channel is configured: nobody is paged." in page
    assert "Nobody has acknowledged it yet." in page
    assert reverse("segment", args=[segment.id]) in page

    AlertChannel.objects.create(name="ops-pager", kind="webhook", target="https://p.example/h")
    page = client.get(reverse("incident", args=[alert.incident_id])).content.decode()
    assert "Tier 1 — the trigger: ops-pager" in page and "nobody is paged" not in page

    response = client.post(
        reverse("incident-ack", args=[alert.incident_id]), {"note": "rolling back the prompt"},
        headers={"HX-Request": "true"},
    )  # fmt: skip
    assert response.status_code == 200 and response["HX-Trigger"] == "alerts-changed"
    fragment = response.content.decode()
    assert "Acknowledged by you" in fragment and "data-focus-after-swap" in fragment
    assert "“rolling back the prompt”" in fragment
    assert Incident.objects.get().acked_by == oncall


def test_r8_2_a_manager_gets_a_page_that_says_what_to_do_not_a_bare_403(
    client, clock, manager, caplog
):
    _thread, segment = frozen_segment()
    alert = freeze(segment, T0)
    client.force_login(manager)
    response = client.post(reverse("incident-ack", args=[alert.incident_id]))
    assert response.status_code == 403
    body = response.content.decode()
    assert "You may not do this" in body and "on-call or operator role" in body
    assert '<nav aria-label="Main">' in body  # the dashboard's own page, the way back
    assert Incident.objects.get().state == "triggered"
    refused = [r for r in caplog.records if r.name == "django.request"]
    assert refused and all(r.exc_info is None for r in refused)  # one line, no traceback


def test_r8_2_an_action_after_the_session_expired_says_so_and_comes_back(client, clock):
    _thread, segment = frozen_segment()
    alert = freeze(segment, T0)
    page = f"http://testserver{reverse('incident', args=[alert.incident_id])}"
    response = client.post(
        reverse("incident-ack", args=[alert.incident_id]),
        headers={"HX-Request": "true", "HX-Current-URL": page},
    )
    assert response.status_code == 200 and response.content == b""
    target = response["HX-Redirect"]
    assert target.startswith(reverse("login")) and "expired=1" in target
    assert f"next=%2Fincidents%2F{alert.incident_id}%2F" in target
    login = client.get(target).content.decode()
    assert "Your session expired — log in again." in login
    assert f'name="next" value="/incidents/{alert.incident_id}/"' in login
    # A plain form comes back to the page it was posted from, not to the POST-only address.
    plain = client.post(
        reverse("incident-ack", args=[alert.incident_id]), headers={"Referer": page}
    )
    assert plain.status_code == 302 and "expired=1" in plain["Location"]
    assert f"next=%2Fincidents%2F{alert.incident_id}%2F" in plain["Location"]
    # Somewhere else entirely is never where it goes back to.
    away = client.post(
        reverse("incident-ack", args=[alert.incident_id]),
        headers={"HX-Request": "true", "HX-Current-URL": "https://evil.example/x"},
    )
    assert "next=%2F&" in away["HX-Redirect"]
    assert Incident.objects.get().state == "triggered"


def test_r8_2_the_incident_list_refreshes_itself_and_filters(client, clock, oncall):
    _thread, segment = frozen_segment()
    alert = freeze(segment, T0)
    client.force_login(oncall)
    page = client.get(reverse("incidents")).content.decode()
    assert 'hx-trigger="every 10s, alerts-changed from:body"' in page
    assert f"Incident #{alert.incident_id}: refund bot" in page
    fragment = client.get(
        reverse("incidents"), {"state": "resolved"}, headers={"HX-Request": "true"}
    ).content.decode()
    assert fragment.lstrip().startswith('<section id="incident-list"')
    assert f"Incident #{alert.incident_id}" not in fragment
    bad = client.get(reverse("incidents"), {"state": "nonsense"})
    assert bad.status_code == 400 and f"Incident #{alert.incident_id}" in bad.content.decode()


def test_r8_2_operators_may_see_an_excerpt_of_the_refused_request_where_allowed(
    client, clock, settings, oncall, operator
):
    thread, segment = frozen_segment()
    services.submit_run(thread, input="Summarise the leaked customer file " + "x" * 900, now=T0)
    alert = freeze(segment, T0)
    url = reverse("incident", args=[alert.incident_id])
    settings.GOVERNANCE_INCIDENT_EXCERPT = True
    client.force_login(operator)
    page = client.get(url).content.decode()
    assert "Refused request" in page and "Summarise the leaked customer file" in page
    assert "x" * 465 + "…" in page and "x" * 466 not in page  # 500 characters, no more
    client.force_login(oncall)  # not an operator: never the customer's words
    assert "Summarise the leaked" not in client.get(url).content.decode()
    settings.GOVERNANCE_INCIDENT_EXCERPT = False  # the production default
    client.force_login(operator)
    assert "Summarise the leaked" not in client.get(url).content.decode()
