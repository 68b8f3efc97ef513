"""Stdio tool servers end to end: registered over the API, run by a real Celery
worker (in this process, threads) for a loopback tool-calling model.

Real servers from PyPI (``mcp-server-time``, ``mcp-server-git``, started from
this virtual environment) answer a run that settles completed with its
receipt; an external-effect tool of the SDK-built fault server that crashes
mid-call settles with its effect unknown and is never replayed (R4.2, R6.4:
stdio has no idempotency key), and the worker goes on serving the next run.
After every test no stdio process is left (the process tree is read)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission

from governance.models import Settlement, ToolProcess, ToolReceipt
from tasks import mcp_stdio
from tests import stdio_servers
from tests.stdio_servers import MARKER, MARKER_ENV, recorded
from tests.tasks import test_engine_registry_tools as registry_engine

pytestmark = pytest.mark.django_db(transaction=True)
ToolModel = registry_engine.ToolModel
model = registry_engine.model  # its fixture: a tool-calling model on loopback

BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def stdio_settings(settings, monkeypatch):
    settings.GOVERNANCE_MCP_STDIO_COMMANDS = None  # any command (as under `make run`)
    settings.GOVERNANCE_MCP_STDIO_START_SECONDS = 15.0
    monkeypatch.setenv(MARKER_ENV, MARKER)


@pytest.fixture(autouse=True)
def no_process_left(transactional_db):
    """After every test: the worker's stdio servers stopped, and no guard or
    server of ours left in the process tree (or anywhere, with our marker)."""
    yield
    mcp_stdio.POOL.stop_all()
    left = stdio_servers.wait_until_none_left()
    assert not left, f"stdio processes left behind: {left}"


@pytest.fixture
def admin_api(api, django_user_model):
    """The API as someone who may register commands the workers run."""
    user = django_user_model.objects.get(username="engine")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["change_toolserver", "run_tool_command"])
    )
    return api


def register(api, name: str, command: str, args: list[str], **extra) -> dict:
    return api.post(
        "/api/v1/tools",
        {"name": name, "kind": "mcp_stdio", "command": command, "args": args,
         "env_names": [MARKER_ENV], "reason": "the stdio tests", **extra},
        expect=201,
    ).json()  # fmt: skip


def thread_for(api, surface: str) -> dict:
    return api.post(
        "/api/v1/threads", {"provider_chain": ["oa"], "tool_surface": [surface]}, expect=201
    ).json()


def tool_message(request: dict) -> str:
    last = request["messages"][-1]
    assert last["role"] == "tool"
    return last["content"]


def test_a_run_calls_mcp_server_time_from_pypi_and_settles_completed_with_its_receipt(
    admin_api, worker, manual_clock, model
):
    registered = register(admin_api, "time", str(BIN / "mcp-server-time"), [])
    assert {t["name"] for t in registered["tools"]} >= {
        "time.get_current_time",
        "time.convert_time",
    }
    thread = thread_for(admin_api, "time.*")
    model.tool, model.arguments = "time__get_current_time", {"timezone": "UTC"}

    run = admin_api.run_and_wait(thread["id"], "What time is it in UTC?")

    assert run["settlement"]["outcome"] == "completed"
    (receipt,) = run["receipts"]
    assert receipt["tool"] == "time.get_current_time" and receipt["server"] == "time"
    assert receipt["effect"] == "succeeded" and receipt["effect_class"] == "read_only"
    assert receipt["schema_version"] == 1 and receipt["latency_ms"] is not None
    answer = json.loads(tool_message(model.requests[1]))["structured"]
    assert answer["timezone"] == "UTC" and answer["datetime"]
    row = ToolReceipt.objects.get(run_id=run["id"])
    assert json.loads(row.result["content"])["timezone"] == "UTC"
    # The worker process that called it keeps it running, and says so.
    (process,) = ToolProcess.objects.filter(server__name="time")
    assert process.state == "running" and process.pid


def test_a_run_calls_mcp_server_git_on_a_repository_and_settles_completed(
    admin_api, worker, manual_clock, model, tmp_path
):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=Tests", "-c", "user.email=tests@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "notes.txt").write_text("hello\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "First notes for the stdio test"], check=True)

    register(admin_api, "git", str(BIN / "mcp-server-git"), ["--repository", str(repo)])
    thread = thread_for(admin_api, "git.*")
    model.tool, model.arguments = "git__git_log", {"repo_path": str(repo), "max_count": 1}

    run = admin_api.run_and_wait(thread["id"], "What was the last commit?")

    assert run["settlement"]["outcome"] == "completed"
    (receipt,) = run["receipts"]
    assert receipt["tool"] == "git.git_log" and receipt["effect"] == "succeeded"
    assert receipt["effect_class"] == "read_only"
    assert "First notes for the stdio test" in tool_message(model.requests[1])


def test_r4_2_r6_4_an_external_stdio_tool_that_crashes_mid_call_is_unknown_and_not_replayed(
    admin_api, worker, manual_clock, model, tmp_path
):
    record = tmp_path / "sent.record"
    command, args = stdio_servers.command("--record", str(record), "--marker", MARKER)
    register(admin_api, "faults", command, args, timeout_s=15.0)
    thread = thread_for(admin_api, "faults.*")
    model.tool, model.arguments = "faults__send_then_crash", {"to": "ops", "text": "deploy done"}

    run = admin_api.run_and_wait(thread["id"], "Tell ops")

    # It acted exactly once; nothing sent it again.
    assert recorded(record) == ["send ops: deploy done"]
    (receipt,) = run["receipts"]
    assert receipt["tool"] == "faults.send_then_crash" and receipt["effect"] == "unknown"
    assert receipt["effect_class"] == "external_effect"
    assert "not known" in receipt["error"] and "sent, now crashing" in receipt["error"]
    assert "verify_effect" in [d["path"] for d in run["lifecycle"]]
    settlement = Settlement.objects.get(run_id=run["id"])
    assert settlement.outcome != "completed"
    assert receipt["idempotency_key"] in json.dumps(settlement.unknown_effects)
    assert "stay unknown and were not replayed" in settlement.reason
    assert len(model.requests) == 1  # the model was not told it had worked

    # The worker goes on: the next run gets a fresh process of the same server.
    model.requests = []
    model.tool, model.arguments = "faults__echo", {"text": "still there?"}
    again = admin_api.run_and_wait(thread_for(admin_api, "faults.*")["id"], "Echo")
    assert again["settlement"]["outcome"] == "completed"
    assert again["receipts"][0]["effect"] == "succeeded"
    assert "still there? (pid " in tool_message(model.requests[1])
    assert recorded(record) == ["send ops: deploy done"]
    (process,) = ToolProcess.objects.filter(server__name="faults")
    assert process.state == "running" and process.restarts == 1
    assert "sent, now crashing" in process.last_error
