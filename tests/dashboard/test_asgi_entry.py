"""dashboard.asgi: the middleware chain and the view run in one thread hop."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import SyncToAsync, iscoroutinefunction

from dashboard.asgi import application, django_application


def _scope(path: str) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip


async def _asgi_call(path: str) -> tuple[int, dict]:
    """One GET through the ASGI entry on the running loop: status and JSON body."""
    sent: list[dict] = []
    body = [{"type": "http.request", "body": b"", "more_body": False}]
    disconnect = asyncio.get_running_loop().create_future()

    async def receive():
        return body.pop() if body else await disconnect

    async def send(message):
        sent.append(message)

    await application(_scope(path), receive, send)
    disconnect.cancel()
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
    # request_started, the chain with its view, response.close: Django's own
    # async chain crossed twice per built-in middleware (over a dozen).
    assert hops <= 3, hops


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
