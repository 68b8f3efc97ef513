"""The loopback wire server the adapter tests talk to, and the adapters'
shared contract (R2.1, R6.1): dispatch, programming errors, SSE parsing,
layering.

``WireServer`` is a real ``ThreadingHTTPServer`` on 127.0.0.1 speaking
HTTP/1.1 with chunked bodies: every SSE chunk is written and flushed on its
own, so the client sees a live stream. No httpx mocks anywhere.
"""

from __future__ import annotations

import ast
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from governance.rules.classification import Classification, classify_attempt
from tasks.adapters import AdjustableClock, call_provider
from tasks.adapters._common import iter_sse
from tasks.adapters.base import (
    CallLimits,
    ChatMessage,
    ProviderConfig,
    ProviderRequest,
    ProviderResponse,
)
from tests.conftest import REPO_ROOT

# --------------------------------------------------------------------------- the server


@dataclass
class Reply:
    """What the server answers to one POST.

    ``chunks`` are written one HTTP chunk each (flushed), ``delay_s`` apart.
    ``break_after`` closes the socket after that many chunks without the
    terminating chunk (a body cut mid-way). ``repeat`` is written every
    ``delay_s`` until the client goes away (at most ``repeat_max`` times).
    ``gate`` (after ``gate_after`` chunks) makes the server wait until the
    test sets it. ``body`` sends a plain Content-Length body instead.
    """

    status: int = 200
    chunks: list[bytes] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream"
    body: bytes | None = None
    delay_s: float = 0.0
    hang_s: float = 0.0
    break_after: int | None = None
    repeat: bytes | None = None
    repeat_max: int = 400
    gate: threading.Event | None = None
    gate_after: int = 1


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        wire = self.server.wire
        headers = {k.lower(): v for k, v in self.headers.items()}
        wire.received.append(Received(self.path, headers, json.loads(raw or b"{}")))
        try:
            self._answer(wire.next_reply())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away: that is the test's point

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _answer(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        if reply.body is not None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        if reply.hang_s:
            time.sleep(reply.hang_s)
        for index, data in enumerate(reply.chunks):
            if reply.break_after is not None and index >= reply.break_after:
                break
            if reply.gate is not None and index == reply.gate_after:
                reply.gate.wait(timeout=5)
            self._chunk(data)
            if reply.delay_s:
                time.sleep(reply.delay_s)
        if reply.repeat is not None:
            for _ in range(reply.repeat_max):
                self._chunk(reply.repeat)
                time.sleep(reply.delay_s or 0.005)
        if reply.break_after is not None:
            # Headers and part of the body went out; now the connection dies.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    wire: WireServer
    connections = 0  # TCP connections accepted (kept-alive ones count once)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1
        super().process_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up (the tests cut streams on purpose) is not news.
        pass


class WireServer:
    """A loopback provider: queue ``replies``; read what it ``received``."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.received: list[Received] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.wire = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def connections(self) -> int:
        return self._server.connections

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def reply(self, *replies: Reply) -> WireServer:
        self.replies.extend(replies)
        return self

    def next_reply(self) -> Reply:
        with self._lock:
            return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    def __enter__(self) -> WireServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def wire():
    with WireServer() as server:
        yield server


def refused_url() -> str:
    """A loopback port nobody listens on: connecting is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


def json_reply(status: int, obj: Any, headers: dict[str, str] | None = None) -> Reply:
    return Reply(
        status=status,
        body=json.dumps(obj).encode(),
        content_type="application/json",
        headers=headers or {},
    )


# --------------------------------------------------------------------------- shared helpers


def start() -> datetime:
    return datetime(2025, 6, 1, 12, 0, tzinfo=UTC)


def user(text: str) -> ProviderRequest:
    return ProviderRequest(model="m-1", messages=(ChatMessage("user", text),))


LIMITS = CallLimits(budget_s=60, no_progress_s=30)


def classify(response: ProviderResponse, clock: AdjustableClock) -> Classification:
    assert response.evidence is not None
    return classify_attempt(response.evidence, clock())


def kinds(response: ProviderResponse) -> list[str]:
    return [event.kind for event in response.events]


def advance_on_heartbeat(clock: AdjustableClock, seconds: float):
    """on_event that moves the fake clock by ``seconds`` on every heartbeat read."""

    def on_event(event) -> None:
        if event.kind in ("heartbeat", "reasoning"):
            clock.advance(seconds)

    return on_event


# --------------------------------------------------------------------------- contract tests


def test_r2_1_call_provider_rejects_programming_errors_with_value_error():
    """R2.1: failures are evidence, but an unknown kind or a bad config is a bug."""
    clock = AdjustableClock(start())
    bad = [
        ProviderConfig("p", "grpc", "m", base_url="http://x"),  # type: ignore[arg-type]
        ProviderConfig("p", "openai", "m"),  # no base_url
        ProviderConfig("p", "anthropic", "m", base_url="ftp://example"),
        ProviderConfig("p", "openai", "m", base_url="http://[::1"),
        ProviderConfig("p", "openai", "m", base_url="http://x", read_timeout_s=0),
        ProviderConfig("p", "scripted", "m"),  # no script
        ProviderConfig("p", "scripted", "m", script={"rules": [{"dance": {}}]}),
    ]
    for config in bad:
        with pytest.raises(ValueError):
            call_provider(config, user("hi"), limits=LIMITS, clock=clock)


def test_r6_1_limits_and_clock_are_checked():
    """R6.1: the clocks are the adapter's only sense of time: a naive clock or a
    non-positive no-progress limit is a programming error."""
    config = ProviderConfig("p", "scripted", "m", script={})
    with pytest.raises(ValueError):
        call_provider(config, user("hi"), limits=LIMITS, clock=lambda: datetime(2025, 1, 1))
    with pytest.raises(ValueError):
        call_provider(
            config,
            user("hi"),
            limits=CallLimits(budget_s=10, no_progress_s=0),
            clock=AdjustableClock(start()),
        )


def test_r6_1_sse_parser_yields_comments_as_heartbeats_and_joins_data_lines():
    """R6.1: a comment line is a keep-alive, reported at once, not an event."""
    lines = [
        ": keep-alive",
        "",
        "event: message_start",
        'data: {"a":',
        "data: 1}",
        "",
        "id: 7",
        "retry: 100",
        "data: [DONE]",
    ]
    items = list(iter_sse(lines))
    assert [(i.comment, i.event, i.data) for i in items] == [
        (True, "", "keep-alive"),
        (False, "message_start", '{"a":\n1}'),
        (False, "message", "[DONE]"),
    ]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "ping", "content_block_delta"]),
            st.text(alphabet=st.characters(blacklist_characters="\r\n"), max_size=30),
        ),
        max_size=8,
    )
)
def test_r6_1_sse_parser_round_trips_any_events(events):
    """R6.1: whatever the payload, each written event is read back once, in order."""
    lines: list[str] = []
    for name, data in events:
        if name:
            lines.append(f"event: {name}")
        lines += [f"data: {data}", ""]
    parsed = [(i.event, i.data) for i in iter_sse(lines)]
    assert parsed == [(name or "message", data) for name, data in events]


def test_r2_1_adapters_are_plain_clients_without_django_or_runner():
    """R2.1 (ARCHITECTURE): adapters gather facts only; no Django, no runner imports."""
    offenders = []
    for path in sorted((REPO_ROOT / "tasks" / "adapters").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in {"django", "celery"} or name.startswith("tasks.stages"):
                    offenders.append(f"{path.name}: {name}")
    assert offenders == []


def test_r2_1_a_caller_transport_is_used_and_left_open(wire):
    """R2.1: a shared transport passed by the caller serves several attempts."""
    done = sse({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]})
    wire.reply(Reply(chunks=[done, sse("[DONE]")]))
    config = ProviderConfig("p", "openai", "m", base_url=wire.url, api_key="k")
    transport = httpx.HTTPTransport()
    clock = AdjustableClock(start())
    try:
        for _ in range(2):
            response = call_provider(
                config, user("hi"), limits=LIMITS, clock=clock, transport=transport
            )
            assert response.text == "ok"
            assert classify(response, clock).failure_class is None
    finally:
        transport.close()
    assert len(wire.received) == 2
