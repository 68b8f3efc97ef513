"""A worker killed with SIGKILL leaves no stdio server behind.

A real ``celery -A tasks worker -P prefork`` process runs a run whose tool
call is stuck in a stdio server that its pool process started (a server that
reads nothing, so the end of its stdin would not stop it); every process
of the worker is then killed with SIGKILL (nothing of it runs a shutdown
hook), and the server and its guard must be gone within a bounded wait,
found in the process table by a marker argument of their own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from django.contrib.auth.models import Permission
from django.db import connection

from governance.models import Provider
from tests import stdio_servers
from tests.stdio_servers import MARKER, MARKER_ENV, recorded
from tests.tasks.conftest import every_queue_key

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
KILL_MARKER = f"{MARKER}-kill"


def _database_url() -> str:
    params = connection.settings_dict
    auth = params["USER"] + (f":{params['PASSWORD']}" if params["PASSWORD"] else "")
    return f"postgres://{auth}@{params['HOST']}:{params['PORT'] or 5432}/{params['NAME']}"


def wait_for(what: str, check, timeout: float, explain=lambda: ""):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}\n{explain()}"
        time.sleep(0.1)
    return value


@pytest.fixture(autouse=True)
def no_process_left(transactional_db):
    """The listing made when registering in this process left nothing either."""
    yield
    left = stdio_servers.wait_until_none_left()
    assert not left, f"stdio processes left behind: {left}"


@pytest.fixture
def prefork_worker(tmp_path, settings):
    import redis

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete(*every_queue_key(settings))
    log_path = tmp_path / "worker.log"
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "REDIS_URL": os.environ.get("REDIS_URL", ""),
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "GOVERNANCE_HOST_NAME": "stdio-kill",
        "GOVERNANCE_VAR_DIR": str(tmp_path / "var"),
        "GOVERNANCE_MCP_STDIO_COMMANDS": sys.executable,
        MARKER_ENV: KILL_MARKER,
        "LOG_LEVEL": "WARNING",
    }
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork",
                "-c", "1", "-l", "INFO", "--hostname", "worker@stdio-kill",
                "--without-mingle", "--without-gossip",
            ],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    tail = lambda: log_path.read_text(errors="replace")[-4000:]  # noqa: E731
    try:
        wait_for("the worker to be ready", lambda: " ready." in tail(), 60, tail)
        yield proc, tail
    finally:
        # Whatever the test got to: every process of the worker we started goes.
        for child in psutil.Process(proc.pid).children(recursive=True) if (
            proc.poll() is None
        ) else []:  # fmt: skip
            child.kill()
        proc.kill()
        proc.wait(30)
        broker.delete(*every_queue_key(settings))
        # A failed test must not leave its servers to the next ones (the
        # assertion above has spoken already).
        for process in stdio_servers_running():
            process.kill()


def test_sigkill_of_a_prefork_worker_leaves_no_stdio_server_behind(
    prefork_worker, api, django_user_model, settings, tmp_path
):
    proc, tail = prefork_worker
    settings.GOVERNANCE_MCP_STDIO_COMMANDS = None
    user = django_user_model.objects.get(username="engine")
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["change_toolserver", "run_tool_command"])
    )
    record = tmp_path / "stuck.record"
    command, args = stdio_servers.command("--record", str(record), "--marker", KILL_MARKER)
    api.post(
        "/api/v1/tools",
        {"name": "faults", "kind": "mcp_stdio", "command": command, "args": args,
         "env_names": [MARKER_ENV], "reason": "the kill test", "timeout_s": 120},
        expect=201,
    )  # fmt: skip
    Provider.objects.create(
        provider_id="p", kind="scripted", model="m",
        script={"rules": [
            {"when": {"last_role_not": "tool", "has_tool": True},
             "tool_call": {"name": "faults.stuck", "arguments": {}}},
        ]},
    )  # fmt: skip
    thread = api.post(
        "/api/v1/threads", {"provider_chain": ["p"], "tool_surface": ["faults.*"]}, expect=201
    ).json()
    run = api.post(f"/api/v1/threads/{thread['id']}/runs", {"input": "wait"}, expect=202).json()
    explain = lambda: tail() + str(api.get(f"/api/v1/runs/{run['run_id']}").json())  # noqa: E731

    # The worker's pool process started the server, and the call is stuck in it:
    # the server reads nothing, so the end of its stdin would not stop it.
    wait_for("the stuck call", lambda: recorded(record) == ["stuck 600"], 60, explain)
    ours = [p for p in stdio_servers_running() if KILL_MARKER in " ".join(p.cmdline())]
    guard = next(p for p in ours if "stdio_guard.py" in " ".join(p.cmdline()))
    server = next(p for p in ours if p.pid != guard.pid)
    assert server.ppid() == guard.pid
    pool_process = guard.parent()
    assert pool_process.ppid() == proc.pid  # a prefork child, not the main process

    workers = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children()]
    workers = [w for w in workers if "stdio_guard.py" not in " ".join(w.cmdline())]
    assert pool_process in workers
    for process in workers:
        os.kill(process.pid, signal.SIGKILL)
    proc.wait(30)

    left = stdio_servers.wait_until_none_left(KILL_MARKER, timeout=10)
    assert left == [], f"left behind by the killed worker: {left}"
    for process in (guard, server):
        assert not process.is_running() or process.status() == psutil.STATUS_ZOMBIE


def stdio_servers_running() -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if KILL_MARKER in " ".join(process.cmdline()):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found
