"""The Tools page for stdio servers: the command line, the names of the
variables each gets, each worker process's state, pid, uptime, restarts and
last stderr lines; the "Register a stdio server" form and the import of an
``mcpServers`` file (preview, then Register), shown only to whoever may use
them. Bad input is said on the page and nothing is written."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile

from governance import time_source
from governance.models import AuditEntry, ToolProcess, ToolServer
from governance.services import tool_servers
from tests.tool_servers import McpRecord, UvicornThread, files_server

pytestmark = pytest.mark.django_db

BIN = Path(sys.executable).parent
TIME = str(BIN / "mcp-server-time")
SECRET = "sk-live-0123456789abcdef"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_stdio_server_left():
    from tasks.mcp_stdio import POOL

    yield
    POOL.stop_all()


@pytest.fixture
def clock():
    manual = time_source.ManualClock(T0)
    time_source.install(manual)
    yield manual
    time_source.install(None)


@pytest.fixture
def mcp_url():
    with UvicornThread(files_server(McpRecord()).streamable_http_app()) as running:
        yield f"http://127.0.0.1:{running.port}/mcp"


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("ada-admin", password="pw-for-tests-1")


@pytest.fixture
def tool_manager(make_user):
    """May change tools, not run commands on the workers."""
    user = make_user("tim-tools", "operator")
    user.user_permissions.add(Permission.objects.get(codename="change_toolserver"))
    return user


def nothing_written() -> bool:
    return not ToolServer.objects.exists() and not AuditEntry.objects.exists()


def stdio_post(**changes) -> dict:
    data = {"name": "time", "command": TIME, "args": "--local-timezone\r\nUTC\r\n",
            "env_names": "TZ, LANG", "cwd": "", "reason": "clock for agents"}  # fmt: skip
    data.update(changes)
    return {f"stdio-{k}": v for k, v in data.items()}


# --------------------------------------------------------------------------- who sees what


def test_the_forms_are_shown_only_to_those_who_may_use_them(client, operator, tool_manager, admin):
    client.force_login(operator)
    page = client.get("/tools/").content.decode()
    assert "Register a stdio server" not in page and "Import an mcpServers file" not in page
    client.force_login(tool_manager)
    page = client.get("/tools/").content.decode()
    assert "Register a stdio server" not in page and "Import an mcpServers file" in page
    client.force_login(admin)
    page = client.get("/tools/").content.decode()
    assert "Register a stdio server" in page and "Import an mcpServers file" in page
    assert 'name="csrfmiddlewaretoken"' in page


@pytest.mark.parametrize("who", ["operator", "tool_manager"])
def test_registering_a_stdio_server_needs_run_tool_command(client, request, who):
    client.force_login(request.getfixturevalue(who))
    assert client.post("/tools/stdio", stdio_post()).status_code == 403
    assert nothing_written()


def test_importing_needs_change_toolserver(client, operator):
    client.force_login(operator)
    text = json.dumps({"mcpServers": {"time": {"command": TIME}}})
    assert client.post("/tools/import", {"import-text": text}).status_code == 403
    assert (
        client.post("/tools/import/register", {"content": text, "reason": "r"}).status_code == 403
    )
    assert nothing_written()


# --------------------------------------------------------------------------- the stdio form


def test_an_admin_registers_a_stdio_server_with_the_form(client, admin):
    client.force_login(admin)
    response = client.post("/tools/stdio", stdio_post())
    assert response.status_code == 302 and response["Location"] == "/tools/#tool-time"
    time = ToolServer.objects.get(name="time")
    assert (time.kind, time.command, time.args) == ("mcp_stdio", TIME, ["--local-timezone", "UTC"])
    assert time.env_names == ["LANG", "TZ"]
    assert [t["name"] for t in time.listed_tools] == ["convert_time", "get_current_time"]
    entry = AuditEntry.objects.get(action="tool.create")
    assert (entry.actor, entry.reason) == ("ada-admin", "clock for agents")
    page = client.get("/tools/").content.decode()
    assert "Registered time (mcp_stdio): tools convert_time, get_current_time." in page
    assert f"{TIME} --local-timezone UTC" in page
    assert "time.get_current_time" in page and "time__get_current_time" in page
    assert "No worker has started it yet" in page


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"reason": ""}, "reason", "This field is required."),
        ({"command": "/nonexistent/server"}, "command",
         "&#x27;/nonexistent/server&#x27; is not an executable file"),
        ({"command": "/bin/false"}, "command", "its tools could not be listed"),
        ({"env_names": "DATABASE_URL"}, "env_names", "is not passed to tool servers"),
        ({"name": "my.clock"}, "name", "1 to 40 letters, digits"),
        ({"cwd": "relative/dir"}, "cwd", "an absolute directory path"),
        ({"args": "--token\nabc"}, "args", "passes a secret on the command line"),
    ],
)  # fmt: skip
def test_a_refused_stdio_form_comes_back_open_with_the_reason_and_nothing_written(
    client, admin, changes, field, words
):
    client.force_login(admin)
    response = client.post("/tools/stdio", stdio_post(**changes))
    assert response.status_code == 400
    page = response.content.decode()
    assert '<details class="tool-form" id="stdio-form" open>' in page
    errors = page.split(f'id="id_stdio-{field}"', 1)[1].split("</div>", 1)[0]
    assert words in errors, errors
    assert nothing_written()


def test_a_name_taken_is_said_on_the_form(client, admin):
    tool_servers.create_tool_server(
        name="time", kind="mcp", url="http://127.0.0.1:9/mcp", by="t", now=time_source.now()
    )
    client.force_login(admin)
    response = client.post("/tools/stdio", stdio_post())
    assert response.status_code == 400
    assert "a tool &#x27;time&#x27; exists already" in response.content.decode()
    assert ToolServer.objects.get().kind == "mcp"


# --------------------------------------------------------------------------- the import


def claude_desktop(mcp_url: str) -> bytes:
    return json.dumps(
        {
            "mcpServers": {
                "time": {"command": TIME, "args": ["--local-timezone", "UTC"], "env": {"TZ": ""}},
                "files": {"url": mcp_url,
                          "headers": {"Authorization": "Bearer ${GOVERNANCE_KEY_FILES}"},
                          "autoApprove": ["read"]},
            }
        }
    ).encode()  # fmt: skip


def preview_of(client, content: bytes):
    upload = SimpleUploadedFile("claude_desktop_config.json", content, "application/json")
    return client.post("/tools/import", {"import-file": upload})


def test_an_upload_is_previewed_then_registered_on_confirm(client, admin, mcp_url):
    client.force_login(admin)
    preview = preview_of(client, claude_desktop(mcp_url))
    assert preview.status_code == 200
    page = preview.content.decode()
    assert "2 servers will be registered" in page
    assert f"{TIME} --local-timezone UTC" in page and mcp_url in page
    assert "$GOVERNANCE_KEY_FILES" in page
    assert "autoApprove" in page and "not read here" in page
    assert "Register 2 servers" in page
    assert nothing_written()  # a preview starts and writes nothing
    content = preview.context["content"]
    assert json.loads(content)["mcpServers"]["time"] == {
        "command": TIME, "args": ["--local-timezone", "UTC"], "env": {"TZ": ""}
    }  # fmt: skip
    assert "autoApprove" not in content  # what is carried is what is registered
    done = client.post("/tools/import/register", {"content": content, "reason": "team setup"})
    assert done.status_code == 302 and done["Location"] == "/tools/"
    assert sorted(ToolServer.objects.values_list("name", "kind")) == [
        ("files", "mcp"),
        ("time", "mcp_stdio"),
    ]
    assert set(AuditEntry.objects.values_list("reason", flat=True)) == {"team setup"}
    page = client.get("/tools/").content.decode()
    assert "Registered time (mcp_stdio): tools convert_time, get_current_time." in page
    assert "Registered files (mcp): tools boom, grow, list_files, read, slow_send, write." in page


def test_a_file_with_secrets_is_refused_without_showing_them_and_cannot_be_registered(
    client, admin
):
    client.force_login(admin)
    text = json.dumps(
        {"mcpServers": {"time": {"command": TIME, "env": {"OPENAI_API_KEY": SECRET}},
                        "old": {"type": "sse", "url": "http://127.0.0.1:9/sse"}}}
    )  # fmt: skip
    response = client.post("/tools/import", {"import-text": text})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Nothing can be registered" in page and "2 problems" in page
    assert "env OPENAI_API_KEY has a value in the file" in page
    assert "only Streamable HTTP is supported" in page
    assert SECRET not in page  # neither in a message nor in a form sent back
    assert "tool-import-register" not in page and 'name="content"' not in page
    assert nothing_written()


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({}, "Choose an mcpServers file or paste its JSON."),
        ({"import-text": "{not json"}, "the file is not JSON"),
        ({"import-file": SimpleUploadedFile("x.json", b"\xff\xfe{}")}, "not UTF-8 text"),
    ],
)
def test_an_upload_that_is_not_a_file_of_servers_says_so(client, admin, data, words):
    client.force_login(admin)
    response = client.post("/tools/import", data)
    assert response.status_code == 400
    assert words in response.content.decode()
    assert nothing_written()


def test_register_needs_a_reason_and_lists_every_server_first(client, admin, tmp_path):
    client.force_login(admin)
    crash = tmp_path / "crashes"
    crash.write_text("#!/bin/sh\necho 'no configuration found' >&2\nexit 3\n")
    crash.chmod(0o755)
    content = json.dumps(
        {"mcpServers": {"time": {"command": TIME}, "crash": {"command": str(crash)}}}
    )
    no_reason = client.post("/tools/import/register", {"content": content, "reason": " "})
    assert no_reason.status_code == 400
    assert "say why these servers are registered" in no_reason.content.decode()
    failed = client.post("/tools/import/register", {"content": content, "reason": "r"})
    assert failed.status_code == 400
    page = failed.content.decode()
    assert "Nothing was registered" in page
    assert "crash: command: its tools could not be listed" in page
    assert 'name="content"' in page  # the same plan may be tried again
    assert nothing_written()


def test_a_tool_manager_imports_http_servers_but_not_commands(client, tool_manager, mcp_url):
    client.force_login(tool_manager)
    preview = preview_of(client, claude_desktop(mcp_url))
    assert preview.status_code == 400
    page = preview.content.decode().replace("&#x27;", "'")
    assert "a stdio server runs a command on the workers: this needs the 'run_tool_command'" in page
    stdio = json.dumps({"mcpServers": {"time": {"command": TIME}}})
    assert (
        client.post("/tools/import/register", {"content": stdio, "reason": "r"}).status_code == 400
    )
    assert nothing_written()
    http = json.dumps({"mcpServers": {"files": {"url": mcp_url}}})
    done = client.post("/tools/import/register", {"content": http, "reason": "shared files"})
    assert done.status_code == 302
    assert ToolServer.objects.get().name == "files"


# --------------------------------------------------------------------------- the processes


def test_each_worker_process_is_shown_with_its_state_uptime_and_stderr(client, operator, clock):
    # As registered on another machine: the command need not exist here to be shown.
    server = ToolServer.objects.create(
        name="git", kind="mcp_stdio", command="/opt/mcp/bin/mcp-server-git",
        args=["--repository", "/srv/repo"], env_names=["GIT_AUTHOR_NAME"], cwd="/srv/repo",
    )  # fmt: skip

    def process(worker: str, **values) -> None:
        ToolProcess.objects.create(server=server, worker=worker, updated_at=T0, **values)

    clock.advance(hours=1, minutes=2)
    process("w1:101", state="running", pid=4242, started_at=T0, restarts=2,
            stderr_tail="INFO serving\nWARNING slow repository")  # fmt: skip
    process("w2:102", state="failed", restarts=0, next_start_at=T0 + timedelta(hours=2),
            last_error="could not start the server: [Errno 2] No such file")  # fmt: skip
    process("w3:103", state="restarting", restarts=4, next_start_at=T0 + timedelta(hours=2),
            last_error="the server exited (Traceback … KeyError)")  # fmt: skip
    process("w4:104", state="stopped", restarts=1)
    client.force_login(operator)
    page = client.get("/tools/").content.decode()
    summary = page.split('class="tools-summary"', 1)[1].split("</p>", 1)[0]
    assert "1 of 1 stdio server in trouble" in summary and "git" in summary
    card = page.split('id="tool-git"', 1)[1]
    assert "/opt/mcp/bin/mcp-server-git --repository /srv/repo" in card
    assert "GIT_AUTHOR_NAME" in card and "/srv/repo" in card
    processes = card.split('data-testid="process-git"')[1:]
    running, failed, restarting, stopped = processes
    assert '<span class="state ok">running</span>' in running
    assert "pid <span" in running and "4242" in running and "up 1 h 02 min" in running
    assert "2 restarts" in running
    assert "<details" in running and "WARNING slow repository" in running
    assert '<pre class="mono stderr-tail">' in running
    assert '<span class="state bad">failed to start</span>' in failed
    assert "Why it failed to start: could not start the server" in failed
    assert "Nothing on stderr." in failed and "4242" not in failed
    assert '<span class="state cooling">restarting</span>' in restarting
    assert "4 restarts" in restarting and "next start" in restarting
    assert "Last error: the server exited" in restarting
    assert '<span class="state info">stopped</span>' in stopped
    assert "up " not in stopped


def test_with_every_process_running_the_page_says_no_trouble(client, operator, clock):
    tool_servers.create_tool_server(
        name="time", kind="mcp_stdio", command=TIME, by="t", now=T0, reason="r", listing=[]
    )
    ToolProcess.objects.create(
        server=ToolServer.objects.get(), worker="w1:1", state="running", pid=7, started_at=T0,
        updated_at=T0,
    )  # fmt: skip
    clock.advance(seconds=45)
    client.force_login(operator)
    page = client.get("/tools/").content.decode()
    assert "No stdio server in trouble" in page
    assert "running in 1 worker<" in page and "up 45.0 s" in page
