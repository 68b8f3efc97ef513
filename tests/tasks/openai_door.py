"""What the tests of the OpenAI-compatible door share: loopback OpenAI-compatible
providers (real HTTP servers, their requests counted where they arrive), the
door's route and client token, the SDK client and the thread's history.

``tests/tasks/conftest.py`` offers its fixtures to every module there."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from governance import time_source
from governance.models import ApiToken, HistoryItem, Provider, Segment, Thread
from governance.services import routes as route_services
from governance.services.tokens import token_digest

TOKEN = "door-chat-token-" + "c" * 24
TRIGGER = "FORBIDDEN-WORD"


class LoopbackProvider(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat-completions server: answers with the last user
    message echoed in two chunks (or, after a tool result, with the result),
    refuses (``content_filter``) any request carrying the trigger word, and,
    offered a ``get_weather`` tool, calls it for a question about the weather
    (its arguments streamed in two pieces, as OpenAI does)."""

    requests: list[dict] = []  # noqa: RUF012 (reset per test)
    gate: threading.Event | None = None  # set: a request saying "wait" is answered
    refuses_trigger = True

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if "wait" in json.dumps(body["messages"]) and type(self).gate is not None:
            type(self).gate.wait(30)
        last = body["messages"][-1]
        last_user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        offered = [t["function"]["name"] for t in body.get("tools") or ()]
        if self.refuses_trigger and TRIGGER in json.dumps(body["messages"]):
            chunks = [{"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}]
        elif "get_weather" in offered and last["role"] == "user" and "weather" in last_user:
            call = {"index": 0, "id": "call_w1", "type": "function"}
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [
                    {**call, "function": {"name": "get_weather", "arguments": '{"city": '}}
                ]}}]},
                {"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": 0, "function": {"arguments": '"Paris"}'}}
                ]}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            ]  # fmt: skip
        elif last["role"] == "tool":
            chunks = [
                {"choices": [{"index": 0, "delta": {"content": f"Tool said: {last['content']}"}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
        else:
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Echo: "}}]},
                {"choices": [{"index": 0, "delta": {"content": last_user}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
            ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps({'model': 'echo-1', **chunk})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


class LenientProvider(LoopbackProvider):
    """The same server, but it answers whatever the messages say."""

    requests: list[dict] = []  # noqa: RUF012 (reset per test)
    refuses_trigger = False


@contextmanager
def serving(handler: type[LoopbackProvider]) -> Iterator[str]:
    """``handler`` on a loopback port, its requests reset: the base URL."""
    handler.requests, handler.gate = [], None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def provider_server():
    with serving(LoopbackProvider) as base_url:
        yield base_url


@pytest.fixture
def lenient_server():
    with serving(LenientProvider) as base_url:
        yield base_url


@pytest.fixture
def asgi_server():
    """``dashboard.site.asgi`` under a real uvicorn in this process (the
    deployment's entry): the wait hears the settlement, the stream is async."""
    from dashboard.site.asgi import application
    from tests.asgi_server import serving as serving_asgi

    with serving_asgi(application) as (base, _loop):
        yield base


@pytest.fixture
def door(provider_server, make_user, monkeypatch):
    """A provider ``echo`` behind the route ``chat``; a client's token."""
    monkeypatch.setenv("GOVERNANCE_KEY_ECHO", "unused-key")
    Provider.objects.create(
        provider_id="echo", kind="openai", model="echo-1", base_url=provider_server,
        api_key_env="GOVERNANCE_KEY_ECHO",
    )  # fmt: skip
    route_services.create_route(
        name="chat", provider_chain=["echo"], by="tests", now=time_source.now()
    )
    user = make_user("door-client", "agent-client")
    ApiToken.objects.create(user=user, name="door", key_digest=token_digest(TOKEN))
    return user


def sdk(live_server, api_key: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{live_server.url}/v1", api_key=api_key, max_retries=0, timeout=60
    )


def history(thread: Thread) -> list[tuple[str, str]]:
    segment = Segment.objects.get(thread=thread, closed_at__isnull=True)
    return list(
        HistoryItem.objects.filter(session=segment.session)
        .order_by("seq")
        .values_list("role", "content")
    )
