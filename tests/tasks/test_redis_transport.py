"""dashboard.site.redis_transport: a torn-down connection is a connection error (R6.5)."""

from __future__ import annotations

import uuid

import pytest
import redis
from kombu import Connection
from kombu.common import ignore_errors

from dashboard.site.redis_transport import Channel


def test_r6_5_the_app_uses_the_guarded_transport(settings):
    from tasks.celery import app

    with app.connection_for_write() as conn:
        assert isinstance(conn.default_channel, Channel)


def test_r6_5_a_channel_whose_connection_is_gone_raises_what_celery_ignores(settings):
    conn = Connection(
        settings.CELERY_BROKER_URL, transport="dashboard.site.redis_transport:Transport"
    )
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


def test_kombus_own_channel_still_needs_the_guard(settings):
    """The day kombu raises a connection error here itself, this fails: then the
    guard (dashboard/site/redis_transport.py) can go."""
    from kombu.transport import redis as kombu_redis

    conn = Connection(settings.CELERY_BROKER_URL, transport=kombu_redis.Transport)
    channel = conn.default_channel
    channel.connection.client = None
    channel._pool = None
    with pytest.raises(AttributeError):
        kombu_redis.Channel._connparams(channel)


def test_r6_6_a_taken_message_leaves_no_copy_in_redis_and_a_lost_worker_gives_it_back(
    settings,
):
    """The broker is a prompt (the sweeps send every row again): a message a
    worker takes is not copied into Redis's unacked set on the way, a round
    trip before each task and one after it; a task whose process died is
    still requeued at once (Celery's reject on worker lost)."""
    from tasks.celery import app

    name = f"test-prompt-{uuid.uuid4().hex}"
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue(name)
        try:
            queue.put({"stage": 1})
            taken = queue.get(timeout=5)
            client = conn.default_channel.client
            assert not client.hexists("unacked", taken.delivery_tag)
            assert client.zscore("unacked_index", taken.delivery_tag) is None
            taken.reject(requeue=True)  # what the worker does when its child died
            again = queue.get(timeout=5)
            assert again.payload == {"stage": 1}
            again.ack()
            with pytest.raises(queue.Empty):
                queue.get(timeout=0.2)
        finally:
            queue.queue.delete()
            queue.close()
