"""A stdio MCP server that misbehaves on request, for the stdio pool's tests,
built with the SDK's own server API (``MCPServer`` over stdio) and run as a
script, so a worker starts it like any command:

    python tests/stdio_servers.py [--slow-start S] [--exit-at-once WORDS]
                                  [--record FILE] [--marker WORD]

Tools: ``echo`` (read-only; answers with the server's pid, so a test tells a
reused process from a new one), ``send`` (an external effect: one line per
call in the record file), ``crash`` (read-only) and ``send_then_crash``
(external: records, then exits mid-call), ``hang`` (sleeps far past any
timeout), ``stuck`` (blocks the whole server, so not even a closed stdin
stops it), ``garbage`` (a line that is not JSON on the real stdout, then
quiet) and ``grow`` (adds a tool and announces ``tools/list_changed`` before
it answers). ``--marker`` is never read: a word on the command line by which
a test finds the process in the process table.

Also here: how a test finds the stdio processes it left behind (``leftovers``).
"""

# No ``from __future__ import annotations``: the SDK reads the tools'
# signatures, and ``Context`` is imported inside ``main`` (below).

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

SCRIPT = Path(__file__).resolve()
GUARD = "stdio_guard.py"
# Named in a stdio server's env_names, this variable reaches the guard, the
# server and anything it starts: a process carrying this session's value is
# ours wherever it was reparented, which a walk of our own children would miss.
MARKER_ENV = "STDIO_TEST_MARKER"
MARKER = f"stdio-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def command(*args: str) -> tuple[str, list[str]]:
    """The ``command`` and ``args`` that register this server."""
    return sys.executable, [str(SCRIPT), *args]


def recorded(path: Path) -> list[str]:
    """The side effects a server recorded in ``path``, one line each."""
    return path.read_text().splitlines() if path.exists() else []


# --------------------------------------------------------------------------- the test side


def _stdio_process(proc, marker: str) -> bool:
    import psutil

    try:
        cmdline = " ".join(proc.cmdline())
        if marker in cmdline:
            return True
        return proc.environ().get(MARKER_ENV) == marker
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def leftovers(marker: str = MARKER) -> list[str]:
    """Every stdio process this test process left: its children (recursive)
    running the guard or a server of ours, and any process anywhere carrying
    ``marker`` (on its command line or in ``MARKER_ENV``)."""
    import psutil

    found = {}
    for child in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        if GUARD in cmdline or str(SCRIPT) in cmdline or "mcp-server-" in cmdline:
            found[child.pid] = cmdline
    for proc in psutil.process_iter():
        if proc.pid not in found and _stdio_process(proc, marker):
            try:
                found[proc.pid] = " ".join(proc.cmdline())
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
    return [f"{pid}: {cmdline[:300]}" for pid, cmdline in sorted(found.items())]


def wait_until_none_left(marker: str = MARKER, timeout: float = 15.0) -> list[str]:
    """The processes still left after a bounded wait for them to die (a
    stopped server may take the SDK's grace period to go); [] once none is."""
    deadline = time.monotonic() + timeout
    while (left := leftovers(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


# --------------------------------------------------------------------------- the server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-start", type=float, default=0.0)
    parser.add_argument("--exit-at-once", default=None)
    parser.add_argument("--record", default="")
    parser.add_argument("--marker", default="")
    options = parser.parse_args()

    print(f"fault server {os.getpid()} starting", file=sys.stderr, flush=True)
    if options.exit_at_once is not None:
        print(options.exit_at_once, file=sys.stderr, flush=True)
        sys.exit(3)
    if options.slow_start:
        time.sleep(options.slow_start)

    # After the start-up faults: importing the SDK takes a second or two here.
    import mcp.types as types
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.types import ToolAnnotations

    # The SDK's stdio transport moves fd 1 aside while it serves (a stray print
    # goes to stderr); ``garbage`` writes to the real wire through this copy.
    wire = os.dup(1)
    read_only = ToolAnnotations(readOnlyHint=True)
    acts = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=False)
    server = MCPServer("faults")

    def record(line: str) -> None:
        if options.record:
            with open(options.record, "a") as out:
                out.write(line + "\n")

    @server.tool(annotations=read_only, description="Says the text back, with this server's pid")
    def echo(text: str) -> str:
        return f"{text} (pid {os.getpid()})"

    @server.tool(annotations=acts, description="Sends a message (a side effect)")
    def send(to: str, text: str) -> str:
        record(f"send {to}: {text}")
        return f"sent to {to}"

    @server.tool(annotations=read_only, description="Dies mid-call")
    def crash() -> str:
        print("crashing on purpose", file=sys.stderr, flush=True)
        os._exit(7)

    @server.tool(annotations=acts, description="Sends a message, then dies before answering")
    def send_then_crash(to: str, text: str) -> str:
        record(f"send {to}: {text}")
        print("sent, now crashing", file=sys.stderr, flush=True)
        os._exit(7)

    @server.tool(annotations=read_only, description="Never answers in time")
    async def hang(seconds: float = 600.0) -> str:
        record(f"hang {seconds:g}")  # a test sees the call in progress
        await asyncio.sleep(seconds)
        return "woke up"

    @server.tool(annotations=read_only, description="Blocks the whole server, reading nothing")
    def stuck(seconds: float = 600.0) -> str:
        record(f"stuck {seconds:g}")
        time.sleep(seconds)  # not even the end of its stdin is noticed meanwhile
        return "unstuck"

    @server.tool(annotations=read_only, description="Writes a line that is not MCP, then nothing")
    async def garbage() -> str:
        os.write(wire, b"this is not JSON-RPC at all\n")
        await asyncio.sleep(600)
        return "never"

    @server.tool(annotations=read_only, description="Adds a tool and says the list changed")
    async def grow(ctx: Context) -> str:
        if "extra" not in {t.name for t in await server.list_tools()}:
            server.add_tool(
                lambda: "extra!", name="extra", description="A tool added later",
                annotations=read_only,
            )  # fmt: skip
        await ctx.session.send_notification(types.ToolListChangedNotification(), ctx.request_id)
        return "grown"

    print(f"fault server {os.getpid()} ready", file=sys.stderr, flush=True)
    server.run("stdio")


if __name__ == "__main__":
    main()
