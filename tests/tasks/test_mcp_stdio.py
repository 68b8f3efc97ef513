"""The stdio pool (``tasks.mcp_stdio``) against a real, misbehaving stdio MCP
server (``tests/stdio_servers.py``, built on the SDK): one process per server
reused across calls, a crash, a hang, garbage on stdout, a slow or failed
start — each gives its fact (``failed`` or ``unknown`` by effect class, R4.2,
R6.4; a hang cut by the call's clock, R6.1), the next call gets a fresh
process, and no process is left behind (the process tree is read after every
test)."""

from __future__ import annotations

import os
import re
import socket
import threading
import time

import psutil
import pytest

from governance.models import ToolProcess, ToolServer
from governance.rules import tools as tool_rules
from tasks import mcp_stdio
from tasks.mcp_stdio import StdioPool, restart_delay
from tests import stdio_servers
from tests.stdio_servers import MARKER, MARKER_ENV, recorded

pytestmark = pytest.mark.django_db


class FakeClock:
    """The pool's backoff clock, moved by the test (no sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def stdio_settings(settings, monkeypatch):
    settings.GOVERNANCE_MCP_STDIO_COMMANDS = None  # any command (as under `make run`)
    settings.GOVERNANCE_MCP_STDIO_START_SECONDS = 15.0
    monkeypatch.setenv(MARKER_ENV, MARKER)


@pytest.fixture(autouse=True)
def no_process_left(db):
    """After every test: the pools stopped, and no guard or server of ours is
    left in the process tree (or anywhere, carrying this session's marker)."""
    yield
    mcp_stdio.POOL.stop_all()
    left = stdio_servers.wait_until_none_left()
    assert not left, f"stdio processes left behind: {left}"


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def pool(clock):
    the_pool = StdioPool(clock=clock)
    yield the_pool
    the_pool.stop_all()


@pytest.fixture
def make_server(tmp_path):
    def make(*args: str, name: str = "faults", timeout_s: float = 15.0) -> ToolServer:
        command, argv = stdio_servers.command(
            "--record", str(tmp_path / f"{name}.record"), "--marker", MARKER, *args
        )
        return ToolServer.objects.create(
            name=name, kind=ToolServer.Kind.MCP_STDIO, command=command, args=argv,
            env_names=[MARKER_ENV], timeout_s=timeout_s,
        )  # fmt: skip

    return make


def pid_of(outcome) -> int:
    assert outcome.end == "result", outcome
    return int(re.search(r"\(pid (\d+)\)", outcome.output["content"]).group(1))


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` died within a bounded wait (a zombie counts as dead)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def effect_classes(pool: StdioPool, server: ToolServer) -> dict[str, str]:
    """Each tool's effect class, from the annotations the server lists (R4.1)."""
    listing = pool.list_tools(server, timeout_s=15)
    assert listing.tools is not None, listing.error
    return {t["name"]: tool_rules.effect_class(t["annotations"]) for t in listing.tools}


def process_row(server: ToolServer) -> ToolProcess:
    return ToolProcess.objects.get(server=server, worker=f"{socket.gethostname()}:{os.getpid()}")


# --------------------------------------------------------------------------- one process


def test_r1_3_one_process_serves_every_call_hears_list_changed_and_reports_its_state(
    pool, make_server
):
    server = make_server()
    first = pool.call_tool(server, "echo", {"text": "one"}, timeout_s=15)
    second = pool.call_tool(server, "echo", {"text": "two"}, timeout_s=15)
    pid = pid_of(first)
    assert pid_of(second) == pid  # reused, not started again
    assert second.output["content"].startswith("two")

    # A tools/list_changed announced during a call is heard: the tools are listed again.
    grown = pool.call_tool(server, "grow", {}, timeout_s=15)
    assert grown.end == "result" and grown.output["content"] == "grown"
    assert "extra" in {t["name"] for t in grown.relisted}
    assert pid_of(pool.call_tool(server, "echo", {"text": "three"}, timeout_s=15)) == pid

    # The guard runs it in a process group of its own, told this process's pid.
    server_process = psutil.Process(pid)
    guard = server_process.parent()
    assert "stdio_guard.py" in " ".join(guard.cmdline())
    assert guard.cmdline()[guard.cmdline().index("--") - 1] == str(os.getpid())
    assert guard.ppid() == os.getpid()
    assert os.getpgid(pid) == os.getpgid(guard.pid) == guard.pid
    # Its environment is what was named (and the SDK's safe defaults), nothing else.
    environment = server_process.environ()
    assert environment[MARKER_ENV] == MARKER
    assert "DATABASE_URL" not in environment and "REDIS_URL" not in environment

    row = process_row(server)
    assert row.state == "running" and row.pid == pid and row.restarts == 0
    assert row.started_at is not None and row.last_error == ""
    assert f"fault server {pid} ready" in row.stderr_tail


def test_a_server_that_died_while_idle_is_started_again_and_a_new_launch_replaces_it(
    pool, make_server
):
    server = make_server()
    first = pid_of(pool.call_tool(server, "echo", {"text": "a"}, timeout_s=15))
    psutil.Process(first).kill()  # dies between calls
    assert gone(first)
    second = pid_of(pool.call_tool(server, "echo", {"text": "b"}, timeout_s=15))
    assert second != first
    row = process_row(server)
    assert row.state == "running" and row.restarts == 1
    assert "killed by signal 9" in row.last_error

    # An admin changed what it runs: the running process is replaced at once.
    server.args = [*server.args, "--slow-start", "0.1"]
    server.save()
    third = pid_of(pool.call_tool(server, "echo", {"text": "c"}, timeout_s=15))
    assert third not in (first, second)
    assert "--slow-start" in psutil.Process(third).cmdline()
    assert gone(second)


# --------------------------------------------------------------------------- faults mid-call


def test_r4_2_r6_4_a_crash_mid_call_is_failed_for_read_only_unknown_for_external_never_resent(
    pool, make_server, clock, tmp_path
):
    server = make_server()
    effects = effect_classes(pool, server)
    assert effects["crash"] == "read_only" and effects["send_then_crash"] == "external_effect"

    crashed = pool.call_tool(server, "crash", {}, timeout_s=15)
    assert crashed.end == "no_answer" and crashed.output["request_sent"] is True
    assert tool_rules.call_effect(crashed.end, effects["crash"]) == "failed"
    assert "crashing on purpose" in crashed.error and "exited with code 7" in crashed.error
    row = process_row(server)
    assert row.state == "restarting" and row.pid is None
    assert "crashing on purpose" in row.stderr_tail

    # The next call starts it again at once (the first restart has no delay).
    sent = pool.call_tool(server, "send_then_crash", {"to": "ops", "text": "hi"}, timeout_s=15)
    assert sent.end == "no_answer"
    assert tool_rules.call_effect(sent.end, effects["send_then_crash"]) == "unknown"
    assert "whether it acted is not known" in sent.error
    # It acted once, and nothing sent it again (stdio has no idempotency key).
    assert recorded(tmp_path / "faults.record") == ["send ops: hi"]

    # Two failures in a row: the third start waits a second (the backoff's clock).
    waiting = pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15)
    assert waiting.end == "not_sent" and "next start in 1 s" in waiting.error
    clock.now += 1.0
    assert pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15).end == "result"
    assert recorded(tmp_path / "faults.record") == ["send ops: hi"]
    assert process_row(server).restarts == 2


def test_r6_1_a_hung_call_is_cut_at_its_timeout_and_its_process_replaced(pool, make_server):
    server = make_server()
    before = pid_of(pool.call_tool(server, "echo", {"text": "warm"}, timeout_s=15))
    # Another call on the same process, with a longer clock, is in flight meanwhile.
    other: dict = {}
    in_flight = threading.Thread(
        target=lambda: other.setdefault(
            "outcome", pool.call_tool(server, "hang", {}, timeout_s=12.0)
        )
    )
    in_flight.start()

    started = time.monotonic()
    hung = pool.call_tool(server, "hang", {}, timeout_s=1.0)
    took = time.monotonic() - started
    assert hung.end == "no_answer" and hung.output["timed_out"] is True
    assert 0.9 <= took < 3.0, took
    assert tool_rules.call_effect(hung.end, "read_only") == "failed"
    assert tool_rules.call_effect(hung.end, "external_effect") == "unknown"

    # The call in flight ends with the process it was on, and says why.
    in_flight.join(15)
    assert other["outcome"].end == "no_answer"
    assert "hung past 1 s: the process is replaced" in other["outcome"].error
    # One failure, not two: the next call starts a new process at once, no backoff.
    assert pool.servers["faults"].failures == 1
    after = pid_of(pool.call_tool(server, "echo", {"text": "next"}, timeout_s=15))
    assert after != before
    assert gone(before)  # the hung process was stopped, not left to hang
    row = process_row(server)
    assert row.state == "running" and row.restarts == 1
    assert "hung past 1 s" in row.last_error


def test_garbage_on_stdout_is_a_clear_error_at_once_not_a_hang(pool, make_server):
    server = make_server()
    before = pid_of(pool.call_tool(server, "echo", {"text": "warm"}, timeout_s=15))

    started = time.monotonic()
    broken = pool.call_tool(server, "garbage", {}, timeout_s=15)
    took = time.monotonic() - started
    assert took < 3.0, took  # far less than the 15 s timeout
    assert broken.end == "no_answer"
    assert broken.error == (
        "faults.garbage: the server wrote a line that is not MCP on stdout: "
        "'this is not JSON-RPC at all'; whether it acted is not known"
    )
    assert "not MCP on stdout" in process_row(server).last_error
    assert gone(before)


# --------------------------------------------------------------------------- starting


def test_r6_1_a_slow_start_is_not_sent_within_the_start_clock_or_the_calls(
    pool, make_server, settings
):
    settings.GOVERNANCE_MCP_STDIO_START_SECONDS = 1.0
    server = make_server("--slow-start", "60")
    started = time.monotonic()
    slow = pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15)
    took = time.monotonic() - started
    assert slow.end == "not_sent" and slow.output == {"request_sent": False}
    assert "did not answer initialize within 1 s" in slow.error
    assert "nothing was sent" in slow.error
    assert took < 2.5, took  # said at once, while its process is being stopped
    row = process_row(server)
    assert row.state == "failed" and row.pid is None
    assert "fault server" in row.stderr_tail and "starting" in row.stderr_tail

    # What the run's clocks leave bounds the start too (R6.1).
    settings.GOVERNANCE_MCP_STDIO_START_SECONDS = 15.0
    other = make_server("--slow-start", "60", name="slow-too")
    started = time.monotonic()
    slow = pool.call_tool(other, "echo", {"text": "x"}, timeout_s=15, limit_s=0.5)
    assert time.monotonic() - started < 2.0
    assert slow.end == "not_sent" and "within 0.5 s" in slow.error


def test_r6_1_a_server_slower_to_start_than_its_calls_take_still_starts(pool, make_server):
    # The call's own timeout bounds the call, not the start.
    server = make_server("--slow-start", "1.5")
    quick = pool.call_tool(server, "echo", {"text": "x"}, timeout_s=0.5)
    assert quick.end == "result", quick.error


def test_a_command_that_exits_at_once_is_not_sent_with_its_own_words(pool, make_server):
    server = make_server("--exit-at-once", "cannot open /nowhere/db.sqlite: no such file")
    outcome = pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15)
    assert outcome.end == "not_sent" and outcome.output == {"request_sent": False}
    assert "cannot open /nowhere/db.sqlite: no such file" in outcome.error
    assert "exited with code 3" in outcome.error
    row = process_row(server)
    assert row.state == "failed"
    assert "cannot open /nowhere/db.sqlite" in row.stderr_tail  # shown with its state


def test_a_command_that_does_not_exist_or_is_no_longer_allowed_is_not_sent(pool, settings):
    missing = ToolServer.objects.create(
        name="missing", kind=ToolServer.Kind.MCP_STDIO, command="/nonexistent/mcp-server",
        timeout_s=15,
    )  # fmt: skip
    outcome = pool.call_tool(missing, "anything", {}, timeout_s=15)
    assert outcome.end == "not_sent"
    assert "cannot start '/nonexistent/mcp-server': No such file or directory" in outcome.error

    # The allow-list narrowed after it was registered: not started at all.
    settings.GOVERNANCE_MCP_STDIO_COMMANDS = ("uvx",)
    refused = ToolServer.objects.create(
        name="refused", kind=ToolServer.Kind.MCP_STDIO, command="/bin/cat", timeout_s=15
    )
    outcome = pool.call_tool(refused, "anything", {}, timeout_s=15)
    assert outcome.end == "not_sent" and "GOVERNANCE_MCP_STDIO_COMMANDS" in outcome.error
    assert pool.servers["refused"].starts == 0
    assert process_row(refused).state == "failed"


def test_restarts_back_off_on_the_pools_clock(pool, make_server, clock):
    assert [restart_delay(n) for n in range(1, 10)] == [0, 1, 2, 4, 8, 16, 32, 60, 60]
    server = make_server("--exit-at-once", "it never starts")
    state = lambda: pool.servers["faults"]  # noqa: E731

    assert pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15).end == "not_sent"
    assert pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15).end == "not_sent"
    assert state().starts == 2  # the first failure restarts at once
    waiting = pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15)
    assert "next start in 1 s" in waiting.error and "it never starts" in waiting.error
    assert state().starts == 2  # not started: nothing runs, nothing was sent
    row = process_row(server)
    assert row.next_start_at is not None and row.state == "failed"

    clock.now += 1.0
    pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15)
    assert state().starts == 3
    clock.now += 1.9
    assert "next start in" in pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15).error
    assert state().starts == 3
    clock.now += 0.1
    pool.call_tool(server, "echo", {"text": "x"}, timeout_s=15)
    assert state().starts == 4
    assert process_row(server).restarts == 3


@pytest.mark.parametrize(
    ("script", "words"),
    [
        ("sleep 300 & exit 0", "[guard] the server exited with code 0"),
        ("kill -40 $$", "[guard] the server was killed by signal 40 (SIGRTMIN+6)"),
    ],
)
def test_a_server_that_ends_leaves_nothing_it_started_and_the_guard_says_how(pool, script, words):
    # The shell starts a child in its group and exits (the child is killed with
    # the group, else it would outlive everyone), or dies by a signal with no name.
    server = ToolServer.objects.create(
        name="shell", kind=ToolServer.Kind.MCP_STDIO, command="/bin/sh", args=["-c", script],
        env_names=[MARKER_ENV], timeout_s=15,
    )  # fmt: skip
    outcome = pool.call_tool(server, "anything", {}, timeout_s=15)
    assert outcome.end == "not_sent"
    assert words in outcome.error
    assert stdio_servers.wait_until_none_left() == []
