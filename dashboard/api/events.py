"""The run stream (R7.1–R7.3): Server-Sent Events of a run and the client's acks
(``GET …/events``, ``POST …/acks``), as API clients and the watch page read them.

Design: ``run_events`` is an async view returning a streaming response over an
async iterator, so uvicorn holds an idle stream as one suspended coroutine (no
thread). Idle streams do not poll the database each: one hub per event loop
polls ``max(RunEvent.id)`` every ``POLL_S`` and wakes the streams only when
something new was written; each woken stream then reads its own run's events.
Under a WSGI server (runserver, the test live server) the same view streams
from a plain generator that polls its run directly.

A disconnect only detaches the viewer (R7.1): nothing here cancels a run or
starts work. Only the watch page's Stop button and the cancel API cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections
from django.db import connection as db_connection
from django.db.models import Max
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt, csrf_protect

import dashboard.api.waits as run_waits
from dashboard.api.base import (
    ApiError,
    authenticate,
    error_response,
    parse_body,
    require_visible,
)
from dashboard.api.schemas import AckBody
from dashboard.site import permissions
from dashboard.site.loop_db import off_loop
from governance import services, time_source
from governance.models import Run, RunEvent
from governance.services import stream as stream

POLL_S = 0.5  # how often new events are looked for
KEEPALIVE_S = 15.0  # a comment line on an idle stream so proxies keep it open
RETRY_MS = 1000  # the browser's reconnect delay (EventSource ``retry:``)
KEEPALIVE = b": keep-alive\n\n"
BATCH = 500  # events per read

# --------------------------------------------------------------------------- auth


def _user_for(request: HttpRequest):
    """Bearer token (API clients) or a logged-in session (the watch page); the
    user is also ``request.api_user`` and its scopes ``request.api_scopes``."""
    if request.headers.get("Authorization"):
        request.api_user = authenticate(request)
        return request.api_user, "token"
    user = request.user
    if user.is_authenticated and user.is_active:
        request.api_user, request.api_scopes = user, ()
        return user, "session"
    raise ApiError(401, "Authorization", "send 'Authorization: Bearer <token>' or log in")


def _run_or_404(request: HttpRequest, run_id: str) -> Run:
    """The run, if the requester may see it (someone else's: 404)."""
    try:
        key = uuid.UUID(str(run_id))
    except ValueError:
        raise ApiError(404, None, "no such run") from None
    run = Run.objects.filter(id=key).first()
    if run is None:
        raise ApiError(404, None, "no such run")
    require_visible(request, run.owner_id, "run")
    return run


LAST_EVENT_ID_MAX = 2**63 - 1  # RunEvent.id is a bigint


def _last_event_id(request: HttpRequest) -> int:
    """The Last-Event-ID header, else ``?last_event_id=``: ASCII digits, 0 … the
    largest id stored (RunEvent.id is a bigint; RunViewer.last_event_id keeps it)."""
    from governance.models import RunViewer

    field = RunViewer._meta.get_field("last_event_id")
    _low, high = db_connection.ops.integer_field_range(field.get_internal_type())
    largest = min(LAST_EVENT_ID_MAX, high if high is not None else LAST_EVENT_ID_MAX)
    raw = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id") or "0"
    # Digits only (int() would take " 7", "+7", "1_0" and other scripts' digits);
    # checked by length first, so a huge value is refused without converting it.
    if not (raw.isascii() and raw.isdigit()):
        shown = raw if len(raw) <= 40 else raw[:40] + "…"
        raise ApiError(400, "Last-Event-ID", f"must be an event id (digits), got {shown!r}")
    if len(raw.lstrip("0")) > len(str(largest)) or int(raw) > largest:
        raise ApiError(400, "Last-Event-ID", f"must be at most {largest}")
    return int(raw)


def _open_stream(request: HttpRequest, run_id: str) -> tuple[Run, int, str | None]:
    """The run, where to resume, and the viewer's connection id: None for an
    onlooker (someone else's run seen by a role that sees all), whose stream
    records no delivery evidence (R7.2: *sent* is the client's, not staff's)."""
    try:
        user, _how = _user_for(request)
        run = _run_or_404(request, run_id)
        last_id = _last_event_id(request)
        connection_id = None
        if permissions.records_delivery(user, run.owner_id, request.api_scopes):
            connection_id = uuid.uuid4().hex
            stream.connect_viewer(
                run, connection_id=connection_id, last_event_id=last_id, now=time_source.now()
            )
        return run, last_id, connection_id
    finally:
        if isinstance(request, ASGIRequest):
            # This request's own thread would otherwise hold a database
            # connection for the stream's whole life: 300 streams, 300 connections.
            db_connection.close()


# --------------------------------------------------------------------------- SSE framing


def _frame(event_id: int, kind: str, metadata: dict) -> bytes:
    data = json.dumps({"kind": kind, "metadata": metadata}, separators=(",", ":"))
    # json.dumps escapes newlines, so one data line carries the whole event.
    return f"id: {event_id}\ndata: {data}\n\n".encode()


def _read(run_id, after_id: int) -> tuple[list[tuple[int, str, dict]], bool]:
    """Settled is read before the events, so "settled and nothing new" is final."""
    settled = stream.run_is_settled(run_id)
    return stream.events_after(run_id, after_id, BATCH), settled


def _written(run_id, connection_id: str | None, events, now) -> None:
    """R7.2: the batch reached the owner's transport: chunks in it are now *sent*."""
    if connection_id is None:
        return  # an onlooker's stream
    chunk_nos = [m.get("chunk_no") for _i, kind, m in events if kind == "chunk"]
    stream.mark_chunks_sent(run_id, [n for n in chunk_nos if isinstance(n, int)], now=now)
    stream.viewer_progress(connection_id, events[-1][0])


def _ends(events) -> bool:
    return any(kind == "settlement" for _i, kind, _m in events)


# --------------------------------------------------------------------------- ASGI path


class _Hub:
    """One per event loop: polls the newest RunEvent id and wakes waiting streams."""

    def __init__(self) -> None:
        self.latest = 0
        self.changed = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.waiters = 0

    async def _poll(self) -> None:
        while self.waiters:
            # Not thread-sensitive: the hub outlives the request that started it.
            latest = await off_loop(_newest_event_id)()
            if latest != self.latest:
                self.latest = latest
                self.changed.set()
                self.changed = asyncio.Event()
            await asyncio.sleep(POLL_S)
        self.task = None

    async def wait(self, timeout: float) -> None:
        self.waiters += 1
        try:
            if self.task is None:
                self.task = asyncio.get_running_loop().create_task(
                    self._poll(), context=contextvars.Context()
                )
            with contextlib.suppress(TimeoutError):  # a timeout is a normal wake-up
                await asyncio.wait_for(self.changed.wait(), timeout)
        finally:
            self.waiters -= 1


def _newest_event_id() -> int:
    return RunEvent.objects.aggregate(m=Max("id"))["m"] or 0


_hubs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hub() -> _Hub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = _Hub()
    return hub


async def event_batches(
    run_id, last_id: int, connection_id: str | None
) -> AsyncIterator[list[tuple[int, str, dict]]]:
    """The run's events in batches as they are written, until the settlement's;
    an empty batch when a keep-alive is due. Each batch counts as handed to the
    transport (R7.2 delivery evidence) once the consumer asks for the next: it
    yields the batch's bytes first. Ends detached (R7.1), never cancelled.
    Consumers close it (``contextlib.aclosing``) so a disconnect detaches at once."""
    with run_waits.settlement_heard(str(run_id)) as settled_heard:
        try:
            batches = _batches(run_id, last_id, connection_id, settled_heard)
            async with contextlib.aclosing(batches):
                async for batch in batches:
                    yield batch
        finally:
            # R7.1: the transport went away (or the stream ended): detached, not cancelled.
            await asyncio.shield(off_loop(_detach)(connection_id))


async def _batches(
    run_id, last_id: int, connection_id: str | None, settled_heard: asyncio.Event
) -> AsyncIterator[list[tuple[int, str, dict]]]:
    idle_since = time.monotonic()
    settled_empty = 0
    while True:
        events, settled = await off_loop(_read)(run_id, last_id)
        if events:
            yield events
            # Resumed: the previous bytes were handed to the transport.
            last_id = events[-1][0]
            await off_loop(_written)(run_id, connection_id, events, time_source.now())
            idle_since = time.monotonic()
            if _ends(events):
                return  # R7.1: settlement streamed: replay/stream ends here
            continue
        if settled:
            # Settled with nothing newer: the settlement event is behind us
            # (or, for old data, missing); a second look closes the stream.
            settled_empty += 1
            if settled_empty >= 2:
                return
        if time.monotonic() - idle_since >= KEEPALIVE_S:
            yield []
            idle_since = time.monotonic()
        timeout = min(POLL_S * 2, KEEPALIVE_S) if settled else KEEPALIVE_S
        await _woken(timeout, settled_heard)


async def _woken(timeout: float, settled_heard: asyncio.Event) -> None:
    """Until the hub sees a new event, the run's settlement is heard (its last
    chunks commit with it: a one-turn run's answer is sent at once, not at the
    hub's next poll), or ``timeout``."""
    if not settled_heard.is_set():
        waits = [
            asyncio.ensure_future(_hub().wait(timeout)),
            asyncio.ensure_future(settled_heard.wait()),
        ]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
    settled_heard.clear()


async def _aevents(run_id, last_id: int, connection_id: str | None) -> AsyncIterator[bytes]:
    yield f"retry: {RETRY_MS}\n: connected\n\n".encode()
    async with contextlib.aclosing(event_batches(run_id, last_id, connection_id)) as batches:
        async for events in batches:
            yield b"".join(_frame(*event) for event in events) if events else KEEPALIVE


def _detach(connection_id: str | None) -> None:
    if connection_id is None:
        return  # an onlooker's stream was never connected
    stream.detach_viewer(connection_id, now=time_source.now())


# --------------------------------------------------------------------------- WSGI path


def event_batches_sync(
    run_id, last_id: int, connection_id: str | None
) -> Iterator[list[tuple[int, str, dict]]]:
    """:func:`event_batches` under a WSGI server: the request's thread polls."""
    try:
        idle_since = time.monotonic()
        settled_empty = 0
        while True:
            events, settled = _read(run_id, last_id)
            if events:
                yield events
                last_id = events[-1][0]
                _written(run_id, connection_id, events, time_source.now())
                idle_since = time.monotonic()
                if _ends(events):
                    return
                continue
            if settled:
                settled_empty += 1
                if settled_empty >= 2:
                    return
            if time.monotonic() - idle_since >= KEEPALIVE_S:
                yield []
                idle_since = time.monotonic()
            close_old_connections()
            time.sleep(POLL_S)
    finally:
        _detach(connection_id)


def _sync_events(run_id, last_id: int, connection_id: str | None) -> Iterator[bytes]:
    yield f"retry: {RETRY_MS}\n: connected\n\n".encode()
    with contextlib.closing(event_batches_sync(run_id, last_id, connection_id)) as batches:
        for events in batches:
            yield b"".join(_frame(*event) for event in events) if events else KEEPALIVE


# --------------------------------------------------------------------------- views


@csrf_exempt
@permissions.declared(GET=None)
async def run_events(request: HttpRequest, run_id: str) -> HttpResponse:
    """GET /api/v1/runs/{id}/events — R7.1: the run's events as SSE, ``id`` = RunEvent.id."""
    if request.method != "GET":
        response = error_response(405, None, "use GET on this address")
        response["Allow"] = "GET"
        return response
    try:
        run, last_id, connection_id = await sync_to_async(_open_stream)(request, run_id)
    except ApiError as exc:
        return error_response(exc.status, exc.field, exc.message)
    body = (
        _aevents(run.id, last_id, connection_id)
        if isinstance(request, ASGIRequest)
        else _sync_events(run.id, last_id, connection_id)
    )
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


def _ack(request: HttpRequest, run_id: str) -> JsonResponse:
    user, how = _user_for(request)
    if how == "session":
        # Session auth needs the CSRF header (a token request is not a browser's).
        rejected = csrf_protect(lambda r: None)(request)
        if rejected is not None:
            return error_response(403, "X-CSRFToken", "CSRF check failed")
    run = _run_or_404(request, run_id)
    if not permissions.records_delivery(user, run.owner_id, request.api_scopes):
        raise ApiError(403, None, "only the run's owner records what its client was shown")
    body = parse_body(request, AckBody)
    try:
        result = stream.record_ack(run, body.through, now=time_source.now())
    except services.ServiceError as exc:
        raise ApiError(400, exc.field, exc.message) from None
    return JsonResponse(
        {
            "run_id": str(run.id),
            "through": result.through,
            "committed": result.committed,
            "sent": result.sent,
            "observed": result.observed,
            "newly_observed": result.newly_observed,
        }
    )


@csrf_exempt
@permissions.declared(POST=permissions.OWN_RUN)  # R7.2: the client's evidence
def run_acks(request: HttpRequest, run_id: str) -> JsonResponse:
    """POST /api/v1/runs/{id}/acks {"through": n} — R7.2/R7.3: observed chunks 1 … n."""
    if request.method != "POST":
        response = error_response(405, None, "use POST on this address")
        response["Allow"] = "POST"
        return response
    try:
        return _ack(request, run_id)
    except ApiError as exc:
        return error_response(exc.status, exc.field, exc.message)
