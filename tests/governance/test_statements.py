"""The stage path's hand-written statements read and write what the ORM would
(governance/services/statements.py), on PostgreSQL here and on SQLite (the
embedded default of ``make run``) in a process of its own.

What is checked is what the rows hold and what a reader sees: statement
counts are upper bounds read through Django's hooks (``django_assert_max_num_queries``),
and neither psycopg's internals (its pipeline, its round trips: bench/throughput.py
measures those) nor the text of a statement is looked at."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.forms.models import model_to_dict

from governance import time_source
from governance.models import (
    BodyChunk,
    Provider,
    ProviderHealthState,
    Run,
    RunEvent,
    SpanRecord,
    Stage,
    Thread,
)
from governance.services import runs, threads
from governance.services import statements as sql
from governance.services.health import providers_with_health
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.django_db


def _run() -> tuple[Run, Stage]:
    Provider.objects.get_or_create(
        provider_id="stmt", defaults={"kind": "scripted", "model": "m", "script": {}}
    )
    thread = threads.create_thread(provider_chain=["stmt"], now=time_source.now())
    run, stage, _ = runs.submit_run(
        thread, input="hello", now=time_source.now(), limits={"model_requests": 3}
    )
    return run, stage


def _fields(instance) -> dict:
    return {f.attname: getattr(instance, f.attname) for f in type(instance)._meta.concrete_fields}


def test_columns_load_what_the_orm_loads():
    """R6.3: the close reads the run's decisions and phase as the ORM would."""
    run, _stage = _run()
    shape = sql.columns(Run, "r")
    rows = sql.fetch(f"SELECT {shape.sql} FROM {sql.table(Run)} r WHERE r.id = %s", [run.id])
    loaded = shape.load(rows[0])
    assert _fields(loaded) == _fields(Run.objects.get(id=run.id))
    assert isinstance(loaded.decisions, list) and isinstance(loaded.authorization, dict)
    assert loaded._state.adding is False


def test_columns_load_none_for_an_outer_joins_missing_side():
    """R2.2: a provider with no breaker row yet reads as one without failures."""
    provider = Provider.objects.create(provider_id="lonely", kind="scripted", model="m")
    found = providers_with_health(["lonely"]).value()
    with pytest.raises(ProviderHealthState.DoesNotExist):
        found["lonely"].health  # noqa: B018 - the access is the assertion
    ProviderHealthState.objects.create(provider=provider, consecutive_failures=2)
    found = providers_with_health(["lonely"]).value()
    assert found["lonely"].health.consecutive_failures == 2


def test_insert_writes_the_row_the_orm_writes_and_returns_its_key():
    """R7.2: a committed chunk is stored as the ORM stores it."""
    run, _stage = _run()
    now = time_source.now()
    mine = BodyChunk(run=run, chunk_no=1, version=1, text="é ☃", final=True, generated_at=now)
    theirs = BodyChunk(run=run, chunk_no=2, version=1, text="é ☃", final=True, generated_at=now)
    sql.insert([mine])
    BodyChunk.objects.bulk_create([theirs])
    assert mine.pk is not None and mine._state.adding is False
    stored = {c.chunk_no: model_to_dict(c, exclude=["id", "chunk_no"]) for c in run.chunks.all()}
    assert stored[1] == stored[2]


def test_insert_of_several_rows_keeps_their_order_and_json():
    """R6.3: a close's events keep their order (the facts are read back in it)."""
    run, stage = _run()
    now = time_source.now()
    events = [
        RunEvent(run=run, segment=run.segment, stage=stage, kind="x", at=now, metadata={"n": n})
        for n in range(3)
    ]
    sql.insert(events)
    assert [e.pk for e in events] == sorted(e.pk for e in events)
    stored = RunEvent.objects.filter(pk__in=[e.pk for e in events]).order_by("id")
    assert [e.metadata for e in stored] == [{"n": 0}, {"n": 1}, {"n": 2}]


def _spans(first: int, count: int) -> list[SpanRecord]:
    at = time_source.now()
    return [
        SpanRecord(
            trace_id=f"{i:032x}",
            span_id=f"{i:016x}",
            name="s",
            start=at,
            end=at,
            status="ok",
            attributes={"n": i},
            component="w",
        )
        for i in range(first, first + count)
    ]


def test_insert_ignoring_conflicts_leaves_out_stored_rows_in_one_statement(
    django_assert_max_num_queries,
):
    """R6.1: the span store's insert writes what ``bulk_create(ignore_conflicts=True)``
    wrote: a row colliding with a stored one is left out, the rest written."""
    sql.insert(_spans(0, 3), ignore_conflicts=True)
    with django_assert_max_num_queries(1):
        sql.insert(_spans(1, 5), ignore_conflicts=True)
    # Only this test's rows: a span store writer of another test commits on its own connection.
    ours = [f"{i:016x}" for i in range(6)]
    stored = SpanRecord.objects.filter(span_id__in=ours).order_by("span_id")
    assert [r.attributes["n"] for r in stored] == [0, 1, 2, 3, 4, 5]
    assert stored.filter(span_id=f"{1:016x}").count() == 1


def test_update_matches_on_equality_and_null_and_counts_rows():
    """R6.6: a stage is finished once (``finished_at IS NULL`` guards the write)."""
    _run_row, stage = _run()
    now = time_source.now()
    assert sql.update(Stage, {"id": stage.id, "finished_at": None}, outcome="x", clocks={"a": 1})
    assert not sql.update(Stage, {"id": stage.id, "outcome": "y"}, detail="never")
    assert sql.update(Stage, {"id": stage.id}, finished_at=now) == 1
    assert sql.update(Stage, {"id": stage.id, "finished_at": None}, outcome="z") == 0
    stage.refresh_from_db()
    assert (stage.outcome, stage.clocks, stage.detail) == ("x", {"a": 1}, "")
    assert stage.finished_at == now


def test_reads_sent_together_answer_as_reads_sent_alone(django_assert_max_num_queries):
    """R6.6: the claim's reads, sent together (on PostgreSQL in one round trip,
    which bench/throughput.py measures), answer exactly as when each is sent
    on its own, before the block ends and after it."""
    run, _stage = _run()
    text = f"SELECT r.id, r.status FROM {sql.table(Run)} r WHERE r.id = %s"
    alone, stages = sql.fetch(text, [run.id]), Stage.objects.count()
    with django_assert_max_num_queries(3), sql.together():
        first = sql.Later(text, [run.id], list)
        second = sql.Later(text, [run.id], len)
        count = sql.Later(f"SELECT count(*) FROM {sql.table(Stage)} s", [], lambda r: r[0][0])
        assert (first.value(), second.value(), count.value()) == (alone, 1, stages)
    with sql.together():
        later = sql.Later(text, [run.id], list)
    assert later.value() == alone  # read after the block's end
    assert sql.Later(text, [run.id], list).value() == alone  # outside: sent at once


@pytest.mark.django_db(transaction=True)
def test_lock_clause_locks_the_named_tables_rows_and_only_theirs():
    """R6.6: the claim and the close lock their rows by name: another
    connection cannot take the named rows, and may take a joined row not named.
    SQLite locks the whole file for a write, so there the clause is empty."""
    from django.db import OperationalError, connections, transaction

    if connection.vendor != "postgresql":
        assert sql.lock_clause("s", "t") == ""
        return
    run, stage = _run()
    locking = (
        f"SELECT s.id FROM {sql.table(Stage)} s JOIN {sql.table(Run)} r ON r.id = s.run_id"
        f" JOIN {sql.table(Thread)} t ON t.id = r.thread_id WHERE s.id = %s"
        f"{sql.lock_clause('s', 't')}"
    )
    other = connections.create_connection("default")
    try:
        with transaction.atomic():
            assert sql.fetch(locking, [stage.id]) == [(stage.id,)]
            with other.cursor() as cursor:
                for table, key in ((Stage, stage.id), (Thread, run.thread_id)):
                    with pytest.raises(OperationalError):  # held: NOWAIT refuses at once
                        cursor.execute(
                            f"SELECT 1 FROM {sql.table(table)} WHERE id = %s FOR UPDATE NOWAIT",
                            [key],
                        )
                    other.rollback()
                cursor.execute(
                    f"SELECT 1 FROM {sql.table(Run)} WHERE id = %s FOR UPDATE NOWAIT", [run.id]
                )
                assert cursor.fetchall() == [(1,)]
                other.rollback()
    finally:
        other.close()


def test_a_claim_loads_the_stage_with_its_run_thread_segment_and_session(
    django_assert_num_queries,
):
    """R6.6: the claim reads what the turn needs with the lock, in one statement."""
    run, stage = _run()
    claimed = runs.claim_stage(stage.id, time_source.now(), lease=timedelta(seconds=30))
    with django_assert_num_queries(0):  # everything came with the claim
        assert claimed.run.id == run.id
        assert claimed.run.thread.provider_chain == ["stmt"]
        assert claimed.run.segment.session.id == run.segment.session_id
        assert claimed.run.segment.thread.id == run.thread_id
    assert _fields(claimed.run) == _fields(Run.objects.get(id=run.id))
    assert Thread.objects.get(id=run.thread_id).provider_chain == ["stmt"]


SQLITE_RUN = textwrap.dedent(
    """
    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    from governance import time_source
    from governance.models import BudgetEntry, HistoryItem, ProviderAttempt, Provider, Run
    from governance.services import runs, threads
    from governance.services import stages as stage_service
    from tasks.stages import run_stage
    stage_service.publish = lambda *a, **k: None
    script = {"default": {"answer": {"text": "The answer is 42.", "chunks": 1}}}
    Provider.objects.create(provider_id="lite", kind="scripted", model="m", script=script)
    for n in range(2):  # the second run finds the provider's health row
        thread = threads.create_thread(provider_chain=["lite"], now=time_source.now())
        run, stage, _ = runs.submit_run(thread, input="six times seven?", now=time_source.now())
        assert run_stage(stage.id) == "accepted"
    run = Run.objects.get(id=run.id)
    assert run.status == "settled" and run.settlement.outcome == "completed", run.status
    history = list(HistoryItem.objects.filter(session=run.segment.session).order_by("seq"))
    assert [(h.seq, h.role) for h in history] == [(1, "user"), (2, "assistant")], history
    assert run.chunks.get().text == "The answer is 42."
    assert ProviderAttempt.objects.filter(run=run, result="accepted").count() == 1
    assert BudgetEntry.objects.filter(account__run=run).count() == 1
    # The span store's insert: more rows than one SQLite statement takes, some stored already.
    from datetime import UTC, datetime
    from governance.models import SpanRecord
    from governance.services import statements as sql
    at = datetime.now(UTC)
    def spans(first, count):
        return [
            SpanRecord(trace_id=f"{i:032x}", span_id=f"{i:016x}", name="s", start=at, end=at,
                       status="ok", attributes={"n": i}, component="w")
            for i in range(first, first + count)
        ]
    sql.insert(spans(0, 300), ignore_conflicts=True)
    sql.insert(spans(200, 200), ignore_conflicts=True)
    assert SpanRecord.objects.count() == 400, SpanRecord.objects.count()
    print("sqlite run settled")
    """
)


def test_a_single_turn_run_settles_on_sqlite_the_embedded_default(tmp_path: Path):
    """R5.1, R6.5: one turn admitted from the ledger and settled once, on SQLite."""
    # The embedded defaults throughout: no Redis (its queues belong to the suite).
    inherited = ("REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")
    env = {
        **{k: v for k, v in os.environ.items() if k not in inherited},
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "GOVERNANCE_VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "dashboard.site.settings",
        "LOG_LEVEL": "WARNING",
    }
    done = subprocess.run(
        [sys.executable, "-c", SQLITE_RUN],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sqlite run settled" in done.stdout


def test_an_orm_save_of_an_existing_row_inside_together_is_refused(django_user_model):
    """R6.3: a stage's close writes everything in one transaction, much of it in
    a pipelined block, where an UPDATE's count is not known; Django's save() of
    an existing row reads it, so the block refuses such a save (on every
    database) rather than let it insert a second row or lose the write."""
    user = django_user_model.objects.create_user("counted-write")
    with sql.together():
        django_user_model.objects.create_user("a-new-row-is-fine")  # an insert reads no count
        user.first_name = "changed"
        with pytest.raises(sql.CountedWriteInside, match="existing row inside"):
            user.save()
    user.save()  # outside the block, as always
    assert django_user_model.objects.get(pk=user.pk).first_name == "changed"
