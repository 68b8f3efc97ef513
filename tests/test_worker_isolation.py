"""Each test process of `make test` has its own Redis database (tests/worker_isolation.py)."""

from __future__ import annotations

import os

from tests.worker_isolation import worker_redis_url


def test_each_worker_gets_the_database_below_the_last():
    base = "redis://127.0.0.1:6379/15"
    assert worker_redis_url(base, "gw0") == base
    assert worker_redis_url(base, "gw1") == "redis://127.0.0.1:6379/14"
    assert worker_redis_url("redis://:pw@h:6380/1", "gw3") == "redis://:pw@h:6380/14"
    assert worker_redis_url("redis://h", "gw1") == "redis://h/15"


def test_this_process_uses_its_own_database():
    from django.conf import settings

    from tests.worker_isolation import GIVEN_REDIS_URL, WORKER

    if not GIVEN_REDIS_URL:  # the embedded defaults: no Redis at all
        assert not settings.REDIS_URL
        return
    expected = worker_redis_url(GIVEN_REDIS_URL, WORKER) if WORKER else GIVEN_REDIS_URL
    assert expected == settings.REDIS_URL == os.environ["REDIS_URL"]
