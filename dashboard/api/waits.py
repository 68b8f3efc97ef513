"""Waiting for a run to settle: ``GET /api/v1/runs/{id}?wait=S``.

A client that wants the settlement asks once and is answered when the run
settles, instead of asking again and again: polling costs the server a request
per poll and, on a small machine, takes the CPU the run itself needs.

How a waiting request hears the settlement: the transaction that writes a
settlement also sends ``NOTIFY governance_run_settled`` with the run's id
(``services.runs.settlement_row``), which PostgreSQL delivers at the commit.
Each web event loop holds one connection on ``LISTEN`` for it (opened by the
first waiting request, closed after ``LINGER_S`` with none) and wakes the
requests waiting for that run. The notification is a prompt, not a fact: a
woken request reads the database, and every waiting request looks again (one
small read: settled or not) every ``RECHECK_S`` anyway, so a lost connection, a
settlement committed before the ``LISTEN`` or SQLite (which has no NOTIFY)
delays an answer by at most that. The listener remembers what it heard for
``HEARD_KEEP_S``: the view's own look, made before its request watched, still
counts when a settlement heard in between is remembered (no second look).
Under a WSGI server (runserver, the tests' live server) the request polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import math
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial

import psycopg
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections, connection

from dashboard.site.loop_db import off_loop, plain_params
from dashboard.site.responses import WaitedAnswer, apply_answered
from governance.services.runs import RUN_SETTLED_CHANNEL
from governance.services.stream import run_is_settled

log = logging.getLogger(__name__)


RECHECK_S = 2.0  # a waiting request reads its run this often, heard or not
POLL_S = 0.05  # without a listener (SQLite, WSGI, while it connects): read this often
LINGER_S = 60.0  # the listener's connection stays this long with nobody waiting
RETRY_MAX_S = 10.0  # the longest pause before connecting again after a failure
HEARD_KEEP_S = 10.0  # a settlement heard is remembered this long (ms would do)


class _Listener:
    """One per event loop: a connection on LISTEN and the requests waiting by run."""

    def __init__(self) -> None:
        self.waiting: dict[str, set[asyncio.Event]] = {}
        # Since when LISTEN has been in place without a break (monotonic), or None.
        self.listening_since: float | None = None
        self.heard: dict[str, float] = {}  # run id → when heard, oldest first
        self.task: asyncio.Task | None = None

    @property
    def listening(self) -> bool:
        """LISTEN is in place: a notification will be heard."""
        return self.listening_since is not None

    def heard_after(self, run_id: str, since: float) -> bool | None:
        """Whether ``run_id``'s settlement was heard after ``since`` (monotonic);
        None when one could have been missed: not listening since before it."""
        if self.listening_since is None or self.listening_since > since:
            return None
        return self.heard.get(run_id, -math.inf) >= since

    def _remember(self, run_id: str, now: float) -> None:
        self.heard.pop(run_id, None)  # moved to the end: the dict stays in time order
        self.heard[run_id] = now
        for oldest, at in list(itertools.islice(self.heard.items(), 8)):
            if now - at <= HEARD_KEEP_S:
                break
            del self.heard[oldest]

    @contextlib.contextmanager
    def watch(self, run_id: str) -> Iterator[asyncio.Event]:
        heard = asyncio.Event()
        self.waiting.setdefault(run_id, set()).add(heard)
        if self.task is None and connection.vendor == "postgresql":
            self.task = asyncio.get_running_loop().create_task(
                self._listen(), context=contextvars.Context()
            )
        try:
            yield heard
        finally:
            found = self.waiting.get(run_id)
            if found is not None:
                found.discard(heard)
                if not found:
                    del self.waiting[run_id]

    async def _listen(self) -> None:
        me = asyncio.current_task()
        pause = 0.2
        try:
            while True:
                try:
                    params = await off_loop(plain_params)()
                    async with await psycopg.AsyncConnection.connect(
                        autocommit=True, **params
                    ) as listen:
                        await listen.execute(f"LISTEN {RUN_SETTLED_CHANNEL}")
                        self.listening_since, pause = time.monotonic(), 0.2
                        if await self._hear(listen):
                            # Nobody waited for LINGER_S. Retired before the
                            # connection's close is awaited: a request arriving
                            # meanwhile starts a listener of its own.
                            self._retire(me)
                            return
                except (psycopg.Error, OSError) as exc:
                    log.warning("run waits: listening for settlements failed: %s", exc)
                if self.task is me:
                    self.listening_since = None
                await asyncio.sleep(pause)
                pause = min(pause * 2, RETRY_MAX_S)
        finally:
            self._retire(me)

    def _retire(self, task: asyncio.Task | None) -> None:
        if self.task is task:
            self.task, self.listening_since = None, None

    async def _hear(self, listen: psycopg.AsyncConnection) -> bool:
        """Wake the waiters of each settled run; True once nobody waited for
        LINGER_S. psycopg's own ``notifies()`` reads them (a reader on the socket
        through libpq's calls measured no faster, bench/throughput.py A/B); a
        lost connection raises psycopg's error out of it."""
        idle_since = None
        while True:
            async for note in listen.notifies(timeout=min(LINGER_S, 1.0) or 0.01):
                self._remember(note.payload, time.monotonic())
                for waiter in self.waiting.get(note.payload, ()):
                    waiter.set()
            if self.waiting:
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            if idle_since is not None and time.monotonic() - idle_since >= LINGER_S:
                return True


_listeners: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _listener() -> _Listener:
    loop = asyncio.get_running_loop()
    found = _listeners.get(loop)
    if found is None:
        found = _listeners[loop] = _Listener()
    return found


def settlement_heard(run_id: str) -> contextlib.AbstractContextManager[asyncio.Event]:
    """An event set when ``run_id``'s settlement is heard (a prompt to look,
    like every notification here): for the run stream, whose last events
    commit with the settlement, so it need not wait for its next poll."""
    return _listener().watch(run_id)


async def answer_when_settled(
    run_id: str,
    wait_s: float,
    settled: Callable[[], bool | None],
    settled_answer: Callable[[], bytes | None],
    answer: Callable[[], bytes],
    looked_at: float | None = None,
) -> AsyncIterator[bytes]:
    """The body of a waiting request: ``answer()`` once ``settled()`` (one small
    read) is not False (the run settled, or is gone), else after ``wait_s``. A
    heard settlement is read with ``settled_answer()`` (None while not settled):
    one read both tells and answers, so the answer costs one trip off the loop;
    a look without a notification (a recheck, polling) is the small read. All
    of them read the database off the event loop. ``looked_at``: when the
    caller's own look, which found the run unsettled, began (monotonic); it
    stands if the listener has listened since before it."""
    deadline = time.monotonic() + wait_s
    listener = _listener()
    body = None
    with listener.watch(run_id) as heard:
        # Watching before the first look: a settlement committed after it is
        # heard. The caller's look came before the watch; it stands when nothing
        # since could have been missed, and a settlement heard since is answered.
        heard_since = None if looked_at is None else listener.heard_after(run_id, looked_at)
        if heard_since is None:
            looked = await off_loop(settled)()
        else:
            looked = False
            if heard_since:
                heard.set()
        while looked is False:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            pause = RECHECK_S if listener.listening else POLL_S
            try:
                await asyncio.wait_for(heard.wait(), min(left, pause))
            except TimeoutError:
                looked = await off_loop(settled)()
            else:
                body = await off_loop(settled_answer)()
                looked = body is not None
            heard.clear()
    yield body if body is not None else await off_loop(answer)()


def waited_answer(
    request,
    run_id,
    wait_s: float,
    answer: Callable[..., bytes | None],
    *,
    looked_at: float | None = None,
) -> WaitedAnswer:
    """The response that answers at the run's settlement (or after ``wait_s``):
    ``answer(settled_only=...)`` builds the body, None while not settled when
    ``settled_only``; a body that is ``Answered`` decides the status and
    headers too. Under ASGI the listener's notification wakes it and the status
    line waits for the body; under a WSGI server the request's thread polls the
    small read before the response is made."""
    settled_now = partial(run_is_settled, run_id)
    final_answer = partial(answer, settled_only=False)
    if not isinstance(request, ASGIRequest):
        part = next(answer_when_settled_sync(wait_s, settled_now, final_answer))
        response = WaitedAnswer([bytes(part)], content_type="application/json")
        apply_answered(response, part)
    else:
        response = WaitedAnswer(content_type="application/json")
        response.streaming_content = _deciding(
            response,
            answer_when_settled(
                str(run_id), wait_s, settled_now, partial(answer, settled_only=True),
                final_answer, looked_at=looked_at,
            ),
        )  # fmt: skip
    response["Cache-Control"] = "no-store"
    return response


async def _deciding(response: WaitedAnswer, parts: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The body's one part, its status and headers given to the response first."""
    async for part in parts:
        apply_answered(response, part)
        yield bytes(part)


def answer_when_settled_sync(
    wait_s: float, settled: Callable[[], bool | None], answer: Callable[[], bytes]
) -> Iterator[bytes]:
    """The same under a WSGI server: the request's own thread polls with the small read."""
    deadline = time.monotonic() + wait_s
    while settled() is False and time.monotonic() < deadline:
        if not connection.in_atomic_block:  # a test's transaction: its connection stays
            close_old_connections()
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
    yield answer()
