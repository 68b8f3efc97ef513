"""Database work from the event loop (the run stream, waiting reads).

A coroutine that needs the database runs the read in the loop's bounded
thread pool, not in a request's own thread, so idle streams and waiting
requests hold no thread. Each call hands its connection back to the process's
pool when it ends: a pool thread lives as long as the process, and a
connection kept in it would be out of the pool for good (a web process has
``DATABASES["default"]["OPTIONS"]["pool"]["max_size"]`` of them; with a few
kept by idle threads its requests waited for one and timed out).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.base.base import BaseDatabaseWrapper

P = ParamSpec("P")
T = TypeVar("T")


def off_loop(func: Callable[P, T]) -> Callable[P, Awaitable[T]]:
    """``func`` as a coroutine function run in the loop's thread pool."""

    def returning_the_connection(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return func(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(returning_the_connection, thread_sensitive=False)


def plain_params(wrapper: BaseDatabaseWrapper = connection) -> dict[str, Any]:
    """A PostgreSQL connection's settings for a plain ``psycopg.connect`` (a LISTEN
    connection, an administrator's one): Django's own options left out."""
    params = wrapper.get_connection_params()
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return params
