"""What a single-turn run costs the database, counted (bench/throughput.py
times it; this keeps the count from creeping back up)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from governance import time_source
from governance.models import Provider, Run, Stage
from governance.services import runs, threads
from governance.services import stages as stage_service
from tasks.stages import run_stage

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42.", "chunks": 1}}}


def _statements(captured) -> list[str]:
    return [q["sql"].split()[0].upper() for q in captured]


def test_a_single_turn_run_costs_three_worker_transactions_and_one_web_transaction(
    monkeypatch,
):
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    Provider.objects.create(provider_id="counted", kind="scripted", model="m", script=ANSWER)
    for attempt in range(2):  # the second run finds the provider's health row
        thread = threads.create_thread(provider_chain=["counted"], now=time_source.now())
        with CaptureQueriesContext(connection) as submitted:
            run, stage, _ = runs.submit_run(
                thread, input="What is six times seven?", now=time_source.now(),
                idempotency_key=f"counted-{attempt}",
            )  # fmt: skip
        with CaptureQueriesContext(connection) as executed:
            assert run_stage(stage.id) == "accepted"
    assert Run.objects.get(id=run.id).status == Run.Status.SETTLED
    assert Stage.objects.get(id=stage.id).outcome == "accepted"

    web, worker = _statements(submitted), _statements(executed)
    assert web.count("COMMIT") == 1 and worker.count("COMMIT") == 3, (web, worker)
    # The run, its budget account and its first stage, after one read of the segment.
    assert len(web) <= 6, submitted.captured_queries
    # Claim with the turn's facts (10), the ledger's admission (5), the close (13).
    assert len(worker) <= 28, "\n".join(q["sql"][:120] for q in executed.captured_queries)
