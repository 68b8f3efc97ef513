"""The Celery app against the real Redis broker, with a real worker."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from celery.contrib.testing.worker import start_worker
from django.core.cache import cache

from tasks import celery_app
from tasks.jobs import ping, read_heartbeat, scheduler_heartbeat
from tests.conftest import requires_services


@pytest.fixture(scope="module")
def redis_worker():
    assert requires_services(), "run the suite with `make test` (real PostgreSQL and Redis)"
    with start_worker(
        celery_app,
        pool="threads",
        concurrency=1,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ) as worker:
        yield worker


def test_broker_is_redis_with_late_acks():
    assert celery_app.conf.broker_url.startswith("redis://")
    assert celery_app.conf.task_acks_late is True
    assert celery_app.conf.task_reject_on_worker_lost is True
    assert celery_app.conf.worker_prefetch_multiplier == 1


def test_task_round_trip_through_redis_and_a_worker(redis_worker):
    result = ping.delay("are you there")
    assert result.get(timeout=30) == {"pong": "are you there"}


def test_scheduled_heartbeat_runs_on_the_worker_and_is_readable(redis_worker):
    cache.delete_many(["heartbeat:worker", "heartbeat:scheduler"])
    assert read_heartbeat("scheduler") is None
    scheduler_heartbeat.apply_async()  # fire and forget, as beat sends it
    deadline = time.monotonic() + 30
    while read_heartbeat("scheduler") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    beat = read_heartbeat("scheduler")
    assert beat is not None, "the worker never ran the heartbeat"
    assert datetime.fromisoformat(beat["at"]) <= datetime.now(UTC)
    assert beat["hostname"]
    assert read_heartbeat("worker") is not None
