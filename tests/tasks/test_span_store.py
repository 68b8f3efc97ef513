"""The embedded span store (R6.1): a run's stage spans, with their clocks, are
readable from PostgreSQL without a collector; the store stays bounded."""

from __future__ import annotations

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
    clock_attributes,
    end_run_span,
    execution_span,
    new_run_trace,
    record_queue_span,
)
from tasks.span_store import (
    DROPPED_ATTRIBUTES_KEY,
    DatabaseSpanExporter,
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
    run span emitted through it keeps the admission id and lands in PostgreSQL."""
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
    run = SpanRecord.objects.get(name="governance.run")
    assert run.span_id == carrier["run_span_id"]
    assert run.component == "worker"
    assert SpanRecord.objects.filter(run_id=RUN_ID, parent_span_id=run.span_id).count() == 2


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
