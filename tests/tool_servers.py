"""Real tool servers on loopback for the registry tests: an MCP
server built with the SDK's own server API (``MCPServer`` over Streamable
HTTP, run by uvicorn in a thread on an ephemeral port) and a plain HTTP tool
server (``http.server`` on port 0). Nothing of either protocol is faked."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import mcp.types as types
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations


@dataclass
class McpRecord:
    """What the MCP server saw: one entry per side effect it performed."""

    writes: list[dict] = field(default_factory=list)
    hangs: list[int] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)


def files_server(record: McpRecord, hang_s: float = 30.0) -> MCPServer:
    server = MCPServer("files")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="Read a file")
    def read(path: str) -> str:
        record.reads.append(path)
        return f"contents of {path}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), description="List files")
    def list_files() -> list[str]:
        return ["a.txt", "b.txt"]

    @server.tool(
        annotations=ToolAnnotations(destructiveHint=True, idempotentHint=False),
        description="Write a file (a side effect)",
    )
    def write(path: str, text: str) -> str:
        record.writes.append({"path": path, "text": text})
        return f"wrote {len(text)} characters to {path}"

    @server.tool(description="Always fails")
    def boom(reason: str = "no reason") -> str:
        raise ValueError(f"boom: {reason}")

    @server.tool(description="Sends something, then takes far too long to answer")
    async def slow_send(n: int) -> str:
        record.hangs.append(n)
        await asyncio.sleep(hang_s)
        return "sent late"

    @server.tool(description="Adds a tool to this server and says the list changed")
    async def grow(ctx: Context) -> str:
        if "extra" not in {t.name for t in await server.list_tools()}:
            server.add_tool(lambda: "extra!", name="extra", description="A tool added later")
        # Sent with the answer (request-scoped), so it reaches the caller's session.
        await ctx.session.send_notification(types.ToolListChangedNotification(), ctx.request_id)
        return "grown"

    return server


class UvicornThread:
    """An ASGI app served by uvicorn in a daemon thread on 127.0.0.1:<ephemeral>."""

    def __init__(self, app) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the MCP test server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.server.force_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class HttpToolHandler(BaseHTTPRequestHandler):
    """An HTTP tool server: ``/weather`` (read-only GET), ``/send`` (an external
    effect, keyed by Idempotency-Key; the first answer can be dropped),
    ``/verify`` (the webhook's verification contract), ``/fail`` (HTTP 500)."""

    seen: list[dict] = []  # noqa: RUF012
    processed: set[str] = set()  # noqa: RUF012
    drop_first_answer = False

    def do_GET(self):
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        type(self).seen.append({"method": "GET", "path": url.path, "query": query,
                                "headers": dict(self.headers)})  # fmt: skip
        if url.path == "/weather":
            self._json(200, {"city": query.get("city"), "sky": "clear", "celsius": 21})
        elif url.path == "/verify":
            key = query.get("idempotency_key")
            if key in type(self).processed:
                self._json(200, {"status": "processed"})
            else:
                self._json(404, {"status": "unseen"})
        else:
            self._json(404, {"error": "no such tool"})

    def do_POST(self):
        url = urlsplit(self.path)
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        key = self.headers.get("Idempotency-Key")
        type(self).seen.append({"method": "POST", "path": url.path, "body": body,
                                "headers": dict(self.headers)})  # fmt: skip
        if url.path == "/fail":
            self._json(500, {"error": "the tool broke"})
            return
        if key:
            type(self).processed.add(key)
        posts = [s for s in type(self).seen if s["method"] == "POST" and s["path"] == url.path]
        if type(self).drop_first_answer and len(posts) == 1:
            self.close_connection = True
            self.connection.close()  # acted, answer lost: unknown
            return
        self._json(200, {"sent": body, "key": key})

    def _json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class HttpToolServer:
    def __enter__(self) -> HttpToolServer:
        HttpToolHandler.seen, HttpToolHandler.processed = [], set()
        HttpToolHandler.drop_first_answer = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), HttpToolHandler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.handler = HttpToolHandler
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
