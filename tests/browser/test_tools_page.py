"""The Tools page in real Chromium: an admin registers mcp-server-time with
the stdio form, imports an mcpServers file (a preview, then Register), and
reads each worker process's state and stderr — on a desktop and a phone."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from governance import time_source
from governance.models import AuditEntry, ToolProcess, ToolServer
from tests.tool_servers import McpRecord, UvicornThread, files_server

pytestmark = pytest.mark.django_db(transaction=True)

TIME = str(Path(sys.executable).parent / "mcp-server-time")
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
PHONE = {"width": 390, "height": 844}


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
def admin(make_user):
    return make_user("ada-admin", is_superuser=True, is_staff=True)


def test_an_admin_registers_a_stdio_server_and_imports_a_file(
    page_for, live_server, admin, shots, clock
):
    tools_url = f"{live_server.url}/tools/"
    page = page_for(admin.username)
    page.goto(tools_url)
    assert page.get_by_label("Command").is_hidden()  # the form waits, folded
    page.get_by_text("Register a stdio server").click()
    page.get_by_label("Name", exact=True).fill("time")
    page.get_by_label("Command").fill(TIME)
    page.get_by_label("Arguments (one a line)").fill("--local-timezone\nUTC")
    page.get_by_label("Environment variables (names only)").fill("TZ")
    page.get_by_label("Why (kept in the audit log)").fill("clock for agents")
    shots(page, "1-stdio-form")
    page.get_by_role("button", name="Register the stdio server").click()
    page.get_by_text(
        "Registered time (mcp_stdio): tools convert_time, get_current_time."
    ).wait_for()
    card = page.locator("#tool-time")
    assert card.get_by_test_id("command-time").inner_text() == f"{TIME} --local-timezone UTC"
    assert "not started yet" in card.locator("h2").inner_text()
    assert ToolServer.objects.get(name="time").args == ["--local-timezone", "UTC"]
    shots(page, "2-registered")

    # A refused form comes back open, with why, and nothing is written.
    page.get_by_text("Register a stdio server").click()
    page.get_by_label("Name", exact=True).fill("clock")
    page.get_by_label("Command").fill("/nonexistent/server")
    page.get_by_label("Why (kept in the audit log)").fill("typo")
    page.get_by_role("button", name="Register the stdio server").click()
    page.get_by_text("'/nonexistent/server' is not an executable file").wait_for()
    assert not ToolServer.objects.filter(name="clock").exists()
    shots(page, "3-refused")

    # An import: pasted, previewed, registered.
    with UvicornThread(files_server(McpRecord()).streamable_http_app()) as running:
        url = f"http://127.0.0.1:{running.port}/mcp"
        page.goto(tools_url)
        page.get_by_text("Import an mcpServers file").click()
        servers = {
            "clock": {"command": TIME, "env": {"TZ": "${TZ}"}},
            "files": {"type": "http", "url": url,
                      "headers": {"Authorization": "Bearer ${GOVERNANCE_KEY_FILES}"}},
        }  # fmt: skip
        page.get_by_label("Or paste it").fill(json.dumps({"mcpServers": servers}, indent=2))
        page.get_by_role("button", name="Preview the import").click()
        page.get_by_text("2 servers will be registered").wait_for()
        assert page.locator("li.planned").count() == 2
        assert AuditEntry.objects.filter(target_id__in=["clock", "files"]).count() == 0
        shots(page, "4-import-preview")
        page.get_by_label("Why (kept in the audit log)").fill("team setup")
        page.get_by_role("button", name="Register 2 servers").click()
        page.get_by_text("Registered files (mcp): tools boom").wait_for()
    assert sorted(ToolServer.objects.values_list("name", flat=True)) == ["clock", "files", "time"]
    shots(page, "5-imported")


def test_processes_and_stderr_read_on_a_desktop_and_a_phone(
    page_for, live_server, admin, shots, clock
):
    server = ToolServer.objects.create(
        name="git", kind="mcp_stdio", command="/opt/mcp/bin/mcp-server-git",
        args=["--repository", "/srv/repositories/platform-monorepo"],
        env_names=["GIT_AUTHOR_EMAIL", "GIT_AUTHOR_NAME"], cwd="/srv/repositories",
    )  # fmt: skip
    ToolProcess.objects.create(
        server=server, worker="worker-1.internal:48211", state="running", pid=48240,
        started_at=T0, restarts=1, updated_at=T0,
        stderr_tail="\n".join(f"INFO git_status answered in {n} ms" for n in range(12))
        + "\nWARNING the repository has 1204 untracked files; git_status is slow",
    )  # fmt: skip
    ToolProcess.objects.create(
        server=server, worker="worker-2.internal:48377", state="failed", restarts=3,
        next_start_at=T0 + timedelta(minutes=4), updated_at=T0,
        last_error="the server did not start ([guard] cannot start '/opt/mcp/bin/mcp-server-git':"
        " No such file or directory)",
    )  # fmt: skip
    clock.advance(hours=3, minutes=7)
    for name, viewport in (("desktop", {"width": 1280, "height": 900}), ("phone", PHONE)):
        page = page_for(admin.username, **viewport)
        page.goto(f"{live_server.url}/tools/")
        summary = page.locator(".tools-summary")
        assert "1 of 1 stdio server in trouble" in summary.inner_text()
        running, failed = page.get_by_test_id("process-git").all()
        assert "running" in running.inner_text() and "up 3 h 07 min" in running.inner_text()
        assert "failed to start" in failed.inner_text()
        assert "Why it failed to start" in failed.inner_text()
        tail = running.locator("pre.stderr-tail")
        assert tail.is_hidden()
        running.get_by_text("Last stderr lines").click()
        assert tail.is_visible() and "untracked files" in tail.inner_text()
        # Nothing runs off the side of the screen: long command lines and logs wrap.
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= viewport["width"], (name, width)
        shots(page, f"processes-{name}")


def test_on_a_phone_a_refused_import_says_why_and_keeps_the_secret_out(
    page_for, live_server, make_user, shots
):
    """A tool manager (change_toolserver, not run_tool_command) pastes a
    Cursor file with a key in it: every problem is listed, nothing can be
    registered, and the key is nowhere on the page."""
    secret = "sk-live-0123456789abcdef"
    user = make_user("tim-tools", "operator")
    user.user_permissions.add(Permission.objects.get(codename="change_toolserver"))
    page = page_for(user.username, **PHONE)
    page.goto(f"{live_server.url}/tools/")
    assert page.get_by_text("Register a stdio server").count() == 0  # not theirs to use
    page.get_by_text("Import an mcpServers file").click()
    cursor = {
        "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                   "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": secret}},
        "legacy": {"type": "sse", "url": "http://127.0.0.1:9/sse"},
    }  # fmt: skip
    page.get_by_label("Or paste it").fill(json.dumps({"mcpServers": cursor}, indent=2))
    page.get_by_role("button", name="Preview the import").click()
    problems = page.locator(".import-problems")
    problems.wait_for()
    assert "Nothing can be registered 3 problems" in problems.inner_text()
    github, legacy = (entry.inner_text() for entry in page.locator("li.planned").all())
    assert "2 problems" in github and "run_tool_command" in github
    assert "GITHUB_PERSONAL_ACCESS_TOKEN has a value in the file" in github
    assert "1 problem" in legacy and "only Streamable HTTP is supported" in legacy
    assert secret not in page.content()
    assert page.get_by_role("button", name="Register").count() == 0
    assert not ToolServer.objects.exists()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= PHONE["width"], width
    shots(page, "refused-import-phone")
