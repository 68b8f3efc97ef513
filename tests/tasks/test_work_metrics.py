"""What the work counts reaches GET /metrics in one process: provider
attempts by outcome and the stages' clocks as histograms
(tests/tasks/test_work_metrics_processes.py: added up over processes)."""

from __future__ import annotations

import pytest

from tests.dashboard import test_metrics as metrics_endpoint
from tests.dashboard.test_metrics import scrape

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42."}}}
scraping = metrics_endpoint.scrape_settings  # its fixture: the scrape's token


def value(samples, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_one_process_counts_attempts_and_the_stage_clocks(
    client, api, worker, manual_clock, scripted_provider, scraping
):
    scripted_provider("p", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["p"]}, expect=201).json()
    before = scrape(client)
    api.run_and_wait(thread["id"], "Hello")
    after = scrape(client)
    attempts = ("governance_provider_attempts_total", {"provider": "p", "outcome": "accepted"})
    assert value(after, attempts[0], **attempts[1]) == value(before, attempts[0], **attempts[1]) + 1
    queue = {"stage_kind": "model_turn", "clock": "queue", "timeout": "none"}
    assert value(after, "governance_stage_clock_seconds_count", **queue) > value(
        before, "governance_stage_clock_seconds_count", **queue
    )
