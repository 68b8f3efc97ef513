"""Overview (system status) and /healthz."""

from __future__ import annotations

import pytest
from django.urls import reverse

from governance.rules.refusal import RULE_TEXT
from tasks.jobs import record_heartbeat

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("oncall", password="correct horse battery")


@pytest.fixture
def operator_role(make_user):
    return make_user("olga-operator", "operator")


def test_overview_requires_login(client):
    response = client.get(reverse("overview"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_overview_shows_each_part_in_words(client, operator):
    record_heartbeat("worker", "worker@test")
    client.force_login(operator)
    response = client.get(reverse("overview"))
    body = response.content.decode()
    assert response.status_code == 200
    for part in ("Database", "Broker", "Worker", "Scheduler", "Telemetry"):
        assert f'<th scope="row">{part}</th>' in body
    assert "worker@test" in body
    assert "Re-probe delays: 15 min, 1 h, 6 h" in body
    assert RULE_TEXT in body  # R3.7: the dashboard copy says the rule in its one voice


def test_overview_htmx_poll_returns_only_the_board_fragment(client, operator):
    client.force_login(operator)
    response = client.get(reverse("overview"), headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="board"')
    # An acknowledgement's answer says alerts-changed (HX-Trigger): the board refreshes.
    assert 'hx-trigger="every 10s, alerts-changed from:body"' in body
    assert '<section id="system-status"' in body
    assert "<html" not in body


def test_overview_rejects_post(client, operator):
    client.force_login(operator)
    assert client.post(reverse("overview")).status_code == 405


def test_healthz_reports_components_without_broker_details(client):
    record_heartbeat("worker", "worker@test")
    response = client.get(reverse("healthz"))
    data = response.json()
    assert response.status_code == 200
    assert data["ok"] is True and data["database"]["ok"] is True
    assert data["worker"]["ok"] is True
    assert data["broker"] == {"ok": True, "detail": "reachable", "age_seconds": None}
    assert "redis://" not in response.content.decode()
    assert response["Cache-Control"].startswith("max-age=0")


def test_login_page_renders_and_rejects_wrong_password(client, operator):
    response = client.post(
        reverse("login"), {"username": "oncall", "password": "wrong"}, follow=False
    )
    assert response.status_code == 200
    assert "Wrong username or password" in response.content.decode()
    response = client.post(
        reverse("login"), {"username": "oncall", "password": "correct horse battery"}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("overview")
