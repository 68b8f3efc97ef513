"""Stdio tool servers: a command each worker process starts and talks MCP
to over stdin/stdout, on the official SDK (``mcp.client.stdio.stdio_client``
and ``ClientSession``; nothing here frames JSON-RPC).

Each worker process keeps one running session per server (``POOL``), started
on first use and reused across calls, on an event loop of its own (a daemon
thread: the task thread hands it coroutines). What this module adds:

* **No orphans.** The server runs under ``tasks/stdio_guard.py``, which dies
  with the worker process (SIGKILL included) and takes the server's whole
  process group with it.
* **Restarts with backoff.** A server that exits, crashes or fails to start
  is started again on its next use: at once the first time, then after 1, 2,
  4 … 60 s (``restart_delay``); a call that comes sooner is not sent.
* **A hung call is cut** at the server's timeout or what the run's clocks
  leave (R6.1, whichever is sooner) and its process replaced.
* **Output that is not MCP** on stdout ends the session at once with the
  line's error, instead of leaving the caller to its timeout.
* **What a call's end means** is the HTTP client's map (``tasks.mcp_client``):
  nothing sent → ``not_sent``; a crash, a hang or garbage after the request
  was written → ``no_answer``, unknown for an external-effect tool (R4.2,
  R6.4: stdio has no idempotency key, so nothing is ever replayed).
* **Its state for the Tools page**: each process reports its state, pid,
  uptime and the last lines of the server's stderr (``ToolProcess`` rows,
  ``services.tool_processes``) when they change.

The environment is named, never stored: the server gets the SDK's safe
defaults (``PATH``, ``HOME`` …) and the variables of ``env_names`` from the
worker's own environment.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp.types as types
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from mcp import ClientSession, MCPError
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types import REQUEST_TIMEOUT

from governance import time_source
from governance.models import ToolServer
from governance.services.secrets import passed_env, passed_env_problem
from tasks.mcp_client import (
    NO_ANSWER_CODES,
    McpListing,
    McpOutcome,
    answered_outcome,
    failure_outcome,
    in_words,
    list_all,
    root_cause,
)

logger = logging.getLogger(__name__)

GUARD = Path(__file__).with_name("stdio_guard.py")
STDERR_LINES = 40
RESTART_DELAY_MAX_S = 60.0
REPORT_EVERY_S = 10.0  # the stderr tail is written at most this often while nothing else changes
_GUARD_STARTED = re.compile(r"\[guard\] started pid (\d+)")


def restart_delay(failures: int) -> float:
    """Seconds before a server that failed ``failures`` times in a row starts
    again: at once after the first failure, then 1, 2, 4 … up to a minute."""
    if failures <= 1:
        return 0.0
    return min(2.0 ** (failures - 2), RESTART_DELAY_MAX_S)


@dataclass(frozen=True)
class Launch:
    """What starts a server; a change of it (an admin's PATCH) replaces the process."""

    command: str
    args: tuple[str, ...]
    env_names: tuple[str, ...]
    cwd: str

    @classmethod
    def of(cls, server: ToolServer) -> Launch:
        return cls(
            server.command, tuple(server.args or ()), tuple(server.env_names or ()), server.cwd
        )

    @property
    def shown(self) -> str:
        return " ".join([self.command, *self.args])[:300]


class NotStarted(Exception):
    """The server is not running and was not started: nothing was sent."""


def launch_problem(launch: Launch) -> str | None:
    """Why the workers may not run this command now (the allow-list may have
    narrowed since it was registered), or None."""
    allowed = settings.GOVERNANCE_MCP_STDIO_COMMANDS
    if allowed is not None and launch.command not in allowed:
        return (
            f"{launch.command!r} is not one of the commands the workers may run "
            "(GOVERNANCE_MCP_STDIO_COMMANDS)"
        )
    for name in launch.env_names:  # checked when registered; a row edited since is not trusted
        if problem := passed_env_problem(name):
            return f"env_names: {problem}"
    return None


def parameters(launch: Launch) -> StdioServerParameters:
    """The SDK's parameters: the guard, told this process's pid, runs the
    command. ``ImproperlyConfigured`` when a named variable cannot be read."""
    return StdioServerParameters(
        command=sys.executable,
        args=["-I", str(GUARD), str(os.getpid()), "--", launch.command, *launch.args],
        env=passed_env(launch.env_names),
        cwd=launch.cwd or None,
    )


class StderrTail:
    """The server's stderr, read by a thread into its last lines. Its end
    (every writer closed: the guard exits only after the server) is how an
    idle server's death is noticed before a call is sent to it."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        self.writer = os.fdopen(write_fd, "w")
        self.lines: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self.pid: int | None = None
        self.ended = threading.Event()
        self.changed = False
        self._reader = threading.Thread(
            target=self._read, args=(os.fdopen(read_fd, "rb"),), daemon=True, name="stdio-stderr"
        )
        self._reader.start()

    def _read(self, stream) -> None:
        with stream:
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip()[:500]
                if self.pid is None and (found := _GUARD_STARTED.match(line)):
                    self.pid = int(found.group(1))
                    continue
                self.lines.append(line)
                self.changed = True
        self.ended.set()

    def close_writer(self) -> None:
        """Our copy of the write end: closed once the server holds its own."""
        if not self.writer.closed:
            self.writer.close()

    def text(self) -> str:
        return "\n".join(self.lines)

    def last(self) -> str:
        """The last two lines (an exception's message and the guard's word on the exit)."""
        return " | ".join(list(self.lines)[-2:])


def _running(pid: int) -> bool:
    """Whether the server's process still runs: a server that died while idle
    is seen before its guard has exited (and closed stderr), so no call is
    sent to it for nothing. Linux's /proc: a zombie or a missing entry is dead."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rpartition(b")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


class _Broken(Exception):
    """The server wrote something that is not MCP on stdout."""


def not_mcp_words(exc: BaseException) -> str:
    """One line naming what the server wrote instead of MCP (the SDK hands
    over the parser's error, whose own text runs over several lines)."""
    shown = None
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            shown = errors()[0].get("input")
        except Exception:
            shown = None
    if shown is not None:
        text = shown if isinstance(shown, str) else repr(shown)
        return f"the server wrote a line that is not MCP on stdout: {text[:200]!r}"
    first = in_words(exc).splitlines()[0] if in_words(exc) else type(exc).__name__
    return f"the server wrote something that is not MCP on stdout ({first})"


class _Session:
    """One running server: its owner task keeps ``stdio_client`` and
    ``ClientSession`` open on the pool's loop until told to stop."""

    def __init__(self, launch: Launch, start_timeout_s: float) -> None:
        self.launch = launch
        self.start_timeout_s = start_timeout_s
        self.tail = StderrTail()
        self.session: ClientSession | None = None
        self.problem = ""  # why it could not start, or why it ended
        self.tools_changed = False
        self.started_at: datetime | None = None
        # asyncio's events bind to the loop at their first wait (the pool's loop).
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._broken = asyncio.Event()
        self.ended = threading.Event()

    @property
    def alive(self) -> bool:
        # A broken session is still open until its owner task closes it: a call
        # sent to it meanwhile would be "not known" for nothing.
        return (
            self.session is not None
            and not self.ended.is_set()
            and not self.tail.ended.is_set()
            and not self._broken.is_set()
            and (self.tail.pid is None or _running(self.tail.pid))
        )

    async def _on_message(self, message) -> None:
        if isinstance(message, Exception):
            if not self.problem:
                self.problem = not_mcp_words(message)
            self._broken.set()
        elif isinstance(message, types.ToolListChangedNotification):
            self.tools_changed = True

    async def until_broken(self, coro):
        """``coro``'s result, or ``_Broken`` as soon as the server writes garbage."""
        outcome: dict[str, Any] = {}

        async def work(scope: anyio.CancelScope) -> None:
            outcome["value"] = await coro
            scope.cancel()

        async def watch(scope: anyio.CancelScope) -> None:
            await self._broken.wait()
            outcome["broken"] = True
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(work, group.cancel_scope)
            group.start_soon(watch, group.cancel_scope)
        if "value" in outcome:
            return outcome["value"]
        raise _Broken(self.problem)

    async def serve(self) -> None:
        """The owner task: start, initialize, then hold the session until stopped."""
        try:
            params = parameters(self.launch)
            async with stdio_client(params, errlog=self.tail.writer) as (read, write):
                self.tail.close_writer()
                async with ClientSession(read, write, message_handler=self._on_message) as session:
                    with anyio.move_on_after(self.start_timeout_s) as start:
                        await self.until_broken(session.initialize())
                    if start.cancelled_caught:
                        # Said now, not after the SDK's stop (up to 4 s more for a
                        # server that ignores its closed stdin): the caller's clock
                        # is running. The process is stopped as this block ends.
                        said = self.tail.last()
                        self.problem = (
                            f"the server did not answer initialize within "
                            f"{self.start_timeout_s:g} s{f'; its stderr: {said}' if said else ''}"
                        )
                        self._ready.set()
                        return
                    self.session, self.started_at = session, time_source.now()
                    self._ready.set()
                    stop = asyncio.ensure_future(self._stop.wait())
                    broken = asyncio.ensure_future(self._broken.wait())
                    await asyncio.wait((stop, broken), return_when=asyncio.FIRST_COMPLETED)
                    stop.cancel()
                    broken.cancel()
        except Exception as exc:
            if not self.problem:
                if not self._ready.is_set():  # the guard's last words arrive as the pipe closes
                    await anyio.to_thread.run_sync(self.tail.ended.wait, 1.0)
                self.problem = self._why(root_cause(exc))
        finally:
            self.tail.close_writer()
            self.session = None
            self.ended.set()
            self._ready.set()

    def _why(self, exc: BaseException) -> str:
        if self._ready.is_set():
            return f"the session ended ({in_words(exc)})"
        said = self.tail.last()
        if isinstance(exc, ImproperlyConfigured | OSError):
            return f"could not start the server: {exc}"
        return f"the server did not start ({said or in_words(exc)})"

    async def wait_ready(self) -> None:
        await self._ready.wait()

    def stop(self) -> None:
        """From the loop's own thread."""
        self._stop.set()

    def stop_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """From any other thread."""
        loop.call_soon_threadsafe(self._stop.set)


@dataclass
class ServerState:
    """One server in this process, as the pool tracks it between calls."""

    name: str
    current: _Session | None = None
    tail: StderrTail | None = None  # the latest process's, kept after a failed start
    failures: int = 0
    starts: int = 0
    next_start_at: float = 0.0  # monotonic
    state: str = "starting"
    last_error: str = ""
    reported_at: float = float("-inf")
    report_due: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)  # held while starting

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)


class StdioPool:
    """Every stdio server session of one worker process.

    ``clock`` (monotonic seconds) times the restart backoff only; how long a
    start or a call may take is waited out on the real clock."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()  # short: the loop, the server table, ``current``
        self._pid: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.servers: dict[str, ServerState] = {}
        self._sessions: list[_Session] = []  # every session not yet ended, current or not

    # ------------------------------------------------------------------ the loop

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: its own loop and servers
                self._pid, self.servers, self._sessions = os.getpid(), {}, []
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, daemon=True, name="stdio-tool-servers"
                ).start()
            assert self._loop is not None
            return self._loop

    def _submit(self, coro) -> Future:
        return asyncio.run_coroutine_threadsafe(coro, self._running_loop())

    @property
    def worker(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    # ------------------------------------------------------------------ starting

    def _state(self, name: str) -> ServerState:
        self._running_loop()  # a forked child forgets its parent's servers first
        with self._lock:
            return self.servers.setdefault(name, ServerState(name))

    def _retire(self, state: ServerState, session: _Session, why: str) -> None:
        """``session`` is over (crash, exit, garbage, hang): its process is
        stopped, and if it was still the server's current one, the server
        starts again on its next use, after the backoff. A call that fails on
        an older session (a concurrent call saw the same end first, and a new
        session may be running already) changes nothing else."""
        loop = self._running_loop()
        with self._lock:
            # Before the stop: the other calls on it fail once it stops, and
            # their words say why it was stopped, not that it "exited".
            session.problem = session.problem or why
            if state.current is session:
                state.current = None
                state.failures += 1
                state.next_start_at = self.clock() + restart_delay(state.failures)
                state.state, state.last_error, state.report_due = "restarting", why[:2000], True
        session.stop_soon(loop)

    def session_for(self, server: ToolServer, budget_s: float) -> _Session:
        """The server's running session, started if need be within ``budget_s``;
        ``NotStarted`` (nothing sent) when it cannot be had now."""
        state = self._state(server.name)
        with state.lock:
            return self._session_for(state, server, budget_s)

    def _session_for(self, state: ServerState, server: ToolServer, budget_s: float) -> _Session:
        launch = Launch.of(server)
        running = state.current
        if running is not None and running.alive and running.launch == launch:
            return running
        if running is not None:
            if running.launch != launch:
                running.stop_soon(self._running_loop())
                with self._lock:
                    state.current, state.failures, state.next_start_at = None, 0, 0.0
            else:
                self._retire(state, running, running.problem or self._exit_words(running))
        if problem := launch_problem(launch):
            state.state, state.last_error, state.report_due = "failed", problem, True
            raise NotStarted(problem)
        wait = state.next_start_at - self.clock()
        if wait > 0:
            raise NotStarted(
                f"{server.name} is restarting after: {state.last_error or 'a failure'} "
                f"(next start in {wait:.0f} s)"
            )
        start_timeout = max(min(settings.GOVERNANCE_MCP_STDIO_START_SECONDS, budget_s), 0.001)
        session = _Session(launch, start_timeout)
        with self._lock:
            self._sessions = [s for s in self._sessions if not s.ended.is_set()] + [session]
        state.starts, state.tail = state.starts + 1, session.tail
        self._submit(session.serve())
        ready = self._submit(session.wait_ready())
        try:
            ready.result(timeout=start_timeout + 10)
        except Exception:  # the owner task bounds the start itself; this is a backstop
            ready.cancel()
        if session.session is None:
            # Stopped, not cancelled: the SDK's teardown is what stops the
            # process, and a cancelled owner task may skip it.
            session.stop_soon(self._running_loop())
            state.failures += 1
            state.next_start_at = self.clock() + restart_delay(state.failures)
            state.state = "failed"
            state.last_error = (session.problem or "the server did not start")[:2000]
            state.report_due = True
            raise NotStarted(state.last_error)
        with self._lock:
            state.current, state.state, state.report_due = session, "running", True
        return session

    @staticmethod
    def _exit_words(session: _Session) -> str:
        session.tail.ended.wait(1.0)
        return f"the server exited ({session.tail.last() or 'no words on stderr'})"

    # ------------------------------------------------------------------ calls

    def call_tool(
        self,
        server: ToolServer,
        tool: str,
        arguments: dict[str, Any],
        *,
        timeout_s: float,
        limit_s: float | None = None,
    ) -> McpOutcome:
        """One ``tools/call`` on the server's running session; never raises (R4.2).

        ``timeout_s`` bounds the call (the server's own timeout); ``limit_s``,
        what the run's clocks leave (R6.1), bounds a start and the call
        together. A start is bounded by ``GOVERNANCE_MCP_STDIO_START_SECONDS``,
        not by the call's timeout: a server slower to start than its calls
        take still starts."""
        deadline = None if limit_s is None else time.monotonic() + limit_s
        state = self._state(server.name)
        try:
            session = self.session_for(
                server,
                limit_s if limit_s is not None else settings.GOVERNANCE_MCP_STDIO_START_SECONDS,
            )
        except NotStarted as exc:
            self.report(server.name)
            return McpOutcome(
                "not_sent", {"request_sent": False},
                f"{server.name}.{tool}: {exc}; nothing was sent",
            )  # fmt: skip
        left = timeout_s if deadline is None else min(timeout_s, deadline - time.monotonic())
        if left <= 0:  # started (and kept for the next call), but the run's clocks ran out
            self.report(server.name)
            return McpOutcome(
                "not_sent", {"request_sent": False},
                f"{server.name}.{tool}: starting the server took the {limit_s:g} s the "
                "run's clocks left; nothing was sent",
            )  # fmt: skip
        outcome = self._call(session, state, server, tool, arguments, left)
        if outcome.end in ("result", "tool_error", "server_error"):
            state.failures = 0  # it answered: whatever failed before is behind it
        self.report(server.name)
        return outcome

    def _call(
        self, session: _Session, state: ServerState, server: ToolServer, tool: str, arguments,
        timeout_s: float,
    ) -> McpOutcome:  # fmt: skip
        live = session.session
        assert live is not None

        async def work():
            with anyio.fail_after(timeout_s):
                result = await session.until_broken(
                    live.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
                )
            relisted = None
            if session.tools_changed:
                session.tools_changed = False
                with anyio.move_on_after(timeout_s):
                    relisted = await list_all(live)
            return result, relisted

        future = self._submit(work())
        try:
            result, relisted = future.result(timeout=timeout_s * 2 + 5)
        except Exception as exc:
            future.cancel()
            cause = root_cause(exc)
            answered = isinstance(cause, MCPError) and cause.code not in NO_ANSWER_CODES
            outcome = failure_outcome(cause, "call", server, tool)
            if answered:
                return outcome
            # A crash, a hang or garbage: this process is done.
            if isinstance(cause, _Broken):
                why = str(cause)
                outcome.error = f"{server.name}.{tool}: {why}; whether it acted is not known"
            elif isinstance(cause, TimeoutError) or (
                isinstance(cause, MCPError) and cause.code == REQUEST_TIMEOUT
            ):
                why = (
                    f"a call to {tool} hung past {round(timeout_s, 1):g} s: the process is replaced"
                )
            else:
                why = session.problem or self._exit_words(session)
                outcome.error = (
                    f"{server.name}.{tool}: the request was sent but the server ended before "
                    f"answering ({why}); whether it acted is not known"
                )[:1000]
            self._retire(state, session, why)
            return outcome
        return answered_outcome(f"{server.name}.{tool}", result, relisted)

    def list_tools(self, server: ToolServer, *, timeout_s: float) -> McpListing:
        """The running session's ``tools/list`` (started if need be, within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        try:
            session = self.session_for(server, timeout_s)
        except NotStarted as exc:
            self.report(server.name)
            return McpListing(None, f"not listed: {exc}")
        live = session.session
        assert live is not None
        left = max(deadline - time.monotonic(), 0.001)

        async def work():
            with anyio.fail_after(left):
                return await session.until_broken(list_all(live))

        try:
            tools = self._submit(work()).result(timeout=left + 5)
        except Exception as exc:
            return McpListing(None, f"not listed: {in_words(root_cause(exc))}")
        session.tools_changed = False
        self.report(server.name)
        return McpListing(tools)

    # ------------------------------------------------------------------ reports

    def report(self, name: str, *, force: bool = False) -> None:
        """Write this process's state of ``server`` when it changed (or its
        stderr did, at most every ``REPORT_EVERY_S``). Never raises: the
        Tools page's view of a process never changes a call's fact (R4.2)."""
        from governance.services import tool_processes

        state = self._state(name)
        session = state.current
        tail = state.tail  # a failed start's too: its stderr says why
        stderr_moved = tail is not None and tail.changed
        now = self.clock()
        if not (force or state.report_due or (
            stderr_moved and now - state.reported_at >= REPORT_EVERY_S
        )):  # fmt: skip
            return
        if tail is not None:
            tail.changed = False
        next_start = None
        if state.state in ("restarting", "failed") and state.next_start_at > now:
            next_start = time_source.now() + timedelta(seconds=state.next_start_at - now)
        try:
            tool_processes.report(
                name, self.worker, state=state.state,
                pid=session.tail.pid if session is not None and state.state == "running" else None,
                started_at=session.started_at if session is not None else None,
                restarts=state.restarts, next_start_at=next_start, last_error=state.last_error,
                stderr_tail=tail.text() if tail is not None else None, now=time_source.now(),
            )  # fmt: skip
        except Exception:
            logger.exception("recording the state of %s's process failed", name)
            return
        state.reported_at, state.report_due = now, False

    # ------------------------------------------------------------------ shutdown

    def stop_all(self, *, wait_s: float = 10.0) -> None:
        """Stop every server of this process (a worker's shutdown, a test's
        end), those already being replaced included, and wait for them."""
        if self._pid != os.getpid() or self._loop is None:
            return
        with self._lock:
            sessions = list(self._sessions)
        for session in sessions:
            session.stop_soon(self._loop)
        deadline = time.monotonic() + wait_s
        for session in sessions:
            session.ended.wait(max(deadline - time.monotonic(), 0.0))
        with self._lock:
            self._sessions = [s for s in self._sessions if not s.ended.is_set()]
        for state in list(self.servers.values()):
            with self._lock:
                state.current, state.state, state.report_due = None, "stopped", True
            self.report(state.name)


POOL = StdioPool()


def list_tools_once(launch: Launch, *, timeout_s: float) -> McpListing:
    """Start the command, list its tools and stop it (registering, importing,
    ``refresh`` from the web or a shell): what it could not do is said in
    words the Tools page and the API show."""
    if problem := launch_problem(launch):
        return McpListing(None, problem)
    session = _Session(launch, timeout_s)

    async def once():
        owner = asyncio.ensure_future(session.serve())
        await session.wait_ready()
        live = session.session
        try:
            if live is None:
                return None
            with anyio.fail_after(timeout_s):
                return await session.until_broken(list_all(live))
        finally:
            session.stop()
            await owner

    try:
        tools = asyncio.run(once())
    except Exception as exc:
        cause = root_cause(exc)
        words = session.problem or (
            f"the server did not list its tools within {timeout_s:g} s"
            if isinstance(cause, TimeoutError)
            else in_words(cause)
        )
        return McpListing(None, words)
    if tools is None:
        return McpListing(None, session.problem or "the server did not start")
    return McpListing(tools)
