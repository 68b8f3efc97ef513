"""Routes over the API (``/api/v1/routes``), ``manage.py route`` and the
Providers page: bad input answers 4xx naming the field and writes nothing;
writes need ``change_provider``."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from dashboard.api.openapi import openapi_document
from governance import time_source
from governance.models import ApiToken, AuditEntry, Provider, Route
from governance.services import routes as route_services
from governance.services.tokens import token_digest
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.django_db

ADMIN = {"Authorization": "Bearer routes-admin-token-" + "a" * 16}
MANAGER = {"Authorization": "Bearer routes-manager-token-" + "m" * 16}


@pytest.fixture
def tokens(make_user):
    admin = make_user("routes-admin", is_superuser=True, is_staff=True)
    manager = make_user("routes-manager", "manager")
    for user, auth in ((admin, ADMIN), (manager, MANAGER)):
        token = auth["Authorization"].split(" ", 1)[1]
        ApiToken.objects.create(user=user, name="t", key_digest=token_digest(token))
    for provider_id in ("alpha", "beta"):
        Provider.objects.create(provider_id=provider_id, kind="scripted", model="m", script={})
    return admin


def call(client, auth, method, path, body=None):
    data = body if isinstance(body, bytes) else json.dumps(body) if body is not None else b""
    return client.generic(method, path, data, content_type="application/json", headers=auth)


def test_add_read_list_and_change_a_route(client, tokens):
    body = {"name": "fast", "provider_chain": ["beta", "alpha"], "description": "quick"}
    made = call(client, ADMIN, "POST", "/api/v1/routes", body)
    assert made.status_code == 201, made.content
    assert made.json()["provider_chain"] == ["beta", "alpha"]
    assert made.json()["enabled"] is True and made.json()["description"] == "quick"
    assert call(client, MANAGER, "GET", "/api/v1/routes/fast").json() == made.json()
    listed = call(client, MANAGER, "GET", "/api/v1/routes").json()["items"]
    assert [r["name"] for r in listed] == ["fast"]
    change = {"enabled": False, "provider_chain": ["alpha"], "reason": "beta retired"}
    changed = call(client, ADMIN, "PATCH", "/api/v1/routes/fast", change)
    assert changed.status_code == 200, changed.content
    assert (changed.json()["enabled"], changed.json()["provider_chain"]) == (False, ["alpha"])
    assert changed.json()["description"] == "quick"
    entries = list(AuditEntry.objects.order_by("id").values_list("action", "actor", "reason"))
    assert entries == [
        ("route.create", "routes-admin", ""),
        ("route.update", "routes-admin", "beta retired"),
    ]


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"name": "fast", "provider_chain": ["nobody"]}, 400, "provider_chain"),
        ({"name": "fast", "provider_chain": ["alpha", "alpha"]}, 400, "provider_chain"),
        ({"name": "fast", "provider_chain": []}, 400, "provider_chain"),
        ({"name": "fast bad", "provider_chain": ["alpha"]}, 400, "name"),
        ({"provider_chain": ["alpha"]}, 400, "name"),
        ({"name": "fast", "provider_chain": ["alpha"], "extra": 1}, 400, "extra"),
        ({"name": "fast", "provider_chain": ["alpha"], "enabled": "yes"}, 400, "enabled"),
        ({"name": "alpha", "provider_chain": ["beta"]}, 409, "name"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(client, tokens, body, status, field):
    response = call(client, ADMIN, "POST", "/api/v1/routes", body)
    assert response.status_code == status, response.content
    assert response.json()["error"]["field"] == field
    assert not Route.objects.exists() and not AuditEntry.objects.exists()


def test_a_taken_name_and_a_bad_change_answer_without_writing(client, tokens):
    route_services.create_route(
        name="fast", provider_chain=["alpha"], by="t", now=time_source.now()
    )
    before = Route.objects.values().get()
    again = call(
        client, ADMIN, "POST", "/api/v1/routes", {"name": "fast", "provider_chain": ["beta"]}
    )
    assert again.status_code == 409 and again.json()["error"]["field"] == "name"
    # A provider may not take the route's name either.
    body = {"provider_id": "fast", "kind": "scripted", "model": "m", "script": {}}
    provider = call(client, ADMIN, "POST", "/api/v1/providers", body)
    assert provider.status_code == 409 and provider.json()["error"]["field"] == "provider_id"
    for body, field in (
        ({"provider_chain": ["nobody"]}, "provider_chain"),
        ({"name": "renamed"}, "name"),
        ({"enabled": 1}, "enabled"),
    ):
        response = call(client, ADMIN, "PATCH", "/api/v1/routes/fast", body)
        assert response.status_code == 400 and response.json()["error"]["field"] == field
    assert (
        call(client, ADMIN, "PATCH", "/api/v1/routes/nobody", {"enabled": False}).status_code == 404
    )
    assert call(client, ADMIN, "GET", "/api/v1/routes/no%20such").status_code == 404
    assert Route.objects.values().get() == before
    assert not Provider.objects.filter(provider_id="fast").exists()
    assert AuditEntry.objects.filter(action__in=["route.update", "provider.create"]).count() == 0


def test_writes_need_change_provider(client, tokens):
    refused = call(
        client, MANAGER, "POST", "/api/v1/routes", {"name": "fast", "provider_chain": ["alpha"]}
    )
    assert refused.status_code == 403 and "change_provider" in refused.json()["error"]["message"]
    assert not Route.objects.exists()


def test_routes_are_described_with_their_links():
    document = openapi_document()
    paths = document["paths"]
    assert set(paths["/api/v1/routes"]) == {"get", "post"}
    assert set(paths["/api/v1/routes/{name}"]) == {"get", "patch"}
    created = paths["/api/v1/routes"]["post"]
    assert "`change_provider`" in created["description"] and "409" in created["responses"]
    assert set(created["responses"]["201"]["links"]) == {"GetRoute", "ChangeRoute"}
    assert document["components"]["schemas"]["RouteCreate"]["additionalProperties"] is False


# --------------------------------------------------------------------------- manage.py route


def run_command(*args) -> str:
    out = StringIO()
    call_command("route", *args, stdout=out)
    return out.getvalue()


def test_the_command_adds_and_lists(tokens):
    assert run_command("list").strip() == "no routes"
    out = run_command("add", "fast", "--chain", "beta, alpha", "--description", "low latency")
    assert out.strip() == "added fast (beta → alpha, enabled)"
    run_command("add", "cheap", "--chain", "alpha", "--disabled")
    lines = run_command("list").splitlines()
    assert lines[0].split() == ["name", "provider_chain", "enabled", "description"]
    assert lines[1].split() == ["cheap", "alpha", "no", "-"]
    assert lines[2].split() == ["fast", "beta,alpha", "yes", "low", "latency"]
    assert AuditEntry.objects.filter(action="route.create", actor="manage.py route").count() == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (("add", "alpha", "--chain", "beta"), "NAME: a provider 'alpha' exists"),
        (("add", "fast", "--chain", "nobody"), "--chain: unknown provider(s): nobody"),
        (("add", "fast", "--chain", "alpha,alpha"), "--chain: a provider appears twice"),
        (("add", "fast", "--chain", ","), "--chain: list at least one provider id"),
        (("add", "no good", "--chain", "alpha"), "NAME: 1 to 64 letters"),
    ],
)
def test_the_command_refuses_bad_input_in_one_line(tokens, args, message):
    with pytest.raises(CommandError) as refused:
        run_command(*args)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    assert not Route.objects.exists()


def test_the_command_exits_non_zero_with_one_line():
    """The name is refused before the database is read: nothing to set up."""
    done = subprocess.run(
        [sys.executable, "manage.py", "route", "add", "x y", "--chain", "alpha"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "CommandError: NAME: 1 to 64 letters, digits, '-' or '_'"
    ]


# --------------------------------------------------------------------------- the Providers page


def test_the_providers_page_shows_the_routes(client, tokens, make_user):
    route_services.create_route(
        name="fast", provider_chain=["beta", "alpha"], by="t", now=time_source.now()
    )
    route_services.create_route(
        name="cheap", provider_chain=["alpha"], enabled=False, by="t", now=time_source.now()
    )
    client.force_login(make_user("viewer", "manager"))
    page = client.get("/providers/").content.decode()
    assert 'id="routes"' in page
    cheap = page[page.index('<tr id="route-cheap">') :].split("</tr>")[0]
    assert cheap.endswith('cheap</th><td class="mono">alpha</td><td>no</td>')
    assert "beta → alpha</td><td>yes</td>" in page
    assert page.index("route-cheap") < page.index("route-fast")


def test_the_providers_page_says_when_there_are_no_routes(client, make_user):
    client.force_login(make_user("viewer", "manager"))
    assert "No routes yet" in client.get("/providers/").content.decode()


def test_the_admin_form_refuses_a_provider_id_a_route_has(client, tokens):
    from django.urls import reverse

    route_services.create_route(
        name="fast", provider_chain=["alpha"], by="t", now=time_source.now()
    )
    client.force_login(tokens)
    form = {
        "provider_id": "fast", "kind": "scripted", "model": "m", "base_url": "",
        "api_key_env": "", "connect_timeout_s": 10, "read_timeout_s": 120,
        "failure_threshold": 3, "base_cooldown_s": 30, "max_cooldown_s": 600, "enabled": "on",
        "currency": "", "refusal_schedule": "{}", "script": "{}",
    }  # fmt: skip
    response = client.post(reverse("admin:governance_provider_add"), form)
    assert response.status_code == 200
    assert "a route &#x27;fast&#x27; exists" in response.content.decode()
    assert not Provider.objects.filter(provider_id="fast").exists()
    renamed = client.post(
        reverse("admin:governance_provider_add"), {**form, "provider_id": "gamma"}
    )
    assert renamed.status_code == 302, renamed.content.decode()[:3000]
    # Renaming a provider to a route's name is refused too.
    gamma = Provider.objects.get(provider_id="gamma")
    change = reverse("admin:governance_provider_change", args=[gamma.pk])
    assert client.post(change, {**form, "provider_id": "fast"}).status_code == 200
    assert Provider.objects.filter(provider_id="gamma").exists()
