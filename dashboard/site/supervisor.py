"""Keep a few long-running child processes up (what ``manage.py up`` runs).

A child that exits while the supervisor is not stopping is restarted after an
exponential backoff; the other children keep running. SIGINT / SIGTERM stop
every child (SIGTERM, then SIGKILL after a grace period) and nothing is
restarted during the shutdown.

The decision "how long to wait before restarting a child that just exited" is
:meth:`RestartPolicy.next_delay`, a pure function of the times it is given.
No Django here, so a test can supervise stand-in children without settings.

A ``status`` callable, when given, is asked every ``status_every`` seconds (by
the injected clock) for a :class:`StatusReport`; its line is logged when its
``state`` differs from the last one logged, so an idle system prints nothing
after its first report.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Backoff: 1 s, 2 s, 4 s ... capped at 30 s; a child that stayed up 60 s starts
# a fresh streak; 5 quick failures in a row are logged as a crash loop.
RESTART_BASE_SECONDS = 1.0
RESTART_CAP_SECONDS = 30.0
STABLE_AFTER_SECONDS = 60.0
CRASH_LOOP_AFTER = 5
POLL_SECONDS = 0.2
STOP_TIMEOUT_SECONDS = 20.0
_NO_STATE = object()  # no status line logged yet


@dataclass(frozen=True)
class Restart:
    """When to restart a child that exited, and the streak that led there."""

    delay: float  # seconds from the exit to the restart
    failures: int  # quick failures in a row, this exit included
    crash_looping: bool  # the streak reached the policy's crash-loop count


@dataclass(frozen=True)
class RestartPolicy:
    base: float = RESTART_BASE_SECONDS
    cap: float = RESTART_CAP_SECONDS
    stable_after: float = STABLE_AFTER_SECONDS
    crash_loop_after: int = CRASH_LOOP_AFTER

    def __post_init__(self):
        if not 0 < self.base <= self.cap:
            raise ValueError(f"need 0 < base <= cap, not base={self.base} cap={self.cap}")
        if self.stable_after <= 0 or self.crash_loop_after < 1:
            raise ValueError("stable_after must be > 0 and crash_loop_after >= 1")

    def next_delay(self, now: float, started_at: float, failures: int) -> Restart:
        """The restart after an exit at ``now`` of a child started at ``started_at``.

        ``failures`` is the quick failures in a row before this exit. A child
        that stayed up ``stable_after`` seconds or more starts a new streak.
        The n-th quick failure in a row waits ``base * 2**(n-1)``, at most ``cap``.
        """
        streak = 1 if now - started_at >= self.stable_after else failures + 1
        delay = min(self.cap, self.base * 2 ** min(streak - 1, 64))
        return Restart(delay, streak, streak >= self.crash_loop_after)


def exit_message(name: str, code: int | None, restart: Restart, restarts: int) -> str:
    """The one line logged when a child exited; ``restarts`` counts this restart."""
    how = f"exited with code {code}" if code is not None else "could not be started"
    line = f"{name} {how}; restarting in {restart.delay:g}s (restart {restarts})"
    if restart.crash_looping:
        line += (
            f"; {name} keeps failing right after start "
            f"({restart.failures} quick failures in a row), still restarting it"
        )
    return line


@dataclass(frozen=True)
class StatusReport:
    """One status line and what it is made of: the line is logged when ``state`` changed."""

    state: object
    line: str


class _Child:
    def __init__(self, name: str, argv: Sequence[str]):
        self.name = name
        self.argv = list(argv)
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.failures = 0  # quick failures in a row
        self.restarts = 0
        self.restart_at: float | None = None


class Supervisor:
    """Run ``commands`` (name → argv) until SIGINT / SIGTERM, restarting any that exits."""

    def __init__(
        self,
        commands: Mapping[str, Sequence[str]] | Iterable[tuple[str, Sequence[str]]],
        *,
        cwd: Path | str | None = None,
        policy: RestartPolicy | None = None,
        log: Callable[[str], None] = print,
        poll_seconds: float = POLL_SECONDS,
        stop_timeout: float = STOP_TIMEOUT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        env: Mapping[str, str] | None = None,
        status: Callable[[], StatusReport] | None = None,
        status_every: float = 0,
    ):
        items = commands.items() if isinstance(commands, Mapping) else commands
        self.children = [_Child(name, argv) for name, argv in items]
        self.cwd = cwd
        self.policy = policy or RestartPolicy()
        self.log = log
        self.poll_seconds = poll_seconds
        self.stop_timeout = stop_timeout
        self.clock = clock
        self.env = dict(env) if env is not None else None
        self.status = status if status_every > 0 else None
        self.status_every = status_every
        self._status_due: float | None = None
        self._status_state: object = _NO_STATE
        self.stop_signal: int | None = None

    def pids(self) -> dict[str, int | None]:
        return {c.name: c.process.pid if c.process else None for c in self.children}

    def request_stop(self, signum: int, _frame=None) -> None:
        self.stop_signal = signum

    def run(self) -> None:
        """Start every child, keep them up, and stop them all on SIGINT / SIGTERM."""
        previous = {
            signum: signal.signal(signum, self.request_stop)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            now = self.clock()
            for child in self.children:
                self._start(child, now)
            started = [c for c in self.children if c.process is not None]
            if started:
                listed = ", ".join(f"{c.name} (pid {c.process.pid})" for c in started)
                self.log(f"Started {listed}.")
            self._status_due = now + self.status_every
            while self.stop_signal is None:
                now = self.clock()
                self._step(now)
                self._report_status(now)
                time.sleep(self._sleep_seconds())
            self.log(f"Stopping on {signal.Signals(self.stop_signal).name}.")
            self._stop_all()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _step(self, now: float) -> None:
        for child in self.children:
            if self.stop_signal is not None:
                return
            process = child.process
            if process is not None and process.poll() is not None:
                self._schedule_restart(child, now, process.returncode)
                continue
            due = process is None and child.restart_at is not None and now >= child.restart_at
            if due and self._start(child, now):
                self.log(f"Restarted {child.name} (pid {child.process.pid}).")

    def _report_status(self, now: float) -> None:
        """Log the status line when it is due and its state changed since the last one."""
        if self.status is None or self._status_due is None or now < self._status_due:
            return
        self._status_due = now + self.status_every
        try:
            report = self.status()
        except Exception as exc:  # a status that cannot be read must not stop the children
            report = StatusReport(
                ("unavailable", type(exc).__name__), f"status unavailable: {exc!r}"
            )
        if report.state != self._status_state:
            self._status_state = report.state
            self.log(report.line)

    def _sleep_seconds(self) -> float:
        pending = [c.restart_at for c in self.children if c.restart_at is not None]
        if not pending:
            return self.poll_seconds
        return max(0.01, min(self.poll_seconds, min(pending) - self.clock()))

    def _start(self, child: _Child, now: float) -> bool:
        child.restart_at = None
        child.started_at = now
        try:
            child.process = subprocess.Popen(child.argv, cwd=self.cwd, env=self.env)
        except OSError as exc:
            child.process = None
            self.log(f"{child.name}: {exc}")
            self._schedule_restart(child, now, None)
            return False
        return True

    def _schedule_restart(self, child: _Child, now: float, code: int | None) -> None:
        restart = self.policy.next_delay(now, child.started_at, child.failures)
        child.process = None
        child.failures = restart.failures
        child.restarts += 1
        child.restart_at = now + restart.delay
        self.log(exit_message(child.name, code, restart, child.restarts))

    def _stop_all(self) -> None:
        running = [c for c in self.children if c.process is not None]
        for child in running:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for child in running:
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"{child.name} did not stop within {self.stop_timeout:g}s; killing it.")
                child.process.kill()
                child.process.wait()
