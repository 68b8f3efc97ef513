"""Telemetry set-up: OTLP/HTTP to a real loopback collector, console, or nowhere."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tasks.telemetry import build_providers, exporter_mode


class _Collector(BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[str, bytes, str]]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append((self.path, body, self.headers.get("Content-Type", "")))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(autouse=True)
def no_span_store(settings):
    # These tests look at the exporters alone; the store has its own tests.
    settings.GOVERNANCE_SPAN_STORE = False


@pytest.fixture
def collector():
    _Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Collector.received
    server.shutdown()
    server.server_close()


def test_exporter_mode_follows_settings(settings):
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = None
    settings.OTEL_TRACES_EXPORTER = "none"
    assert exporter_mode() == "none"
    settings.OTEL_TRACES_EXPORTER = "console"
    assert exporter_mode() == "console"
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = "http://127.0.0.1:4318"
    assert exporter_mode() == "otlp"


def test_otlp_export_reaches_a_loopback_collector(settings, monkeypatch, collector):
    endpoint, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = endpoint
    tracer_provider, meter_provider = build_providers("test")
    tracer = tracer_provider.get_tracer("tests")
    with tracer.start_as_current_span("governance.stage") as span:
        span.set_attribute("governance.clock.queue_ms", 1234)
    assert tracer_provider.force_flush(10_000)
    tracer_provider.shutdown()
    meter_provider.shutdown()
    traces = [body for path, body, _ in received if path == "/v1/traces"]
    assert traces, f"collector got {[path for path, _, _ in received]}"
    request = ExportTraceServiceRequest.FromString(traces[0])
    spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert [s.name for s in spans] == ["governance.stage"]
    attributes = {a.key: a.value.int_value for a in spans[0].attributes}
    assert attributes["governance.clock.queue_ms"] == 1234
    resource = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
    assert resource["service.component"] == "test"
    # Which host (as in stage claims) and which process sent it.
    assert resource["host.name"] == settings.GOVERNANCE_HOST_NAME
    pids = [a.value.int_value for a in request.resource_spans[0].resource.attributes
            if a.key == "process.pid"]  # fmt: skip
    assert pids == [os.getpid()]


def test_console_mode_prints_spans(settings, capsys):
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = None
    settings.OTEL_TRACES_EXPORTER = "console"
    tracer_provider, meter_provider = build_providers("test")
    with tracer_provider.get_tracer("tests").start_as_current_span("printed-span"):
        pass
    tracer_provider.force_flush()
    tracer_provider.shutdown()
    meter_provider.shutdown()
    assert "printed-span" in capsys.readouterr().out


def test_none_mode_exports_nothing_but_still_traces(settings, collector):
    _endpoint, received = collector
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = None
    settings.OTEL_TRACES_EXPORTER = "none"
    tracer_provider, meter_provider = build_providers("test")
    with tracer_provider.get_tracer("tests").start_as_current_span("quiet") as span:
        assert span.get_span_context().is_valid
    tracer_provider.shutdown()
    meter_provider.shutdown()
    assert received == []


# --------------------------------------------------------------------------- what goes where


def exported_spans(received) -> list:
    out = []
    for path, body, _ in received:
        if path != "/v1/traces":
            continue
        request = ExportTraceServiceRequest.FromString(body)
        out.extend(s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans)
    return out


def is_sql(span) -> bool:
    for attribute in span.attributes:
        if attribute.key in ("db.system", "db.system.name"):
            return attribute.value.string_value == "postgresql"
    return False


@pytest.fixture
def otlp_and_store(settings, collector):
    endpoint, received = collector
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = endpoint
    settings.GOVERNANCE_SPAN_STORE = True
    settings.OTEL_TRACES_SAMPLER_ARG = 1.0
    return received


@pytest.mark.django_db(transaction=True)
def test_r6_1_sql_http_and_request_spans_go_to_otlp_never_to_the_store(otlp_and_store):
    """R6.1: with an OTLP endpoint, a stage's SQL statements (real psycopg
    instrumentation), its HTTP client call and the Celery/request spans are
    exported to the (loopback) collector; the span store keeps only the run,
    execution, attempt and tool spans (the queue span is exported, not stored)."""
    from governance.models import SpanRecord
    from tests.tasks.test_span_store import (
        STAGE_NAMES,
        STORED_NAMES,
        record_stage,
        sql_http_celery_and_request_spans,
    )

    received = otlp_and_store
    tracer_provider, meter_provider = build_providers("worker")
    try:
        record_stage(tracer_provider, during=sql_http_celery_and_request_spans)
        assert tracer_provider.force_flush(10_000)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
    assert set(SpanRecord.objects.values_list("name", flat=True)) == STORED_NAMES
    spans = exported_spans(received)
    names = {s.name for s in spans}
    assert names >= STAGE_NAMES  # the run's own spans are exported too, the queue span included
    sql = [s for s in spans if is_sql(s)]
    assert len(sql) >= 2, names  # the ORM query and the cursor's SELECT 1
    assert {"POST", "run/tasks.stages.execute_stage"} <= names
    assert "POST api/v1/threads/<str:thread_id>/runs" in names
    # The SQL spans hang under the stage: one trace, as a collector shows it.
    assert {s.trace_id for s in sql} == {s.trace_id for s in spans if s.name == "governance.run"}


@pytest.mark.django_db(transaction=True)
def test_r6_1_sampling_never_takes_a_stage_from_the_store(otlp_and_store, settings):
    """R6.1: OTEL_TRACES_SAMPLER_ARG=0 samples every trace out of OTLP — the
    SQL and HTTP spans are not even recorded — but the run's spans are still
    recorded and stored (all but the queue span, which the store never keeps)."""
    from governance.models import SpanRecord
    from tests.tasks.test_span_store import (
        STORED_NAMES,
        record_stage,
        sql_http_celery_and_request_spans,
    )

    received = otlp_and_store
    settings.OTEL_TRACES_SAMPLER_ARG = 0.0
    tracer_provider, meter_provider = build_providers("worker")
    try:
        carrier = record_stage(tracer_provider, during=sql_http_celery_and_request_spans)
        assert tracer_provider.force_flush(10_000)
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
    assert carrier["traceparent"].endswith("-00")  # the run's trace is not sampled
    assert set(SpanRecord.objects.values_list("name", flat=True)) == STORED_NAMES
    assert exported_spans(received) == []


@pytest.mark.django_db(transaction=True)
def test_r6_1_a_queue_span_goes_to_otlp_but_not_to_the_store(otlp_and_store):
    """R6.1: the stage queue span is still created and exported to a configured
    collector — under the run span, marked stage.queue, with its enqueued →
    started interval and clocks — but the embedded store does not keep it: the
    Stage row already holds that interval. The run span beside it is stored."""
    from datetime import timedelta

    from governance.models import SpanRecord
    from tasks import instrumentation
    from tests.tasks.test_span_store import CLOCKS, STAGE_RUN, T0

    received = otlp_and_store
    tracer_provider, meter_provider = build_providers("worker")
    instrumentation.use_tracer_provider(tracer_provider)
    try:
        carrier = instrumentation.new_run_trace(str(STAGE_RUN), thread_id="th", segment_key="seg")
        instrumentation.record_queue_span(
            carrier,
            run_id=STAGE_RUN,
            stage_id="st-q",
            stage_kind="model_turn",
            enqueued_at=T0,
            started_at=T0 + timedelta(seconds=1),
            attributes=CLOCKS,
        )
        instrumentation.end_run_span(
            carrier, run_id=STAGE_RUN, started_at=T0, ended_at=T0 + timedelta(seconds=2)
        )
        assert tracer_provider.force_flush(10_000)
    finally:
        instrumentation.use_tracer_provider(None)
        tracer_provider.shutdown()
        meter_provider.shutdown()

    # The store: the run span only.
    assert list(SpanRecord.objects.values_list("name", flat=True)) == ["governance.run"]
    # The collector: both, the queue span whole.
    spans = {s.name: s for s in exported_spans(received)}
    assert set(spans) == {"governance.run", "governance.stage.queue"}
    queue, run = spans["governance.stage.queue"], spans["governance.run"]
    assert queue.trace_id == run.trace_id
    assert queue.parent_span_id == run.span_id
    assert run.span_id.hex() == carrier["run_span_id"]
    assert queue.end_time_unix_nano - queue.start_time_unix_nano == 10**9
    attributes = {a.key: a.value for a in queue.attributes}
    assert attributes["governance.span.kind"].string_value == "stage.queue"
    assert attributes["governance.run_id"].string_value == str(STAGE_RUN)
    assert attributes["governance.stage_id"].string_value == "st-q"
    for key, value in CLOCKS.items():
        assert attributes[key].int_value == value, key


def test_r6_1_the_sampler_records_governance_spans_and_samples_the_rest(settings):
    """R6.1: ParentBased(TraceIdRatio) for everything; a governance span the
    ratio drops is RECORD_ONLY (kept for the store, not flagged sampled), and
    what runs under it follows it out of OTLP."""
    from opentelemetry.sdk.trace.sampling import Decision

    from tasks.instrumentation import SPAN_KIND_ATTRIBUTE
    from tasks.telemetry import GovernanceSampler, make_sampler

    def decide(sampler, attributes, parent=None):
        return sampler.should_sample(parent, 0xABC, "x", attributes=attributes)

    marked = {SPAN_KIND_ATTRIBUTE: "stage.execution", "governance.run_id": "r"}
    for ratio, plain in ((0.0, Decision.DROP), (1.0, Decision.RECORD_AND_SAMPLE)):
        settings.OTEL_TRACES_SAMPLER_ARG = ratio
        sampler = make_sampler(exporting=True)
        assert isinstance(sampler, GovernanceSampler)
        assert "TraceIdRatioBased" in sampler.get_description()
        assert decide(sampler, {"db.system": "postgresql"}).decision is plain
        result = decide(sampler, marked)
        assert result.decision.is_recording()
        assert dict(result.attributes) == marked  # the attributes survive the ratio
        assert result.decision.is_sampled() == (ratio == 1.0)
    settings.OTEL_TRACES_SAMPLER_ARG = 1.0
    # No exporter: only the run's spans are recorded at all.
    quiet = make_sampler(exporting=False)
    assert decide(quiet, {"db.system": "postgresql"}).decision is Decision.DROP
    assert decide(quiet, marked).decision is Decision.RECORD_ONLY


def test_r6_1_a_child_of_an_unsampled_governance_span_is_dropped(settings):
    """R6.1: SQL under a RECORD_ONLY stage span is not recorded (ParentBased)."""
    from opentelemetry import trace

    from tasks.instrumentation import SPAN_KIND_ATTRIBUTE

    settings.OTEL_EXPORTER_OTLP_ENDPOINT = "http://127.0.0.1:9"  # never reached
    settings.OTEL_TRACES_SAMPLER_ARG = 0.0
    tracer_provider, meter_provider = build_providers("worker")
    try:
        tracer = tracer_provider.get_tracer("tests")
        stage = tracer.start_span(
            "governance.stage.execution",
            attributes={SPAN_KIND_ATTRIBUTE: "stage.execution", "governance.run_id": "r"},
        )
        assert stage.is_recording() and not stage.get_span_context().trace_flags.sampled
        child = tracer.start_span("SELECT", context=trace.set_span_in_context(stage))
        assert not child.is_recording()
        child.end()
        stage.end()
    finally:
        tracer_provider.shutdown()
        meter_provider.shutdown()
