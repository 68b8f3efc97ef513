"""OpenTelemetry set-up for the web, the worker and the scheduler.

Two kinds of spans, two destinations:

* the run's own spans (run, stage queue/execution, provider attempt, tool
  call — marked by tasks/instrumentation.py with ``governance.span.kind``)
  are always recorded and written to the embedded span store
  (tasks/span_store.py) unless ``GOVERNANCE_SPAN_STORE`` is off, so the
  dashboard shows a run's trace without a collector;
* every span goes to OTLP/HTTP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set
  (or to the console when ``OTEL_TRACES_EXPORTER=console``), sampled by
  ``ParentBased(TraceIdRatioBased(OTEL_TRACES_SAMPLER_ARG))``.

Django, Celery and psycopg are instrumented only when there is an exporter
to send their spans to: without one, a SQL statement costs no span at all.
The tracer still works in every mode, so code never checks whether
telemetry is on.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

from django.conf import settings
from opentelemetry import metrics, trace
from opentelemetry.context import Context
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
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes

from tasks.instrumentation import (
    PinnedIdGenerator,
    is_governance_span,
    semconv_from,
    use_semconv,
)
from tasks.span_store import build_processor, span_store_enabled

_lock = threading.Lock()
_configured: dict[str, str] = {}


class GovernanceSampler(Sampler):
    """``others`` decides; a governance span is recorded whatever it says.

    A governance span the ratio would drop is ``RECORD_ONLY``: recorded, so
    the span store (which takes every governance span) keeps it, but not
    flagged sampled, so it does not reach OTLP and the SQL or HTTP spans
    under it are dropped too (they follow their parent). The store never
    loses a stage to sampling, and OTLP gets whole traces or none.
    """

    def __init__(self, others: Sampler) -> None:
        self.others = others

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        result = self.others.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )
        if result.decision.is_sampled() or not is_governance_span(attributes):
            return result
        # The ratio samplers drop the attributes along with the span: keep them.
        return SamplingResult(Decision.RECORD_ONLY, attributes, result.trace_state)

    def get_description(self) -> str:
        return f"GovernanceSampler{{{self.others.get_description()}}}"


def make_sampler(exporting: bool) -> Sampler:
    """The sampler for a process that does (or does not) export to OTLP/console.

    Not exporting, only governance spans are recorded (everything else is a
    non-recording span that costs next to nothing).
    """
    if not exporting:
        return GovernanceSampler(ALWAYS_OFF)
    return GovernanceSampler(ParentBased(TraceIdRatioBased(settings.OTEL_TRACES_SAMPLER_ARG)))


def exporter_mode() -> str:
    """Which exporter the settings select: ``otlp``, ``console`` or ``none``."""
    if settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        return "otlp"
    if settings.OTEL_TRACES_EXPORTER == "console":
        return "console"
    return "none"


def _otlp_url(signal: str) -> str:
    # What the exporters derive from OTEL_EXPORTER_OTLP_ENDPOINT, from settings.
    return f"{settings.OTEL_EXPORTER_OTLP_ENDPOINT.rstrip('/')}/v1/{signal}"


def build_providers(
    component: str, mode: str | None = None
) -> tuple[TracerProvider, MeterProvider]:
    """Tracer and meter providers for ``component`` with the selected exporter."""
    mode = mode or exporter_mode()
    resource = Resource.create(
        {
            "service.name": settings.OTEL_SERVICE_NAME,
            "service.component": component,
            # Workers on several hosts are told apart, as in stage claims.
            "host.name": settings.GOVERNANCE_HOST_NAME,
            "process.pid": os.getpid(),
        }
    )
    readers: list[MetricReader] = []
    span_exporter: SpanExporter | None = None
    if mode == "otlp":
        # Headers, timeouts and compression still come from OTEL_EXPORTER_OTLP_*.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter(endpoint=_otlp_url("traces"))
        readers.append(
            PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=_otlp_url("metrics")))
        )
    elif mode == "console":
        # Bind the stream now: the exporter's default is the stdout of import time.
        span_exporter = ConsoleSpanExporter(out=sys.stdout)
        readers.append(
            PeriodicExportingMetricReader(
                ConsoleMetricExporter(out=sys.stdout), export_interval_millis=60000
            )
        )
    store = span_store_enabled()
    sampler = make_sampler(span_exporter is not None) if span_exporter or store else ALWAYS_OFF
    # Pinned ids let a run span allocated at admission be emitted at settlement.
    tracer_provider = TracerProvider(
        resource=resource, id_generator=PinnedIdGenerator(), sampler=sampler
    )
    if span_exporter is not None:
        # Exports sampled spans only (governance spans of unsampled traces stay out).
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    if store:
        # Its own processor: a slow collector must not hold back the store.
        tracer_provider.add_span_processor(build_processor())
    return tracer_provider, MeterProvider(resource=resource, metric_readers=readers)


def configure_telemetry(component: str) -> str:
    """Install the global providers (and, when exporting, the instrumentations)
    once per process; flush them when a Celery worker process stops."""
    with _lock:
        if "mode" in _configured:
            return _configured["mode"]
        mode = exporter_mode()
        use_semconv(
            semconv_from(
                settings.OTEL_SEMCONV_STABILITY_OPT_IN,
                settings.OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT,
                settings.OTEL_SERVICE_NAME,
            )
        )
        tracer_provider, meter_provider = build_providers(component, mode)
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
        for instrumentor in instrumentors(mode):
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument()
        _flush_on_worker_shutdown()
        _configured["mode"] = mode
        return mode


def instrumentors(mode: str) -> list:
    """The auto-instrumentations worth their cost in ``mode``: none without an
    exporter (their spans would go nowhere: no store, no OTLP)."""
    if mode == "none":
        return []
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

    return [DjangoInstrumentor(), CeleryInstrumentor(), PsycopgInstrumentor()]


def _flush_on_worker_shutdown() -> None:
    # A prefork child leaves through os._exit: atexit handlers do not run there.
    from celery.signals import worker_process_shutdown, worker_shutdown

    for signal in (worker_process_shutdown, worker_shutdown):
        signal.connect(_on_worker_shutdown, weak=False, dispatch_uid=f"telemetry-{signal.name}")


def _on_worker_shutdown(**_kwargs) -> None:
    shutdown_telemetry()


def shutdown_telemetry() -> None:
    """Flush what is buffered (span store and exporters) and stop the providers
    (once: a worker may get both shutdown signals)."""
    with _lock:
        if _configured.get("shutdown"):
            return
        _configured["shutdown"] = "yes"
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush()
        provider.shutdown()
    meter_provider = metrics.get_meter_provider()
    if isinstance(meter_provider, MeterProvider):
        meter_provider.shutdown()
