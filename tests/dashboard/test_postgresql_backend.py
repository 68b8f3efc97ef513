"""The pool's connection check (dashboard.site.postgresql): no query for a healthy
idle connection, a refusal for one the server ended."""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import connection

from dashboard.site.postgresql.base import check_idle_connection


def _dsn() -> str:
    params = connection.get_connection_params()
    return psycopg.conninfo.make_conninfo(
        **{k: v for k, v in params.items() if k in {"host", "port", "user", "password"}},
        dbname=params.get("dbname") or connection.settings_dict["NAME"],
    )


@pytest.fixture
def idle_and_observer():
    idle = psycopg.connect(_dsn(), autocommit=True)
    observer = psycopg.connect(_dsn(), autocommit=True)
    yield idle, observer
    idle.close()
    observer.close()


def _last_query(observer, pid: int) -> str:
    return observer.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[
        0
    ]


def test_a_healthy_idle_connection_passes_without_a_round_trip(idle_and_observer):
    idle, observer = idle_and_observer
    idle.execute("SELECT 'the last thing this session ran'")
    check_idle_connection(idle)
    check_idle_connection(idle)
    assert (
        _last_query(observer, idle.info.backend_pid) == "SELECT 'the last thing this session ran'"
    )


def test_a_connection_the_server_ended_is_refused(idle_and_observer):
    idle, observer = idle_and_observer
    pid = idle.info.backend_pid
    assert observer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0] is True
    deadline = time.monotonic() + 5
    while observer.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
        assert time.monotonic() < deadline, "the backend did not end"
        time.sleep(0.01)
    with pytest.raises(psycopg.OperationalError):
        check_idle_connection(idle)


def test_a_closed_connection_is_refused(idle_and_observer):
    idle, _ = idle_and_observer
    idle.close()
    with pytest.raises(psycopg.OperationalError):
        check_idle_connection(idle)


@pytest.mark.django_db
def test_the_pool_hands_out_connections_through_this_check():
    if connection.pool is None:
        pytest.fail("the suite runs on a pooled PostgreSQL connection (DATABASE_POOL_MAX_SIZE)")
    assert connection.pool._check is check_idle_connection
