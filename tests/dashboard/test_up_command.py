"""README's run command: web + worker + scheduler on the embedded defaults."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from dashboard.site.management.commands.up import (
    ROOT_NOTICE,
    child_commands,
    child_log_level,
    describe_status,
    read_status,
)
from dashboard.site.supervisor import Restart, RestartPolicy, StatusReport, Supervisor, exit_message
from tests.conftest import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def start_up(tmp_path: Path):
    """Start `manage.py up` on a free port with its own var dir; ``*args`` are up's options."""
    started = []

    def start(*args: str):
        port = _free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DJANGO_", "DATABASE_", "CELERY_", "OTEL_"))
            and k not in {"REDIS_URL", "LOG_LEVEL"}
        }
        env.update(
            {
                "GOVERNANCE_VAR_DIR": str(tmp_path / "var"),
                "GOVERNANCE_HEARTBEAT_SECONDS": "1",
                "GOVERNANCE_UP_STATUS_SECONDS": "1",
            }
        )
        process = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(port), "--concurrency", "1", *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            umask=0o022,  # the usual one: the embedded files must not follow it
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        started.append(process)
        return f"http://127.0.0.1:{port}", process, lines

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


@pytest.fixture
def system(start_up):
    return start_up()


# What the children print at INFO: the scheduler's "Sending due task", the
# worker's "received" / "succeeded", uvicorn's "Uvicorn running on", Celery's banners.
INFO_NOISE = re.compile(
    r"Sending due task|Task \S+ received|succeeded in|Uvicorn running on|celery@|beat: Starting"
)
STATUS_LINE = re.compile(
    r"^\[\d\d:\d\d:\d\d UTC\] \d+ runs? in progress, \d+ stages? waiting, "
    r"(last beat \d+ s ago|no beat yet)( \(late\))? - http://127\.0\.0\.1:\d+/$",
    re.MULTILINE,
)


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


def test_up_runs_web_worker_and_scheduler_on_embedded_defaults(system, tmp_path: Path):
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

    # The first screen: the URL and credentials, then the start line; the
    # children run at WARNING (the beats above went through without INFO lines)
    # and the status comes as one line when it changes.
    _text_match(lines, STATUS_LINE, 10)
    printed = "".join(lines)
    assert f"Dashboard: {base}/  user: admin  password: " in printed
    assert printed.index("password:") < printed.index("Started web")
    assert not INFO_NOISE.search(printed), printed
    assert "No hostname was supplied" not in printed
    assert (ROOT_NOTICE in printed) == (os.geteuid() == 0)
    # up made the embedded defaults' folders before starting the children.
    var = tmp_path / "var"
    assert (var / "broker" / "queue").is_dir() and (var / "staticfiles").is_dir()
    # Owner-only, whatever the umask: the folders and the database.
    for path in (var, var / "broker", var / "broker" / "queue", var / "staticfiles"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE((var / "db.sqlite3").stat().st_mode) == 0o600

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
    assert set(pids) == {"web", "worker", "alerts", "scheduler"}  # alerts: a worker of its own
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
from dashboard.site.supervisor import RestartPolicy, Supervisor
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

    def __init__(self, argv, cwd=None, env=None):
        self.argv, self.pid, self.returncode = argv, next(self.pids), None
        self.env = env
        self.signals: list[int] = []

    def poll(self):
        return self.returncode

    def send_signal(self, signum):
        self.signals.append(signum)
        self.returncode = -signum

    def wait(self, timeout=None):
        return self.returncode


def test_supervisor_restarts_only_when_the_backoff_is_due_and_never_while_stopping(monkeypatch):
    monkeypatch.setattr("dashboard.site.supervisor.subprocess.Popen", _FakeProcess)
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


def test_up_verbose_brings_the_full_logs_back(start_up):
    _base, process, lines = start_up("--verbose", "--no-demo-admin")
    _text_match(lines, re.compile(r"Sending due task"), 60)
    _text_match(lines, re.compile(r"Task tasks\.jobs\.scheduler_heartbeat\[\S+\] succeeded"), 30)
    printed = "".join(lines)
    assert "Uvicorn running on" in printed
    assert not STATUS_LINE.search(printed)  # the logs say it all
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0


# --------------------------------------------------------------------------- what up prints


def test_children_run_at_warning_unless_verbose_or_log_level_says_otherwise():
    assert child_log_level(verbose=False, log_level=None) == "WARNING"
    assert child_log_level(verbose=True, log_level=None) == "INFO"
    assert child_log_level(verbose=False, log_level="INFO") == "INFO"
    assert child_log_level(verbose=False, log_level="ERROR") == "ERROR"
    assert child_log_level(verbose=True, log_level="DEBUG") == "DEBUG"
    assert child_log_level(verbose=True, log_level="ERROR") == "INFO"


def _commands(level: str) -> dict[str, list[str]]:
    return child_commands(
        host="0.0.0.0", port=8123, concurrency=3, level=level, schedule="/s", python="py"
    )


def test_child_commands_carry_the_level_and_drop_celerys_banners_below_info():
    quiet = _commands("WARNING")
    assert quiet["web"][:4] == ["py", "-m", "uvicorn", "dashboard.site.asgi:application"]
    assert quiet["web"][4:] == [
        "--host", "0.0.0.0", "--port", "8123", "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    assert quiet["worker"][:4] == ["py", "-m", "celery", "--quiet"]
    assert quiet["worker"][quiet["worker"].index("--loglevel") + 1] == "WARNING"
    assert quiet["worker"][quiet["worker"].index("--concurrency") + 1] == "3"
    assert quiet["scheduler"][:4] == ["py", "-m", "celery", "--quiet"]
    assert quiet["scheduler"][-4:] == ["--loglevel", "WARNING", "--schedule", "/s"]

    # Every queue on the worker; the alerts queue also on a process of its own.
    assert quiet["worker"][quiet["worker"].index("--queues") + 1] == (
        "alerts,turns,tools,callbacks,maintenance"
    )
    assert quiet["alerts"][quiet["alerts"].index("--queues") + 1] == "alerts"
    assert quiet["alerts"][quiet["alerts"].index("--concurrency") + 1] == "1"

    full = _commands("INFO")
    assert "--quiet" not in full["worker"] and "--quiet" not in full["scheduler"]
    assert full["web"][-2:] == ["--log-level", "info"]
    assert full["scheduler"][full["scheduler"].index("--loglevel") + 1] == "INFO"


AT = datetime(2026, 3, 1, 14, 32, 5, tzinfo=UTC)
URL = "http://127.0.0.1:8001/"


def _status(runs=0, waiting=0, beat_age: float | None = 3.0) -> StatusReport:
    return describe_status(
        runs=runs, waiting=waiting, beat_age=beat_age, stale_after=90, url=URL, at=AT
    )


def test_status_line_says_runs_stages_and_the_last_beat():
    assert _status().line == (
        "[14:32:05 UTC] 0 runs in progress, 0 stages waiting, last beat 3 s ago - " + URL
    )
    assert _status(1, 1, 12.4).line.startswith(
        "[14:32:05 UTC] 1 run in progress, 1 stage waiting, last beat 12 s ago"
    )
    assert "2 runs in progress, 5 stages waiting, last beat 91 s ago (late)" in (
        _status(2, 5, 91).line
    )
    assert "no beat yet" in _status(beat_age=None).line


def test_status_state_changes_with_the_counts_and_the_beats_health_not_its_age():
    assert _status(beat_age=1).state == _status(beat_age=29).state  # idle: nothing new
    assert _status(runs=1).state != _status().state
    assert _status(waiting=1).state != _status().state
    assert _status(beat_age=91).state != _status().state  # late
    assert _status(beat_age=None).state != _status().state


@pytest.mark.django_db
def test_read_status_counts_active_runs_and_stages_not_started():
    from governance import services, time_source
    from governance.models import Provider
    from tasks.jobs import record_heartbeat

    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    thread = services.create_thread(provider_chain=["p"], title="t", now=time_source.now())
    services.submit_run(thread, input="hi", now=time_source.now())
    beat = record_heartbeat("scheduler", "test")
    beat_at = datetime.fromisoformat(beat["at"])

    report = read_status(URL, now=beat_at + timedelta(seconds=4))
    assert "1 run in progress, 1 stage waiting, last beat 4 s ago - " + URL in report.line
    late = read_status(URL, now=beat_at + timedelta(seconds=1000))
    assert "last beat 1000 s ago (late)" in late.line


# --------------------------------------------------------------------------- make run


def _make_n(*args: str) -> str:
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", "run", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={k: v for k, v in os.environ.items() if k not in {"HOST", "PORT", "VERBOSE"}},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[-1]


def test_make_run_passes_port_and_host_to_up():
    assert _make_n().endswith("manage.py up --host 127.0.0.1 --port 8000")
    assert _make_n("PORT=8001").endswith("manage.py up --host 127.0.0.1 --port 8001")
    assert _make_n("PORT=8001", "HOST=0.0.0.0").endswith("manage.py up --host 0.0.0.0 --port 8001")
    assert _make_n("VERBOSE=1").endswith("manage.py up --host 127.0.0.1 --port 8000 --verbose")


def test_supervisor_gives_children_the_environment_it_was_given(monkeypatch):
    monkeypatch.setattr("dashboard.site.supervisor.subprocess.Popen", _FakeProcess)
    supervisor = Supervisor({"web": ["w"]}, env={"LOG_LEVEL": "WARNING"}, log=lambda _: None)
    supervisor._start(supervisor.children[0], now=0.0)
    assert supervisor.children[0].process.env == {"LOG_LEVEL": "WARNING"}


class _Statuses:
    """A status source: the reports to hand out, and how often it was asked."""

    def __init__(self, *reports: StatusReport | Exception):
        self.reports, self.asked = list(reports), 0

    def __call__(self) -> StatusReport:
        self.asked += 1
        report = self.reports.pop(0)
        if isinstance(report, Exception):
            raise report
        return report


def test_status_is_asked_every_interval_and_logged_only_when_it_changed():
    idle = StatusReport((0, 0, "ok"), "idle")
    busy = StatusReport((1, 1, "ok"), "busy")
    statuses = _Statuses(idle, StatusReport(idle.state, "idle, older beat"), busy, idle)
    lines: list[str] = []
    supervisor = Supervisor({}, log=lines.append, status=statuses, status_every=30)
    supervisor._status_due = 100.0 + 30  # as run() sets it when the children started

    for now in (100.0, 110.0, 129.9):
        supervisor._report_status(now)
    assert statuses.asked == 0 and lines == []
    supervisor._report_status(130.0)
    assert lines == ["idle"]
    supervisor._report_status(150.0)  # not due again before 160
    supervisor._report_status(160.0)  # same state: nothing printed while idle
    assert statuses.asked == 2 and lines == ["idle"]
    supervisor._report_status(190.0)
    supervisor._report_status(220.0)
    assert lines == ["idle", "busy", "idle"]


def test_a_status_that_fails_is_logged_once_and_the_supervisor_goes_on():
    statuses = _Statuses(OSError("db gone"), OSError("db gone"), StatusReport("s", "back"))
    lines: list[str] = []
    supervisor = Supervisor({}, log=lines.append, status=statuses, status_every=1)
    supervisor._status_due = 0.0
    for now in (0.0, 1.0, 2.0):
        supervisor._report_status(now)
    assert lines == ["status unavailable: OSError('db gone')", "back"]


def test_no_status_when_its_interval_is_zero():
    statuses = _Statuses()
    supervisor = Supervisor({}, log=lambda _: None, status=statuses, status_every=0)
    supervisor._status_due = 0.0
    supervisor._report_status(1e9)
    assert statuses.asked == 0


class _StubbornProcess(_FakeProcess):
    def send_signal(self, signum):
        self.signals.append(signum)  # ignores it

    def wait(self, timeout=None):
        if timeout is not None and signal.SIGKILL not in self.signals:
            raise subprocess.TimeoutExpired(self.argv, timeout)
        return self.returncode

    def kill(self):
        self.signals.append(signal.SIGKILL)
        self.returncode = -9


def test_a_child_that_ignores_sigterm_is_killed_and_that_is_logged(monkeypatch):
    monkeypatch.setattr("dashboard.site.supervisor.subprocess.Popen", _StubbornProcess)
    lines: list[str] = []
    supervisor = Supervisor({"worker": ["k"]}, log=lines.append, stop_timeout=0.01)
    supervisor._start(supervisor.children[0], now=0.0)
    supervisor._stop_all()
    assert supervisor.children[0].process.signals == [signal.SIGTERM, signal.SIGKILL]
    assert lines == ["worker did not stop within 0.01s; killing it."]
