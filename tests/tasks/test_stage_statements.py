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
    # Claim with the turn's facts (10), the ledger's admission (4: the account
    # locked and its entries read in one statement), the close (13).
    assert len(worker) <= 27, "\n".join(q["sql"][:120] for q in executed.captured_queries)


def test_a_submit_over_the_api_is_one_transaction_and_a_savepoint_only_for_a_key(
    api, scripted_provider, monkeypatch
):
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    scripted_provider("counted", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["counted"]}, expect=201).json()
    path = f"/api/v1/threads/{thread['id']}/runs"
    api.post(path, {"input": "warm up"}, expect=202)  # the token's last use, once a minute
    with CaptureQueriesContext(connection) as plain:
        api.post(path, {"input": "no key"}, expect=202)
    with CaptureQueriesContext(connection) as keyed:
        api.post(path, {"input": "a key", "idempotency_key": "counted-api"}, expect=202)
    with CaptureQueriesContext(connection) as repeated:
        api.post(path, {"input": "a key", "idempotency_key": "counted-api"}, expect=200)
    plain, keyed = _statements(plain), _statements(keyed)
    # The token, the user's permissions, the thread, the segment, three rows.
    assert plain.count("COMMIT") == 1 and "SAVEPOINT" not in plain and len(plain) <= 9, plain
    assert keyed.count("SAVEPOINT") == 1 and len(keyed) <= 11, keyed
    assert "ROLLBACK" in _statements(repeated)  # the repeat's insert rolled back to the savepoint
