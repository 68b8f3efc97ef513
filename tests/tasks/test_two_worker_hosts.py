"""R6.6 across hosts: two worker processes with different host names, one broker, one
database — each stage executed exactly once, the work shared, and the host
named in the claim."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from governance import services, time_source
from governance.models import Provider, Run, Stage, Thread
from governance.services.broker import publish
from tests.tasks.conftest import every_queue_key

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
RUNS = 24


def _database_url() -> str:
    params = connection.settings_dict
    auth = params["USER"] + (f":{params['PASSWORD']}" if params["PASSWORD"] else "")
    return f"postgres://{auth}@{params['HOST']}:{params['PORT'] or 5432}/{params['NAME']}"


@pytest.fixture
def two_hosts(tmp_path, settings):
    import redis

    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    broker.delete(*every_queue_key(settings))
    workers = []
    for host in ("host-a", "host-b"):
        env = {
            **os.environ,
            "DATABASE_URL": _database_url(),
            "REDIS_URL": os.environ.get("REDIS_URL", ""),
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "GOVERNANCE_HOST_NAME": host,
            "GOVERNANCE_VAR_DIR": str(tmp_path / host),
            "LOG_LEVEL": "WARNING",
        }
        log = (tmp_path / f"{host}.log").open("w")
        workers.append(
            (
                subprocess.Popen(
                    [
                        sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork",
                        "-c", "2", "-l", "INFO", "--hostname", f"worker@{host}",
                        "--without-mingle", "--without-gossip",
                    ],
                    cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                ),
                tmp_path / f"{host}.log",
            )
        )  # fmt: skip
    deadline = time.monotonic() + 60
    while not all(" ready." in path.read_text(errors="replace") for _, path in workers):
        assert time.monotonic() < deadline, "\n".join(p.read_text() for _, p in workers)
        assert all(proc.poll() is None for proc, _ in workers)
        time.sleep(0.1)
    yield workers
    for proc, _ in workers:
        proc.terminate()
    for proc, _ in workers:
        proc.wait(30)
    broker.delete(*every_queue_key(settings))


def test_r6_6_two_hosts_share_the_work_and_run_each_stage_once(two_hosts):
    Provider.objects.create(
        provider_id="p", kind="scripted", model="m",
        script={"default": {"answer": {"text": "done", "chunks": 1}}},
    )  # fmt: skip
    now = time_source.now()
    for index in range(RUNS):
        thread = services.create_thread(provider_chain=["p"], now=now)
        _run, stage, _ = services.submit_run(
            Thread.objects.get(id=thread.id), input=f"run {index}", now=now,
            idempotency_key=f"two-hosts-{index}",
        )  # fmt: skip
        publish([stage])
    deadline = time.monotonic() + 90
    while Run.objects.exclude(status=Run.Status.SETTLED).exists():
        assert time.monotonic() < deadline, [p.read_text()[-3000:] for _, p in two_hosts]
        time.sleep(0.1)

    stages = list(Stage.objects.all())
    assert len(stages) == RUNS
    assert {s.deliveries for s in stages} == {1}  # each executed exactly once
    assert {s.outcome for s in stages} == {"accepted"}
    hosts = [s.holder.split("/")[0] for s in stages]
    assert set(hosts) == {"host-a", "host-b"}, hosts  # shared, and told apart
    assert min(hosts.count("host-a"), hosts.count("host-b")) >= 2
    assert settings.GOVERNANCE_HOST_NAME not in hosts  # not this test process's name
