"""Django's PostgreSQL backend, pooled, with a check that costs no round trip.

psycopg_pool's own check sends a query for every connection it hands out,
one commit on the server per web request and per task (a third of a
single-turn run's commits). An idle connection has nothing to read, so
``check_idle_connection`` looks at the socket instead: a readable one means
the server ended the session (a restart's "terminating connection") or sent
something unasked, and only then is the connection tried with a query and
replaced if that fails. A PostgreSQL restart still costs no stage
(tests/faults/test_postgres_restart.py).

It sets psycopg_pool's private ``_check`` (psycopg-pool 3.x, kept below 4 in
pyproject.toml): Django builds the pool with ``check=`` its own and a
``"check"`` in ``OPTIONS["pool"]`` collides with it. It can go when Django
lets the pool's check be chosen (or psycopg_pool's check costs no query).
"""

from __future__ import annotations

import select

import psycopg
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool


def check_idle_connection(conn: psycopg.Connection) -> None:
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    if readable:
        ConnectionPool.check_connection(conn)


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        pool = super().pool
        # Django passes psycopg_pool's check when CONN_HEALTH_CHECKS is on and
        # offers no option to choose another; the pool is not open yet here.
        if pool is not None and pool._check is ConnectionPool.check_connection:
            pool._check = check_idle_connection
        return pool
