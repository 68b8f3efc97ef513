"""What the span store costs a run: rows, INSERT statements and commits.

Runs single-turn runs through the real path (API → Redis → a Celery worker in
this process → PostgreSQL) with telemetry configured the way a deployed
worker configures it (``configure_telemetry``), then reports per run:

* span-store rows (``SpanRecord``), by span name;
* span-store INSERT statements (each one its own autocommit commit);
* all rows inserted and all commits in the database (``pg_stat_database``),
  so the store's share of the per-run budget is visible;
* process CPU per run (the API client, the worker and the span writer);
* the telemetry CPU of one stage — its spans (``record_queue_span`` +
  ``execution_span`` + ``attempt_span``), those of 0 or 20 SQL statements in
  it, and writing them to the store — best of 5 x 200 stages.

The same file runs against an older tree (``git archive`` it elsewhere, copy
this file in, run it there with ``PYTHONPATH`` set to that tree) for a
before/after comparison.

Run (needs the suite's PostgreSQL and Redis)::

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/gov_spans \
    REDIS_URL=redis://127.0.0.1:6379/10 \
    .venv/bin/pytest -q -s -p no:cacheprovider bench/span_store_cost.py

``SPAN_BENCH_OTLP=1`` points the exporter at a loopback collector first (the
OTLP mode); ``SPAN_BENCH_RUNS`` sets how many runs (default 20).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

RUNS = int(os.environ.get("SPAN_BENCH_RUNS", "20"))
ANSWER = {"default": {"answer": {"text": "The answer is 42.", "chunks": 2}}}


class _Collector(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


if os.environ.get("SPAN_BENCH_OTLP"):
    _server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=_server.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{_server.server_address[1]}"

# As a deployed worker does, before any connection is opened.
from django.conf import settings  # noqa: E402

settings.OTEL_EXPORTER_OTLP_ENDPOINT = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")

from tasks import telemetry  # noqa: E402

MODE = telemetry.configure_telemetry("worker")

from tests.tasks.conftest import api, manual_clock, scripted_provider, worker  # noqa: E402, F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module", autouse=True)
def _flush_telemetry_at_the_end():
    yield
    telemetry.shutdown_telemetry()  # before the test database is dropped


def _db_counters(cursor) -> tuple[int, int]:
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    cursor.execute(
        "SELECT xact_commit, tup_inserted FROM pg_stat_database WHERE datname = current_database()"
    )
    return cursor.fetchone()


def _settle_stats() -> None:
    # Backends report their counters when idle (PostgreSQL 15: about every second).
    time.sleep(11)


def test_span_store_cost_per_run(api, worker, manual_clock, scripted_provider):  # noqa: F811
    from django.db import connection
    from opentelemetry import trace

    from governance.models import Run, SpanRecord, Stage
    from tasks import span_store

    inserts = Counter()
    original = span_store.DatabaseSpanExporter.export

    def counting_export(self, spans):
        result = original(self, spans)
        inserts["calls"] += 1
        return result

    span_store.DatabaseSpanExporter.export = counting_export
    try:
        scripted_provider("p", ANSWER)
        threads = [
            api.post("/api/v1/threads", {"provider_chain": ["p"]}, expect=201).json()
            for _ in range(RUNS)
        ]
        provider = trace.get_tracer_provider()
        provider.force_flush()
        SpanRecord.objects.all().delete()
        inserts.clear()
        _settle_stats()
        with connection.cursor() as cursor:
            commits0, rows0 = _db_counters(cursor)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        run_ids = [
            api.post(f"/api/v1/threads/{t['id']}/runs", {"input": "Hello"}, expect=202).json()[
                "run_id"
            ]
            for t in threads
        ]
        deadline = time.monotonic() + 120
        while Run.objects.filter(id__in=run_ids, status=Run.Status.SETTLED).count() < RUNS:
            assert time.monotonic() < deadline, "runs did not settle"
            time.sleep(0.25)
        provider.force_flush()
        cpu1, wall1 = time.process_time(), time.perf_counter()
        _settle_stats()
        with connection.cursor() as cursor:
            commits1, rows1 = _db_counters(cursor)
    finally:
        span_store.DatabaseSpanExporter.export = original

    stages = Stage.objects.filter(run_id__in=run_ids).count()
    names = Counter(SpanRecord.objects.values_list("name", flat=True))
    total = sum(names.values())
    print(f"\nmode={MODE} runs={RUNS} stages/run={stages / RUNS:.2f}")
    print(
        f"span-store rows/run={total / RUNS:.2f}  "
        f"INSERT statements/run={inserts['calls'] / RUNS:.2f}"
    )
    for name, n in names.most_common(12):
        print(f"   {n / RUNS:7.2f}  {name}")
    print(
        f"process CPU/run={(cpu1 - cpu0) / RUNS * 1000:.1f} ms "
        f"(API + worker + span writer; wall {(wall1 - wall0) / RUNS * 1000:.1f} ms/run)"
    )
    print(
        "database (all tables; incl. a few polls): "
        f"commits/run={(commits1 - commits0) / RUNS:.2f} "
        f"rows inserted/run={(rows1 - rows0) / RUNS:.2f}"
    )


def _record_stages(n: int, sql_per_stage: int) -> None:
    from django.db import connection

    from tasks import instrumentation as spans

    run_id = "6f1c2a4e-0d5b-4c89-9a57-3e2f1b0c7d11"
    t0 = datetime(2040, 1, 1, tzinfo=UTC)
    carrier = spans.new_run_trace(run_id, thread_id="t", segment_key="s")
    clocks = spans.clock_attributes(
        {"queue_ms": 1, "execution_ms": 2, "no_progress_ms": 3, "deadline_remaining_ms": 4}
    )
    for i in range(n):
        spans.record_queue_span(
            carrier, run_id=run_id, stage_id=i, stage_kind="model_turn",
            enqueued_at=t0, started_at=t0, attributes=clocks,
        )  # fmt: skip
        with spans.execution_span(
            carrier, run_id=run_id, stage_id=i, stage_kind="model_turn", started_at=t0
        ) as stage:
            with connection.cursor() as cursor:
                for _ in range(sql_per_stage):
                    cursor.execute("SELECT 1")
            with spans.attempt_span(
                provider_id="p", kind="primary", model="m", started_at=t0, segment_key="s"
            ) as attempt:
                attempt.finish(t0 + timedelta(milliseconds=5), {"input_tokens": 1})
            stage.set_attributes(clocks)
            stage.end(t0 + timedelta(milliseconds=6))


@pytest.mark.parametrize("sql_per_stage", [0, 20])
def test_cpu_cost_of_recording_a_stage(sql_per_stage):
    """CPU the process spends on one stage's telemetry: its spans (queue,
    execution, attempt) and those of ``sql_per_stage`` SQL statements inside
    the execution span, including writing them to the store (force_flush),
    minus the same statements run with instrumentation suppressed. Best of
    5 x 200 stages."""
    from django.db import connection
    from opentelemetry import trace
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    provider = trace.get_tracer_provider()
    best = float("inf")
    for _ in range(5):
        provider.force_flush()
        begin = time.process_time()
        with suppress_instrumentation(), connection.cursor() as cursor:
            for _ in range(200 * sql_per_stage):
                cursor.execute("SELECT 1")
        bare = time.process_time() - begin
        begin = time.process_time()
        _record_stages(200, sql_per_stage)
        provider.force_flush()
        best = min(best, (time.process_time() - begin - bare) / 200)
    print(
        f"\nmode={MODE} telemetry CPU per stage ({sql_per_stage} SQL statements in it): "
        f"{best * 1e6:.0f} µs"
    )
