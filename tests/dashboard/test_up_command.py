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

from dashboard.supervisor import Restart, RestartPolicy, Supervisor, exit_message
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

    # A SIGKILLed worker is restarted; web and beat keep running.
    pids = _started_pids(lines)
    os.kill(pids["worker"], signal.SIGKILL)
    restarted = _text_match(lines, re.compile(r"Restarted worker \(pid (\d+)\)\."), 10)
    assert "worker exited with code -9; restarting in 1s (restart 1)" in "".join(lines)
    worker = int(restarted.group(1))
    assert worker != pids["worker"] and _alive(worker)
    assert _alive(pids["web"]) and _alive(pids["scheduler"])
    assert httpx.get(f"{base}/login/", timeout=5).status_code == 200

    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert "Stopped web, worker and scheduler." in "".join(lines)
    for pid in (pids["web"], pids["scheduler"], worker):
        assert not _alive(pid), pid


# --------------------------------------------------------------------------- the supervisor

SUPERVISE = """
import sys
from dashboard.supervisor import RestartPolicy, Supervisor
children = {
    "web": [sys.executable, "-c", "import time; time.sleep(60)"],
    "worker": [sys.executable, "-c", "import time; time.sleep(60)"],
    "scheduler": [sys.executable, "-c", sys.argv[1]],
}
policy = RestartPolicy(base=0.1, cap=0.4, stable_after=30, crash_loop_after=3)
Supervisor(children, log=lambda line: print(line, flush=True), policy=policy,
           poll_seconds=0.05, stop_timeout=5).run()
print("supervisor stopped", flush=True)
"""
STARTED = re.compile(r"^Started (.*)\.$", re.MULTILINE)
CHILD_PID = re.compile(r"(\w+) \(pid (\d+)\)")


@pytest.fixture
def supervisor():
    """Start the supervisor on stand-in children; the scheduler runs the given code."""
    started = []

    def start(scheduler_code: str = "import time; time.sleep(60)"):
        process = subprocess.Popen(
            [sys.executable, "-c", SUPERVISE, scheduler_code],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True).start()
        started.append(process)
        return process, lines

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


def _text_match(lines: list[str], pattern: re.Pattern, timeout: float = 5.0) -> re.Match:
    return _wait_for(lambda: pattern.search("".join(lines)), timeout, pattern.pattern, lines)


def _started_pids(lines: list[str], timeout: float = 5.0) -> dict[str, int]:
    listed = _text_match(lines, STARTED, timeout).group(1)
    return {name: int(pid) for name, pid in CHILD_PID.findall(listed)}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_killed_child_is_restarted_and_the_others_keep_running(supervisor):
    process, lines = supervisor()
    pids = _started_pids(lines)
    assert set(pids) == {"web", "worker", "scheduler"} and all(map(_alive, pids.values()))

    os.kill(pids["worker"], signal.SIGKILL)
    restarted = _text_match(lines, re.compile(r"Restarted worker \(pid (\d+)\)\."))
    new_worker = int(restarted.group(1))
    printed = "".join(lines)
    assert "worker exited with code -9; restarting in 0.1s (restart 1)" in printed
    assert new_worker != pids["worker"] and _alive(new_worker)
    assert not _alive(pids["worker"])
    assert _alive(pids["web"]) and _alive(pids["scheduler"])
    assert "web exited" not in printed and "scheduler exited" not in printed

    # Killed again soon after its restart: the backoff doubles.
    os.kill(new_worker, signal.SIGKILL)
    again = _text_match(lines, re.compile(r"Restarted worker \(pid (\d+)\)\.(?s:.*)Restarted"))
    assert "worker exited with code -9; restarting in 0.2s (restart 2)" in "".join(lines)
    newest = int(CHILD_PID.findall(again.group(0))[-1][1])

    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 0
    assert "".join(lines).endswith("Stopping on SIGTERM.\nsupervisor stopped\n")
    for pid in (pids["web"], pids["scheduler"], newest):
        assert not _alive(pid), pid


def test_a_crash_looping_child_is_logged_and_restarted_and_ctrl_c_stops_all(supervisor):
    process, lines = supervisor("raise SystemExit(3)")
    pids = _started_pids(lines)
    loop = re.compile(r"scheduler exited with code 3; restarting in 0\.4s \(restart 4\); .*")
    line = _text_match(lines, loop).group(0)
    assert "scheduler keeps failing right after start (4 quick failures in a row)" in line
    printed = "".join(lines)
    for n, delay in enumerate(["0.1s", "0.2s", "0.4s"], start=1):
        assert f"scheduler exited with code 3; restarting in {delay} (restart {n})" in printed
    assert _alive(pids["web"]) and _alive(pids["worker"])

    # Ctrl-C in a terminal: SIGINT reaches the whole process group at once.
    os.killpg(process.pid, signal.SIGINT)
    assert process.wait(10) == 0
    # Nothing is restarted once the stop began.
    assert "".join(lines).split("Stopping on SIGINT.\n", 1)[1] == "supervisor stopped\n"
    assert not _alive(pids["web"]) and not _alive(pids["worker"])


# --------------------------------------------------------------------------- the backoff policy


def test_restart_backoff_doubles_per_quick_failure_up_to_the_cap():
    policy = RestartPolicy(base=1, cap=30, stable_after=60, crash_loop_after=5)
    failures, delays, started_at = 0, [], 1000.0
    for _ in range(8):
        now = started_at + 2  # up 2 s each time: a quick failure
        restart = policy.next_delay(now, started_at, failures)
        delays.append(restart.delay)
        failures = restart.failures
        started_at = now + restart.delay
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert failures == 8


def test_restart_backoff_resets_after_the_child_stayed_up():
    policy = RestartPolicy(base=1, cap=30, stable_after=60)
    assert policy.next_delay(now=1059.9, started_at=1000, failures=4) == Restart(16, 5, True)
    assert policy.next_delay(now=1060, started_at=1000, failures=4) == Restart(1, 1, False)
    assert policy.next_delay(now=5000, started_at=1000, failures=40) == Restart(1, 1, False)


def test_restart_backoff_flags_a_crash_loop_and_survives_long_streaks():
    policy = RestartPolicy(base=1, cap=30, stable_after=60, crash_loop_after=5)
    assert not policy.next_delay(10, 9, failures=3).crash_looping
    assert policy.next_delay(10, 9, failures=4).crash_looping
    assert policy.next_delay(10, 9, failures=10_000) == Restart(30, 10_001, True)


@pytest.mark.parametrize(
    "values",
    [{"base": 0}, {"base": 2, "cap": 1}, {"stable_after": 0}, {"crash_loop_after": 0}],
)
def test_restart_policy_rejects_values_that_cannot_back_off(values):
    with pytest.raises(ValueError):
        RestartPolicy(**values)


def test_exit_line_names_the_child_code_delay_and_restart_count():
    assert (
        exit_message("worker", -9, Restart(1, 1, False), restarts=1)
        == "worker exited with code -9; restarting in 1s (restart 1)"
    )
    assert exit_message("web", 1, Restart(30, 6, True), restarts=9) == (
        "web exited with code 1; restarting in 30s (restart 9); web keeps failing right "
        "after start (6 quick failures in a row), still restarting it"
    )
    assert exit_message("web", None, Restart(2, 2, False), restarts=2).startswith(
        "web could not be started; restarting in 2s"
    )


class _FakeProcess:
    pids = iter(range(100, 1000))

    def __init__(self, argv, cwd=None):
        self.argv, self.pid, self.returncode = argv, next(self.pids), None
        self.signals: list[int] = []

    def poll(self):
        return self.returncode

    def send_signal(self, signum):
        self.signals.append(signum)
        self.returncode = -signum

    def wait(self, timeout=None):
        return self.returncode


def test_supervisor_restarts_only_when_the_backoff_is_due_and_never_while_stopping(monkeypatch):
    monkeypatch.setattr("dashboard.supervisor.subprocess.Popen", _FakeProcess)
    lines: list[str] = []
    supervisor = Supervisor(
        {"web": ["w"], "worker": ["k"]},
        policy=RestartPolicy(base=1, cap=30, stable_after=60),
        log=lines.append,
    )
    for child in supervisor.children:
        supervisor._start(child, now=0.0)
    web, worker = (child.process for child in supervisor.children)

    worker.returncode = -9
    supervisor._step(now=10.0)
    assert lines == ["worker exited with code -9; restarting in 1s (restart 1)"]
    supervisor._step(now=10.9)
    assert supervisor.pids() == {"web": web.pid, "worker": None}
    supervisor._step(now=11.0)
    new_worker = supervisor.children[1].process
    assert supervisor.pids() == {"web": web.pid, "worker": new_worker.pid}
    assert lines[-1] == f"Restarted worker (pid {new_worker.pid})."

    new_worker.returncode = 1  # again after 0.5 s: a quick failure, twice the wait
    supervisor._step(now=11.5)
    assert lines[-1] == "worker exited with code 1; restarting in 2s (restart 2)"
    supervisor.request_stop(signal.SIGTERM)
    supervisor._step(now=20.0)
    assert supervisor.pids()["worker"] is None
    supervisor._stop_all()
    assert web.signals == [signal.SIGTERM]
