"""dashboard.asgi: the middleware chain and the view run in one thread hop."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.sync import SyncToAsync, iscoroutinefunction

from dashboard.asgi import application, django_application


def _asgi_get(path: str) -> tuple[int, dict, int]:
    """One GET through the ASGI entry; returns status, JSON body and how many
    times the request crossed from the event loop into a thread."""
    hops = 0
    original = SyncToAsync.__call__

    async def counting(self, *args, **kwargs):
        nonlocal hops
        hops += 1
        return await original(self, *args, **kwargs)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }  # fmt: skip
    sent: list[dict] = []

    async def call() -> None:
        body = [{"type": "http.request", "body": b"", "more_body": False}]
        disconnect = asyncio.get_running_loop().create_future()

        async def receive():
            return body.pop() if body else await disconnect

        async def send(message):
            sent.append(message)

        await application(scope, receive, send)
        disconnect.cancel()

    SyncToAsync.__call__ = counting
    try:
        asyncio.run(call())
    finally:
        SyncToAsync.__call__ = original
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload), hops


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
