"""The tool registry over the API and ``manage.py tool``: register
an MCP server (listed from a real loopback server) or an HTTP tool, read it,
disable it, override effects, list again; bad input answers 4xx in the API's
error shape, or a one-line CLI error; a thread's tool surface names registry
tools and ``server.*``; a schema change is a tool-surface boundary (R1.3)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from governance import time_source
from governance.models import ApiToken, AuditEntry, Provider, Segment, ToolServer
from governance.services import tool_servers
from governance.services.tokens import token_digest
from tests.tool_servers import McpRecord, UvicornThread, files_server

pytestmark = pytest.mark.django_db

TOKEN = "tool-admin-token-" + "t" * 24
READER = "tool-reader-token-" + "r" * 24
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


class Api:
    def __init__(self, client, token: str) -> None:
        self.client, self.headers = client, {"Authorization": f"Bearer {token}"}

    def send(self, method: str, path: str, body=None, status: int = 200):
        response = self.client.generic(
            method, path, data=b"" if body is None else json.dumps(body),
            content_type="application/json", headers=self.headers,
        )  # fmt: skip
        assert response.status_code == status, response.content[:1000]
        assert response["Content-Type"].startswith("application/json")
        return response.json()


@pytest.fixture
def admin(client, django_user_model):
    user = django_user_model.objects.create_user("tool-admin", password="pw-for-tests-1")
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["change_toolserver", "apply_boundary", "submit_run"]
        )
    )
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(TOKEN))
    return Api(client, TOKEN)


@pytest.fixture
def reader(client, django_user_model):
    user = django_user_model.objects.create_user("tool-reader", password="pw-for-tests-1")
    ApiToken.objects.create(user=user, name="r", key_digest=token_digest(READER))
    return Api(client, READER)


@pytest.fixture
def mcp_url():
    with UvicornThread(files_server(McpRecord(), hang_s=2).streamable_http_app()) as running:
        yield f"http://127.0.0.1:{running.port}/mcp"


def field_of(answer) -> str | None:
    error = answer["error"]
    assert set(error) == {"field", "message"} and error["message"].strip()
    return error["field"]


def test_register_an_mcp_server_lists_what_it_exposes(admin, reader, mcp_url):
    created = admin.send(
        "POST", "/api/v1/tools",
        {"name": "files", "kind": "mcp", "url": mcp_url, "token_env": "GOVERNANCE_KEY_FILES"},
        status=201,
    )  # fmt: skip
    assert created["schema_version"] == 1 and created["list_error"] is None
    assert created["token_env"] == "GOVERNANCE_KEY_FILES" and created["token_present"] is False
    by_name = {t["name"]: t for t in created["tools"]}
    assert by_name["files.read"]["effect"] == "read_only"
    assert by_name["files.read"]["wire_name"] == "files__read"
    assert by_name["files.write"]["effect"] == "external_effect"
    assert by_name["files.read"]["parameters"]["required"] == ["path"]
    listed = reader.send("GET", "/api/v1/tools")["items"]
    assert [(t["name"], t["tool_count"]) for t in listed] == [("files", 6)]
    detail = reader.send("GET", "/api/v1/tools/files")
    assert {t["name"] for t in detail["tools"]} == set(by_name)
    assert AuditEntry.objects.filter(action="tool.create", target_id="files").exists()


def test_register_an_http_tool_and_disable_it(admin):
    created = admin.send(
        "POST", "/api/v1/tools",
        {"name": "weather", "kind": "http", "url": "http://127.0.0.1:9/weather",
         "method": "GET", "description": "Weather", "parameters": SCHEMA,
         "effect": "read_only"}, status=201,
    )  # fmt: skip
    assert [t["name"] for t in created["tools"]] == ["weather"]
    changed = admin.send("PATCH", "/api/v1/tools/weather", {"enabled": False, "reason": "x"})
    assert changed["enabled"] is False
    assert ToolServer.objects.get(name="weather").enabled is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "a.b", "kind": "mcp", "url": "http://127.0.0.1:9/mcp"}, "name"),
        ({"name": "calculator", "kind": "mcp", "url": "http://127.0.0.1:9/mcp"}, "name"),
        ({"name": "a__b", "kind": "mcp", "url": "http://127.0.0.1:9/mcp"}, "name"),
        ({"name": "x", "kind": "ftp", "url": "http://127.0.0.1:9/"}, "kind"),
        ({"name": "x", "kind": "mcp", "url": "file:///etc/passwd"}, "url"),
        ({"name": "x", "kind": "http", "url": "http://127.0.0.1:9/", "method": "GET",
          "description": "d", "effect": "read_only"}, "parameters"),
        ({"name": "x", "kind": "http", "url": "http://127.0.0.1:9/", "method": "GET",
          "description": "d", "parameters": {"type": "nonsense"}, "effect": "read_only"},
         "parameters"),
        ({"name": "x", "kind": "http", "url": "http://127.0.0.1:9/", "method": "GET",
          "description": "d", "parameters": SCHEMA}, "effect"),
        ({"name": "x", "kind": "mcp", "url": "http://127.0.0.1:9/mcp", "effect": "read_only"},
         "effect"),
        ({"name": "x", "kind": "mcp", "url": "http://127.0.0.1:9/mcp", "token": "secret"},
         "token"),
        ({"name": "x", "kind": "mcp", "url": "http://127.0.0.1:9/mcp", "token_env": "a b"},
         "token_env"),
    ],
)  # fmt: skip
def test_bad_registrations_answer_400_naming_the_field(admin, body, field):
    assert field_of(admin.send("POST", "/api/v1/tools", body, status=400)) == field
    assert not ToolServer.objects.exists()


def test_permissions_duplicates_and_unknown_names(admin, reader):
    body = {"name": "files", "kind": "mcp", "url": "http://127.0.0.1:9/mcp"}
    field_of(reader.send("POST", "/api/v1/tools", body, status=403))
    created = admin.send("POST", "/api/v1/tools", body, status=201)
    assert created["list_error"] and "not listed" in created["list_error"]  # unreachable: kept
    assert field_of(admin.send("POST", "/api/v1/tools", body, status=409)) == "name"
    field_of(reader.send("GET", "/api/v1/tools/nope", status=404))
    field_of(reader.send("PATCH", "/api/v1/tools/files", {"enabled": False}, status=403))
    assert field_of(
        admin.send("PATCH", "/api/v1/tools/files", {"effect_overrides": {"w": "x"}}, status=400)
    ) == "effect_overrides"  # fmt: skip
    assert field_of(
        admin.send("PATCH", "/api/v1/tools/files", {"effect_overrides": {"w": "read_only"}},
                   status=400)
    ) == "effect_overrides"  # not a listed tool  # fmt: skip


def test_thread_tool_surfaces_name_registry_tools(admin, mcp_url):
    Provider.objects.create(provider_id="p", kind="scripted", model="m", script={})
    admin.send("POST", "/api/v1/tools", {"name": "files", "kind": "mcp", "url": mcp_url},
               status=201)  # fmt: skip
    for surface in (["files.*"], ["files.read", "calculator"]):
        thread = admin.send(
            "POST", "/api/v1/threads", {"provider_chain": ["p"], "tool_surface": surface},
            status=201,
        )  # fmt: skip
        assert thread["tool_surface"] == sorted(surface)
    for surface, words in ((["files.nope"], "no tool named"), (["other.*"], "unknown"),
                           (["files"], "MCP server")):  # fmt: skip
        answer = admin.send(
            "POST", "/api/v1/threads", {"provider_chain": ["p"], "tool_surface": surface},
            status=400,
        )  # fmt: skip
        assert field_of(answer) == "tool_surface" and words in answer["error"]["message"]


def test_r1_3_disabling_a_server_is_a_tool_surface_boundary_for_threads_that_see_it(admin, mcp_url):
    Provider.objects.create(provider_id="p", kind="scripted", model="m", script={})
    admin.send("POST", "/api/v1/tools", {"name": "files", "kind": "mcp", "url": mcp_url},
               status=201)  # fmt: skip
    thread = admin.send(
        "POST", "/api/v1/threads", {"provider_chain": ["p"], "tool_surface": ["files.*"]},
        status=201,
    )  # fmt: skip
    first = thread["segment"]["key"]
    answer = admin.send("PATCH", "/api/v1/tools/files", {"enabled": False, "reason": "retired"})
    assert answer["boundaries"] and answer["boundaries"][0] != first
    closed = Segment.objects.get(key=first)
    assert closed.closed_kind == "tool_surface_change" and "retired" in closed.close_reason
    assert AuditEntry.objects.filter(action="boundary.tool_surface_change").count() == 1
    # Re-listing an unchanged server opens nothing.
    admin.send("PATCH", "/api/v1/tools/files", {"enabled": True})
    again = admin.send("PATCH", "/api/v1/tools/files", {"refresh": True})
    assert again["boundaries"] == []


# --- manage.py tool ---------------------------------------------------------------


def run(*args) -> str:
    out = StringIO()
    call_command("tool", *args, stdout=out)
    return out.getvalue()


def test_cli_add_list_disable_enable_refresh(mcp_url, tmp_path):
    assert "tools boom, grow, list_files, read, slow_send, write" in run(
        "add", "files", "--kind", "mcp", "--url", mcp_url
    )
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    assert "added weather (http GET, read_only)" in run(
        "add", "weather", "--kind", "http", "--url", "http://127.0.0.1:9/w", "--method", "GET",
        "--description", "Weather", "--parameters", str(schema), "--effect", "read_only",
    )  # fmt: skip
    table = run("list")
    assert table.splitlines()[0].split()[:3] == ["name", "kind", "enabled"]
    assert "files" in table and "weather" in table
    assert run("disable", "files", "--reason", "x").strip() == "files disabled"
    assert run("disable", "files").strip() == "files was already disabled"
    assert run("enable", "files").strip() == "files enabled"
    assert "6 tool(s), schema version 1" in run("refresh", "files")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("add", "a.b", "--kind", "mcp", "--url", "http://127.0.0.1:9/"), "name:"),
        (("add", "x", "--kind", "http", "--url", "http://127.0.0.1:9/", "--method", "GET",
          "--description", "d", "--effect", "read_only"), "--parameters:"),
        (("add", "x", "--kind", "http", "--url", "http://127.0.0.1:9/", "--parameters",
          "/nonexistent.json"), "--parameters: cannot read"),
        (("disable", "nope"), "no tool 'nope'"),
        (("refresh", "nope"), "no tool 'nope'"),
    ],
)  # fmt: skip
def test_cli_bad_input_is_one_line_and_fails(args, words):
    with pytest.raises(CommandError) as caught:
        run(*args)
    message = str(caught.value)
    assert words in message and "\n" not in message


def test_the_tools_page_shows_the_registry_with_effect_classes(client, reader, mcp_url):
    run("add", "files", "--kind", "mcp", "--url", mcp_url)
    tool_servers.create_tool_server(
        name="gone", kind="mcp", url="http://127.0.0.1:9/mcp", by="t", now=time_source.now()
    )
    client.force_login(get_user_model().objects.get(username="tool-reader"))
    page = client.get("/tools/").content.decode()
    assert 'href="/tools/" aria-current="page"' in page
    assert "files.read" in page and "files__read" in page and "read-only" in page
    assert "files.write" in page and "external effect" in page
    assert "No tools listed yet." in page  # gone: never listed
    client.logout()
    assert client.get("/tools/").status_code == 302  # logged-in people only
