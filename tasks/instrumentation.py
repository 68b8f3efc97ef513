"""Spans and metrics of a run (R6.1, R6.2): what the turn runner calls.

Trace shape of one run::

    <API request span>                      (Django instrumentation, if any)
      governance.run                        admission → settlement
        governance.stage.queue              enqueued_at → started_at
        governance.stage.execution          started_at → finished_at
          chat <model>                      one provider attempt (GenAI semconv)
          execute_tool <tool>               one tool call (``tool_span``)

Each of these carries ``governance.span.kind`` (``SPAN_KIND_ATTRIBUTE``) from
its start, with a value in the closed set ``GOVERNANCE_SPAN_KINDS``, and
``governance.run_id``. That pair is what the embedded span store keeps
(``stored_in_span_store``) and what the sampler never drops
(tasks/telemetry.py); every other span — Django requests, SQL statements,
Celery tasks, HTTP client calls — goes to OTLP only, sampled, and only when an
exporter is configured. The store thus holds what the dashboard draws, a few
rows per stage, not one row per SQL statement.

Every stage span carries the four clocks of R6.1 (``CLOCK_ATTRIBUTES``), so a
long queue wait is visibly a queue span, never execution time (R6.2).

Under ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``
(``use_semconv``) the spans also speak the latest GenAI conventions: the run
span is ``invoke_agent {agent}``, every GenAI span names the conversation
(``gen_ai.conversation.id``: the thread), ``gen_ai.provider.name`` is the
vendor (the provider id stays in ``governance.provider.id``), a refusal's
finish reason is ``content_filter`` and a streamed answer's time to first
chunk is ``gen_ai.response.time_to_first_chunk``. Without it the names emitted
before stay. Prompt and answer contents are in no span unless
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` asks for them (latest
conventions only: ``gen_ai.input.messages``/``gen_ai.output.messages``).
The dashboard tells spans apart by ``governance.span.kind``, never by name.

Times come from the injected clock (``governance.time_source``), which may be far
from wall time, so every span gets explicit start/end nanoseconds from the
datetimes the runner passes in.

The run span is allocated at admission (``new_run_trace``) but emitted at
settlement (``end_run_span``), possibly in another process. Its id travels in
the carrier stored on the run; stage spans use it as their parent long before
the run span exists. To emit the run span with that pre-allocated id we start
it through the normal tracer while a context variable pins the ids that
:class:`PinnedIdGenerator` hands out. Going through ``Tracer.start_span`` keeps
sampling, span limits, resource and *every* span processor (OTLP, console,
span store) without touching SDK internals; the only requirement is that the
provider's ``id_generator`` is a ``PinnedIdGenerator`` — ``build_providers``
creates it so, and ``get_tracer``/``use_tracer_provider`` wrap any other SDK
provider's generator.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tasks import work_metrics

logger = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "governance"
RUN_SPAN_NAME = "governance.run"
QUEUE_SPAN_NAME = "governance.stage.queue"
EXECUTION_SPAN_NAME = "governance.stage.execution"
APPROVAL_WAIT_SPAN_NAME = "governance.approval.wait"

# What a span is to the dashboard; set at the span's start so the sampler sees it.
SPAN_KIND_ATTRIBUTE = "governance.span.kind"
RUN_KIND = "run"
QUEUE_KIND = "stage.queue"
EXECUTION_KIND = "stage.execution"
ATTEMPT_KIND = "attempt"
TOOL_KIND = "tool"
APPROVAL_WAIT_KIND = "approval.wait"
GOVERNANCE_SPAN_KINDS = frozenset(
    {RUN_KIND, QUEUE_KIND, EXECUTION_KIND, ATTEMPT_KIND, TOOL_KIND, APPROVAL_WAIT_KIND}
)

# Carrier keys besides W3C ``traceparent`` (which names the *run* span).
RUN_SPAN_KEY = "run_span_id"
PARENT_SPAN_KEY = "parent_span_id"  # the admission request span ("" for a new trace)

CLOCK_ATTRIBUTES = (
    "governance.clock.queue_ms",
    "governance.clock.execution_ms",
    "governance.clock.no_progress_ms",
    "governance.clock.deadline_remaining_ms",
)
_CLOCK_KEYS = ("queue_ms", "execution_ms", "no_progress_ms", "deadline_remaining_ms")
_CLOCK_NAME = dict(zip(_CLOCK_KEYS, CLOCK_ATTRIBUTES, strict=True))
# A clock the caller did not supply and we cannot compute (see _fill_clocks).
CLOCK_UNKNOWN = -1

# Short names the runner may use in AttemptSpan.finish(); dotted names pass through.
ATTEMPT_ATTRIBUTE_ALIASES = {
    "finish_reasons": "gen_ai.response.finish_reasons",
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "response_model": "gen_ai.response.model",
    "response_id": "gen_ai.response.id",
    "refusal_verdict": "governance.refusal.verdict",
    "reprobes": "governance.refusal.reprobes",
    "failure_class": "governance.failure_class",
}

_PROPAGATOR = TraceContextTextMapPropagator()
_RUN_ID_KEY = otel_context.create_key("governance.run_id")
_STAGE_ID_KEY = otel_context.create_key("governance.stage_id")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
_CONVERSATION_KEY = otel_context.create_key("gen_ai.conversation.id")

GENAI_LATEST_OPT_IN = "gen_ai_latest_experimental"
# The values of the capture setting that put contents in spans.
CAPTURE_IN_SPANS = frozenset({"true", "1", "span_only", "span_and_event"})


@dataclass(frozen=True)
class Semconv:
    """Which GenAI conventions the spans speak (read once per process from the
    settings by ``tasks.telemetry.configure_telemetry``)."""

    latest: bool = False  # OTEL_SEMCONV_STABILITY_OPT_IN names gen_ai_latest_experimental
    capture_content: bool = False  # OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
    agent_name: str = "agent-governance"  # gen_ai.agent.name of the invoke_agent span


_semconv = Semconv()


def semconv_from(opt_in: str, capture: str, agent_name: str) -> Semconv:
    """The conventions the two standard settings ask for (comma-separated opt-ins)."""
    latest = GENAI_LATEST_OPT_IN in {part.strip() for part in (opt_in or "").split(",")}
    capture_content = latest and (capture or "").strip().lower() in CAPTURE_IN_SPANS
    return Semconv(latest, capture_content, agent_name or Semconv.agent_name)


def use_semconv(semconv: Semconv) -> Semconv:
    """Emit by ``semconv`` from now on; returns the previous one (tests restore it)."""
    global _semconv
    previous, _semconv = _semconv, semconv
    return previous


def current_semconv() -> Semconv:
    return _semconv


def is_governance_span(attributes: Mapping[str, Any] | None) -> bool:
    """True for the spans this module emits (a known ``governance.span.kind``)."""
    return bool(attributes) and attributes.get(SPAN_KIND_ATTRIBUTE) in GOVERNANCE_SPAN_KINDS


# The queue bar is drawn from the stage row's own times (enqueued → started),
# so the store keeps no second copy of it; the queue span still goes to OTLP.
STORED_SPAN_KINDS = GOVERNANCE_SPAN_KINDS - {QUEUE_KIND}


def stored_in_span_store(attributes: Mapping[str, Any] | None) -> bool:
    """What the embedded span store keeps: a governance span of a run that the
    facts do not already hold."""
    return (
        bool(attributes)
        and attributes.get(SPAN_KIND_ATTRIBUTE) in STORED_SPAN_KINDS
        and bool(attributes.get("governance.run_id"))
    )


# --------------------------------------------------------------------------- ids


@dataclass
class _Pin:
    trace_id: int
    span_id: int
    trace_used: bool = False
    span_used: bool = False


_pin: ContextVar[_Pin | None] = ContextVar("governance_pinned_span_ids", default=None)


class PinnedIdGenerator(IdGenerator):
    """Random ids, except one pinned (trace id, span id) while ``_pinned`` is active.

    Each pinned id is handed out once, so a span processor that starts a span
    of its own during ``on_start`` still gets a fresh id.
    """

    def __init__(self, fallback: IdGenerator | None = None) -> None:
        self.fallback = fallback or RandomIdGenerator()

    def generate_span_id(self) -> int:
        pin = _pin.get()
        if pin is not None and not pin.span_used:
            pin.span_used = True
            return pin.span_id
        return self.fallback.generate_span_id()

    def generate_trace_id(self) -> int:
        pin = _pin.get()
        if pin is not None and not pin.trace_used:
            pin.trace_used = True
            return pin.trace_id
        return self.fallback.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return self.fallback.is_trace_id_random()


@contextmanager
def _pinned(trace_id: int, span_id: int) -> Iterator[None]:
    token = _pin.set(_Pin(trace_id, span_id))
    try:
        yield
    finally:
        _pin.reset(token)


def ensure_pinned_ids(provider: Any) -> None:
    """Make an SDK provider's tracers able to emit pre-allocated run spans."""
    if isinstance(provider, SDKTracerProvider) and not isinstance(
        provider.id_generator, PinnedIdGenerator
    ):
        provider.id_generator = PinnedIdGenerator(provider.id_generator)


# --------------------------------------------------------------------------- providers

_lock = threading.Lock()
_tracer_provider: Any = None  # None: the global provider
_tracer_cache: tuple[Any, trace.Tracer] | None = None
_meter_provider: Any = None  # None: the global provider
_instruments_owner: Any = None
_instruments: dict[str, Any] = {}


def use_tracer_provider(provider: Any | None) -> None:
    """Emit through ``provider`` instead of the global one (tests); None restores it."""
    global _tracer_provider, _tracer_cache
    with _lock:
        _tracer_provider = provider
        _tracer_cache = None


def get_tracer() -> trace.Tracer:
    global _tracer_cache
    provider = _tracer_provider or trace.get_tracer_provider()
    with _lock:
        if _tracer_cache is not None and _tracer_cache[0] is provider:
            return _tracer_cache[1]
        # Before get_tracer: an SDK tracer copies the provider's id generator.
        ensure_pinned_ids(provider)
        tracer = provider.get_tracer(INSTRUMENTATION_NAME)
        _tracer_cache = (provider, tracer)
        return tracer


def use_meter_provider(provider: Any | None) -> None:
    """Record metrics through ``provider`` instead of the global one; None restores it."""
    global _meter_provider
    with _lock:
        _meter_provider = provider


# --------------------------------------------------------------------------- helpers


def _ns(moment: datetime) -> int:
    """Exact nanoseconds since the epoch of an aware datetime."""
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise ValueError(f"span times must be timezone-aware datetimes, got {moment!r}")
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def _ms(delta: timedelta) -> int:
    return max(delta, timedelta(0)) // _ONE_MS


def _fallback_now(not_before: datetime) -> datetime:
    # A block that raised before .end()/.finish(): the injected clock is the
    # best time we have. Never before the span's start.
    from governance import time_source

    return max(time_source.now(), not_before)


def _attribute_value(value: Any) -> Any:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value // _ONE_MS
    if isinstance(value, list | tuple | set | frozenset):
        items = [_attribute_value(v) for v in value if v is not None]
        return [v if isinstance(v, str | bool | int | float) else str(v) for v in items]
    return str(value)


def otel_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attribute values OTel accepts: None dropped, enums/UUIDs/datetimes flattened."""
    return {
        str(key): _attribute_value(value)
        for key, value in (attributes or {}).items()
        if value is not None
    }


def clock_attributes(clocks_ms: Mapping[str, Any] | Any) -> dict[str, int]:
    """R6.1: ``{queue_ms, execution_ms, no_progress_ms, deadline_remaining_ms}`` →
    the ``governance.clock.*`` attribute names (a ``StageClocks`` is accepted too)."""
    if hasattr(clocks_ms, "as_millis"):
        clocks_ms = clocks_ms.as_millis()
    out = {}
    for key, value in clocks_ms.items():
        name = _CLOCK_NAME.get(key) or (key if key in CLOCK_ATTRIBUTES else None)
        if name is None:
            raise ValueError(f"unknown clock {key!r}; known clocks: {', '.join(_CLOCK_KEYS)}")
        out[name] = int(value)
    return out


def stage_outcome_attributes(
    *, outcome: str, timeout_name: str, failure_class: str
) -> dict[str, Any]:
    """A finished stage's outcome as span and metric attributes (R6.2: three
    separate facts).

    ``governance.stage.timeout`` is set only when one of the run's clocks ran
    out; the failure class of what the stage called is ``error.type`` (an
    interrupted stream is ``interrupted``, never a timeout).
    """
    attrs: dict[str, Any] = {"governance.stage.outcome": outcome}
    if timeout_name:
        attrs["governance.stage.timeout"] = timeout_name
    if failure_class:
        attrs["governance.stage.failure_class"] = failure_class
        attrs["error.type"] = failure_class
    return attrs


def _fill_clocks(attributes: dict[str, Any], computed: Mapping[str, int], where: str) -> None:
    """R6.1: every stage span carries all four clocks.

    Missing ones are computed from the span's own times when possible, else
    set to ``CLOCK_UNKNOWN`` (-1) and logged: a missing clock is a runner bug,
    not a reason to lose the span.
    """
    missing = []
    for name in CLOCK_ATTRIBUTES:
        if name in attributes:
            continue
        if name in computed:
            attributes[name] = computed[name]
        else:
            attributes[name] = CLOCK_UNKNOWN
            missing.append(name)
    if missing:
        logger.warning("%s span without clock(s) %s", where, ", ".join(missing))


def _stage_identity(run_id: Any, stage_id: Any, stage_kind: Any, span_kind: str) -> dict[str, Any]:
    return otel_attributes(
        {
            SPAN_KIND_ATTRIBUTE: span_kind,
            "governance.run_id": str(run_id),
            "governance.stage_id": str(stage_id),
            "governance.stage_kind": stage_kind,
        }
    )


def _record_failure(span: trace.Span, exc: BaseException, at: datetime) -> None:
    span.record_exception(exc, timestamp=_ns(at), escaped=True)
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__qualname__}: {exc}"[:500]))


# --------------------------------------------------------------------------- propagation


def current_carrier() -> dict[str, str]:
    """W3C TraceContext headers of the current span (empty when there is none)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier


def context_from(carrier: Mapping[str, str] | None) -> Context:
    """The context a W3C carrier describes; an empty one (a new trace) if invalid.

    Deliberately not based on the current context: a stage span must hang
    under its run span, not under whatever Celery span happens to be current.
    """
    return _PROPAGATOR.extract(dict(carrier or {}), context=Context())


def _run_span_context(carrier: Mapping[str, str] | None) -> SpanContext | None:
    span_context = trace.get_current_span(context_from(carrier)).get_span_context()
    return span_context if span_context.is_valid else None


def _new_trace_flags(trace_id: int, run_id: Any) -> trace.TraceFlags:
    """The sampled flag a new run trace gets: the provider's sampler decides.

    The flag travels in the carrier, so every stage span and every SQL or
    HTTP span under it follows this one decision (ParentBased sampling). A
    governance span is recorded (and stored) whatever the flag says; the
    flag only decides what reaches OTLP.
    """
    provider = _tracer_provider or trace.get_tracer_provider()
    sampler = getattr(provider, "sampler", None)
    if sampler is None:  # the API's no-op provider, or a non-SDK one
        return trace.TraceFlags(trace.TraceFlags.SAMPLED)
    try:
        result = sampler.should_sample(
            Context(),
            trace_id,
            RUN_SPAN_NAME,
            attributes={SPAN_KIND_ATTRIBUTE: RUN_KIND, "governance.run_id": str(run_id)},
        )
        sampled = result.decision.is_sampled()
    except Exception:
        logger.debug("sampler failed; the run trace is sampled", exc_info=True)
        sampled = True
    return trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT)


def new_run_trace(run_id: Any, *, thread_id: Any, segment_key: Any) -> dict[str, str]:
    """Allocate the run span's identity at admission; store the carrier on the run.

    The run span is a child of the current span (the API request span, if
    any) and so continues its trace; without one it starts a new trace.
    ``traceparent`` names the run span itself, so any W3C consumer of the
    carrier parents its spans under the run.
    """
    current = trace.get_current_span()
    parent = current.get_span_context()
    ids = RandomIdGenerator()
    if parent.is_valid:
        trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
    else:
        trace_id = ids.generate_trace_id()
        flags, state = _new_trace_flags(trace_id, run_id), None
    span_id = ids.generate_span_id()
    run_context = SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=flags, trace_state=state
    )
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(run_context)))
    carrier[RUN_SPAN_KEY] = format(span_id, "016x")
    carrier[PARENT_SPAN_KEY] = format(parent.span_id, "016x") if parent.is_valid else ""
    if current.is_recording():
        # The admission request is part of the run's story in the span store.
        current.set_attributes(
            otel_attributes(
                {
                    "governance.run_id": str(run_id),
                    "governance.thread_id": str(thread_id),
                    "governance.segment_key": segment_key,
                    "governance.run_span_id": carrier[RUN_SPAN_KEY],
                }
            )
        )
    return carrier


# --------------------------------------------------------------------------- spans


def note_admission_segment(segment_key: Any) -> None:
    """The admission request span names the segment the run was admitted on
    (known only once the run is written; nothing when no span records)."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(otel_attributes({"governance.segment_key": segment_key}))


def end_run_span(
    carrier: Mapping[str, str],
    *,
    run_id: Any,
    started_at: datetime,
    ended_at: datetime,
    attributes: Mapping[str, Any] | None = None,
    conversation_id: Any = None,
) -> None:
    """Emit the root ``governance.run`` span with the id allocated at admission.

    Under the latest GenAI conventions it is the ``invoke_agent {agent}`` span
    of the conversation (the thread); a run may ask several providers, so its
    provider is on its ``chat`` spans. Emitting it twice (a redelivered
    settlement) produces the same ids; the span store keeps one row.
    """
    run = _run_span_context(carrier)
    if run is None:
        logger.warning("run %s: no valid trace carrier, run span not emitted", run_id)
        return
    parent_hex = (carrier or {}).get(PARENT_SPAN_KEY) or ""
    parent_context = Context()  # never the current (Celery) span
    try:
        parent_id = int(parent_hex, 16) if parent_hex else 0
    except ValueError:
        parent_id = 0
    if parent_id:
        parent = SpanContext(
            run.trace_id,
            parent_id,
            is_remote=True,
            trace_flags=run.trace_flags,
            trace_state=run.trace_state,
        )
        parent_context = trace.set_span_in_context(NonRecordingSpan(parent), Context())
    attrs = {
        **otel_attributes(attributes),
        SPAN_KIND_ATTRIBUTE: RUN_KIND,
        "governance.run_id": str(run_id),
    }
    name = RUN_SPAN_NAME
    if _semconv.latest:
        name = f"invoke_agent {_semconv.agent_name}"
        attrs.update(
            otel_attributes(
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": _semconv.agent_name,
                    "gen_ai.conversation.id": conversation_id,
                }
            )
        )
    with _pinned(run.trace_id, run.span_id):
        span = get_tracer().start_span(
            name, context=parent_context, attributes=attrs, start_time=_ns(started_at)
        )
    got = span.get_span_context()
    if span.is_recording() and (got.trace_id, got.span_id) != (run.trace_id, run.span_id):
        logger.warning(
            "run %s: tracer provider ignores pinned ids (no PinnedIdGenerator); "
            "stage spans will not link to this run span",
            run_id,
        )
    span.end(end_time=_ns(max(ended_at, started_at)))


def record_queue_span(
    carrier: Mapping[str, str],
    *,
    run_id: Any,
    stage_id: Any,
    stage_kind: Any,
    enqueued_at: datetime,
    started_at: datetime,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """R6.1/R6.2: the time a stage spent queued, as its own span under the run."""
    attrs = {
        **_stage_identity(run_id, stage_id, stage_kind, QUEUE_KIND),
        **otel_attributes(attributes),
        SPAN_KIND_ATTRIBUTE: QUEUE_KIND,
    }
    _fill_clocks(
        attrs,
        {CLOCK_ATTRIBUTES[0]: _ms(started_at - enqueued_at), CLOCK_ATTRIBUTES[1]: 0},
        QUEUE_SPAN_NAME,
    )
    span = get_tracer().start_span(
        QUEUE_SPAN_NAME,
        context=context_from(carrier),
        attributes=attrs,
        start_time=_ns(enqueued_at),
    )
    span.end(end_time=_ns(max(started_at, enqueued_at)))


def record_approval_wait_span(
    carrier: Mapping[str, str],
    *,
    run_id: Any,
    stage_id: Any,
    tool: str,
    requested_at: datetime,
    decided_at: datetime,
    answer: str,
    decided_by: str,
) -> None:
    """R6.1: the wait for a person's answer to one call, a clock of its own:
    apart from the stage's queue and execution, and no-progress did not run."""
    attrs = {
        **_stage_identity(run_id, stage_id, "tool_call", APPROVAL_WAIT_KIND),
        SPAN_KIND_ATTRIBUTE: APPROVAL_WAIT_KIND,
        "governance.tool": tool,
        "governance.approval.answer": answer,
        "governance.approval.decided_by": decided_by,
        "governance.clock.approval_wait_ms": _ms(decided_at - requested_at),
    }
    span = get_tracer().start_span(
        APPROVAL_WAIT_SPAN_NAME,
        context=context_from(carrier),
        attributes=attrs,
        start_time=_ns(requested_at),
    )
    span.end(end_time=_ns(max(decided_at, requested_at)))


class StageSpan:
    """Handle of a ``governance.stage.execution`` span."""

    def __init__(self, span: trace.Span, started_at: datetime) -> None:
        self.span = span
        self.started_at = started_at
        self.ended = False
        self._attributes: dict[str, Any] = {}

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        attrs = otel_attributes(attributes)
        self._attributes.update(attrs)
        self.span.set_attributes(attrs)
        if attrs.get("error.type"):
            self.span.set_status(Status(StatusCode.ERROR, str(attrs["error.type"])))

    def end(self, finished_at: datetime | None = None) -> None:
        """End at ``finished_at`` (the injected clock's now when None); idempotent."""
        if self.ended:
            return
        finished_at = max(finished_at or _fallback_now(self.started_at), self.started_at)
        attrs = dict(self._attributes)
        _fill_clocks(
            attrs,
            {CLOCK_ATTRIBUTES[1]: _ms(finished_at - self.started_at)},
            EXECUTION_SPAN_NAME,
        )
        self.set_attributes({k: v for k, v in attrs.items() if k not in self._attributes})
        self.ended = True
        self.span.end(end_time=_ns(finished_at))


@contextmanager
def execution_span(
    carrier: Mapping[str, str],
    *,
    run_id: Any,
    stage_id: Any,
    stage_kind: Any,
    started_at: datetime,
    attributes: Mapping[str, Any] | None = None,
    conversation_id: Any = None,
) -> Iterator[StageSpan]:
    """R6.1: a stage's execution, child of the run span and current inside the block.

    Attempt spans opened in the block are its children (and name
    ``conversation_id``, the thread, under the latest GenAI conventions). If
    the block raises, the exception is recorded and the span still ends (at
    the injected clock's now unless ``.end()`` was called).
    """
    span = get_tracer().start_span(
        EXECUTION_SPAN_NAME,
        context=context_from(carrier),
        attributes=_stage_identity(run_id, stage_id, stage_kind, EXECUTION_KIND),
        start_time=_ns(started_at),
    )
    handle = StageSpan(span, started_at)
    if attributes:
        handle.set_attributes(attributes)
    ctx = trace.set_span_in_context(span)
    ctx = otel_context.set_value(_RUN_ID_KEY, str(run_id), ctx)
    ctx = otel_context.set_value(_STAGE_ID_KEY, str(stage_id), ctx)
    if conversation_id is not None:
        ctx = otel_context.set_value(_CONVERSATION_KEY, str(conversation_id), ctx)
    token = otel_context.attach(ctx)
    try:
        yield handle
    except BaseException as exc:
        if not handle.ended:
            _record_failure(span, exc, _fallback_now(started_at))
        raise
    finally:
        otel_context.detach(token)
        handle.end()


@contextmanager
def _current(span, handle, started_at: datetime) -> Iterator[None]:
    """``span`` is the current span inside; it ends with the block, failed if the
    block raised, unless ``handle`` ended it already."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    except BaseException as exc:
        if not handle.ended:
            at = _fallback_now(started_at)
            _record_failure(span, exc, at)
            handle.finish(at)
        raise
    finally:
        otel_context.detach(token)
        if not handle.ended:
            handle.finish(_fallback_now(started_at))


class AttemptSpan:
    """Handle of one provider attempt (a GenAI ``chat`` client span)."""

    def __init__(
        self,
        span: trace.Span,
        started_at: datetime,
        provider_id: str = "",
        metric_attributes: Mapping[str, str] | None = None,
    ) -> None:
        self.span = span
        self.started_at = started_at
        self.provider_id = provider_id
        # The GenAI metrics' attributes known at the start (operation, provider, model).
        self.metric_attributes = dict(metric_attributes or {})
        self.ended = False

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.span.set_attributes(_attempt_attributes(attributes))

    def capture(self, messages: Callable[[], tuple[Any, Any]]) -> None:
        """The prompt and the answer (``messages()``: input, output), only when
        the capture setting asks for them (latest conventions: JSON in
        ``gen_ai.input.messages``/``gen_ai.output.messages``). Not asked, nothing
        is built."""
        if _semconv.capture_content and self.span.is_recording():
            input_messages, output_messages = messages()
            self.span.set_attributes(
                {
                    "gen_ai.input.messages": json.dumps(input_messages, default=str),
                    "gen_ai.output.messages": json.dumps(output_messages, default=str),
                }
            )

    def finish(
        self,
        ended_at: datetime,
        attributes: Mapping[str, Any] | None = None,
        *,
        first_chunk_at: datetime | None = None,
    ) -> None:
        """Record the outcome and end the span; idempotent.

        ``governance.failure_class`` (or ``failure_class``) marks the span as
        an error with that class as ``error.type``. ``first_chunk_at``: when the
        streamed answer's first chunk came (time to first chunk).
        """
        if self.ended:
            return
        attrs = _attempt_attributes(attributes or {})
        failure = attrs.get("governance.failure_class")
        if failure:
            attrs.setdefault("error.type", str(failure))
            self.span.set_status(Status(StatusCode.ERROR, str(failure)))
        first_chunk_s = (
            _ms(first_chunk_at - self.started_at) / 1000 if first_chunk_at is not None else None
        )
        if _semconv.latest:
            if failure == "refusal":  # a refusal is a content filter, whatever the vendor said
                attrs["gen_ai.response.finish_reasons"] = ["content_filter"]
            elif attrs.get("gen_ai.response.finish_reasons") == [""]:
                del attrs["gen_ai.response.finish_reasons"]
            if first_chunk_s is not None:
                attrs["gen_ai.response.time_to_first_chunk"] = first_chunk_s
        self.span.set_attributes(attrs)
        self.ended = True
        ended_at = max(ended_at, self.started_at)
        self.span.end(end_time=_ns(ended_at))
        work_metrics.attempt(self.provider_id, str(failure or ""))
        self._record_genai_metrics(
            attrs, (ended_at - self.started_at).total_seconds(), first_chunk_s
        )

    def _record_genai_metrics(
        self, attrs: Mapping[str, Any], duration_s: float, first_chunk_s: float | None
    ) -> None:
        """OpenTelemetry's GenAI client metrics, with their standard attribute names,
        to the meter (OTLP) and to Prometheus (``tasks.work_metrics``)."""
        metric_attrs = dict(self.metric_attributes)
        if attrs.get("gen_ai.response.model"):
            metric_attrs["gen_ai.response.model"] = str(attrs["gen_ai.response.model"])
        with_error = {
            **metric_attrs,
            **({"error.type": str(attrs["error.type"])} if attrs.get("error.type") else {}),
        }
        _instrument(GENAI_DURATION).record(duration_s, with_error)
        tokens = {
            token_type: attrs.get(f"gen_ai.usage.{token_type}_tokens")
            for token_type in ("input", "output")
        }
        for token_type, amount in tokens.items():
            if isinstance(amount, int) and amount >= 0:
                _instrument(GENAI_TOKENS).record(
                    amount, {**metric_attrs, "gen_ai.token.type": token_type}
                )
        if first_chunk_s is not None:
            _instrument(GENAI_FIRST_CHUNK).record(first_chunk_s, metric_attrs)
        work_metrics.genai(with_error, duration_s, tokens, first_chunk_s)


def _attempt_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    attrs = otel_attributes({ATTEMPT_ATTRIBUTE_ALIASES.get(k, k): v for k, v in attributes.items()})
    reasons = attrs.get("gen_ai.response.finish_reasons")
    if isinstance(reasons, str):
        attrs["gen_ai.response.finish_reasons"] = [reasons]
    return attrs


@contextmanager
def attempt_span(
    *,
    provider_id: Any,
    kind: Any,
    model: Any,
    started_at: datetime,
    segment_key: Any,
    vendor: Any = None,
) -> Iterator[AttemptSpan]:
    """One provider attempt under the current (execution) span, GenAI semconv.

    ``vendor`` is the provider's kind (``openai``, ``anthropic``, …): the
    ``gen_ai.provider.name`` of the latest conventions; before them that name
    held the provider id, and still does without the opt-in. If the block
    raises before ``.finish()``, the exception is recorded and the span ends
    at the injected clock's now.
    """
    provider_name = (vendor or provider_id) if _semconv.latest else provider_id
    genai = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": str(provider_name),
        "gen_ai.request.model": str(model),
    }
    attrs = otel_attributes(
        {
            SPAN_KIND_ATTRIBUTE: ATTEMPT_KIND,
            **genai,
            "governance.provider.id": provider_id,
            "governance.segment_key": segment_key,
            "governance.attempt.kind": kind,
            "governance.run_id": otel_context.get_value(_RUN_ID_KEY),
            "governance.stage_id": otel_context.get_value(_STAGE_ID_KEY),
            **_conversation(),
        }
    )
    span = get_tracer().start_span(
        f"chat {model}", kind=SpanKind.CLIENT, attributes=attrs, start_time=_ns(started_at)
    )
    handle = AttemptSpan(span, started_at, str(provider_id), genai)
    with _current(span, handle, started_at):
        yield handle


def _conversation() -> dict[str, Any]:
    """``gen_ai.conversation.id`` (the thread) under the latest conventions."""
    if not _semconv.latest:
        return {}
    return {"gen_ai.conversation.id": otel_context.get_value(_CONVERSATION_KEY)}


class ToolSpan:
    """Handle of one tool call (an ``execute_tool <tool>`` span)."""

    def __init__(self, span: trace.Span, started_at: datetime) -> None:
        self.span = span
        self.started_at = started_at
        self.ended = False

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.span.set_attributes(otel_attributes(attributes))

    def finish(
        self,
        ended_at: datetime,
        *,
        effect: Any = None,
        error: Any = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """Record the effect (``succeeded``/``failed``/``refused``/``unknown``) and end;
        idempotent. ``failed`` and ``refused`` mark the span as an error."""
        if self.ended:
            return
        attrs = otel_attributes({**(attributes or {}), "governance.tool.effect": effect})
        effect_words = attrs.get("governance.tool.effect")
        if effect_words in TOOL_ERROR_EFFECTS:
            attrs.setdefault("error.type", str(effect_words))
            self.span.set_status(Status(StatusCode.ERROR, str(error or effect_words)[:500]))
        self.span.set_attributes(attrs)
        self.ended = True
        self.span.end(end_time=_ns(max(ended_at, self.started_at)))
        work_metrics.tool_call(str(effect_words or ""))


TOOL_ERROR_EFFECTS = frozenset({"failed", "refused"})


@contextmanager
def tool_span(
    *,
    tool: Any,
    started_at: datetime,
    call_id: Any = None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[ToolSpan]:
    """One tool call under the current (execution) span.

    Named and attributed after the GenAI ``execute_tool`` span (``gen_ai.tool.*``;
    ``gen_ai.operation.name`` too under the latest conventions, as before them
    it was not set). If the block raises before
    ``.finish()``, the exception is recorded and the span ends at the injected
    clock's now.
    """
    latest = (
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.type": "function", **_conversation()}
        if _semconv.latest
        else {}
    )
    attrs = otel_attributes(
        {
            **(attributes or {}),
            SPAN_KIND_ATTRIBUTE: TOOL_KIND,
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": call_id,
            **latest,
            "governance.run_id": otel_context.get_value(_RUN_ID_KEY),
            "governance.stage_id": otel_context.get_value(_STAGE_ID_KEY),
        }
    )
    span = get_tracer().start_span(
        f"execute_tool {tool}", attributes=attrs, start_time=_ns(started_at)
    )
    handle = ToolSpan(span, started_at)
    with _current(span, handle, started_at):
        yield handle


# --------------------------------------------------------------------------- metrics

COUNTERS: dict[str, tuple[str, str]] = {
    "governance.refusals": ("{refusal}", "Provider refusals, by provider and segment"),
    "governance.reprobes": ("{reprobe}", "Refusal re-probes, by provider"),
    "governance.freezes": ("{freeze}", "Provider freezes in a segment"),
    "governance.fallbacks": ("{fallback}", "Fallbacks to another provider"),
    "governance.notifications": ("{notification}", "Notifications, by severity and channel"),
}
HISTOGRAMS: dict[str, str] = {
    "governance.clock.queue": "queue_ms",
    "governance.clock.execution": "execution_ms",
}
# Queue waits run to minutes; the SDK's default buckets stop at 10 s.
CLOCK_BUCKETS_MS = (
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000,
    60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000,
)  # fmt: skip


# OpenTelemetry's GenAI client metrics (their names, units and advised buckets).
GENAI_DURATION = "gen_ai.client.operation.duration"
GENAI_TOKENS = "gen_ai.client.token.usage"
GENAI_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
GENAI_SECONDS_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
GENAI_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
GENAI_HISTOGRAMS: dict[str, tuple[str, str, tuple]] = {
    GENAI_DURATION: ("s", "GenAI operation duration", GENAI_SECONDS_BUCKETS),
    GENAI_TOKENS: ("{token}", "Number of input and output tokens used", GENAI_TOKEN_BUCKETS),
    GENAI_FIRST_CHUNK: (
        "s",
        "Time to receive the first chunk of a streamed answer",
        GENAI_SECONDS_BUCKETS,
    ),
}


def _instrument(name: str) -> Any:
    global _instruments_owner
    provider = _meter_provider or metrics.get_meter_provider()
    with _lock:
        if _instruments_owner is not provider:
            _instruments.clear()
            _instruments_owner = provider
        instrument = _instruments.get(name)
        if instrument is None:
            meter = provider.get_meter(INSTRUMENTATION_NAME)
            if name in COUNTERS:
                unit, description = COUNTERS[name]
                instrument = meter.create_counter(name, unit=unit, description=description)
            elif name in GENAI_HISTOGRAMS:
                unit, description, buckets = GENAI_HISTOGRAMS[name]
                instrument = meter.create_histogram(
                    name, unit=unit, description=description,
                    explicit_bucket_boundaries_advisory=buckets,
                )  # fmt: skip
            else:
                instrument = meter.create_histogram(
                    name,
                    unit="ms",
                    description=f"Stage {HISTOGRAMS[name][:-3]} clock (R6.1)",
                    explicit_bucket_boundaries_advisory=CLOCK_BUCKETS_MS,
                )
            _instruments[name] = instrument
        return instrument


def count(name: str, amount: int = 1, **attributes: Any) -> None:
    """Add to a governance counter (``governance.refusals`` or just ``refusals``)."""
    full = name if name.startswith("governance.") else f"governance.{name}"
    if full not in COUNTERS:
        raise ValueError(f"unknown counter {name!r}; known: {', '.join(COUNTERS)}")
    if amount < 0:
        raise ValueError("counters only go up")
    _instrument(full).add(amount, otel_attributes(attributes))
    work_metrics.count(full, amount, attributes)


def observe_clocks(stage_kind: Any, clocks_ms: Mapping[str, Any] | Any, **attributes: Any) -> None:
    """R6.1: record a finished stage's queue and execution clocks (ms)."""
    clocks = clock_attributes(clocks_ms)
    attrs = otel_attributes({"governance.stage_kind": stage_kind, **attributes})
    for name, key in HISTOGRAMS.items():
        value = clocks.get(_CLOCK_NAME[key])
        if value is not None and value >= 0:
            _instrument(name).record(value, attrs)
    if isinstance(clocks_ms, Mapping):
        timeout = str(attributes.get("governance.stage.timeout") or "")
        work_metrics.stage_clocks(str(stage_kind), clocks_ms, timeout)


__all__ = [
    "CLOCK_ATTRIBUTES",
    "GOVERNANCE_SPAN_KINDS",
    "SPAN_KIND_ATTRIBUTE",
    "AttemptSpan",
    "PinnedIdGenerator",
    "Semconv",
    "StageSpan",
    "ToolSpan",
    "attempt_span",
    "clock_attributes",
    "context_from",
    "count",
    "current_carrier",
    "current_semconv",
    "end_run_span",
    "execution_span",
    "get_tracer",
    "is_governance_span",
    "new_run_trace",
    "observe_clocks",
    "record_queue_span",
    "semconv_from",
    "stage_outcome_attributes",
    "stored_in_span_store",
    "tool_span",
    "use_meter_provider",
    "use_semconv",
    "use_tracer_provider",
]
