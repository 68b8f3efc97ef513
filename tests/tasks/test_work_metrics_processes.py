"""One scrape adds up what every process counted: a real prefork worker
writes its counts to ``PROMETHEUS_MULTIPROC_DIR`` (as ``manage.py up`` gives
every child), and GET /metrics, served by another process, reads them.

Its own module: the in-process worker of other modules would take stages
from the prefork worker and count them in this process instead."""

from __future__ import annotations

import time

import pytest

from governance.models import Run
from tests.tasks import test_approval_worker_kill as worker_kill
from tests.tasks import test_work_metrics as one_process
from tests.tasks.test_work_metrics import ANSWER, scrape, value

pytestmark = pytest.mark.django_db(transaction=True)
start_worker = worker_kill.start_worker  # its fixture: real prefork workers
scraping = one_process.scraping  # its fixture: the scrape's token


def test_one_scrape_adds_up_the_counts_of_every_process(
    client,
    api,
    scripted_provider,
    scraping,
    start_worker,
    tmp_path,
):
    counts = tmp_path / "metrics"
    counts.mkdir()
    scraping.GOVERNANCE_METRICS_DIR = str(counts)
    scripted_provider("p", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["p"]}, expect=201).json()
    _worker, tail = start_worker("metrics-worker", PROMETHEUS_MULTIPROC_DIR=str(counts))
    for text in ("one", "two"):
        api.post(f"/api/v1/threads/{thread['id']}/runs", {"input": text}, expect=202)
    deadline = time.monotonic() + 60
    while Run.objects.exclude(status=Run.Status.SETTLED).exists():
        assert time.monotonic() < deadline, tail()
        time.sleep(0.1)
    # A stage's counts are written just after its close commits: look until they are.
    attempts = {"provider": "p", "outcome": "accepted"}
    samples = scrape(client)
    while value(samples, "governance_provider_attempts_total", **attempts) < 2:
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)
        samples = scrape(client)
    # The worker's pool process counted them; this process only read its files.
    assert value(samples, "governance_provider_attempts_total", provider="p",
                 outcome="accepted") == 2  # fmt: skip
    assert value(samples, "governance_stage_clock_seconds_count", stage_kind="model_turn",
                 clock="execution", timeout="none") == 2  # fmt: skip
    assert any(path.name.startswith("counter_") for path in counts.iterdir())
