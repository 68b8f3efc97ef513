"""OpenTelemetry set-up for the web, the worker and the scheduler.

Spans go to OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, to the
console when ``OTEL_TRACES_EXPORTER=console``, and nowhere otherwise (the
tracer still works, so code never checks whether telemetry is on). In every
mode they are also written to the embedded span store (``SpanRecord``, see
tasks/span_store.py) unless ``GOVERNANCE_SPAN_STORE`` is off, so the
dashboard shows a run's trace without a collector.
"""

from __future__ import annotations

import sys
import threading

from django.conf import settings
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)

from tasks.instrumentation import PinnedIdGenerator
from tasks.span_store import (
    DEFAULT_MAX_SPANS_PER_EXPORT,
    DatabaseSpanExporter,
    span_store_enabled,
)

_lock = threading.Lock()
_configured: dict[str, str] = {}


def exporter_mode() -> str:
    """Which exporter the settings select: ``otlp``, ``console`` or ``none``."""
    if settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return "otlp"
    if settings.OTEL_TRACES_EXPORTER == "console":
        return "console"
    return "none"


def build_providers(
    component: str, mode: str | None = None
) -> tuple[TracerProvider, MeterProvider]:
    """Tracer and meter providers for ``component`` with the selected exporter."""
    mode = mode or exporter_mode()
    resource = Resource.create(
        {"service.name": settings.OTEL_SERVICE_NAME, "service.component": component}
    )
    # Pinned ids let a run span allocated at admission be emitted at settlement.
    tracer_provider = TracerProvider(resource=resource, id_generator=PinnedIdGenerator())
    readers: list[MetricReader] = []
    span_exporter: SpanExporter | None = None
    if mode == "otlp":
        # The exporters read OTEL_EXPORTER_OTLP_ENDPOINT (+ headers) themselves.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter()
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    elif mode == "console":
        # Bind the stream now: the exporter's default is the stdout of import time.
        span_exporter = ConsoleSpanExporter(out=sys.stdout)
        readers.append(
            PeriodicExportingMetricReader(
                ConsoleMetricExporter(out=sys.stdout), export_interval_millis=60000
            )
        )
    if span_exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if span_store_enabled():
        # Its own processor: a slow collector must not hold back the store.
        tracer_provider.add_span_processor(
            BatchSpanProcessor(
                DatabaseSpanExporter(), max_export_batch_size=DEFAULT_MAX_SPANS_PER_EXPORT
            )
        )
    return tracer_provider, MeterProvider(resource=resource, metric_readers=readers)


def configure_telemetry(component: str) -> str:
    """Install the global providers and instrumentations once per process."""
    with _lock:
        if "mode" in _configured:
            return _configured["mode"]
        mode = exporter_mode()
        tracer_provider, meter_provider = build_providers(component, mode)
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        _instrument()
        _configured["mode"] = mode
        return mode


def _instrument() -> None:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    for instrumentor in (DjangoInstrumentor(), CeleryInstrumentor(), PsycopgInstrumentor()):
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument()


def shutdown_telemetry() -> None:
    """Flush what is buffered (called on process exit)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush()
        provider.shutdown()
