"""What a single-turn run costs the database, counted (bench/throughput.py
times it; this keeps the count from creeping back up)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import pytest
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace

from governance import time_source
from governance.models import Provider, Run, Stage
from governance.services import runs, threads
from governance.services import stages as stage_service
from tasks.stages import run_stage

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42.", "chunks": 1}}}


def _statements(captured) -> list[str]:
    return [q["sql"].split()[0].upper() for q in captured]


@contextmanager
def querysets_built() -> Iterator[list[str]]:
    """The models whose querysets had their SQL built (reads: an insert or an
    update has a compiler of its own). A hot request reads by fixed SQL texts."""
    built: list[str] = []
    build = SQLCompiler.as_sql

    def counting(self, *args, **kwargs):
        built.append(self.query.model.__name__)
        return build(self, *args, **kwargs)

    with mock.patch.object(SQLCompiler, "as_sql", counting):
        yield built


def test_a_single_turn_run_costs_two_worker_transactions_and_one_web_transaction(
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
    # The claim admits the first request's draw: no transaction of its own.
    assert web.count("COMMIT") == 1 and worker.count("COMMIT") == 2, (web, worker)
    # The run, its budget account and its first stage in one statement, after
    # one read of the segment.
    if connection.vendor == "postgresql":
        assert web == ["BEGIN", "SELECT", "WITH", "COMMIT"], submitted.captured_queries
    assert len(web) <= 6, submitted.captured_queries
    # Claim with the turn's facts (10), the ledger's admission (4: the account
    # locked and its entries read in one statement), the close (14, its NOTIFY
    # of the settlement sent with its writes).
    print("WORKER", len(worker), worker)
    assert len(worker) <= 28, "\n".join(q["sql"][:120] for q in executed.captured_queries)
    notified = sum("pg_notify" in q["sql"] for q in executed.captured_queries)
    assert notified == (1 if connection.vendor == "postgresql" else 0)


def test_a_submit_over_the_api_is_one_transaction_and_a_savepoint_only_for_a_key(
    api, scripted_provider, monkeypatch
):
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    scripted_provider("counted", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["counted"]}, expect=201).json()
    path = f"/api/v1/threads/{thread['id']}/runs"
    api.post(path, {"input": "warm up"}, expect=202)  # the token's last use, once a minute
    with CaptureQueriesContext(connection) as plain, querysets_built() as built:
        api.post(path, {"input": "no key"}, expect=202)
    with CaptureQueriesContext(connection) as keyed:
        api.post(path, {"input": "a key", "idempotency_key": "counted-api"}, expect=202)
    with CaptureQueriesContext(connection) as repeated:
        api.post(path, {"input": "a key", "idempotency_key": "counted-api"}, expect=200)
    plain, keyed = _statements(plain), _statements(keyed)
    # The token with its user, the user's permissions, the thread with its open
    # segment (fixed SQL texts, no queryset built), three rows (one statement
    # on PostgreSQL).
    rows = 1 if connection.vendor == "postgresql" else 3
    assert plain.count("COMMIT") == 1 and "SAVEPOINT" not in plain, plain
    assert len(plain) <= 5 + rows, plain
    assert built == []
    assert keyed.count("SAVEPOINT") == 1 and len(keyed) <= 7 + rows, keyed
    assert "ROLLBACK" in _statements(repeated)  # the repeat's insert rolled back to the savepoint


def test_a_poll_of_a_runs_detail_is_seven_plain_statements(api, scripted_provider, monkeypatch):
    """GET /api/v1/runs/{id}, which a client polls to see its run settle: the
    token with its user; the run with its segment and settlement; its stages,
    attempts, receipts, chunks, and its budget account with its entries. No
    queryset's SQL is built (services.run_budget_view reads the ledger as
    the admission does)."""
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    scripted_provider("counted", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["counted"]}, expect=201).json()
    path = f"/api/v1/threads/{thread['id']}/runs"
    run_id = api.post(path, {"input": "What is six times seven?"}, expect=202).json()["run_id"]
    assert run_stage(Stage.objects.get(run_id=run_id).id) == "accepted"
    with CaptureQueriesContext(connection) as polled, querysets_built() as built:
        body = api.get(f"/api/v1/runs/{run_id}").json()
    assert body["settlement"] and body["attempts"] and body["chunks"] and body["budget"]
    assert len(polled) <= 7, "\n".join(q["sql"][:120] for q in polled.captured_queries)
    assert built == []
    # Once dashboard.site.asgi is imported, this process's span store writes the stage's
    # spans from its own thread: written now, they leave with this test's rows.
    getattr(trace.get_tracer_provider(), "force_flush", lambda: True)()


# What psycopg waits on the server for: a statement outside a pipeline, a
# pipeline's flush or sync, a commit. Queuing a statement in a pipeline is not one.
ROUND_TRIP_GENERATORS = {"_fetch_gen", "_sync_gen", "_exit_gen", "_commit_gen", "_rollback_gen"}


@contextmanager
def round_trips(monkeypatch, module, name: str) -> Iterator[list[list[str]]]:
    """Per call of ``module.name`` inside the block: what psycopg waited on the
    server for (psycopg's private generators, by name). A transaction's BEGIN
    is one, in a pipeline too (psycopg syncs it before the first statement)."""
    import psycopg
    from psycopg import pq
    from psycopg._connection_base import BaseConnection

    calls: list[list[str]] = []
    inside = False
    real_wait, real_start = psycopg.Connection.wait, BaseConnection._start_query
    real_call = getattr(module, name)

    def wait(self, gen, *args, **kwargs):
        called = getattr(gen, "__name__", "")
        if inside and (
            called in ROUND_TRIP_GENERATORS or (called == "_execute_gen" and self._pipeline is None)
        ):
            calls[-1].append(called)
        return real_wait(self, gen, *args, **kwargs)

    def start_query(self):
        if (
            inside
            and not self._autocommit
            and self.pgconn.transaction_status == pq.TransactionStatus.IDLE
        ):
            calls[-1].append("BEGIN")
        return (yield from real_start(self))

    def counted(*args, **kwargs):
        nonlocal inside
        calls.append([])
        inside = True
        try:
            return real_call(*args, **kwargs)
        finally:
            inside = False

    monkeypatch.setattr(psycopg.Connection, "wait", wait)
    monkeypatch.setattr(BaseConnection, "_start_query", start_query)
    monkeypatch.setattr(module, name, counted)
    yield calls


def test_a_single_turn_claim_and_close_are_five_round_trips_each(monkeypatch):
    """The claim: BEGIN, the locking read, its writes with the gate's question,
    the turn's reads and the ledger's lock, the first request's draw, COMMIT
    (the draw's own transaction would be four more). The close: BEGIN, the
    locking read with the reads made under its lock, the attempt, the writes
    with the settlement, COMMIT."""
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    Provider.objects.create(provider_id="counted", kind="scripted", model="m", script=ANSWER)
    with (
        round_trips(monkeypatch, stage_service, "start_stage") as claims,
        round_trips(monkeypatch, stage_service, "close_stage") as closes,
    ):
        for attempt in range(2):  # the second run finds the provider's health row
            thread = threads.create_thread(provider_chain=["counted"], now=time_source.now())
            run, stage, _ = runs.submit_run(
                thread, input="What is six times seven?", now=time_source.now(),
                idempotency_key=f"trips-{attempt}",
            )  # fmt: skip
            assert run_stage(stage.id) == "accepted"
    assert len(claims) == len(closes) == 2
    assert Run.objects.get(id=run.id).status == Run.Status.SETTLED
    if connection.vendor == "postgresql":  # SQLite has no round trips to count
        assert claims[-1] == ["BEGIN", "_fetch_gen", "_exit_gen", "_execute_gen", "_commit_gen"], (
            claims
        )
        assert len(closes[-1]) == 5 and closes[-1][0] == "BEGIN", closes
