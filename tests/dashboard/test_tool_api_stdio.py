"""Stdio MCP servers over the API: registering one lists its tools through
a short-lived process of the real command (``mcp-server-time`` from PyPI)
before anything is written; who may register one (an admin's
``run_tool_command``, a reason), which commands (``GOVERNANCE_MCP_STDIO_COMMANDS``)
and the bad inputs — a missing command, one that does not start, one that
never answers ``initialize``, one that writes something that is not MCP, a
schema a provider refuses — each answer 4xx saying what happened, fast,
with nothing half-registered. The environment is named, never stored."""

from __future__ import annotations

import shlex
import sys
import textwrap
import time
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command

from governance.models import ApiToken, AuditEntry, Provider, Segment, ToolServer
from governance.services.tokens import token_digest
from tests.conftest import REPO_ROOT
from tests.dashboard.test_tool_api import Api, field_of

pytestmark = pytest.mark.django_db

ADMIN = "stdio-admin-token-" + "a" * 24
TOOL_ADMIN = "stdio-tools-token-" + "t" * 24
TIME_SERVER = str(Path(sys.executable).with_name("mcp-server-time"))
TIME_RELATIVE = ".venv/bin/mcp-server-time"  # as the README names it
BAD_SCHEMA_SERVER = textwrap.dedent(
    """
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    async def list_tools(ctx, params):
        schema = {"type": "object", "properties": {"city": {"type": "town"}}}
        tool = types.Tool(name="lookup", description="x", input_schema=schema)
        return types.ListToolsResult(tools=[tool])

    async def main():
        server = Server("bad-schema", on_list_tools=list_tools)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
    """
)


def _api(client, django_user_model, username: str, token: str, codenames: list[str]) -> Api:
    user = django_user_model.objects.create_user(username, password="pw-for-tests-1")
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(token))
    return Api(client, token)


@pytest.fixture
def admin(client, django_user_model):
    return _api(
        client, django_user_model, "stdio-admin", ADMIN,
        ["change_toolserver", "run_tool_command", "submit_run"],
    )  # fmt: skip


@pytest.fixture
def tool_admin(client, django_user_model):
    """May register MCP servers over HTTP, not commands the workers run."""
    return _api(client, django_user_model, "tools-only", TOOL_ADMIN, ["change_toolserver"])


def stdio(name: str = "time", **extra) -> dict:
    return {"name": name, "kind": "mcp_stdio", "command": TIME_SERVER,
            "reason": "clocks for the agents", **extra}  # fmt: skip


def test_registering_a_stdio_server_lists_its_tools_and_audits_who_and_why(admin):
    created = admin.send(
        "POST", "/api/v1/tools", stdio(args=["--local-timezone", "UTC"], env_names=["TZ"]),
        status=201,
    )  # fmt: skip

    assert created["kind"] == "mcp_stdio" and created["command"] == TIME_SERVER
    assert created["args"] == ["--local-timezone", "UTC"] and created["env_names"] == ["TZ"]
    assert {t["name"] for t in created["tools"]} == {"time.get_current_time", "time.convert_time"}
    assert all(t["effect"] == "read_only" for t in created["tools"])  # readOnlyHint from the server
    assert created["schema_version"] == 1 and created["list_error"] is None
    assert created["url"] == "" and created["processes"] == []
    entry = AuditEntry.objects.get(action="tool.create", target_id="time")
    assert entry.actor == "stdio-admin" and entry.reason == "clocks for the agents"
    assert entry.detail["command"] == TIME_SERVER
    # Read back as a thread's tool surface may name it.
    assert admin.send("GET", "/api/v1/tools/time")["tool_count"] == 2


def test_a_stdio_server_needs_run_tool_command_and_a_reason(admin, tool_admin):
    answer = tool_admin.send("POST", "/api/v1/tools", stdio(), status=403)
    assert "run_tool_command" in answer["error"]["message"]
    started = time.monotonic()
    answer = admin.send("POST", "/api/v1/tools", stdio(reason=""), status=400)
    assert field_of(answer) == "reason"
    assert time.monotonic() - started < 1.0  # refused before any process was started
    assert not ToolServer.objects.exists()


def test_with_debug_off_only_listed_commands_may_be_registered(admin, settings):
    settings.GOVERNANCE_MCP_STDIO_COMMANDS = ()
    answer = admin.send("POST", "/api/v1/tools", stdio(), status=400)
    assert field_of(answer) == "command"
    assert "GOVERNANCE_MCP_STDIO_COMMANDS" in answer["error"]["message"]
    settings.GOVERNANCE_MCP_STDIO_COMMANDS = ("/usr/bin/true", TIME_SERVER)
    admin.send("POST", "/api/v1/tools", stdio(), status=201)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"command": ""}, "command", "required"),
        ({"command": "no-such-command-here"}, "command", "not found on the PATH"),
        ({"command": "/bin/false"}, "command", "exited with code 1"),
        ({"command": "/bin/echo", "args": ["hello"]}, "command", "not MCP"),
        ({"url": "http://127.0.0.1:9/mcp"}, "url", "a stdio server is a command"),
        ({"env_names": ["DATABASE_URL"]}, "env_names", "not passed to tool servers"),
        ({"env_names": ["not a name"]}, "env_names", None),
        ({"args": ["--api-key=sk-live-123"]}, "args", "name an environment variable"),
        ({"args": ["--token", "abc"]}, "args", "name an environment variable"),
        ({"cwd": "relative/dir"}, "cwd", "absolute"),
        ({"cwd": "/no/such/directory"}, "cwd", "not a directory"),
    ],
)
def test_bad_stdio_configurations_are_refused_with_nothing_registered(admin, body, field, words):
    started = time.monotonic()
    answer = admin.send("POST", "/api/v1/tools", stdio(**body), status=400)
    assert field_of(answer) == field
    if words:
        assert words in answer["error"]["message"]
    assert time.monotonic() - started < 5.0
    assert not ToolServer.objects.exists()
    assert not AuditEntry.objects.filter(action="tool.create").exists()


def test_a_server_that_never_answers_initialize_is_refused_within_the_start_limit(admin, settings):
    settings.GOVERNANCE_MCP_STDIO_START_SECONDS = 1.0
    started = time.monotonic()
    answer = admin.send(
        "POST", "/api/v1/tools", stdio(command="/bin/sleep", args=["30"]), status=400
    )
    assert time.monotonic() - started < 8.0  # the limit, then the kill: not the sleep
    assert field_of(answer) == "command"
    assert "did not answer initialize within 1 s" in answer["error"]["message"]
    assert not ToolServer.objects.exists()


def test_a_schema_a_provider_would_refuse_is_refused(admin, tmp_path):
    script = tmp_path / "bad_schema_server.py"
    script.write_text(BAD_SCHEMA_SERVER)
    answer = admin.send(
        "POST", "/api/v1/tools", stdio(command=sys.executable, args=[str(script)]), status=400
    )
    assert field_of(answer) == "command"
    assert "'lookup'" in answer["error"]["message"]
    assert "not a valid JSON Schema" in answer["error"]["message"]
    assert not ToolServer.objects.exists()


def test_environment_values_are_never_stored_or_shown(admin, monkeypatch):
    monkeypatch.setenv("GOVERNANCE_KEY_TIME_DEMO", "value-that-must-not-leak")
    created = admin.send(
        "POST", "/api/v1/tools", stdio(env_names=["GOVERNANCE_KEY_TIME_DEMO"]), status=201
    )
    assert created["env_names"] == ["GOVERNANCE_KEY_TIME_DEMO"]
    row = ToolServer.objects.get(name="time")
    stored = " ".join(str(getattr(row, f.attname)) for f in ToolServer._meta.concrete_fields)
    assert "value-that-must-not-leak" not in stored
    assert "value-that-must-not-leak" not in str(AuditEntry.objects.values_list("detail"))


def test_r1_3_changing_what_a_stdio_server_runs_is_listed_first_audited_and_a_boundary(
    admin, tool_admin
):
    admin.send("POST", "/api/v1/tools", stdio(), status=201)
    Provider.objects.create(provider_id="p", kind="scripted", model="m", script={})
    thread = admin.send(
        "POST", "/api/v1/threads", {"provider_chain": ["p"], "tool_surface": ["time.*"]},
        status=201,
    )  # fmt: skip

    # Another admin of HTTP tools may not change what the workers run.
    tool_admin.send("PATCH", "/api/v1/tools/time", {"enabled": False, "reason": "x"}, status=403)
    answer = admin.send("PATCH", "/api/v1/tools/time", {"args": ["--local-timezone", "UTC"]},
                        status=400)  # fmt: skip
    assert field_of(answer) == "reason"
    # A new command that does not start changes nothing.
    answer = admin.send(
        "PATCH", "/api/v1/tools/time", {"command": "/bin/false", "reason": "try"}, status=400
    )
    assert field_of(answer) == "command"
    assert ToolServer.objects.get(name="time").command == TIME_SERVER

    changed = admin.send(
        "PATCH", "/api/v1/tools/time",
        {"args": ["--local-timezone", "Europe/Paris"], "reason": "Paris time"},
    )  # fmt: skip
    assert changed["args"] == ["--local-timezone", "Europe/Paris"]
    # The server's schemas name its local time zone: listed again, a new version
    # (a tool-surface boundary for the threads that see it, R1.3).
    assert changed["schema_version"] == 2
    assert "Europe/Paris" in str([t["parameters"] for t in changed["tools"]])
    assert changed["boundaries"] and changed["boundaries"][0] != thread["segment"]["key"]
    closed = Segment.objects.get(key=thread["segment"]["key"])
    assert closed.closed_kind == "tool_surface_change"
    entry = AuditEntry.objects.get(action="tool.update", target_id="time")
    assert entry.reason == "Paris time" and entry.detail["after"]["args"] == changed["args"]


def test_the_readme_registers_a_stdio_server_in_two_lines():
    section = (REPO_ROOT / "README.md").read_text().split("## Tools", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2 and block[0] == ".venv/bin/pip install mcp-server-time"
    words = shlex.split(block[1].replace("$PWD", str(REPO_ROOT)))
    assert words[:3] == [".venv/bin/python", "manage.py", "tool"]
    out = StringIO()
    call_command(*words[2:], stdout=out)

    server = ToolServer.objects.get(name="time")
    assert server.kind == "mcp_stdio" and server.command == str(REPO_ROOT / TIME_RELATIVE)
    assert {t["name"] for t in server.listed_tools} == {"get_current_time", "convert_time"}
    assert "get_current_time" in out.getvalue()
