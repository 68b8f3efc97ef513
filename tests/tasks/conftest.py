"""Fixtures for the engine: a manual clock, a real Celery worker on Redis, the API."""

from __future__ import annotations

import ast
import json
import time
from datetime import UTC, datetime

import pytest
from celery.contrib.testing.worker import start_worker
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from governance import time_source
from governance.models import ApiToken, Provider, Run
from governance.services.broker import BROKER_EPOCH_KEY, lane_keys
from governance.services.tokens import token_digest
from tasks import celery_app, instrumentation
from tests.conftest import requires_services
from tests.tasks.openai_door import (  # noqa: F401 (the door's fixtures, for its test modules)
    asgi_server,
    door,
    lenient_server,
    provider_server,
)


@pytest.fixture
def span_exporter():
    """Every span the code emits in the test, kept in memory (its own provider)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentation.use_tracer_provider(provider)
    yield exporter
    instrumentation.use_tracer_provider(None)
    provider.shutdown()


@pytest.fixture
def manual_clock():
    start = datetime.now(UTC).replace(microsecond=0)
    the_clock = time_source.ManualClock(start)
    time_source.install(the_clock)
    yield the_clock
    time_source.install(None)


@pytest.fixture(scope="module")
def worker():
    """A real worker consuming the real Redis broker, in this process (threads),
    so it shares the installed manual clock."""
    assert requires_services(), "run the suite with `make test` (real PostgreSQL and Redis)"
    celery_app.conf.broker_connection_retry_on_startup = True
    with start_worker(
        celery_app,
        pool="threads",
        concurrency=2,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ) as running:
        yield running


class Api:
    def __init__(self, client, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}

    def post(self, path: str, body: dict | None = None, expect: int | None = None):
        response = self.client.post(
            path, data=json.dumps(body or {}), content_type="application/json",
            headers=self.headers,
        )  # fmt: skip
        if expect is not None:
            assert response.status_code == expect, response.content.decode()[:2000]
        return response

    def get(self, path: str, expect: int | None = 200):
        response = self.client.get(path, headers=self.headers)
        if expect is not None:
            assert response.status_code == expect, response.content.decode()[:2000]
        return response

    def run_and_wait(self, thread_id: str, text: str, timeout: float = 60.0, **extra) -> dict:
        accepted = self.post(
            f"/api/v1/threads/{thread_id}/runs", {"input": text, **extra}, expect=202
        ).json()
        return self.wait(accepted["run_id"], timeout)

    def wait(self, run_id: str, timeout: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if Run.objects.filter(id=run_id, status=Run.Status.SETTLED).exists():
                return self.get(f"/api/v1/runs/{run_id}").json()
            time.sleep(0.05)
        body = self.get(f"/api/v1/runs/{run_id}").json()
        raise AssertionError(f"run {run_id} did not settle: {json.dumps(body, indent=1)[:4000]}")


@pytest.fixture
def api(client, django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("engine", password="unused-password-1")
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=["apply_boundary", "submit_run", "cancel_run", "see_all_runs"]
        )
    )
    token = "test-token-" + "x" * 20
    ApiToken.objects.create(user=user, name="tests", key_digest=token_digest(token))
    return Api(client, token)


@pytest.fixture
def scripted_provider():
    def make(provider_id: str, script: dict, model: str | None = None) -> Provider:
        return Provider.objects.create(
            provider_id=provider_id, kind="scripted", model=model or f"{provider_id}-model",
            script=script,
        )  # fmt: skip

    return make


def sent_stages(redis_client, lane: int | None = None) -> list[int]:
    """The stage ids waiting in the real broker's turns queue, in the order
    they will be taken (both lanes, or only lane ``lane``: 0 ahead, 1 new work)."""
    keys = lane_keys("turns")
    ids = []
    for key in keys if lane is None else [keys[lane]]:
        for raw in reversed(redis_client.lrange(key, 0, -1)):  # taken from the right
            headers = json.loads(raw)["headers"]
            if headers["task"] == "tasks.stages.execute_stage":
                ids.extend(ast.literal_eval(headers["argsrepr"]))
    return ids


def every_queue_key(settings) -> list[str]:
    """Every Redis list of every queue (each queue has a lane for work sent again)."""
    return [key for name in settings.GOVERNANCE_QUEUES for key in lane_keys(name)]


@pytest.fixture
def broker_queue(settings):
    """The real broker's Redis, its queues empty, and known not to have lost
    anything (a test that flushes it deletes ``BROKER_EPOCH_KEY`` too)."""
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(*every_queue_key(settings))
    client.set(BROKER_EPOCH_KEY, "tests")
    yield client
    client.delete(*every_queue_key(settings))
