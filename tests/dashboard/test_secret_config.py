"""Secrets that cannot be pointed at, at every door a configuration comes
through: the API, the admin's forms and ``manage.py provider`` / ``tool``.

A key variable must match GOVERNANCE_KEY_ENV_ALLOW and be none of the
system's own; a base URL carries no credentials and obeys the outbound rules
(GOVERNANCE_OUTBOUND_ALLOW); a URL stored before these checks is shown masked.
Bad input is refused with the field and a readable reason, and writes nothing.
"""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, ManagementUtility, call_command
from django.urls import reverse

from governance.models import AlertChannel, ApiToken, AuditEntry, Provider, ToolServer
from governance.rules.outbound import AllowList, parse_allow_list
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db

TOKEN = "secret-config-token-" + "s" * 24
OPENAI = {
    "provider_id": "openai-main",
    "kind": "openai",
    "model": "gpt-4o-mini",
    "base_url": "https://llm.example/v1",
}


class Api:
    def __init__(self, client) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {TOKEN}"}

    def send(self, method: str, path: str, body=None, status: int = 200) -> dict:
        response = self.client.generic(
            method, path, data=b"" if body is None else json.dumps(body),
            content_type="application/json", headers=self.headers,
        )  # fmt: skip
        assert response.status_code == status, response.content[:2000]
        return response.json()

    def refusal(self, method: str, path: str, body: dict) -> dict:
        error = self.send(method, path, body, status=400)["error"]
        assert set(error) == {"field", "message"}
        return error


@pytest.fixture
def api(client, django_user_model):
    user = django_user_model.objects.create_user("keeper")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["change_provider", "change_toolserver"])
    )
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(TOKEN))
    return Api(client)


@pytest.fixture
def production_outbound(settings):
    """DJANGO_DEBUG=0's outbound rules: nothing listed, https required."""
    settings.GOVERNANCE_OUTBOUND_ALLOW = AllowList()
    settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = True
    return settings


def provider_command(*args: str) -> str:
    out = StringIO()
    call_command("provider", *args, stdout=out)
    return out.getvalue()


def nothing_written() -> bool:
    return not Provider.objects.exists() and not AuditEntry.objects.exists()


# --------------------------------------------------------------------------- key variables


FORBIDDEN = ("DJANGO_SECRET_KEY", "DATABASE_URL", "X_FILE", "GOVERNANCE_CALLBACK_SECRET",
             "DJANGO_SECRET_KEY_FILE")  # fmt: skip


@pytest.mark.parametrize("name", FORBIDDEN)
def test_the_api_refuses_a_key_variable_the_allow_list_does_not_name(api, name):
    error = api.refusal("POST", "/api/v1/providers", {**OPENAI, "key_env": name})
    assert error["field"] == "key_env"
    assert error["message"].startswith(f"{name!r} is not allowed")
    assert "name a variable matching GOVERNANCE_KEY_*, OPENAI_API_KEY" in error["message"]
    assert "(GOVERNANCE_KEY_ENV_ALLOW)" in error["message"]
    assert nothing_written()


@pytest.mark.parametrize("name", ["GOVERNANCE_KEY_FOO", "OPENAI_API_KEY"])
def test_the_api_accepts_an_allowed_key_variable(api, name, monkeypatch):
    monkeypatch.setenv(name, "sk-allowed-value")
    created = api.send("POST", "/api/v1/providers", {**OPENAI, "key_env": name}, status=201)
    assert created["key_env"] == name and created["key_env_refused"] is None
    assert created["key_present"] is True
    assert Provider.objects.get().api_key_env == name


def test_a_patch_to_a_forbidden_key_variable_changes_nothing(api):
    api.send("POST", "/api/v1/providers", {**OPENAI, "key_env": "OPENAI_API_KEY"}, status=201)
    error = api.refusal("PATCH", "/api/v1/providers/openai-main", {"key_env": "REDIS_URL"})
    assert error["field"] == "key_env" and "'REDIS_URL' is not allowed" in error["message"]
    assert Provider.objects.get().api_key_env == "OPENAI_API_KEY"
    assert list(AuditEntry.objects.values_list("action", flat=True)) == ["provider.create"]


def test_an_operator_may_widen_the_allow_list_but_not_to_the_systems_own(api, settings):
    from governance.rules.secrets import key_env_policy

    settings.GOVERNANCE_KEY_ENV_ALLOW = key_env_policy(["*"], settings.GOVERNANCE_KEY_ENV_ALLOW.own)
    api.send("POST", "/api/v1/providers", {**OPENAI, "key_env": "VENDOR_TOKEN"}, status=201)
    error = api.refusal(
        "POST", "/api/v1/providers", {**OPENAI, "provider_id": "x", "key_env": "DJANGO_SECRET_KEY"}
    )
    assert "this system's own settings" in error["message"]


def test_a_stored_forbidden_key_variable_is_shown_not_allowed_never_present(
    api, client, make_user, monkeypatch
):
    """A row stored before the allow-list: its variable is set, but never read."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-django-signing-key")
    Provider.objects.create(api_key_env="DJANGO_SECRET_KEY", **OPENAI)
    answer = api.send("GET", "/api/v1/providers/openai-main")
    assert answer["key_present"] is False
    assert "'DJANGO_SECRET_KEY' is not allowed" in answer["key_env_refused"]
    client.force_login(make_user("mona", "manager"))
    page = client.get(reverse("providers")).content.decode()
    assert "not allowed" in page and "the-django-signing-key" not in page
    listing = provider_command("list")
    assert "not allowed" in listing.splitlines()[1]


def test_the_command_refuses_a_forbidden_key_variable_in_one_line():
    with pytest.raises(CommandError) as refused:
        provider_command(
            "add", "x", "--kind", "openai", "--model", "m", "--base-url", "https://llm.example/v1",
            "--key-env", "DJANGO_SECRET_KEY",
        )  # fmt: skip
    message = str(refused.value)
    assert message.startswith("--key-env: 'DJANGO_SECRET_KEY' is not allowed")
    assert "GOVERNANCE_KEY_*" in message and "\n" not in message
    assert nothing_written()


def test_manage_py_exits_non_zero_on_a_forbidden_key_variable(capsys, monkeypatch):
    from django.db import connections

    monkeypatch.setattr(connections, "close_all", lambda: None)  # the test's own connection
    argv = ["manage.py", "provider", "add", "x", "--kind", "openai", "--model", "m",
            "--base-url", "https://llm.example/v1", "--key-env", "DATABASE_URL"]  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        ManagementUtility(argv).execute()
    assert exited.value.code not in (0, None)
    err = capsys.readouterr().err.strip()
    assert err.startswith("CommandError: --key-env: 'DATABASE_URL' is not allowed")
    assert len(err.splitlines()) == 1
    assert nothing_written()


def test_the_admin_form_refuses_a_forbidden_key_variable(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    form = {
        "provider_id": "p1", "kind": "openai", "model": "m", "base_url": "https://llm.example/v1",
        "api_key_env": "DJANGO_SECRET_KEY", "connect_timeout_s": 10, "read_timeout_s": 120,
        "failure_threshold": 3, "base_cooldown_s": 30, "max_cooldown_s": 600, "enabled": "on",
        "currency": "", "refusal_schedule": "{}", "script": "null",
    }  # fmt: skip
    response = client.post(reverse("admin:governance_provider_add"), form)
    assert response.status_code == 200
    body = response.content.decode()
    assert "is not allowed" in body and "GOVERNANCE_KEY_ENV_ALLOW" in body
    assert not Provider.objects.exists()
    response = client.post(
        reverse("admin:governance_provider_add"), {**form, "api_key_env": "GOVERNANCE_KEY_P1"}
    )
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Provider.objects.get().api_key_env == "GOVERNANCE_KEY_P1"


def test_the_admin_alert_channel_form_refuses_a_forbidden_routing_key_variable(client, make_user):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    form = {"name": "pager", "kind": "pagerduty", "target": "", "escalation_order": 1,
            "daily_budget": 10, "enabled": "on",
            "routing_key_env": "GOVERNANCE_CALLBACK_SECRET"}  # fmt: skip
    response = client.post(reverse("admin:governance_alertchannel_add"), form)
    assert response.status_code == 200 and "is not allowed" in response.content.decode()
    assert not AlertChannel.objects.exists()


def test_the_tool_api_and_command_refuse_a_forbidden_token_variable(api):
    body = {"name": "weather", "kind": "http", "url": "https://weather.example/now",
            "method": "GET", "description": "weather", "effect": "read_only",
            "parameters": {"type": "object"}, "token_env": "DJANGO_SECRET_KEY"}  # fmt: skip
    error = api.refusal("POST", "/api/v1/tools", body)
    assert error["field"] == "token_env" and "is not allowed" in error["message"]
    with pytest.raises(CommandError, match=r"^--token-env: 'DATABASE_URL' is not allowed"):
        call_command(
            "tool", "add", "files", "--kind", "mcp", "--url", "https://files.example/mcp",
            "--token-env", "DATABASE_URL", stdout=StringIO(),
        )  # fmt: skip
    assert not ToolServer.objects.exists()


# --------------------------------------------------------------------------- base URLs


@pytest.mark.parametrize(
    ("base_url", "add"),
    [
        ("https://169.254.169.254/v1", "169.254.169.254"),
        ("https://10.0.0.1/v1", "10.0.0.1"),
        ("https://127.0.0.1:8000/v1", "127.0.0.1"),
    ],
)
def test_a_base_url_the_outbound_rules_refuse_is_refused_until_listed(
    api, production_outbound, base_url, add
):
    error = api.refusal("POST", "/api/v1/providers", {**OPENAI, "base_url": base_url})
    assert error["field"] == "base_url"
    assert f"unless GOVERNANCE_OUTBOUND_ALLOW lists it (add {add})" in error["message"]
    assert nothing_written()
    with pytest.raises(CommandError, match=r"^--base-url: .*GOVERNANCE_OUTBOUND_ALLOW"):
        provider_command("add", "x", "--kind", "openai", "--model", "m", "--base-url", base_url)
    assert nothing_written()

    production_outbound.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list([add])
    created = api.send("POST", "/api/v1/providers", {**OPENAI, "base_url": base_url}, status=201)
    assert created["base_url"] == base_url


def test_plain_http_to_a_local_server_needs_it_listed_in_production(api, production_outbound):
    body = {**OPENAI, "base_url": "http://127.0.0.1:11434/v1"}
    assert "GOVERNANCE_OUTBOUND_ALLOW" in api.refusal("POST", "/api/v1/providers", body)["message"]
    production_outbound.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1"])
    api.send("POST", "/api/v1/providers", body, status=201)


def test_a_name_that_resolves_to_a_private_address_is_refused(api, production_outbound):
    """localhost resolves to loopback here, whatever DNS says elsewhere."""
    body = {**OPENAI, "base_url": "https://localhost:8443/v1"}
    error = api.refusal("POST", "/api/v1/providers", body)
    assert "localhost resolves to" in error["message"] and "(add localhost or" in error["message"]


def test_a_patch_to_a_refused_base_url_changes_nothing(api, production_outbound):
    api.send("POST", "/api/v1/providers", OPENAI, status=201)
    error = api.refusal(
        "PATCH", "/api/v1/providers/openai-main", {"base_url": "https://169.254.169.254/latest"}
    )
    assert error["field"] == "base_url" and "link-local" in error["message"]
    assert Provider.objects.get().base_url == OPENAI["base_url"]


def test_the_admin_form_refuses_a_metadata_base_url(client, make_user, production_outbound):
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    form = {
        "provider_id": "p1", "kind": "openai", "model": "m",
        "base_url": "https://169.254.169.254/v1", "api_key_env": "", "connect_timeout_s": 10,
        "read_timeout_s": 120, "failure_threshold": 3, "base_cooldown_s": 30,
        "max_cooldown_s": 600, "enabled": "on", "currency": "", "refusal_schedule": "{}",
        "script": "null",
    }  # fmt: skip
    response = client.post(reverse("admin:governance_provider_add"), form)
    assert response.status_code == 200 and "GOVERNANCE_OUTBOUND_ALLOW" in response.content.decode()
    assert not Provider.objects.exists()


# --------------------------------------------------------------------------- credentials in URLs


@pytest.mark.parametrize(
    "base_url",
    ["https://user:pw@llm.example/v1", "https://llm.example/v1?api_key=sk-1",
     "https://llm.example/v1?SIG=abc"],
)  # fmt: skip
def test_a_base_url_with_credentials_is_refused(api, base_url):
    error = api.refusal("POST", "/api/v1/providers", {**OPENAI, "base_url": base_url})
    assert error["field"] == "base_url" and "may not carry" in error["message"]
    assert nothing_written()


def test_a_tool_url_with_credentials_is_refused(api):
    body = {"name": "files", "kind": "mcp", "url": "https://bot:hunter2@files.example/mcp"}
    error = api.refusal("POST", "/api/v1/tools", body)
    assert error["field"] == "url" and "user name or password" in error["message"]
    assert not ToolServer.objects.exists()


def test_a_stored_password_url_is_masked_wherever_it_is_shown(api, client, make_user):
    Provider.objects.create(
        provider_id="old", kind="openai", model="m",
        base_url="https://user:hunter2@llm.example/v1?api_key=sk-stored",
    )  # fmt: skip
    ToolServer.objects.create(
        name="files", kind="mcp", url="https://bot:hunter2@files.example/mcp?token=t0k3n"
    )
    shown = "https://***@llm.example/v1?api_key=***"
    assert api.send("GET", "/api/v1/providers/old")["base_url"] == shown
    assert api.send("GET", "/api/v1/providers")["items"][0]["base_url"] == shown
    tool = api.send("GET", "/api/v1/tools/files")
    assert tool["url"] == "https://***@files.example/mcp?token=***"
    assert api.send("GET", "/api/v1/tools")["items"][0]["url"] == tool["url"]
    assert "hunter2" not in provider_command("list")

    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    for page in (
        reverse("providers"),
        reverse("tools"),
        reverse("admin:governance_provider_changelist"),
        reverse("admin:governance_toolserver_changelist"),
    ):
        body = client.get(page).content.decode()
        assert "hunter2" not in body and "sk-stored" not in body and "t0k3n" not in body, page
        assert "***@" in body, page
