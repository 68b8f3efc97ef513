"""What a single-turn run costs the database, bounded: one transaction for a
stage's claim and one for its close, one for a submit (R6.6), and no more
statements than today.

Counted through Django's own hooks, whatever builds the statements (the ORM,
``governance/services/statements.py`` or a later refactor): statements by
``connection.execute_wrapper`` (every statement a cursor sends; with a
wrapper installed the stage path sends them through Django's cursor),
commits and savepoints by the connection's own ``commit`` / ``savepoint`` /
``savepoint_rollback``, which ``transaction.atomic`` calls. The figures are
upper bounds taken from what a run costs today: fewer is always fine. The
exact figures, and the time each costs, are bench/throughput.py's to report.

What statements a path sends is not checked either (no SQL text, no
queryset compiler): how a statement is built is the code's own business;
its count is bounded.

Round trips are not counted here: inside psycopg's pipeline mode
(``statements.together``) several statements share one round trip, which no
Django hook can see. bench/throughput.py measures what the stages cost with
them (their times, and the commits per run from PostgreSQL's own counters).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from django.db import DEFAULT_DB_ALIAS, connections
from opentelemetry import trace

from governance import time_source
from governance.models import Provider, Run, Stage
from governance.services import runs, threads
from governance.services import stages as stage_service
from tasks.stages import run_stage

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42.", "chunks": 1}}}

# Today's figures, as upper bounds.
ROWS = 3  # the run, its ledger, its first stage: one insert each
WORKER_COMMITS = 2  # the claim (with the first request's draw) and the close
WORKER_STATEMENTS = 24  # the claim with the turn's facts, the draw, the close
SUBMIT_STATEMENTS = 1 + ROWS  # the segment read, then the run, its account, its stage
API_SUBMIT_STATEMENTS = 3 + ROWS  # the token, the permissions, the thread, the rows
API_KEYED_EXTRA = 2  # a key's savepoint and its release
POLL_STATEMENTS = 7  # the token, the run, its stages, attempts, receipts, chunks, ledger


@dataclass
class Counted:
    """What the default connection did inside :func:`counted`."""

    statements: list[str] = field(default_factory=list)  # each one's text, for the messages
    commits: int = 0
    savepoints: int = 0
    rollbacks_to_savepoint: int = 0

    def shown(self) -> str:
        return "\n".join(text[:120] for text in self.statements)


@contextmanager
def counted() -> Iterator[Counted]:
    """Count this thread's statements and transactions by Django's hooks."""
    db = connections[DEFAULT_DB_ALIAS]
    seen = Counted()

    def statement(execute, sql, params, many, context):
        seen.statements.append(sql)
        return execute(sql, params, many, context)

    def counting(name: str, attribute: str):
        real = getattr(db, name)

        def call(*args, **kwargs):
            setattr(seen, attribute, getattr(seen, attribute) + 1)
            return real(*args, **kwargs)

        return call

    counters = {
        "commit": "commits",
        "savepoint": "savepoints",
        "savepoint_rollback": "rollbacks_to_savepoint",
    }
    before = {name: db.__dict__.get(name) for name in counters}
    for name, attribute in counters.items():
        setattr(db, name, counting(name, attribute))  # on the instance: the class's is untouched
    try:
        with db.execute_wrapper(statement):
            yield seen
    finally:
        for name, previous in before.items():
            if previous is None:
                delattr(db, name)
            else:
                setattr(db, name, previous)


def test_a_single_turn_run_costs_two_worker_transactions_and_one_web_transaction(
    monkeypatch,
):
    """R6.6: the claim admits the first request's draw in its own transaction
    (no transaction of its own), the close writes everything in one; the
    submit writes the run, its budget account and its first stage in one."""
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    Provider.objects.create(provider_id="counted", kind="scripted", model="m", script=ANSWER)
    for attempt in range(2):  # the second run finds the provider's health row
        thread = threads.create_thread(provider_chain=["counted"], now=time_source.now())
        with counted() as submitted:
            run, stage, _ = runs.submit_run(
                thread, input="What is six times seven?", now=time_source.now(),
                idempotency_key=f"counted-{attempt}",
            )  # fmt: skip
        with counted() as executed:
            assert run_stage(stage.id) == "accepted"
    assert Run.objects.get(id=run.id).status == Run.Status.SETTLED
    assert Stage.objects.get(id=stage.id).outcome == "accepted"

    assert submitted.commits <= 1, submitted.shown()
    assert len(submitted.statements) <= SUBMIT_STATEMENTS, submitted.shown()
    assert 1 <= executed.commits <= WORKER_COMMITS, executed.shown()
    assert len(executed.statements) <= WORKER_STATEMENTS, executed.shown()


def test_a_submit_over_the_api_is_one_transaction_and_a_savepoint_only_for_a_key(
    api, scripted_provider, monkeypatch
):
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    scripted_provider("counted", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["counted"]}, expect=201).json()
    path = f"/api/v1/threads/{thread['id']}/runs"
    api.post(path, {"input": "warm up"}, expect=202)  # the token's last use, once a minute
    with counted() as plain:
        api.post(path, {"input": "no key"}, expect=202)
    with counted() as keyed:
        api.post(path, {"input": "a key", "idempotency_key": "counted-api"}, expect=202)
    with counted() as repeated:
        api.post(path, {"input": "a key", "idempotency_key": "counted-api"}, expect=200)
    assert plain.commits <= 1 and plain.savepoints == 0, plain.shown()
    assert len(plain.statements) <= API_SUBMIT_STATEMENTS, plain.shown()
    assert keyed.commits <= 1 and keyed.savepoints == 1, keyed.shown()
    assert len(keyed.statements) <= API_SUBMIT_STATEMENTS + API_KEYED_EXTRA, keyed.shown()
    # The repeat's insert collided with the stored key: rolled back to the savepoint.
    assert repeated.rollbacks_to_savepoint == 1, repeated.shown()


def test_a_poll_of_a_runs_detail_is_seven_statements_at_most(api, scripted_provider, monkeypatch):
    """GET /api/v1/runs/{id}, which a client polls to see its run settle: the
    token with its user; the run with its segment and settlement; its stages,
    attempts, receipts, chunks, and its budget account with its entries."""
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    scripted_provider("counted", ANSWER)
    thread = api.post("/api/v1/threads", {"provider_chain": ["counted"]}, expect=201).json()
    path = f"/api/v1/threads/{thread['id']}/runs"
    run_id = api.post(path, {"input": "What is six times seven?"}, expect=202).json()["run_id"]
    assert run_stage(Stage.objects.get(run_id=run_id).id) == "accepted"
    with counted() as polled:
        body = api.get(f"/api/v1/runs/{run_id}").json()
    assert body["settlement"] and body["attempts"] and body["chunks"] and body["budget"]
    assert len(polled.statements) <= POLL_STATEMENTS, polled.shown()
    assert polled.commits == 0, polled.shown()  # a read writes nothing
    # Once dashboard.site.asgi is imported, this process's span store writes the stage's
    # spans from its own thread: written now, they leave with this test's rows.
    getattr(trace.get_tracer_provider(), "force_flush", lambda: True)()


def test_a_single_turn_claim_and_close_are_one_transaction_each(monkeypatch):
    """R6.6: the claim (with the turn's reads and the first request's draw) is
    one transaction and the close (with the settlement) another: each commits
    once. How many round trips each takes is the benchmark's to measure."""
    monkeypatch.setattr(stage_service, "publish", lambda ids, countdowns=None: None)
    Provider.objects.create(provider_id="counted", kind="scripted", model="m", script=ANSWER)
    claims: list[Counted] = []
    closes: list[Counted] = []

    def around(calls: list[Counted], real):
        def call(*args, **kwargs):
            with counted() as seen:
                result = real(*args, **kwargs)
            calls.append(seen)
            return result

        return call

    monkeypatch.setattr(stage_service, "start_stage", around(claims, stage_service.start_stage))
    monkeypatch.setattr(stage_service, "close_stage", around(closes, stage_service.close_stage))
    for attempt in range(2):  # the second run finds the provider's health row
        thread = threads.create_thread(provider_chain=["counted"], now=time_source.now())
        run, stage, _ = runs.submit_run(
            thread, input="What is six times seven?", now=time_source.now(),
            idempotency_key=f"trips-{attempt}",
        )  # fmt: skip
        assert run_stage(stage.id) == "accepted"
    assert len(claims) == len(closes) == 2
    assert Run.objects.get(id=run.id).status == Run.Status.SETTLED
    assert claims[-1].commits == 1, claims[-1].shown()
    assert closes[-1].commits == 1, closes[-1].shown()
