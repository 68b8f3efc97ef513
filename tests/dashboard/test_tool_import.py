"""Importing an ``mcpServers`` file (Claude Desktop, Cursor, VS Code) and
``manage.py tool add``/``import`` for stdio servers: the plan, the secrets
the file may not hold, all or nothing, and real servers registered — the
PyPI ``mcp-server-time`` and ``mcp-server-git`` started from this virtual
environment, and an SDK-built MCP server over Streamable HTTP on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from dashboard.api.tools import register
from governance import time_source
from governance.models import AuditEntry, ToolServer
from governance.services import ServiceError, tool_servers
from governance.services.tool_import import ImportRefused, plan_text, read_plan, register_plan
from tests.tool_servers import McpRecord, UvicornThread, files_server

pytestmark = pytest.mark.django_db

BIN = Path(sys.executable).parent
TIME = str(BIN / "mcp-server-time")
GIT = str(BIN / "mcp-server-git")
SECRET = "sk-live-0123456789abcdef"  # never to be seen again once read
TIME_TOOLS = ["convert_time", "get_current_time"]


@pytest.fixture(autouse=True)
def no_stdio_server_left():
    """Registering starts short-lived processes only; a pooled one a test
    might start in this process is stopped at its end all the same."""
    from tasks.mcp_stdio import POOL

    yield
    POOL.stop_all()


@pytest.fixture
def mcp_url():
    with UvicornThread(files_server(McpRecord()).streamable_http_app()) as running:
        yield f"http://127.0.0.1:{running.port}/mcp"


def file_of(servers: dict) -> str:
    return json.dumps({"mcpServers": servers})


def nothing_written() -> bool:
    return not ToolServer.objects.exists() and not AuditEntry.objects.exists()


# --------------------------------------------------------------------------- the plan


def test_stdio_and_http_entries_become_a_plan_of_what_would_be_registered():
    plan = read_plan(
        file_of({
            "time": {"command": TIME, "args": ["--local-timezone", "UTC"],
                     "env": {"TZ": "", "LANG": "${LANG}", "HOME": "$HOME",
                             "GIT_DIR": "${env:GIT_DIR}"}, "cwd": "/tmp"},
            "files": {"type": "http", "url": "http://127.0.0.1:9/mcp",
                      "headers": {"Authorization": "Bearer ${GOVERNANCE_KEY_FILES}"}},
            "docs": {"type": "streamable-http", "url": "http://127.0.0.1:9/docs/mcp",
                     "disabled": True, "autoApprove": ["read"]},
        })
    )  # fmt: skip
    assert plan.ok and plan.every_problem() == []
    time, files, docs = plan.servers
    assert (time.kind, time.command, time.args, time.cwd) == (
        "mcp_stdio",
        TIME,
        ("--local-timezone", "UTC"),
        "/tmp",
    )
    assert time.env_names == ("GIT_DIR", "HOME", "LANG", "TZ")  # names only, as stored
    assert time.runs == f"{TIME} --local-timezone UTC"
    assert (files.kind, files.url, files.token_env) == (
        "mcp",
        "http://127.0.0.1:9/mcp",
        "GOVERNANCE_KEY_FILES",
    )
    assert (docs.enabled, docs.ignored) == (False, ("autoApprove",))
    assert nothing_written()
    # What a preview carries to its Register button reads back as the same plan.
    assert read_plan(plan_text(plan)).servers == tuple(replace(s, ignored=()) for s in plan.servers)
    assert "autoApprove" not in plan_text(plan)


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"command": TIME, "env": {"OPENAI_API_KEY": SECRET}},
         'env OPENAI_API_KEY has a value in the file, and values are never stored: put it in '
         'the workers\' environment and write "${OPENAI_API_KEY}" (or "") instead'),
        ({"command": TIME, "env": {"TOKEN": "${OTHER_TOKEN}"}},
         "env TOKEN refers to ${OTHER_TOKEN}: a worker passes each variable under its own name"),
        ({"command": TIME, "env": {"PORT": 8080}}, "env PORT has a value in the file"),
        ({"command": TIME, "env": {"KEY": "${input:api-key}"}}, "asks VS Code for an input"),
        ({"command": TIME, "env": {"DATABASE_URL": ""}},
         "env: 'DATABASE_URL' is not passed to tool servers"),
        ({"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": f"Bearer {SECRET}"}},
         "headers.Authorization carries a token in the file, and tokens are never stored: put "
         "it in the workers' environment"),
        ({"url": "http://127.0.0.1:9/mcp", "headers": {"X-Api-Key": SECRET}},
         "headers.X-Api-Key: only an Authorization header is sent to an MCP server"),
        ({"url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "Bearer ${HOME}"}},
         "headers.Authorization: "),  # not a variable a key may live in (the allow-list)
        ({"command": TIME, "args": ["--api-key", SECRET]}, "args: --api-key passes a secret"),
        ({"command": TIME, "args": ["${workspaceFolder}"]}, "args[0] refers to a variable"),
        ({"type": "sse", "url": "http://127.0.0.1:9/sse"},
         'type "sse": only Streamable HTTP is supported'),
        ({"type": "websocket", "url": "ws://127.0.0.1:9/"}, 'type "websocket" is not one'),
        ({"command": TIME, "url": "http://127.0.0.1:9/mcp"}, "not both"),
        ({"args": ["x"]}, "no command (a stdio server) and no url (an HTTP server)"),
        ({"command": ["uvx", "x"]}, "command: Input should be a valid string"),
        ({"command": TIME, "args": "--local-timezone UTC"}, "args: Input should be a valid list"),
        ({"command": "uvx", "cwd": "${workspaceFolder}"}, "cwd: an absolute directory path"),
        ("uvx mcp-server-time", "an entry is an object"),
    ],
)  # fmt: skip
def test_each_refusal_says_what_to_write_instead_and_never_repeats_a_secret(entry, words):
    plan = read_plan(file_of({"srv": entry}))
    problems = plan.every_problem()
    assert not plan.ok
    assert any(p.startswith("srv: ") and words in p for p in problems), problems
    assert all(SECRET not in p for p in problems)


def test_a_refused_secret_in_the_arguments_or_the_url_is_not_shown_in_the_plan():
    plan = read_plan(
        file_of({
            "gh": {"command": "/bin/true", "args": ["--token", SECRET]},
            "web": {"url": f"http://127.0.0.1:9/mcp?api_key={SECRET}"},
            "old": {"type": "sse", "url": f"http://me:{SECRET}@127.0.0.1:9/sse"},
        })
    )  # fmt: skip
    gh, web, old = plan.servers
    assert gh.runs == "/bin/true … (its arguments are not shown: see the problem)"
    assert web.runs == "http://127.0.0.1:9/mcp?api_key=***"
    assert old.runs == "http://***@127.0.0.1:9/sse"
    assert all(s.problems for s in plan.servers)
    assert SECRET not in repr([s.runs for s in plan.servers]) + repr(plan.every_problem())


def test_a_name_the_registry_cannot_take_is_refused_with_the_reason_and_a_better_one():
    plan = read_plan(file_of({"github.com": {"command": TIME}, "calculator": {"command": TIME}}))
    assert plan.every_problem() == [
        "github.com: name: 1 to 40 letters, digits, '-' or single '_' (no '.': its tools are "
        "name.tool) (rename it in the file, e.g. 'github-com')",
        "calculator: name: 'calculator' is a built-in tool",
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "the file is not JSON: "),
        ("[]", 'the file has no "mcpServers" object'),
        ('{"mcp": {}}', 'the file has no "mcpServers" object'),
        ('{"mcpServers": {}}', '"mcpServers" names no server'),
        ('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}',
         "the server 'a' appears twice in the file"),
        ("x" * 300_000, "the file is over 256,000 characters"),
    ],
)  # fmt: skip
def test_a_file_that_is_not_an_mcp_servers_file_says_so(text, words):
    plan = read_plan(text)
    assert not plan.ok
    assert any(words in p for p in plan.every_problem()), plan.every_problem()


def test_vs_codes_servers_key_is_read_too():
    plan = read_plan(json.dumps({"servers": {"time": {"type": "stdio", "command": TIME}}}))
    assert plan.ok and plan.servers[0].command == TIME


def test_a_command_outside_the_allow_list_is_refused_naming_the_setting(settings):
    settings.GOVERNANCE_MCP_STDIO_COMMANDS = (TIME,)
    plan = read_plan(file_of({"time": {"command": TIME}, "git": {"command": GIT}}))
    [problem] = plan.every_problem()
    assert problem.startswith("git: command: ") and "GOVERNANCE_MCP_STDIO_COMMANDS" in problem


def test_a_caller_that_may_not_run_commands_gets_each_stdio_entry_refused(mcp_url):
    plan = read_plan(
        file_of({"time": {"command": TIME}, "files": {"url": mcp_url}}),
        refuse_stdio="an admin's action",
    )
    assert plan.every_problem() == ["time: an admin's action"]


# --------------------------------------------------------------------------- registering


def test_a_name_taken_refuses_the_whole_file():
    tool_servers.create_tool_server(
        name="files", kind="mcp", url="http://127.0.0.1:9/mcp", by="t", now=time_source.now()
    )
    plan = read_plan(file_of({"time": {"command": TIME}, "files": {"url": "http://127.0.0.1:9/x"}}))
    assert plan.every_problem() == ["files: name: a tool 'files' exists already"]
    with pytest.raises(ImportRefused) as refused:
        register_plan(plan, by="t", reason="r", register=register)
    assert refused.value.problems == ["files: name: a tool 'files' exists already"]
    assert list(ToolServer.objects.values_list("name", flat=True)) == ["files"]


def test_a_reason_is_required_before_anything_starts():
    plan = read_plan(file_of({"time": {"command": TIME}}))
    with pytest.raises(ServiceError) as refused:
        register_plan(plan, by="t", reason="  ", register=register)
    assert refused.value.field == "reason"
    assert nothing_written()


def test_servers_that_cannot_be_listed_leave_nothing_registered_and_each_is_named(tmp_path):
    """All or nothing: time is listed and registered, then the two after it
    fail to start; every problem is said and time's registration is rolled back."""
    crash = tmp_path / "crashes"
    crash.write_text("#!/bin/sh\necho 'no configuration found' >&2\nexit 3\n")
    garbage = tmp_path / "not-mcp"
    garbage.write_text("#!/bin/sh\necho 'hello, this is not JSON-RPC'\nexec cat >/dev/null\n")
    for script in (crash, garbage):
        script.chmod(0o755)
    servers = {"time": {"command": TIME}, "crash": {"command": str(crash)},
               "chatty": {"command": str(garbage)}}  # fmt: skip
    # A command that is not there is said before anything starts.
    missing = read_plan(file_of({**servers, "missing": {"command": str(tmp_path / "nothing")}}))
    assert missing.every_problem() == [
        f"missing: command: '{tmp_path / 'nothing'}' is not an executable file"
    ]
    plan = read_plan(file_of(servers))
    assert plan.ok, plan.every_problem()
    with pytest.raises(ImportRefused) as refused:
        register_plan(plan, by="t", reason="three at once", register=register)
    crashed, chatty = refused.value.problems
    assert crashed.startswith("crash: command: its tools could not be listed: ")
    assert "no configuration found" in crashed or "exited with code 3" in crashed
    assert chatty.startswith("chatty: command: its tools could not be listed: ")
    assert "not MCP" in chatty
    assert nothing_written()


def test_an_http_server_that_does_not_answer_leaves_nothing_registered():
    plan = read_plan(file_of({"time": {"command": TIME}, "gone": {"url": "http://127.0.0.1:9/"}}))
    with pytest.raises(ImportRefused) as refused:
        register_plan(plan, by="t", reason="r", register=register)
    [problem] = refused.value.problems
    assert problem.startswith("gone: its tools could not be listed: ")
    assert nothing_written()


# --------------------------------------------------------------------------- manage.py tool


def run(*args, stdin: str | None = None) -> str:
    out = StringIO()
    extra = {"stdin": StringIO(stdin)} if stdin is not None else {}
    call_command("tool", *args, stdout=out, **extra)
    return out.getvalue()


def claude_desktop_file(tmp_path: Path, mcp_url: str) -> Path:
    """As Claude Desktop writes claude_desktop_config.json: one stdio server, one remote."""
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "time": {"command": TIME, "args": ["--local-timezone", "UTC"],
                             "env": {"TZ": ""}},
                    "files": {"type": "http", "url": mcp_url,
                              "headers": {"Authorization": "Bearer ${GOVERNANCE_KEY_FILES}"}},
                },
                "globalShortcut": "Ctrl+Space",
            },
            indent=2,
        )
    )  # fmt: skip
    return path


def test_import_a_claude_desktop_file_registers_both_servers_with_their_tools(tmp_path, mcp_url):
    out = run("import", str(claude_desktop_file(tmp_path, mcp_url)), "--reason", "as on laptops")
    lines = out.splitlines()
    assert lines[0].split() == ["name", "kind", "runs", "env", "state"]
    assert lines[1].split() == ["time", "mcp_stdio", TIME, "--local-timezone", "UTC", "TZ", "ok"]
    assert lines[2].split() == ["files", "mcp", mcp_url, "token", "$GOVERNANCE_KEY_FILES", "ok"]
    assert f"registered time (mcp_stdio): tools {', '.join(TIME_TOOLS)}" in out
    assert "registered files (mcp): tools boom, grow, list_files, read, slow_send, write" in out
    time = ToolServer.objects.get(name="time")
    assert (time.command, time.args, time.env_names) == (TIME, ["--local-timezone", "UTC"], ["TZ"])
    assert [t["name"] for t in time.listed_tools] == TIME_TOOLS
    assert time.schema_version == 1 and time.listed_at is not None
    files = ToolServer.objects.get(name="files")
    assert (files.kind, files.token_env, files.list_error) == ("mcp", "GOVERNANCE_KEY_FILES", "")
    audits = AuditEntry.objects.filter(action="tool.create").order_by("target_id")
    assert [(a.target_id, a.actor, a.reason) for a in audits] == [
        ("files", "manage.py tool", "as on laptops"),
        ("time", "manage.py tool", "as on laptops"),
    ]


def test_import_from_standard_input_as_a_dry_run_writes_nothing(mcp_url):
    text = file_of({"files": {"url": mcp_url, "alwaysAllow": ["read"]}})
    out = run("import", "-", "--dry-run", stdin=text)
    assert "files: ignored (not read here): alwaysAllow" in out
    assert "dry run: 1 server(s) would be registered" in out
    assert nothing_written()


def test_import_refuses_a_bad_file_with_one_line_per_problem(tmp_path):
    path = tmp_path / "mcp.json"
    path.write_text(
        file_of({
            "time": {"command": TIME, "env": {"OPENAI_API_KEY": SECRET}},
            "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
        })
    )  # fmt: skip
    with pytest.raises(CommandError) as refused:
        run("import", str(path), "--reason", "r")
    lines = str(refused.value).splitlines()
    assert lines[0] == "nothing was registered (2 problem(s)):"
    assert lines[1].startswith("  time: env OPENAI_API_KEY has a value in the file")
    assert lines[2].startswith('  old: type "sse": only Streamable HTTP is supported')
    assert SECRET not in str(refused.value)
    assert nothing_written()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("import", "/nonexistent/mcp.json", "--reason", "r"), "cannot read /nonexistent/mcp.json"),
        (("import", "-"), "--reason: say why these servers are registered"),
    ],
)
def test_import_bad_input_fails_with_a_readable_line(args, words):
    with pytest.raises(CommandError) as refused:
        run(*args, stdin=file_of({"time": {"command": TIME}}))
    assert words in str(refused.value)
    assert nothing_written()


def test_cli_adds_a_stdio_server_in_one_line_and_lists_refreshes_disables_it():
    out = run(
        "add", "time", "--kind", "mcp_stdio", "--command", TIME, "--reason", "clock for agents",
        "--", "--local-timezone", "UTC",
    )  # fmt: skip
    assert out.strip() == f"added time (mcp_stdio): tools {', '.join(TIME_TOOLS)}"
    time = ToolServer.objects.get(name="time")
    assert (time.args, time.env_names, time.cwd) == (["--local-timezone", "UTC"], [], "")
    assert AuditEntry.objects.get(action="tool.create").reason == "clock for agents"
    table = run("list")
    assert f"{TIME} --local-timezone UTC" in table and "mcp_stdio" in table
    assert "2 tool(s), schema version 1" in run("refresh", "time")
    with pytest.raises(CommandError, match="--reason: say why this stdio server changes"):
        run("disable", "time")
    assert run("disable", "time", "--reason", "not today").strip() == "time disabled"


def test_cli_adds_mcp_server_git_with_arguments_an_environment_name_and_a_directory(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    out = run(
        "add", "git", "--kind", "mcp_stdio", "--command", GIT, "--arg=--repository",
        "--arg", str(tmp_path), "--env", "GIT_AUTHOR_NAME", "--env", "GIT_AUTHOR_EMAIL",
        "--cwd", str(tmp_path), "--reason", "repository reads",
    )  # fmt: skip
    assert out.startswith("added git (mcp_stdio): tools ") and "git_status" in out
    git = ToolServer.objects.get(name="git")
    assert git.args == ["--repository", str(tmp_path)]
    assert (git.env_names, git.cwd) == (["GIT_AUTHOR_EMAIL", "GIT_AUTHOR_NAME"], str(tmp_path))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("add", "time", "--kind", "mcp_stdio", "--command", TIME),
         "--reason: say why the workers should run this command"),
        (("add", "nope", "--kind", "mcp_stdio", "--command", "/nonexistent/server",
          "--reason", "r"), "--command: '/nonexistent/server' is not an executable file"),
        (("add", "nope", "--kind", "mcp_stdio", "--command", "/bin/false", "--reason", "r"),
         "--command: its tools could not be listed: the server did not start"),
        (("add", "time", "--kind", "mcp_stdio", "--command", TIME, "--env", "DJANGO_SECRET_KEY",
          "--reason", "r"), "--env: 'DJANGO_SECRET_KEY' is not passed to tool servers"),
        (("add", "time", "--kind", "mcp", "--url", "http://127.0.0.1:9/", "--command", TIME),
         "--command: only a stdio server"),
        (("add", "time", "--kind", "mcp"), "--url: an http:// or https:// URL is required"),
        (("list", "--", "x"), "only 'add' takes a command's arguments after --"),
    ],
)  # fmt: skip
def test_cli_stdio_bad_input_is_one_line_and_writes_nothing(args, words):
    with pytest.raises(CommandError) as refused:
        run(*args)
    assert words in str(refused.value) and "\n" not in str(refused.value)
    assert nothing_written()
