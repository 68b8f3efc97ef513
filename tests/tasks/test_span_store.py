"""The embedded span store (R6.1): a run's stage spans, with their clocks, are
readable from PostgreSQL without a collector; the store stays bounded."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from governance.models import SpanRecord
from tasks import instrumentation
from tasks.instrumentation import (
    attempt_span,
    clock_attributes,
    end_run_span,
    execution_span,
    new_run_trace,
    record_queue_span,
    tool_span,
)
from tasks.span_store import (
    DROPPED_ATTRIBUTES_KEY,
    DatabaseSpanExporter,
    SpanStoreProcessor,
    prune_span_store,
    prune_spans,
    span_store_enabled,
)
from tasks.telemetry import build_providers

RUN_ID = uuid.UUID("0b9a6c44-2f7e-4d1a-8c3b-5a6e7f8091a2")
T0 = datetime(2039, 7, 1, 8, 30, tzinfo=UTC)  # the injected clock, far from wall time
CLOCKS = clock_attributes(
    {"queue_ms": 1000, "execution_ms": 2000, "no_progress_ms": 3000, "deadline_remaining_ms": 4}
)


def record_run(provider: TracerProvider) -> dict[str, str]:
    """One run through the instrumentation API, captured in memory."""
    instrumentation.use_tracer_provider(provider)
    try:
        carrier = new_run_trace(str(RUN_ID), thread_id="th", segment_key="seg")
        record_queue_span(
            carrier,
            run_id=RUN_ID,
            stage_id="st-1",
            stage_kind="model_turn",
            enqueued_at=T0,
            started_at=T0 + timedelta(seconds=1),
            attributes=CLOCKS,
        )
        with execution_span(
            carrier,
            run_id=RUN_ID,
            stage_id="st-1",
            stage_kind="model_turn",
            started_at=T0 + timedelta(seconds=1),
        ) as stage:
            stage.set_attributes(CLOCKS)
            stage.end(T0 + timedelta(seconds=3))
        end_run_span(carrier, run_id=RUN_ID, started_at=T0, ended_at=T0 + timedelta(seconds=4))
    finally:
        instrumentation.use_tracer_provider(None)
    return carrier


@pytest.fixture
def finished_spans():
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.component": "worker"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    carrier = record_run(provider)
    provider.shutdown()
    return carrier, list(memory.get_finished_spans())


def make_rows(n: int, *, start: datetime, step: timedelta) -> list[SpanRecord]:
    rows = [
        SpanRecord(
            trace_id=f"{i:032x}",
            span_id=f"{i + 1:016x}",
            name=f"span-{i}",
            start=start + i * step,
            end=start + i * step,
        )
        for i in range(n)
    ]
    return SpanRecord.objects.bulk_create(rows)


@pytest.mark.django_db
def test_r6_1_export_writes_rows_with_run_component_clocks_and_parents(finished_spans):
    """R6.1: exported spans become SpanRecord rows: hex ids, parent links, aware UTC
    times from the injected clock, run_id from governance.run_id, component from the
    resource, and the four clocks on stage spans."""
    carrier, spans = finished_spans
    assert DatabaseSpanExporter().export(spans) is SpanExportResult.SUCCESS

    rows = {r.name: r for r in SpanRecord.objects.all()}
    assert set(rows) == {
        "governance.run",
        "governance.stage.queue",
        "governance.stage.execution",
    }
    run = rows["governance.run"]
    assert run.span_id == carrier["run_span_id"]
    assert run.trace_id == carrier["traceparent"].split("-")[1]
    assert run.parent_span_id == ""
    assert (run.start, run.end) == (T0, T0 + timedelta(seconds=4))
    assert run.start.utcoffset() == timedelta(0)
    for name in ("governance.stage.queue", "governance.stage.execution"):
        stage = rows[name]
        assert stage.parent_span_id == run.span_id
        assert stage.trace_id == run.trace_id
        assert stage.run_id == RUN_ID
        assert stage.component == "worker"
        assert stage.status == "unset"
        assert {k: stage.attributes[k] for k in CLOCKS} == CLOCKS
    assert rows["governance.stage.queue"].end == T0 + timedelta(seconds=1)
    assert SpanRecord.objects.filter(run_id=RUN_ID).count() == 3


@pytest.mark.django_db
def test_r6_1_duplicate_export_is_ignored(finished_spans):
    """R6.1: a redelivered stage re-exports the same spans; (trace_id, span_id) keeps
    one row each and the export still succeeds."""
    _carrier, spans = finished_spans
    exporter = DatabaseSpanExporter()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert exporter.export(spans + spans) is SpanExportResult.SUCCESS
    assert SpanRecord.objects.count() == len(spans) == 3


@pytest.mark.django_db
def test_r6_1_export_bound_drops_and_counts_extra_spans():
    """R6.1: at most max_spans_per_export spans are written per call; the rest are
    dropped and counted."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("tests")
    for i in range(7):
        tracer.start_span(f"s{i}").end()
    exporter = DatabaseSpanExporter(max_spans_per_export=5)
    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.SUCCESS
    assert SpanRecord.objects.count() == 5
    assert exporter.dropped_spans == 2
    assert sorted(SpanRecord.objects.values_list("name", flat=True)) == [
        "s0",
        "s1",
        "s2",
        "s3",
        "s4",
    ]


@pytest.mark.django_db
def test_r6_1_attributes_are_capped_and_json_safe():
    """R6.1: attributes are bounded in number and size, governance.* kept first,
    and made JSON-safe (no NaN, no NUL) so PostgreSQL accepts the row."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    span = provider.get_tracer("tests").start_span("big")
    span.set_attributes({f"noise.{i:02d}": i for i in range(20)})
    span.set_attributes(
        {
            "governance.run_id": "not-a-uuid",
            "governance.clock.queue_ms": 5,
            "long": "x" * 5000,
            "nul": "a\x00b",
            "nan": float("nan"),
            "list": [f"item-{i}" for i in range(100)],
        }
    )
    span.end()
    exporter = DatabaseSpanExporter(max_attributes=8, max_value_chars=50, max_sequence_items=4)
    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.SUCCESS

    (row,) = SpanRecord.objects.all()
    attrs = row.attributes
    assert len(attrs) == 8
    assert attrs[DROPPED_ATTRIBUTES_KEY] == 26 - 7
    assert attrs["governance.clock.queue_ms"] == 5
    assert attrs["governance.run_id"] == "not-a-uuid"
    assert row.run_id is None  # not a UUID: kept as an attribute only
    bounded = exporter.bounded_attributes(
        {"long": "x" * 5000, "nul": "a\x00b", "nan": float("nan"), "list": ["y" * 30] * 100}
    )
    assert len(bounded["long"]) == 50
    assert bounded["nul"] == "ab"
    assert bounded["nan"] == "nan"
    assert len(bounded["list"]) == 2  # the 50-character budget ran out after two items


@pytest.mark.django_db
def test_r6_1_export_failure_is_reported_not_raised(finished_spans):
    """R6.1/R4.2: a failing store returns FAILURE and counts it; it never raises
    into the run."""
    _carrier, spans = finished_spans
    exporter = DatabaseSpanExporter(using="no-such-database")
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert exporter.failed_exports == 2
    assert SpanRecord.objects.count() == 0


@pytest.mark.django_db
def test_r6_1_prune_by_age_then_by_count():
    """R6.1: prune_spans deletes spans older than max_age, then the oldest beyond
    max_rows, and returns how many it deleted."""
    now = T0
    make_rows(10, start=now - timedelta(hours=10), step=timedelta(hours=1))
    # Starts at now-10h … now-1h. Older than 4h: the six at now-10h … now-5h.
    assert prune_spans(now, timedelta(hours=4, minutes=30), max_rows=100) == 6
    assert SpanRecord.objects.count() == 4
    assert prune_spans(now, timedelta(hours=24), max_rows=3) == 1
    remaining = list(SpanRecord.objects.order_by("start").values_list("start", flat=True))
    assert remaining == [now - timedelta(hours=h) for h in (3, 2, 1)]
    assert prune_spans(now, timedelta(hours=24), max_rows=3) == 0
    assert prune_spans(now, timedelta(hours=24), max_rows=0) == 3


@pytest.mark.django_db
def test_r6_1_prune_task_uses_settings_and_the_injected_clock(settings):
    """R6.1: the beat job prunes with SPAN_STORE_MAX_AGE_HOURS / SPAN_STORE_MAX_ROWS
    against governance.clock."""
    from governance import time_source

    time_source.install(time_source.ManualClock(T0))
    try:
        settings.SPAN_STORE_MAX_AGE_HOURS = 2
        settings.SPAN_STORE_MAX_ROWS = 1
        make_rows(4, start=T0 - timedelta(hours=3, minutes=30), step=timedelta(hours=1))
        assert prune_span_store.name == "tasks.span_store.prune_span_store"
        assert prune_span_store.apply().get() == 3
    finally:
        time_source.install(None)
    (row,) = SpanRecord.objects.all()
    assert row.start == T0 - timedelta(minutes=30)


@pytest.mark.django_db(transaction=True)
def test_r6_1_build_providers_stores_spans_by_default(settings):
    """R6.1: build_providers always adds the span store (no collector needed); a
    run span emitted through it keeps the admission id and lands in PostgreSQL,
    with the stage's execution span under it (the queue span is not stored: the
    stage row holds that interval)."""
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = None
    settings.OTEL_TRACES_EXPORTER = "none"
    assert span_store_enabled()
    tracer_provider, meter_provider = build_providers("worker")
    try:
        carrier = record_run(tracer_provider)
        assert tracer_provider.force_flush(10_000)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
    # This run's: a worker an earlier test started may still be storing its own.
    run = SpanRecord.objects.get(name="governance.run", run_id=RUN_ID)
    assert run.span_id == carrier["run_span_id"]
    assert run.component == "worker"
    (child,) = SpanRecord.objects.filter(run_id=RUN_ID, parent_span_id=run.span_id)
    assert child.name == "governance.stage.execution"
    assert {k: child.attributes[k] for k in CLOCKS} == CLOCKS
    assert not SpanRecord.objects.filter(name="governance.stage.queue", run_id=RUN_ID).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("off", [0, "0", False, "false"])
def test_r6_1_span_store_can_be_switched_off(settings, off):
    """R6.1: GOVERNANCE_SPAN_STORE=0 leaves the store out of build_providers."""
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = None
    settings.OTEL_TRACES_EXPORTER = "none"
    settings.GOVERNANCE_SPAN_STORE = off
    assert not span_store_enabled()
    tracer_provider, meter_provider = build_providers("worker")
    try:
        with tracer_provider.get_tracer("tests").start_as_current_span("not-stored"):
            pass
        assert tracer_provider.force_flush(10_000)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
    assert SpanRecord.objects.count() == 0


# --------------------------------------------------------------------------- what is stored, how

STAGE_RUN = uuid.UUID("7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f")


def record_stage(
    provider: TracerProvider,
    *,
    run_id: uuid.UUID = STAGE_RUN,
    stage_id: str = "st-1",
    during=None,
    end_run: bool = True,
) -> dict[str, str]:
    """One model-turn stage with an attempt and a tool call, then the run span;
    ``during(provider)`` runs inside the attempt span (SQL, HTTP, …)."""
    instrumentation.use_tracer_provider(provider)
    try:
        carrier = new_run_trace(str(run_id), thread_id="th", segment_key="seg")
        record_queue_span(
            carrier,
            run_id=run_id,
            stage_id=stage_id,
            stage_kind="model_turn",
            enqueued_at=T0,
            started_at=T0 + timedelta(seconds=1),
            attributes=CLOCKS,
        )
        with execution_span(
            carrier,
            run_id=run_id,
            stage_id=stage_id,
            stage_kind="model_turn",
            started_at=T0 + timedelta(seconds=1),
        ) as stage:
            with attempt_span(
                provider_id="p",
                kind="primary",
                model="m",
                started_at=T0 + timedelta(seconds=1),
                segment_key="seg",
            ) as attempt:
                if during is not None:
                    during(provider)
                attempt.finish(T0 + timedelta(seconds=2), {"input_tokens": 3})
            with tool_span(
                tool="calculator", call_id="c1", started_at=T0 + timedelta(seconds=2)
            ) as tool:
                tool.finish(T0 + timedelta(milliseconds=2500), effect="succeeded")
            stage.set_attributes(CLOCKS)
            stage.end(T0 + timedelta(seconds=3))
        if end_run:
            end_run_span(carrier, run_id=run_id, started_at=T0, ended_at=T0 + timedelta(seconds=4))
    finally:
        instrumentation.use_tracer_provider(None)
    return carrier


# Every span record_stage emits (what an OTLP collector receives) …
STAGE_NAMES = {
    "governance.run",
    "governance.stage.queue",
    "governance.stage.execution",
    "chat m",
    "execute_tool calculator",
}
# … and what the store keeps of them: not the queue span, whose interval
# (enqueued_at → started_at) is already on the Stage row.
STORED_NAMES = STAGE_NAMES - {"governance.stage.queue"}


def sql_http_celery_and_request_spans(provider):
    """What auto-instrumentation adds to a stage: none of it is the dashboard's."""
    from django.db import connection
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.trace import SpanKind

    # Real psycopg spans: the stage's own connection, instrumented.
    connection.ensure_connection()
    PsycopgInstrumentor.instrument_connection(connection.connection, tracer_provider=provider)
    try:
        SpanRecord.objects.filter(name="nothing").count()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        PsycopgInstrumentor.uninstrument_connection(connection.connection)
        # uninstrument_connection leaves the flag set; the pool hands this very
        # connection to the next test, whose instrument_connection would skip it.
        connection.connection._is_instrumented_by_opentelemetry = False
    # The httpx client span of the provider call, a Celery span, a request span
    # that new_run_trace tagged with the run id.
    tracer = provider.get_tracer("tests.auto")
    tracer.start_span(
        "POST",
        kind=SpanKind.CLIENT,
        attributes={"http.request.method": "POST", "url.full": "http://127.0.0.1:9/v1/chat"},
    ).end()
    tracer.start_span("run/tasks.stages.execute_stage", kind=SpanKind.CONSUMER).end()
    tracer.start_span(
        "POST api/v1/threads/<str:thread_id>/runs",
        kind=SpanKind.SERVER,
        attributes={"governance.run_id": str(STAGE_RUN), "http.request.method": "POST"},
    ).end()


def stored_names() -> set[str]:
    return set(SpanRecord.objects.values_list("name", flat=True))


@pytest.fixture
def store_only(settings):
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = None
    settings.OTEL_TRACES_EXPORTER = "none"
    settings.GOVERNANCE_SPAN_STORE = True
    tracer_provider, meter_provider = build_providers("worker")
    yield tracer_provider
    tracer_provider.shutdown()
    meter_provider.shutdown()


@pytest.mark.django_db(transaction=True)
def test_r6_1_run_stage_attempt_and_tool_spans_are_stored_and_nothing_else(store_only):
    """R6.1: the store keeps what the run page draws and the facts do not hold —
    run, execution, attempt and tool spans, each marked governance.span.kind —
    and not the stage's queue span (the Stage row has that interval), nor its
    SQL statements, HTTP client calls, Celery or request spans. With no
    exporter those are not even recorded."""
    seen = []

    def during(provider):
        sql_http_celery_and_request_spans(provider)
        span = provider.get_tracer("tests.auto").start_span("SELECT")
        seen.append(span.is_recording())
        span.end()

    record_stage(store_only, during=during)
    assert store_only.force_flush(10_000)
    assert stored_names() == STORED_NAMES
    assert seen == [False]  # no exporter: an auto-instrumentation span is a no-op
    kinds = dict(SpanRecord.objects.values_list("name", "attributes__governance.span.kind"))
    assert kinds == {
        "governance.run": "run",
        "governance.stage.execution": "stage.execution",
        "chat m": "attempt",
        "execute_tool calculator": "tool",
    }
    assert set(SpanRecord.objects.values_list("run_id", flat=True)) == {STAGE_RUN}
    tool = SpanRecord.objects.get(name="execute_tool calculator")
    execution = SpanRecord.objects.get(name="governance.stage.execution")
    assert tool.parent_span_id == execution.span_id
    assert tool.attributes["gen_ai.tool.name"] == "calculator"
    assert tool.attributes["governance.tool.effect"] == "succeeded"


def test_r6_1_no_auto_instrumentation_without_an_exporter():
    """R6.1: without OTLP (or console) Django, Celery and psycopg are not
    instrumented at all: a SQL statement costs no span."""
    from tasks.telemetry import instrumentors

    assert instrumentors("none") == []
    names = {type(i).__name__ for i in instrumentors("otlp")}
    assert names == {"DjangoInstrumentor", "CeleryInstrumentor", "PsycopgInstrumentor"}


class CountingExporter(DatabaseSpanExporter):
    """Records the SQL each export sends (on the writer's own connection)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.statements: list[str] = []
        self.threads: set[str] = set()
        self.atomic: list[bool] = []

    def export(self, spans):
        from django.db import connections
        from django.test.utils import CaptureQueriesContext

        connection = connections[self.using]
        self.threads.add(threading.current_thread().name)
        self.atomic.append(connection.in_atomic_block)
        with CaptureQueriesContext(connection) as captured:
            result = super().export(spans)
        self.statements.extend(q["sql"] for q in captured.captured_queries)
        return result

    def inserts(self) -> list[str]:
        return [s for s in self.statements if s.startswith('INSERT INTO "governance_spanrecord"')]


def provider_with(processor: SpanStoreProcessor) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.component": "worker"}))
    provider.add_span_processor(processor)
    return provider


@pytest.mark.django_db(transaction=True)
def test_r6_1_a_stage_is_one_insert_written_soon_after_it_ends():
    """R6.1: a stage's stored spans (attempt, tool, execution) and the run span
    go to the store in ONE multi-row INSERT on the writer's own connection, a
    moment after the execution span ends — not one INSERT per span, and not
    only when the (here very long) flush interval runs out."""
    # A clean store: rows another test's writer committed would end the wait below early.
    SpanRecord.objects.all().delete()
    exporter = CountingExporter()
    processor = SpanStoreProcessor(exporter, flush_delay_s=0.05, flush_interval_s=600)
    provider = provider_with(processor)
    try:
        record_stage(provider)
        deadline = time.monotonic() + 5
        while len(stored_names()) < len(STORED_NAMES) and time.monotonic() < deadline:
            time.sleep(0.01)  # no force_flush: the stage's end is the trigger
        assert stored_names() == STORED_NAMES
        assert len(exporter.inserts()) == 1, exporter.statements
        assert processor.written_batches == 1
        assert exporter.threads == {"span-store-writer"}
        assert exporter.atomic == [False]  # autocommit, not inside anyone's transaction
    finally:
        provider.shutdown()


@pytest.mark.django_db(transaction=True)
def test_r6_1_spans_of_stages_ending_together_share_an_insert_and_a_stage_in_progress_waits():
    """R6.1: spans wait in the buffer until a stage ends (or the interval);
    everything buffered then goes in one INSERT; force_flush writes the rest."""
    exporter = CountingExporter()
    processor = SpanStoreProcessor(exporter, flush_delay_s=0.2, flush_interval_s=600)
    provider = provider_with(processor)
    try:
        stored = 5 * len(STORED_NAMES)  # 20: the queue spans are not stored
        for i in range(5):
            record_stage(provider, run_id=uuid.uuid4(), stage_id=f"st-{i}")
        deadline = time.monotonic() + 5
        while SpanRecord.objects.count() < stored and time.monotonic() < deadline:
            time.sleep(0.01)
        assert SpanRecord.objects.count() == stored
        assert len(exporter.inserts()) == 1
        # A stage still running whose attempt span already ended: the attempt
        # waits in the buffer for the stage's end (or the interval).
        instrumentation.use_tracer_provider(provider)
        try:
            carrier = new_run_trace(str(STAGE_RUN), thread_id="th", segment_key="seg")
            with execution_span(
                carrier,
                run_id=STAGE_RUN,
                stage_id="st-late",
                stage_kind="model_turn",
                started_at=T0,
            ) as stage:
                with attempt_span(
                    provider_id="p", kind="primary", model="m", started_at=T0, segment_key="seg"
                ) as attempt:
                    attempt.finish(T0 + timedelta(seconds=1))
                time.sleep(0.3)
                assert SpanRecord.objects.count() == stored
                assert processor.force_flush(5_000)
                assert SpanRecord.objects.count() == stored + 1
                assert len(exporter.inserts()) == 2
                stage.end(T0 + timedelta(seconds=2))
        finally:
            instrumentation.use_tracer_provider(None)
        assert processor.force_flush(5_000)
        assert SpanRecord.objects.count() == stored + 2
        assert (
            SpanRecord.objects.filter(**{"attributes__governance.stage_id": "st-late"}).count() == 2
        )
    finally:
        provider.shutdown()


@pytest.mark.django_db(transaction=True)
def test_r6_1_the_store_write_never_joins_the_callers_transaction():
    """R6.1/R4.2: spans recorded inside a transaction are written by the writer
    on its own connection: the caller's connection sends no span INSERT, its
    transaction rolling back does not take the spans with it, and the writer
    does not wait for the caller's commit."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    exporter = CountingExporter()
    processor = SpanStoreProcessor(exporter, flush_delay_s=0, flush_interval_s=600)
    provider = provider_with(processor)

    class Rollback(Exception):
        pass

    try:
        with pytest.raises(Rollback), transaction.atomic():
            with CaptureQueriesContext(connection) as caller_queries:
                record_stage(provider)
                assert processor.force_flush(5_000)  # written while the caller is mid-transaction
            raise Rollback
        assert not any("governance_spanrecord" in q["sql"] for q in caller_queries)
        assert stored_names() == STORED_NAMES
        assert exporter.atomic and not any(exporter.atomic)
    finally:
        provider.shutdown()


class BrokenExporter(DatabaseSpanExporter):
    def __init__(self, fail_times: int):
        super().__init__()
        self.fail_times = fail_times
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        if self.calls <= self.fail_times:
            raise RuntimeError("a bug in the exporter")
        return super().export(spans)


@pytest.mark.django_db(transaction=True)
def test_r6_1_a_failing_store_is_logged_and_never_breaks_the_caller(caplog):
    """R6.1/R4.2: a store that cannot write (no such database; an exporter bug)
    costs the spans of that batch and a log line — the caller's stage and its
    transaction go on, and the writer keeps serving later batches."""
    from django.db import transaction

    from governance.models import ApiToken

    down = SpanStoreProcessor(
        DatabaseSpanExporter(using="no-such-database"), flush_delay_s=0.05, flush_interval_s=600
    )
    provider = provider_with(down)
    try:
        with transaction.atomic():
            record_stage(provider)
            assert down.force_flush(5_000)
            ApiToken.objects.count()  # the caller's transaction is still usable
        assert down.exporter.failed_exports >= 1
    finally:
        provider.shutdown()
    assert "span store: export failed" in caplog.text
    assert SpanRecord.objects.count() == 0

    buggy = SpanStoreProcessor(BrokenExporter(fail_times=1), flush_delay_s=0.05)
    provider = provider_with(buggy)
    try:
        record_stage(provider, stage_id="st-1")
        assert buggy.force_flush(5_000)
        record_stage(provider, run_id=uuid.uuid4(), stage_id="st-2")
        assert buggy.force_flush(5_000)
    finally:
        provider.shutdown()
    assert "span store: export raised" in caplog.text
    assert SpanRecord.objects.count() == len(STORED_NAMES)  # the second stage


@pytest.mark.django_db(transaction=True)
def test_r6_1_a_full_buffer_drops_and_counts_instead_of_blocking():
    """R4.2: when the writer cannot keep up, on_end drops (and counts) spans
    beyond the buffer instead of making the stage wait."""
    gate = threading.Event()

    class SlowExporter(DatabaseSpanExporter):
        def export(self, spans):
            gate.wait(10)
            return super().export(spans)

    per_stage = len(STORED_NAMES - {"governance.run"})  # attempt, tool, execution
    processor = SpanStoreProcessor(SlowExporter(), max_queue=per_stage, flush_delay_s=0)
    provider = provider_with(processor)
    try:
        record_stage(provider, end_run=False)  # three spans: the writer takes them, blocks
        deadline = time.monotonic() + 5
        while processor._queue and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not processor._queue
        begin = time.monotonic()
        for i in range(3):
            record_stage(provider, run_id=uuid.uuid4(), stage_id=f"more-{i}", end_run=False)
        assert time.monotonic() - begin < 1
        assert processor.dropped_spans == 3 * per_stage - per_stage
        gate.set()
        assert processor.force_flush(10_000)
    finally:
        gate.set()
        provider.shutdown()
    assert SpanRecord.objects.count() == per_stage + per_stage


@pytest.mark.django_db(transaction=True)
def test_r6_1_shutdown_writes_what_is_buffered():
    """R6.1: a worker that stops writes its buffered spans first."""
    processor = SpanStoreProcessor(DatabaseSpanExporter(), flush_delay_s=600, flush_interval_s=600)
    provider = provider_with(processor)
    try:
        record_stage(provider)
        time.sleep(0.05)
        assert SpanRecord.objects.count() == 0  # nothing due yet
    finally:
        provider.shutdown()
    assert stored_names() == STORED_NAMES
    record_stage(provider, run_id=uuid.uuid4())  # after shutdown: dropped, counted
    assert processor.dropped_spans == len(STORED_NAMES)  # a queue span is not even offered
    assert SpanRecord.objects.count() == len(STORED_NAMES)


def test_r6_1_worker_shutdown_flushes_the_span_store(monkeypatch):
    """R6.1: a Celery worker process leaving (prefork children skip atexit)
    flushes telemetry through the worker-shutdown signals."""
    from celery.signals import worker_process_shutdown

    from tasks import telemetry

    calls = []
    monkeypatch.setattr(telemetry, "shutdown_telemetry", lambda: calls.append(1))
    telemetry._flush_on_worker_shutdown()
    worker_process_shutdown.send(sender=None, pid=1, exitcode=0)
    assert calls == [1]


# --------------------------------------------------------------------------- the cap


@pytest.mark.django_db
def test_r6_1_count_prune_deletes_oldest_first_in_bounded_batches():
    """R6.1: beyond max_rows the oldest rows go, at most batch_rows per DELETE."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make_rows(50, start=T0 - timedelta(hours=1), step=timedelta(seconds=1))
    with CaptureQueriesContext(connection) as queries:
        assert prune_spans(T0, timedelta(hours=24), max_rows=10, batch_rows=7) == 40
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 1 + 6  # none by age; by count 7+7+7+7+7+5
    assert all("LIMIT 7" in sql for sql in deletes)
    kept = list(SpanRecord.objects.order_by("start").values_list("name", flat=True))
    assert kept == [f"span-{i}" for i in range(40, 50)]


@pytest.mark.django_db
def test_r6_1_count_check_under_the_cap_is_two_index_lookups():
    """R6.1: while the store is certainly under the cap (max(id) - min(id) + 1
    rows at most) the count check does not rank the rows."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    make_rows(20, start=T0 - timedelta(hours=1), step=timedelta(seconds=1))
    with CaptureQueriesContext(connection) as queries:
        assert prune_spans(T0, timedelta(hours=24), max_rows=20) == 0
    assert not any("OFFSET" in q["sql"] for q in queries)
    assert prune_spans(T0, timedelta(hours=24), max_rows=19) == 1


@pytest.mark.django_db(transaction=True)
def test_r6_1_the_count_cap_holds_while_writing_more_than_the_cap():
    """R6.1: the writer checks the cap every prune_every_rows rows it writes, so
    the store stays within max_rows (plus at most one check's worth) however
    many spans arrive between two beat runs; the newest rows are the ones kept."""
    max_rows, every = 30, 10
    processor = SpanStoreProcessor(
        DatabaseSpanExporter(),
        flush_delay_s=0,
        prune_every_rows=every,
        prune=lambda: prune_spans(T0, timedelta(days=3650), max_rows, batch_rows=4),
    )
    provider = provider_with(processor)
    highest = 0
    try:
        for i in range(40):  # 160 stored spans, more than five times the cap
            record_stage(provider, run_id=uuid.uuid4(), stage_id=f"st-{i}")
            assert processor.force_flush(5_000)
            highest = max(highest, SpanRecord.objects.count())
    finally:
        provider.shutdown()
    assert highest <= max_rows + every
    assert SpanRecord.objects.count() <= max_rows + every
    prune_spans(T0, timedelta(days=3650), max_rows)
    assert SpanRecord.objects.count() == max_rows


@pytest.mark.django_db(transaction=True)
def test_r6_1_build_providers_configures_the_writer_and_its_cap_from_settings(settings):
    """R6.1: build_providers' store processor takes its flush timing and cap
    check from settings (defined once in dashboard/site/settings.py)."""
    from governance import time_source
    from tasks.span_store import SpanStoreProcessor as Processor

    settings.OTEL_EXPORTER_OTLP_ENDPOINT = None
    settings.OTEL_TRACES_EXPORTER = "none"
    settings.GOVERNANCE_SPAN_STORE = True
    settings.SPAN_STORE_FLUSH_DELAY_MS = 0
    settings.SPAN_STORE_FLUSH_INTERVAL_MS = 60_000
    settings.SPAN_STORE_PRUNE_EVERY_ROWS = len(STORED_NAMES)  # 4: one stage's rows
    settings.SPAN_STORE_MAX_ROWS = 3
    settings.SPAN_STORE_MAX_AGE_HOURS = 1
    tracer_provider, meter_provider = build_providers("worker")
    (processor,) = [
        p
        for p in tracer_provider._active_span_processor._span_processors
        if isinstance(p, Processor)
    ]
    assert (processor.flush_delay_s, processor.flush_interval_s) == (0, 60)
    assert processor.prune_every_rows == len(STORED_NAMES)
    make_rows(2, start=T0 - timedelta(hours=2), step=timedelta(minutes=1))  # too old
    time_source.install(time_source.ManualClock(T0 + timedelta(seconds=5)))
    try:
        record_stage(tracer_provider)
        assert tracer_provider.force_flush(10_000)
    finally:
        time_source.install(None)
        tracer_provider.shutdown()
        meter_provider.shutdown()
    # The two old rows went by age, then the oldest of the four new ones by count.
    assert SpanRecord.objects.count() == 3
    assert not SpanRecord.objects.filter(name="governance.stage.queue").exists()
    assert not SpanRecord.objects.filter(start__lt=T0).exists()
