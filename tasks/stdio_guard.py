"""Runs one stdio tool server so that it cannot outlive the worker process
that started it — SIGKILL included.

    python -I tasks/stdio_guard.py WORKER_PID -- COMMAND [ARG ...]

The MCP SDK's ``stdio_client`` starts this script (run by its path, so no
package is imported) in a new process group; the script asks Linux to send it
SIGTERM when the thread that started it dies (``PR_SET_PDEATHSIG``), starts
the server in the same group with the same stdin, stdout and stderr, and
lets go of its own copies of stdin and stdout, so the pipes close when the
server does. On SIGTERM, SIGHUP or SIGINT it kills the whole group (the
server and anything the server started, ``npx`` → ``node`` for instance);
when the server exits on its own, whatever it left in the group goes too. A
``PR_SET_PDEATHSIG`` on the server itself would not reach the server's own
children; a guard that stays reaches them all.

It writes two kinds of lines to stderr, prefixed ``[guard]``: ``started pid
N`` once the server runs, and how it ended (its exit code or signal), which
the worker keeps with the server's own last lines for the Tools page.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1
EXIT_CANNOT_START = 127


def _say(words: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"[guard] {words}\n".encode())


def _kill_group(signum: int, _frame) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # this process included: nothing survives


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        _say("usage: stdio_guard.py WORKER_PID -- COMMAND [ARG ...]")
        return 2
    worker_pid, command = int(argv[0]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        _say(f"prctl(PR_SET_PDEATHSIG) failed: errno {ctypes.get_errno()}")
        return EXIT_CANNOT_START
    if os.getppid() != worker_pid:  # the worker died before the line above
        return EXIT_CANNOT_START
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _kill_group)
    try:
        server = subprocess.Popen(command)  # same group, same stdin/stdout/stderr
    except OSError as exc:
        _say(f"cannot start {command[0]!r}: {exc.strerror or exc}")
        return EXIT_CANNOT_START
    _say(f"started pid {server.pid}")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    code = server.wait()
    if code < 0:
        _say(f"the server was killed by signal {-code} ({_signal_name(-code)})")
        code = 128 - code
    else:
        _say(f"the server exited with code {code}")
    if _others_in_group():
        # What the server started outlives it (npx → node, a daemonised helper):
        # nobody would stop it once this guard is gone, so the group goes now.
        _kill_group(signal.SIGKILL, None)
    return code


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name of its own
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"


def _others_in_group() -> bool:
    """Whether a process other than this one is left in this process group."""
    me, group = os.getpid(), os.getpgrp()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
