"""README's run command: web + worker + scheduler on the embedded defaults."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def system(tmp_path: Path):
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_", "CELERY_", "OTEL_")) and k not in {"REDIS_URL"}
    }
    env.update({"GOVERNANCE_VAR_DIR": str(tmp_path / "var"), "GOVERNANCE_HEARTBEAT_SECONDS": "1"})
    process = subprocess.Popen(
        [sys.executable, "manage.py", "up", "--port", str(port), "--concurrency", "1"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
    reader.start()
    try:
        yield f"http://127.0.0.1:{port}", process, lines
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _wait_for(check, timeout: float, what: str, lines: list[str]):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"{what} not reached; last={last!r}\n{''.join(lines[-40:])}")


def test_up_runs_web_worker_and_scheduler_on_embedded_defaults(system):
    base, process, lines = system

    def all_alive():
        data = httpx.get(f"{base}/healthz", timeout=5).json()
        return data if data["worker"]["ok"] and data["scheduler"]["ok"] else None

    health = _wait_for(all_alive, 90, "worker and scheduler heartbeats", lines)
    assert health["database"]["detail"] == "sqlite"

    printed = "".join(lines)
    match = re.search(r"user: (\S+)\s+password: (\S+)", printed)
    assert match, printed
    username, password = match.groups()

    with httpx.Client(base_url=base, timeout=10) as browser:
        login_page = browser.get("/login/")
        token = browser.cookies["csrftoken"]
        assert login_page.status_code == 200
        response = browser.post(
            "/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        )
        assert response.status_code == 302, response.text[:500]
        overview = browser.get("/")
        assert overview.status_code == 200
        assert "Scheduler" in overview.text

    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert "Stopped web, worker and scheduler." in "".join(lines)
