"""Telemetry set-up: OTLP/HTTP to a real loopback collector, console, or nowhere."""

from __future__ import annotations

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
