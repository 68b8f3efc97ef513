"""ASGI entry point (served by uvicorn; streams need an async server)."""

import asyncio
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor

import django
from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.db import close_old_connections
from django.http import FileResponse
from django.urls import set_script_prefix

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.site.settings")


class SyncChainASGIHandler(ASGIHandler):
    """Django's ASGI handler with the middleware chain and the view run as
    one synchronous call, in the request's own thread.

    Django runs an ASGI request's middleware async when it can, and its
    built-in middleware then send each process_request and process_response
    through sync_to_async: a dozen thread hops per request, ≈2.5 ms of a 3 ms
    404 on two cores. Every middleware here can run sync, so the chain runs
    the way WSGI runs it. An async view (the SSE stream) is still awaited on
    the event loop and its async body is streamed there.

    Each request's synchronous part runs on one thread of its own, as in
    Django, but the thread is one an earlier request left idle (as a WSGI
    server's are): Django starts a thread for every request and another to
    join it, and what a thread keeps is lost with it (Celery's result backend
    is built anew in each one: ≈1 ms of a submit).

    And a request crosses into its thread once: Django's handler crosses for
    the ``request_started`` signal, for the chain and for ``response.close()``
    (three hops, about a third of a JSON answer's CPU on the event loop's
    side). Here the thread sends the signal, runs the chain and closes a
    response whose body is in hand before the loop sends it, as WSGI does; a
    streaming response is closed after its body, and the client's disconnect
    still ends it (``_stream``, Django's way).

    It overrides Django's ``ASGIHandler.handle`` and calls the handler's own
    steps (``read_body``, ``create_request``, ``send_response``,
    ``listen_for_disconnect``: Django 5.x, kept below 6 in pyproject.toml;
    tests/dashboard/test_asgi_entry.py runs them). Measured A/B against
    Django's stock handler (docs/performance.md): the web's CPU per lone run
    halves and the submit's p50 is 40 % lower. It can go when Django's ASGI
    handler runs a synchronous middleware chain in one hop.
    """

    def __init__(self) -> None:
        super().__init__()
        self._idle_threads: list[ThreadPoolExecutor] = []

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        # Only the event loop's thread takes and returns threads: no lock.
        thread = self._idle_threads.pop() if self._idle_threads else _request_thread()
        try:
            async with ThreadSensitiveContext(executor=thread):
                await self.handle(scope, receive, send)
        finally:
            if len(self._idle_threads) < IDLE_REQUEST_THREADS:
                self._idle_threads.append(thread)
            else:
                thread.shutdown(wait=False)

    async def handle(self, scope, receive, send):
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        try:
            response = await sync_to_async(self._respond, thread_sensitive=True)(scope, body_file)
            if response.streaming:
                await self._stream(response, receive, send)
            else:
                await self.send_response(response, send)
        finally:
            body_file.close()

    def _respond(self, scope, body_file):
        """In the request's thread: what Django's handler does in three hops."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, response = self.create_request(scope, body_file)
        if request is not None:
            response = self.get_response(request)
            response._handler_class = self.__class__
            if isinstance(response, FileResponse):
                response.block_size = self.chunk_size  # the server chunks
        if not response.streaming:
            # The body is in hand: request_finished hands the thread's
            # connection back now, not after one more hop.
            response.close()
        else:
            # A stream (a waiting answer, an event stream, an export) can last
            # minutes: its connection goes back to the pool now, and a body
            # that reads again in this thread takes one then. Held, eight
            # waiting clients took a web process's whole pool.
            close_old_connections()
        return response

    async def _stream(self, response, receive, send):
        """A streaming body, ended early by the client's disconnect (an idle
        stream or a waiting request would otherwise outlive its client)."""
        if isinstance(response, WaitedAnswer):
            send = _with_the_end(send, response)
        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(self.send_response(response, send)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                if not task.done():
                    task.cancel()
                # The client left (RequestAborted), or the other task ended this one.
                with contextlib.suppress(RequestAborted, asyncio.CancelledError):
                    await task
        finally:
            await sync_to_async(response.close, thread_sensitive=True)()


def _with_the_end(send, response):
    """``send`` that holds a body part until the next message and sends it with
    that one: a body of one part goes out with the body's end, in one write.
    The status line waits for that part too: a waited answer may decide its
    own status (``responses.Answered``), and it is read from the response then."""
    held = None
    start = None

    async def sending(message):
        nonlocal held, start
        if message["type"] == "http.response.start":
            start = message
            return
        if start is not None:
            await send({**start, "status": response.status_code, "headers": _headers(response)})
            start = None
        if message["type"] == "http.response.body":
            if held is not None:
                message = {**message, "body": held["body"] + message.get("body", b"")}
                held = None
            if message.get("more_body"):
                held = message
                return
        await send(message)

    return sending


def _headers(response) -> list[tuple[bytes, bytes]]:
    """The response's headers as Django's ``send_response`` encodes them."""
    headers = [(name.encode("ascii"), value.encode("latin1")) for name, value in response.items()]
    headers.extend(
        (b"Set-Cookie", c.output(header="").encode("ascii").strip())
        for c in response.cookies.values()
    )
    return headers


# Idle request threads kept for the next requests (a burst's peak starts more).
IDLE_REQUEST_THREADS = 32


def _request_thread() -> ThreadPoolExecutor:
    # One worker: all thread-sensitive calls of a request run on the same thread.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")


django.setup(set_prefix=False)
django_application = SyncChainASGIHandler()

from django.conf import settings  # noqa: E402  (needs settings loaded)

from dashboard.site.responses import WaitedAnswer  # noqa: E402
from tasks.telemetry import configure_telemetry  # noqa: E402

configure_telemetry(component="web")


async def application(scope, receive, send):
    """Django's ASGI handler spools a whole body to a temporary file before any
    middleware runs; a declared Content-Length over the limit is refused here,
    before the body is read (the same 413 JSON as dashboard/site/errors.py)."""
    if (
        scope["type"] == "http"
        and scope.get("path", "").startswith("/api/")
        and _declared_length(scope) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    ):
        from dashboard.site.errors import too_large

        response = too_large()
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
        headers.append((b"content-length", str(len(response.content)).encode()))
        headers.append((b"connection", b"close"))  # the unread body is not drained
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": response.content})
        return
    await django_application(scope, receive, send)


def _declared_length(scope) -> int:
    from dashboard.site.errors import declared_length

    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return declared_length(value.decode("latin-1")) or 0  # not a number: Django's 400
    return 0
