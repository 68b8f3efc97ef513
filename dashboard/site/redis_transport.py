"""Kombu's Redis transport, with one guard for a broker outage.

When Redis goes away under a worker, Celery closes the consumer's connection
and the channel's close restores the messages the worker had taken but not
acknowledged. If the connection was already torn down, kombu's channel finds
its connection's client gone and raises ``AttributeError`` while building a
new Redis pool — not a connection error — so Celery's handler, which ignores
connection errors on this path, lets it kill the worker (seen once in
tests/faults/test_redis_outage.py). Here that state is a connection error:
the close is ignored as Celery intends, the worker reconnects, and asks for
the stages of messages the broker no longer holds to be sent again (R6.6:
the broker is a prompt, the database the record; tasks/celery.py).

It overrides a private method of kombu's channel (``_connparams``, kombu 5.x;
pyproject.toml keeps kombu below 6). It can go when kombu raises a connection
error there itself: tests/tasks/test_redis_transport.py fails on that day.
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False):
        if self.connection.client is None:
            raise kombu_redis.redis.exceptions.ConnectionError(
                "the broker connection is already closed"
            )
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
