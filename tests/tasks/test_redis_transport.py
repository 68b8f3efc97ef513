"""dashboard.redis_transport: a torn-down connection is a connection error (R6.5)."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection
from kombu.common import ignore_errors

from dashboard.redis_transport import Channel


def test_r6_5_the_app_uses_the_guarded_transport(settings):
    from tasks.celery import app

    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, Channel)


def test_r6_5_a_channel_whose_connection_is_gone_raises_what_celery_ignores(settings):
    conn = Connection(settings.CELERY_BROKER_URL, transport="dashboard.redis_transport:Transport")
    channel = conn.default_channel
    channel.connection.client = None  # what the outage left behind
    channel._pool = None
    with pytest.raises(redis.exceptions.ConnectionError):
        channel._connparams()
    # Celery's handler closes the connection inside ignore_errors: now nothing escapes it.
    reached = []
    with ignore_errors(conn):
        channel.pool  # noqa: B018 (building the pool is what raised)
        reached.append("no error")
    assert reached == []  # the error was raised, and ignored
