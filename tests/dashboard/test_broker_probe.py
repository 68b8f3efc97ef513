"""The overview's broker probe is a real round trip over a pooled connection, not a
new connection and handshake per page (6 ms of the overview at scale, bench/scale.py)."""

from __future__ import annotations

import socket

from dashboard.site import status
from tasks.celery import app


def test_the_broker_probe_reuses_one_connection_and_still_sees_an_outage(settings):
    url = app.conf.broker_write_url or app.conf.broker_url
    assert url.startswith("redis://")
    for _ in range(20):
        assert status.broker_status().ok
    pool = status._redis_client(url).connection_pool
    assert pool._created_connections == 1
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    saved = app.conf.broker_write_url
    app.conf.broker_write_url = dead
    try:
        down = status.broker_status()
    finally:
        app.conf.broker_write_url = saved
    assert not down.ok and "unreachable" in down.detail
