"""What the work counts reaches GET /metrics in one process: provider
attempts by outcome and the stages' clocks as histograms
(tests/tasks/test_work_metrics_processes.py: added up over processes)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from governance.rules.outbound import parse_allow_list

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42."}}}
TOKEN = "work-metrics-token-" + "w" * 20


@pytest.fixture
def scraping(settings):
    settings.GOVERNANCE_METRICS_TOKEN = TOKEN
    settings.GOVERNANCE_METRICS_ALLOW = parse_allow_list([])
    return settings


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


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
