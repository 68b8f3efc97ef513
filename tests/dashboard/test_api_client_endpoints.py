"""What a client needs: notifications (list, acknowledge), providers
(list, add, read, change; ``manage.py provider``), the thread list and any
segment by key — through the Django test client, plus schemathesis over these
operations with rows to find (the shared contract test has almost none).
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from urllib.parse import quote

import pytest
import schemathesis
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from dashboard.api.openapi import openapi_document
from governance import services, time_source
from governance.models import ApiToken, AuditEntry, Notification, Provider, Thread
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db

TOKEN = "client-endpoints-token-" + "c" * 24
READER_TOKEN = "client-endpoints-reader-" + "r" * 24
T0 = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
SCRIPT = {"default": {"answer": {"text": "hi"}}}


class Api:
    def __init__(self, client, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}

    def get(self, path: str, params=None, status: int = 200):
        response = self.client.get(path, params or {}, headers=self.headers)
        assert response.status_code == status, response.content[:1000]
        return response

    def send(self, method: str, path: str, body=None, status: int = 200):
        response = self.client.generic(
            method,
            path,
            data=b"" if body is None else json.dumps(body),
            content_type="application/json",
            headers=self.headers,
        )
        assert response.status_code == status, response.content[:1000]
        return response


def error_field(response) -> str | None:
    assert response["Content-Type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"field", "message"} and error["message"].strip()
    return error["field"]


def _user(django_user_model, name: str, token: str, *codenames: str):
    user = django_user_model.objects.create_user(name)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(token))
    return user


@pytest.fixture
def admin_user(django_user_model):
    return _user(
        django_user_model, "ops-admin", TOKEN, "acknowledge_notification", "change_provider",
        "see_all_runs", "submit_run",
    )  # fmt: skip


@pytest.fixture
def api(client, admin_user):
    return Api(client, TOKEN)


@pytest.fixture
def reader(client, django_user_model):
    """A token whose user holds no permission: reads only."""
    _user(django_user_model, "reader", READER_TOKEN)
    return Api(client, READER_TOKEN)


@pytest.fixture
def thread():
    Provider.objects.create(provider_id="alpha", kind="scripted", model="a-1", script=SCRIPT)
    Provider.objects.create(provider_id="beta", kind="scripted", model="b-1", script=SCRIPT)
    return services.create_thread(provider_chain=["alpha", "beta"], now=T0)


def notify(key: str, at: datetime, *, severity="normal", segment=None, acked_by=None):
    return Notification.objects.create(
        dedupe_key=key,
        severity=severity,
        text=f"notice {key}",
        segment=segment,
        provider_ids=["alpha"],
        created_at=at,
        acked_by=acked_by,
        acked_at=at + timedelta(minutes=1) if acked_by else None,
    )


def all_pages(api: Api, path: str, **params) -> list[list]:
    pages, cursor = [], None
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        body = api.get(path, query).json()
        pages.append(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 50


# --------------------------------------------------------------------------- notifications


def test_notifications_are_listed_newest_first_with_their_fields(api, thread, admin_user):
    segment = services.open_segment(thread)
    notify("n-old", T0, severity="critical", segment=segment, acked_by=admin_user)
    notify("n-new", T0 + timedelta(hours=1))
    body = api.get("/api/v1/notifications").json()
    assert [item["dedupe_key"] for item in body["items"]] == ["n-new", "n-old"]
    assert body["next_cursor"] is None
    old = body["items"][1]
    assert old["segment"] == segment.key and "#" in old["segment"]
    assert old["severity"] == "critical" and old["text"] == "notice n-old"
    assert old["acknowledged_by"] == "ops-admin"
    assert old["acknowledged_at"] == (T0 + timedelta(minutes=1)).isoformat()
    assert body["items"][0]["acknowledged_by"] is None
    assert body["items"][0]["segment"] is None


def test_notification_filters(api, thread, admin_user):
    segment = services.open_segment(thread)
    notify("crit-acked", T0, severity="critical", segment=segment, acked_by=admin_user)
    notify("crit-open", T0 + timedelta(minutes=5), severity="critical")
    notify("normal-open", T0 + timedelta(minutes=10), segment=segment)

    def keys(**params):
        return {i["dedupe_key"] for i in api.get("/api/v1/notifications", params).json()["items"]}

    assert keys(state="unacknowledged") == {"crit-open", "normal-open"}
    assert keys(state="acknowledged") == {"crit-acked"}
    assert keys(severity="critical") == {"crit-acked", "crit-open"}
    assert keys(severity="critical", state="unacknowledged") == {"crit-open"}
    assert keys(segment=segment.key) == {"crit-acked", "normal-open"}
    assert keys(segment="nope#1") == set()
    assert keys(since=(T0 + timedelta(minutes=5)).isoformat()) == {"crit-open", "normal-open"}
    # A '#' in a query value is sent as %23 (the path form of the key, too).
    path = f"/api/v1/notifications?segment={quote(segment.key, safe='')}"
    assert len(api.get(path).json()["items"]) == 2


def test_notifications_page_through_ties_without_loss_or_repeat(api):
    for number in range(7):  # the same created_at for all: the id breaks the tie
        notify(f"tie-{number}", T0)
    notify("later", T0 + timedelta(seconds=1))
    pages = all_pages(api, "/api/v1/notifications", limit=3)
    assert [len(page) for page in pages] == [3, 3, 2]
    keys = [item["dedupe_key"] for page in pages for item in page]
    assert keys[0] == "later"
    assert sorted(keys[1:]) == sorted(f"tie-{n}" for n in range(7)) and len(set(keys)) == 8
    ids = [item["id"] for item in pages[0] + pages[1] + pages[2]][1:]
    assert ids == sorted(ids, reverse=True)
    # The cursor is opaque but stable: the same page again from the same cursor.
    first = api.get("/api/v1/notifications", {"limit": 3}).json()
    again = api.get("/api/v1/notifications", {"limit": 3, "cursor": first["next_cursor"]})
    assert again.json()["items"] == pages[1]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": "not a cursor"}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b'["x", "1"]').decode()}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b'["2031-01-01T00:00:00", "1"]').decode()}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b'["2031-01-01T00:00:00+00:00", "x"]').decode()},
         "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"{}").decode()}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(
            b'["2031-01-01T00:00:00+00:00", "' + b"9" * 30 + b'"]').decode()}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(
            b'["0001-01-01T00:00:00+23:00", "1"]').decode()}, "cursor"),
        ({"cursor": ""}, "cursor"),
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "5.0"}, "limit"),
        ({"limit": "abc"}, "limit"),
        ({"limit": "\u0663"}, "limit"),
        ({"state": "open"}, "state"),
        ({"severity": "loud"}, "severity"),
        ({"since": "yesterday"}, "since"),
        ({"since": "0.5"}, "since"),
        ({"since": "2031-01-01T00:00:00"}, "since"),  # no offset
        ({"since": "0001-01-01T00:00:00+23:59"}, "since"),
        ({"segment": "a\x00#1"}, "segment"),
        ({"page": "2"}, "page"),
    ],
)  # fmt: skip
def test_bad_notification_queries_are_400_naming_the_parameter(api, params, field):
    response = api.get("/api/v1/notifications", params, status=400)
    assert error_field(response) == field


def test_a_repeated_query_parameter_is_400(api):
    response = api.get("/api/v1/notifications?state=all&state=acknowledged", status=400)
    assert error_field(response) == "state"


def test_acknowledging_needs_the_permission_and_writes_nothing_without_it(reader):
    notification = notify("n", T0, severity="critical")
    response = reader.send("POST", f"/api/v1/notifications/{notification.id}/ack", status=403)
    assert "acknowledge_notification" in response.json()["error"]["message"]
    notification.refresh_from_db()
    assert notification.acked_at is None and not AuditEntry.objects.exists()


def test_acknowledging_is_once_and_says_who_was_first(client, api, django_user_model):
    notification = notify("n", T0, severity="critical")
    url = f"/api/v1/notifications/{notification.id}/ack"
    first = api.send("POST", url).json()
    assert first["acknowledged_now"] is True and first["acknowledged_by"] == "ops-admin"
    assert first["acknowledged_at"] is not None
    assert AuditEntry.objects.filter(action="alert.acknowledge", target_id=str(notification.id))
    _user(django_user_model, "second", "second-token-" + "s" * 24, "acknowledge_notification")
    second = Api(client, "second-token-" + "s" * 24).send("POST", url).json()
    assert second["acknowledged_now"] is False
    assert second["acknowledged_by"] == "ops-admin"
    assert second["acknowledged_at"] == first["acknowledged_at"]
    assert AuditEntry.objects.filter(action="alert.acknowledge").count() == 1


@pytest.mark.parametrize("notification_id", ["999999", "abc", "-1", str(10**30), "\u0663"])
def test_acknowledging_an_unknown_notification_is_404(api, notification_id):
    response = api.send("POST", f"/api/v1/notifications/{quote(notification_id)}/ack", status=404)
    assert error_field(response) is None


# --------------------------------------------------------------------------- providers


OPENAI = {
    "provider_id": "openai-main",
    "kind": "openai",
    "model": "gpt-4o-mini",
    "base_url": "https://llm.example/v1",
    "key_env": "GOVERNANCE_KEY_TEST_OPENAI",
}


def test_a_provider_is_added_by_its_key_variable_and_no_key_is_ever_echoed(api, monkeypatch):
    monkeypatch.delenv("GOVERNANCE_KEY_TEST_OPENAI", raising=False)
    created = api.send("POST", "/api/v1/providers", OPENAI, status=201).json()
    assert created["key_env"] == "GOVERNANCE_KEY_TEST_OPENAI" and created["key_present"] is False
    assert created["enabled"] is True and created["breaker"] == "closed"
    assert created["read_timeout_s"] == 120.0
    row = Provider.objects.get(provider_id="openai-main")
    assert row.api_key_env == "GOVERNANCE_KEY_TEST_OPENAI" and row.base_url == OPENAI["base_url"]
    entry = AuditEntry.objects.get(action="provider.create")
    assert entry.actor == "ops-admin" and entry.target_id == "openai-main"

    monkeypatch.setenv("GOVERNANCE_KEY_TEST_OPENAI", "sk-very-secret-value-123")
    for response in (
        api.get("/api/v1/providers/openai-main"),
        api.get("/api/v1/providers"),
    ):
        assert b"sk-very-secret-value-123" not in response.content
    assert api.get("/api/v1/providers/openai-main").json()["key_present"] is True
    listed = api.get("/api/v1/providers").json()["items"]
    assert [p["provider_id"] for p in listed] == ["openai-main"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"api_key": "sk-abc"}, "api_key"),
        ({"key": "sk-abc"}, "key"),
        ({"key_env": "sk-abc-123"}, "key_env"),
        ({"key_env": "A" * 101}, "key_env"),
        ({"provider_id": "has space"}, "provider_id"),
        ({"provider_id": "p" * 65}, "provider_id"),
        ({"provider_id": ""}, "provider_id"),
        ({"model": "m" * 201}, "model"),
        ({"model": "  "}, "model"),
        ({"kind": "gemini"}, "kind"),
        ({"base_url": ""}, "base_url"),
        ({"base_url": "ftp://llm.example"}, "base_url"),
        ({"base_url": "https://" + "h" * 200}, "base_url"),
        ({"connect_timeout_s": 0}, "connect_timeout_s"),
        ({"read_timeout_s": 3601}, "read_timeout_s"),
        ({"failure_threshold": 0}, "failure_threshold"),
        ({"failure_threshold": 2.5}, "failure_threshold"),
        ({"base_cooldown_s": 100, "max_cooldown_s": 50}, "max_cooldown_s"),
        ({"script": SCRIPT}, "script"),  # only the scripted kind has one
        ({"enabled": "yes"}, "enabled"),
    ],
)
def test_bad_provider_bodies_are_400_naming_the_field_and_write_nothing(api, change, field):
    response = api.send("POST", "/api/v1/providers", {**OPENAI, **change}, status=400)
    assert error_field(response) == field
    assert not Provider.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"provider_id": "s", "kind": "scripted", "model": "s-1"}, "script"),
        ({"provider_id": "s", "kind": "scripted", "model": "s-1", "script": {"x": 1}}, "script"),
        ({"provider_id": "s", "kind": "scripted", "model": "s-1", "script": SCRIPT,
          "base_url": "https://llm.example"}, "base_url"),
        ({"provider_id": "s", "kind": "scripted", "model": "s-1",
          "script": {"default": {"answer": {"text": "a\x00b"}}}}, "script"),
        ({"provider_id": "a", "kind": "anthropic", "model": "claude"}, "base_url"),
        ({"provider_id": "s", "kind": "scripted", "model": "s-1", "script": SCRIPT,
          "key_env": "GOVERNANCE_KEY_SOME"}, "key_env"),
    ],
)  # fmt: skip
def test_kind_specific_rules(api, body, field):
    response = api.send("POST", "/api/v1/providers", body, status=400)
    assert error_field(response) == field
    assert not Provider.objects.exists()


def test_a_scripted_provider_with_a_valid_script_is_added(api):
    body = {"provider_id": "demo", "kind": "scripted", "model": "demo-1", "script": SCRIPT}
    created = api.send("POST", "/api/v1/providers", body, status=201).json()
    assert created["has_script"] is True and created["key_env"] is None
    assert Provider.objects.get(provider_id="demo").script == SCRIPT


def test_a_provider_id_is_taken_once(api):
    api.send("POST", "/api/v1/providers", OPENAI, status=201)
    response = api.send("POST", "/api/v1/providers", {**OPENAI, "model": "other"}, status=409)
    assert error_field(response) == "provider_id"
    assert Provider.objects.get(provider_id="openai-main").model == "gpt-4o-mini"


def test_adding_and_changing_providers_need_the_permission(reader):
    reader.send("POST", "/api/v1/providers", OPENAI, status=403)
    assert not Provider.objects.exists()
    Provider.objects.create(provider_id="alpha", kind="scripted", model="a", script=SCRIPT)
    reader.send("PATCH", "/api/v1/providers/alpha", {"enabled": False}, status=403)
    assert Provider.objects.get(provider_id="alpha").enabled is True
    assert reader.get("/api/v1/providers/alpha").json()["enabled"] is True  # reads are open


def test_disabling_over_the_api_takes_the_provider_out_of_routing(api, thread):
    response = api.send("PATCH", "/api/v1/providers/alpha", {"enabled": False, "reason": "rot"})
    assert response.json()["enabled"] is False
    verdicts = services.health_verdicts(list(Provider.objects.all()), time_source.now())
    assert (verdicts["alpha"].available, verdicts["alpha"].state) == (False, "disabled")
    assert verdicts["beta"].available is True
    entry = AuditEntry.objects.get(action="provider.update")
    assert entry.detail == {"before": {"enabled": True}, "after": {"enabled": False}}
    assert entry.reason == "rot"
    # Again: nothing changes, nothing is audited.
    api.send("PATCH", "/api/v1/providers/alpha", {"enabled": False})
    assert AuditEntry.objects.filter(action="provider.update").count() == 1
    assert api.send("PATCH", "/api/v1/providers/alpha", {"enabled": True}).json()["enabled"]


def test_an_older_row_the_checks_would_refuse_can_still_be_disabled(api):
    Provider.objects.create(provider_id="legacy", kind="scripted", model="l")  # no script
    assert (
        api.send("PATCH", "/api/v1/providers/legacy", {"enabled": False}).json()["enabled"] is False
    )
    response = api.send("PATCH", "/api/v1/providers/legacy", {"model": "l2"}, status=400)
    assert error_field(response) == "script"


def test_patch_changes_only_what_is_sent(api):
    api.send("POST", "/api/v1/providers", OPENAI, status=201)
    changed = api.send(
        "PATCH",
        "/api/v1/providers/openai-main",
        {"model": "gpt-5", "read_timeout_s": 30, "key_env": "GOVERNANCE_KEY_OTHER"},
    ).json()
    assert changed["model"] == "gpt-5" and changed["read_timeout_s"] == 30.0
    assert (
        changed["key_env"] == "GOVERNANCE_KEY_OTHER" and changed["base_url"] == OPENAI["base_url"]
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kind": "anthropic"}, "kind"),
        ({"provider_id": "renamed"}, "provider_id"),
        ({"api_key": "sk-1"}, "api_key"),
        ({"base_url": ""}, "base_url"),
        ({"max_cooldown_s": 1, "base_cooldown_s": 5}, "max_cooldown_s"),
        ({"script": SCRIPT}, "script"),
    ],
)
def test_bad_patches_are_400_and_change_nothing(api, change, field):
    api.send("POST", "/api/v1/providers", OPENAI, status=201)
    before = Provider.objects.get(provider_id="openai-main").updated_at
    response = api.send("PATCH", "/api/v1/providers/openai-main", change, status=400)
    assert error_field(response) == field
    assert Provider.objects.get(provider_id="openai-main").updated_at == before


@pytest.mark.parametrize("provider_id", ["nope", "bad%20id", "x" * 65, "a%00b"])
def test_unknown_providers_are_404(api, provider_id):
    api.get(f"/api/v1/providers/{provider_id}", status=404)
    api.send("PATCH", f"/api/v1/providers/{provider_id}", {"enabled": False}, status=404)


# --------------------------------------------------------------------------- threads, segments


def test_threads_are_listed_newest_first_in_pages(api, thread):
    later = [
        services.create_thread(provider_chain=["alpha"], title=f"t{n}", now=T0 + timedelta(n + 1))
        for n in range(4)
    ]
    pages = all_pages(api, "/api/v1/threads", limit=2)
    assert [len(page) for page in pages] == [2, 2, 1]
    ids = [item["id"] for page in pages for item in page]
    assert ids == [str(t.id) for t in reversed(later)] + [str(thread.id)]
    item = pages[-1][0]
    assert item["open_segment"] == services.open_segment(thread).key
    assert item["provider_chain"] == ["alpha", "beta"] and "system_prompt" not in item
    assert Thread.objects.count() == 5


def test_thread_list_cursor_and_limit_are_checked(api):
    assert error_field(api.get("/api/v1/threads", {"cursor": "xyz"}, status=400)) == "cursor"
    assert error_field(api.get("/api/v1/threads", {"limit": "500"}, status=400)) == "limit"
    assert api.get("/api/v1/threads").json() == {"items": [], "next_cursor": None}


def test_a_segment_is_found_by_its_key_with_the_hash_url_encoded(api, thread):
    segment = services.open_segment(thread)
    assert "#" in segment.key
    body = api.get(f"/api/v1/segments/{quote(segment.key, safe='')}").json()
    assert body["key"] == segment.key and body["thread_id"] == str(thread.id)
    assert [p["provider_id"] for p in body["providers"]] == ["alpha", "beta"]
    assert all(p["state"] == "eligible" for p in body["providers"])
    # A closed segment stays readable by its key.
    services.apply_boundary(
        thread, "fresh_start", by="ops", reason="test", now=T0 + timedelta(minutes=1)
    )
    closed = api.get(f"/api/v1/segments/{quote(segment.key, safe='')}").json()
    assert closed["closed_kind"] == "fresh_start" and closed["closed_at"] is not None


@pytest.mark.parametrize("key", ["nope%231", "nope", "abc%23x", "a%00b%231", "x" * 70 + "%231"])
def test_unknown_or_malformed_segment_keys_are_404(api, thread, key):
    assert error_field(api.get(f"/api/v1/segments/{key}", status=404)) is None


# --------------------------------------------------------------------------- the description


def test_the_new_operations_are_described():
    paths = openapi_document()["paths"]
    assert set(paths["/api/v1/threads"]) == {"get", "post"}
    assert set(paths["/api/v1/providers"]) == {"get", "post"}
    assert set(paths["/api/v1/providers/{provider_id}"]) == {"get", "patch"}
    names = {p["name"] for p in paths["/api/v1/notifications"]["get"]["parameters"]}
    assert names == {"cursor", "limit", "state", "severity", "segment", "since"}
    schemas = openapi_document()["components"]["schemas"]
    create = schemas["ProviderCreate"]
    assert create["additionalProperties"] is False and "api_key" not in create["properties"]
    assert "key_present" in schemas["ProviderAnswer"]["required"]


# --------------------------------------------------------------------------- manage.py provider


def run_command(*args) -> str:
    out = StringIO()
    call_command("provider", *args, stdout=out)
    return out.getvalue()


def test_the_command_adds_lists_and_disables(tmp_path, monkeypatch):
    monkeypatch.setenv("GOVERNANCE_KEY_TEST_CLI", "cli-secret-value")
    out = run_command(
        "add", "cli-openai", "--kind", "openai", "--model", "gpt", "--base-url",
        "https://llm.example/v1", "--key-env", "GOVERNANCE_KEY_TEST_CLI",
    )  # fmt: skip
    assert "added cli-openai" in out and "GOVERNANCE_KEY_TEST_CLI (set)" in out
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    run_command("add", "cli-demo", "--kind", "scripted", "--model", "d", "--script", str(script))
    listing = run_command("list")
    lines = listing.splitlines()
    assert lines[0].split() == [
        "provider_id", "kind", "model", "enabled", "breaker", "key_env", "key", "base_url",
    ]  # fmt: skip
    assert lines[1].split()[:4] == ["cli-demo", "scripted", "d", "yes"]
    assert lines[2].split() == [
        "cli-openai", "openai", "gpt", "yes", "closed", "GOVERNANCE_KEY_TEST_CLI", "set",
        "https://llm.example/v1",
    ]  # fmt: skip
    assert "cli-secret-value" not in listing
    assert "cli-openai disabled" in run_command("disable", "cli-openai", "--reason", "r")
    assert Provider.objects.get(provider_id="cli-openai").enabled is False
    assert "already disabled" in run_command("disable", "cli-openai")
    assert "cli-openai enabled" in run_command("enable", "cli-openai")
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "actor"))
    assert actions == [
        ("provider.create", "manage.py provider"),
        ("provider.create", "manage.py provider"),
        ("provider.update", "manage.py provider"),
        ("provider.update", "manage.py provider"),
    ]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("add", "x", "--kind", "openai", "--model", "m"), "--base-url:"),
        (("add", "x y", "--kind", "scripted", "--model", "m"), "provider_id:"),
        (("add", "x", "--kind", "openai", "--model", "m", "--base-url", "https://h",
          "--key-env", "sk-123"), "--key-env:"),
        (("add", "x", "--kind", "scripted", "--model", "m", "--script", "/no/such.json"),
         "--script: cannot read"),
        (("add", "x", "--kind", "openai", "--model", "m", "--base-url", "https://h",
          "--read-timeout", "0"), "--read-timeout:"),
        (("add", "x", "--kind", "gemini", "--model", "m"), "invalid choice"),
        (("disable", "ghost"), "no provider 'ghost'"),
    ],
)  # fmt: skip
def test_command_errors_are_one_readable_line(args, words):
    with pytest.raises(CommandError) as raised:
        run_command(*args)
    message = str(raised.value)
    assert words in message and "\n" not in message and "Traceback" not in message
    assert not Provider.objects.exists()


def test_command_refuses_a_taken_id_and_a_bad_script(tmp_path):
    run_command("add", "dup", "--kind", "openai", "--model", "m", "--base-url", "https://h")
    with pytest.raises(CommandError, match="exists already"):
        run_command("add", "dup", "--kind", "openai", "--model", "m", "--base-url", "https://h")
    bad = tmp_path / "bad.json"
    bad.write_text('{"rules": 5}')
    with pytest.raises(CommandError, match="--script: script"):
        run_command("add", "s", "--kind", "scripted", "--model", "m", "--script", str(bad))
    assert run_command("list").count("\n") == 2  # header and dup


def test_a_command_with_no_providers_says_so():
    assert run_command("list").strip() == "no providers"


# --------------------------------------------------------------------------- schemathesis


SCHEMA = schemathesis.openapi.from_dict(openapi_document()).include(
    path_regex=r"^/api/v1/(notifications|providers|segments|threads$)"
)


@pytest.fixture
def rows(admin_user, thread):
    """Rows for the lists to answer with, so their answers are checked item by item."""
    segment = services.open_segment(thread)
    notify("seed-1", T0, severity="critical", segment=segment, acked_by=admin_user)
    notify("seed-2", T0 + timedelta(seconds=1))
    Provider.objects.create(
        provider_id="keyed", kind="openai", model="m", base_url="https://h", api_key_env="K_ENV"
    )


@pytest.mark.django_db(transaction=True)
@SCHEMA.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_the_client_endpoints_answer_as_described(case, live_server, admin_user, rows):
    case.call_and_validate(
        base_url=live_server.url,
        headers={"Authorization": f"Bearer {TOKEN}"},
        excluded_checks=[positive_data_acceptance],
    )


@pytest.mark.parametrize(
    "url", ["http://[::1/v1", "http://[zz]/v1", "http://h:port/v1", "http://h:99999999/"]
)
def test_a_url_the_parser_refuses_is_a_400_naming_its_field_never_a_500(api, url):
    """schemathesis's stateful phase found these as 500s (urlsplit's ValueError)."""
    api.send("POST", "/api/v1/providers", OPENAI, status=201)
    before = Provider.objects.get(provider_id="openai-main").updated_at
    patched = api.send("PATCH", "/api/v1/providers/openai-main", {"base_url": url}, status=400)
    assert error_field(patched) == "base_url"
    assert Provider.objects.get(provider_id="openai-main").updated_at == before
    created = api.send("POST", "/api/v1/providers", {**OPENAI, "provider_id": "x", "base_url": url},
                       status=400)  # fmt: skip
    assert error_field(created) == "base_url" and not Provider.objects.filter(provider_id="x")
