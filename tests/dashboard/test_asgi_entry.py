"""dashboard.site.asgi: the middleware chain and the view run in one thread hop."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import SyncToAsync, iscoroutinefunction
from django.core import signals
from django.http import JsonResponse, StreamingHttpResponse
from django.test import override_settings
from django.urls import path

from dashboard.site.asgi import application, django_application
from dashboard.site.responses import WaitedAnswer

EVENTS: list = []  # what the handler and the views below did, in order
STREAM_GO_ON = threading.Event()  # the stream's second part may be sent


def _scope(path: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip


async def _exchange(path: str, leave_after_first_part: bool = False) -> list[dict]:
    """One GET through the ASGI entry on the running loop: the messages sent
    (recorded in EVENTS too; a stream's second part follows its first)."""
    sent: list = []
    body = [{"type": "http.request", "body": b"", "more_body": False}]
    gone = asyncio.get_running_loop().create_future()

    async def receive():
        return body.pop() if body else await gone

    async def send(message):
        sent.append(message)
        EVENTS.append(("sent", message.get("body")))
        if leave_after_first_part and message.get("body") == b"first ":
            gone.set_result({"type": "http.disconnect"})
        elif message.get("body") == b"first ":
            STREAM_GO_ON.set()

    await asyncio.wait_for(application(_scope(path), receive, send), 10)
    if not gone.done():
        gone.cancel()
    return sent


async def _asgi_call(path: str) -> tuple[int, dict]:
    """One GET through the ASGI entry on the running loop: status and JSON body."""
    sent = await _exchange(path)
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(payload)


def _asgi_get(path: str) -> tuple[int, dict, int]:
    """One GET through the ASGI entry; returns status, JSON body and how many
    times the request crossed from the event loop into a thread."""
    hops = 0
    original = SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        nonlocal hops
        hops += 1
        return await original(self, *args, **kwargs)

    SyncToAsync.__call__ = counting
    try:
        status, body = asyncio.run(_asgi_call(path))
    finally:
        SyncToAsync.__call__ = original
    return status, body, hops


@pytest.fixture
def chain_threads(monkeypatch):
    """The thread each request's middleware chain ran on, in order."""
    seen: list[int] = []
    chain = django_application.get_response

    def recording(request):
        seen.append(threading.get_ident())
        return chain(request)

    monkeypatch.setattr(django_application, "get_response", recording)
    return seen


def test_the_middleware_chain_runs_synchronously():
    assert not iscoroutinefunction(django_application._middleware_chain)


@pytest.mark.django_db(transaction=True)
def test_an_api_request_crosses_into_a_thread_for_the_chain_not_per_middleware():
    status, body, hops = _asgi_get("/api/v1/no-such-address")
    assert status == 404
    assert "error" in body
    # One: request_started, the chain with its view and response.close go in
    # the same crossing. Django's own handler crossed three times, its async
    # chain twice more per built-in middleware (over a dozen).
    assert hops == 1, hops


@pytest.mark.django_db(transaction=True)
def test_a_request_runs_on_a_thread_an_earlier_request_left_idle(chain_threads):
    for _ in range(3):
        assert _asgi_get("/api/v1/no-such-address")[0] == 404
    # Django's own handler starts (and joins) a new thread for every request.
    assert len(set(chain_threads)) == 1, chain_threads
    assert threading.get_ident() not in chain_threads  # never the event loop's


@pytest.mark.django_db(transaction=True)
def test_requests_at_the_same_time_each_have_a_thread_of_their_own(chain_threads, monkeypatch):
    both_inside = threading.Barrier(2, timeout=10)  # broken if one waited for the other
    recording = django_application.get_response

    def meeting(request):
        both_inside.wait()
        return recording(request)

    monkeypatch.setattr(django_application, "get_response", meeting)

    async def two_at_once():
        return await asyncio.gather(
            _asgi_call("/api/v1/no-such-address"), _asgi_call("/api/v1/no-such-address")
        )

    assert [status for status, _ in asyncio.run(two_at_once())] == [404, 404]
    assert len(set(chain_threads)) == 2, chain_threads


# --------------------------------------------------------------------------- signals, streams


def _json_view(request):
    EVENTS.append(("view", threading.get_ident()))
    return JsonResponse({"ok": True})


async def _stream_view(request):
    async def body():
        try:
            yield b"first "
            while not STREAM_GO_ON.is_set():
                await asyncio.sleep(0.005)
            yield b"second"
        finally:
            EVENTS.append(("body ended", None))

    return StreamingHttpResponse(body(), content_type="text/plain")


def _export_view(request):
    """A CSV export whose rows are read later, in the request's thread."""
    from django.contrib.auth.models import User
    from django.db import connection

    from dashboard.pages.streaming import csv_response

    EVENTS.append(("view", threading.get_ident()))
    User.objects.count()  # the view's own read: the thread holds a connection

    def rest():
        EVENTS.append(("rows read", threading.get_ident()))
        EVENTS.append(("connection held", connection.connection is not None))
        return [
            f"{name}\n"
            for name in User.objects.order_by("username").values_list("username", flat=True)
        ]

    return csv_response(["username\n"], rest, filename="users.csv")


def _waited_view(request):
    async def body():
        await asyncio.sleep(0.01)  # the run settles
        yield b'{"status": "settled"}'

    return WaitedAnswer(body(), content_type="application/json")


urlpatterns = [
    path("json", _json_view),
    path("stream", _stream_view),
    path("export", _export_view),
    path("waited", _waited_view),
]


@pytest.fixture
def recorded_signals():
    EVENTS.clear()
    STREAM_GO_ON.clear()

    def started(**kwargs):
        EVENTS.append(("request_started", threading.get_ident()))

    def finished(**kwargs):
        EVENTS.append(("request_finished", threading.get_ident()))

    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        with override_settings(ROOT_URLCONF=__name__):
            yield EVENTS
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)


@pytest.mark.django_db(transaction=True)
def test_a_json_answer_is_made_and_closed_in_the_requests_thread(recorded_signals):
    asyncio.run(_exchange("/json"))
    kinds = [kind for kind, _ in recorded_signals]
    # Closed (request_finished: its connection handed back) before it is sent.
    assert kinds == ["request_started", "view", "request_finished", "sent", "sent"], kinds
    threads = {ident for kind, ident in recorded_signals if kind != "sent"}
    assert len(threads) == 1 and threading.get_ident() not in threads


@pytest.mark.django_db(transaction=True)
def test_a_streaming_answer_is_closed_after_its_body(recorded_signals):
    sent = asyncio.run(_exchange("/stream"))
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"first second"
    assert sent[-1] == {"type": "http.response.body"}  # the closing message
    kinds = [kind for kind, _ in recorded_signals]
    assert kinds.index("request_finished") > max(
        i for i, kind in enumerate(kinds) if kind == "sent"
    ), kinds
    assert kinds.count("request_finished") == 1


@pytest.mark.django_db(transaction=True)
def test_a_waited_answer_goes_out_with_the_end_of_its_body(recorded_signals):
    """One message, so one write: the client holds the whole answer at once,
    not its part and then the chunked body's end in another packet."""
    sent = asyncio.run(_exchange("/waited"))
    assert sent[0]["type"] == "http.response.start"
    assert sent[1:] == [{"type": "http.response.body", "body": b'{"status": "settled"}'}]
    kinds = [kind for kind, _ in recorded_signals]
    assert kinds[-1] == "request_finished" and kinds.count("request_finished") == 1, kinds


@pytest.mark.django_db(transaction=True)
def test_a_client_that_leaves_ends_its_stream(recorded_signals):
    sent = asyncio.run(_exchange("/stream", leave_after_first_part=True))
    assert [m.get("body") for m in sent[1:]] == [b"first "]  # nothing after it left
    kinds = [kind for kind, _ in recorded_signals]
    assert "body ended" in kinds
    assert kinds[-1] == "request_finished", kinds  # still closed, once
    assert kinds.count("request_finished") == 1


@pytest.mark.django_db(transaction=True)
def test_a_stream_hands_its_connection_back_and_a_later_read_takes_one(
    recorded_signals, django_user_model
):
    """A stream can outlast a pool's worth of clients: its thread's connection
    goes back before the body is sent; rows read later in that thread still read."""
    django_user_model.objects.create_user("ada", password="unused-password-1")
    sent = asyncio.run(_exchange("/export"))
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"username\nada\n"
    view, rows = (ident for kind, ident in recorded_signals if kind in ("view", "rows read"))
    assert view == rows  # the same thread
    assert ("connection held", False) in recorded_signals  # handed back, then taken again
