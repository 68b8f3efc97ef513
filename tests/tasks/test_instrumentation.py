"""Run traces (R6.1, R6.2): one root span per run, stage spans with four clocks,
GenAI attempt spans, and governance metrics.

The times are from a clock far from wall time, as the injected clock may be.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from governance import time_source
from governance.rules.run_clocks import StageClocks
from tasks import instrumentation
from tasks.instrumentation import (
    CLOCK_ATTRIBUTES,
    attempt_span,
    clock_attributes,
    context_from,
    count,
    current_carrier,
    end_run_span,
    execution_span,
    new_run_trace,
    observe_clocks,
    record_queue_span,
)

RUN_ID = "6f1c2a4e-0d5b-4c89-9a57-3e2f1b0c7d11"
T0 = datetime(2041, 3, 5, 12, 0, tzinfo=UTC)  # far from wall time on purpose


def ns(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1) * 1000


def clocks(queue=0, execution=0, no_progress=0, deadline_remaining=600_000) -> dict:
    return clock_attributes(
        {
            "queue_ms": queue,
            "execution_ms": execution,
            "no_progress_ms": no_progress,
            "deadline_remaining_ms": deadline_remaining,
        }
    )


@pytest.fixture
def spans(span_exporter):
    return span_exporter


@pytest.fixture
def metric_reader():
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrumentation.use_meter_provider(provider)
    yield reader
    instrumentation.use_meter_provider(None)
    provider.shutdown()


@pytest.fixture
def manual_clock():
    manual = time_source.ManualClock(T0)
    time_source.install(manual)
    yield manual
    time_source.install(None)


def by_name(exporter, name):
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert found, f"no {name!r} in {[s.name for s in exporter.get_finished_spans()]}"
    return found


def run_one_stage(carrier, *, enqueued_at, started_at, finished_at, stage_id="st-1"):
    queue_ms = (started_at - enqueued_at) // timedelta(milliseconds=1)
    exec_ms = (finished_at - started_at) // timedelta(milliseconds=1)
    record_queue_span(
        carrier,
        run_id=RUN_ID,
        stage_id=stage_id,
        stage_kind="model_turn",
        enqueued_at=enqueued_at,
        started_at=started_at,
        attributes=clocks(queue=queue_ms, no_progress=queue_ms),
    )
    with execution_span(
        carrier, run_id=RUN_ID, stage_id=stage_id, stage_kind="model_turn", started_at=started_at
    ) as stage:
        with attempt_span(
            provider_id="openai",
            kind="primary",
            model="gpt-4o",
            started_at=started_at,
            segment_key="tenant-a/general",
        ) as attempt:
            attempt.finish(
                finished_at,
                {
                    "finish_reasons": ["stop"],
                    "input_tokens": 120,
                    "output_tokens": 45,
                    "refusal_verdict": "none",
                    "reprobes": 0,
                },
            )
        stage.set_attributes(clocks(queue=queue_ms, execution=exec_ms))
        stage.end(finished_at)


def test_r6_1_run_root_span_has_the_id_allocated_at_admission(spans):
    """R6.1: the root governance.run span is emitted at settlement with the span id
    stored on the run at admission; every stage span recorded earlier is its child."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="tenant-a/general")
    assert set(carrier) >= {"traceparent", "run_span_id"}
    assert carrier["traceparent"].split("-")[2] == carrier["run_span_id"]

    run_one_stage(
        carrier,
        enqueued_at=T0,
        started_at=T0 + timedelta(seconds=1),
        finished_at=T0 + timedelta(seconds=3),
    )
    # Stage spans are recorded before the run span exists.
    assert [s.name for s in spans.get_finished_spans()].count("governance.run") == 0
    end_run_span(
        carrier,
        run_id=RUN_ID,
        started_at=T0,
        ended_at=T0 + timedelta(seconds=4),
        attributes={"governance.settlement.outcome": "completed"},
    )

    (run,) = by_name(spans, "governance.run")
    assert format(run.context.span_id, "016x") == carrier["run_span_id"]
    assert run.parent is None  # no request span at admission: a new trace
    assert run.start_time == ns(T0)
    assert run.end_time == ns(T0 + timedelta(seconds=4))
    assert run.attributes["governance.run_id"] == RUN_ID
    assert run.attributes["governance.settlement.outcome"] == "completed"

    (queue,) = by_name(spans, "governance.stage.queue")
    (execution,) = by_name(spans, "governance.stage.execution")
    for stage in (queue, execution):
        assert stage.context.trace_id == run.context.trace_id
        assert stage.parent.span_id == run.context.span_id
        assert stage.attributes["governance.run_id"] == RUN_ID
        assert stage.attributes["governance.stage_kind"] == "model_turn"
    (attempt,) = by_name(spans, "chat gpt-4o")
    assert attempt.parent.span_id == execution.context.span_id
    assert attempt.context.trace_id == run.context.trace_id


def test_r6_1_admission_continues_the_api_request_trace(spans):
    """R6.1: a run admitted inside an API request span continues that trace; the run
    span's parent is the request span."""
    tracer = instrumentation.get_tracer()
    with tracer.start_as_current_span("POST /api/runs", kind=SpanKind.SERVER) as request:
        carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="tenant-a/general")
    request_ctx = request.get_span_context()
    assert carrier["traceparent"].split("-")[1] == format(request_ctx.trace_id, "032x")
    assert carrier["run_span_id"] != format(request_ctx.span_id, "016x")

    end_run_span(carrier, run_id=RUN_ID, started_at=T0, ended_at=T0 + timedelta(seconds=9))
    (run,) = by_name(spans, "governance.run")
    assert run.context.trace_id == request_ctx.trace_id
    assert run.parent.span_id == request_ctx.span_id
    (request_span,) = by_name(spans, "POST /api/runs")
    # The request span is tagged so the span store files it under the run.
    assert request_span.attributes["governance.run_id"] == RUN_ID
    assert request_span.attributes["governance.run_span_id"] == carrier["run_span_id"]


def test_r6_1_every_stage_span_carries_the_four_clocks(spans):
    """R6.1: queue and execution spans both carry queue, execution, no-progress and
    deadline-remaining clocks."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    run_one_stage(
        carrier,
        enqueued_at=T0,
        started_at=T0 + timedelta(seconds=2),
        finished_at=T0 + timedelta(seconds=5),
    )
    for name in ("governance.stage.queue", "governance.stage.execution"):
        (stage,) = by_name(spans, name)
        assert set(CLOCK_ATTRIBUTES) <= set(stage.attributes), name
    (execution,) = by_name(spans, "governance.stage.execution")
    assert execution.attributes["governance.clock.queue_ms"] == 2000
    assert execution.attributes["governance.clock.execution_ms"] == 3000
    assert execution.attributes["governance.clock.deadline_remaining_ms"] == 600_000


def test_r6_1_missing_clocks_are_filled_not_lost(spans):
    """R6.1: a stage span recorded without clocks still carries all four: the ones its
    own times give are computed, the rest are -1 (unknown)."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    record_queue_span(
        carrier,
        run_id=RUN_ID,
        stage_id="st-9",
        stage_kind="tool_call",
        enqueued_at=T0,
        started_at=T0 + timedelta(milliseconds=1500),
    )
    with execution_span(
        carrier, run_id=RUN_ID, stage_id="st-9", stage_kind="tool_call", started_at=T0
    ) as stage:
        stage.end(T0 + timedelta(milliseconds=250))
    (queue,) = by_name(spans, "governance.stage.queue")
    assert queue.attributes["governance.clock.queue_ms"] == 1500
    assert queue.attributes["governance.clock.execution_ms"] == 0
    assert queue.attributes["governance.clock.no_progress_ms"] == -1
    (execution,) = by_name(spans, "governance.stage.execution")
    assert execution.attributes["governance.clock.execution_ms"] == 250
    assert execution.attributes["governance.clock.deadline_remaining_ms"] == -1


def test_r6_2_queued_then_fast_stage_shows_long_queue_short_execution(spans):
    """R6.2: 90 s spent queued is a long queue span, not execution time: the
    execution span of a fast stage stays short."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    enqueued = T0
    started = T0 + timedelta(seconds=90)
    finished = started + timedelta(milliseconds=200)
    run_one_stage(carrier, enqueued_at=enqueued, started_at=started, finished_at=finished)

    (queue,) = by_name(spans, "governance.stage.queue")
    (execution,) = by_name(spans, "governance.stage.execution")
    assert (queue.start_time, queue.end_time) == (ns(enqueued), ns(started))
    assert (execution.start_time, execution.end_time) == (ns(started), ns(finished))
    assert queue.end_time - queue.start_time == 90 * 10**9
    assert execution.end_time - execution.start_time == 200 * 10**6
    assert queue.attributes["governance.clock.queue_ms"] == 90_000
    assert execution.attributes["governance.clock.execution_ms"] == 200


def test_r6_1_attempt_span_has_genai_and_governance_attributes(spans):
    """R6.1: an attempt span follows the GenAI conventions and carries our refusal,
    failure class and attempt kind, plus the run it belongs to."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    started = T0 + timedelta(seconds=1)
    with execution_span(
        carrier, run_id=RUN_ID, stage_id="st-2", stage_kind="model_turn", started_at=started
    ) as stage:
        with attempt_span(
            provider_id="anthropic",
            kind="reprobe",
            model="claude-x",
            started_at=started,
            segment_key="tenant-b/medical",
        ) as attempt:
            attempt.finish(
                started + timedelta(seconds=2),
                {
                    "gen_ai.response.finish_reasons": "content_filter",
                    "gen_ai.usage.input_tokens": 900,
                    "gen_ai.usage.output_tokens": 3,
                    "governance.refusal.verdict": "refused",
                    "governance.refusal.reprobes": 1,
                    "governance.failure_class": "refusal",
                },
            )
        stage.end(started + timedelta(seconds=2))

    (span,) = by_name(spans, "chat claude-x")
    attrs = span.attributes
    assert span.kind is SpanKind.CLIENT
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "anthropic"
    assert attrs["gen_ai.request.model"] == "claude-x"
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("content_filter",)
    assert attrs["gen_ai.usage.input_tokens"] == 900
    assert attrs["gen_ai.usage.output_tokens"] == 3
    assert attrs["governance.segment_key"] == "tenant-b/medical"
    assert attrs["governance.refusal.verdict"] == "refused"
    assert attrs["governance.refusal.reprobes"] == 1
    assert attrs["governance.failure_class"] == "refusal"
    assert attrs["governance.attempt.kind"] == "reprobe"
    assert attrs["governance.run_id"] == RUN_ID
    assert attrs["error.type"] == "refusal"
    assert span.status.status_code is StatusCode.ERROR
    assert span.end_time - span.start_time == 2 * 10**9


def test_r6_2_failing_stage_records_the_exception_and_still_ends(spans, manual_clock):
    """R6.2: an exception inside the execution block is recorded on the span, which
    still ends (at the injected clock's now) and re-raises to the caller."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    manual_clock.set(T0 + timedelta(seconds=7))
    with (
        pytest.raises(RuntimeError, match="adapter blew up"),
        execution_span(
            carrier, run_id=RUN_ID, stage_id="st-3", stage_kind="model_turn", started_at=T0
        ) as stage,
    ):
        # Clocks known at the start; execution_ms is only known at the end.
        stage.set_attributes(
            clock_attributes({"queue_ms": 5, "no_progress_ms": 5, "deadline_remaining_ms": 9})
        )
        with attempt_span(
            provider_id="openai", kind="primary", model="m", started_at=T0, segment_key="seg"
        ):
            raise RuntimeError("adapter blew up")

    (execution,) = by_name(spans, "governance.stage.execution")
    (attempt,) = by_name(spans, "chat m")
    for span in (execution, attempt):
        assert span.status.status_code is StatusCode.ERROR
        assert span.end_time == ns(T0 + timedelta(seconds=7))
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes["exception.message"] == "adapter blew up"
    assert attempt.parent.span_id == execution.context.span_id
    assert execution.attributes["governance.clock.execution_ms"] == 7000


def test_r6_1_execution_span_is_current_only_inside_the_block(spans):
    """R6.1: inside the block the execution span is current (carrier names it);
    after it the caller's context is restored."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    assert current_carrier() == {}
    with execution_span(
        carrier, run_id=RUN_ID, stage_id="st-4", stage_kind="finalization", started_at=T0
    ) as stage:
        inner = current_carrier()
        stage.end(T0 + timedelta(seconds=1))
    assert current_carrier() == {}
    (execution,) = by_name(spans, "governance.stage.execution")
    assert inner["traceparent"].split("-")[2] == format(execution.context.span_id, "016x")


def test_r6_1_context_from_ignores_the_current_span_and_bad_carriers(spans):
    """R6.1: a stage span hangs under the run named by the carrier, never under
    whatever span is current; an invalid carrier gives a fresh root."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    tracer = instrumentation.get_tracer()
    with tracer.start_as_current_span("celery.run"):
        record_queue_span(
            carrier,
            run_id=RUN_ID,
            stage_id="st-5",
            stage_kind="model_turn",
            enqueued_at=T0,
            started_at=T0,
            attributes=clocks(),
        )
        assert not context_from({"traceparent": "garbage"})
    (queue,) = by_name(spans, "governance.stage.queue")
    assert format(queue.parent.span_id, "016x") == carrier["run_span_id"]


def test_r6_1_end_run_span_twice_emits_identical_ids(spans):
    """R6.1: a redelivered settlement re-emits the same run span identity (the span
    store then keeps one row)."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    for _ in range(2):
        end_run_span(carrier, run_id=RUN_ID, started_at=T0, ended_at=T0 + timedelta(seconds=1))
    first, second = by_name(spans, "governance.run")
    assert first.context.span_id == second.context.span_id
    assert first.context.trace_id == second.context.trace_id
    # The pin is used up: an ordinary span afterwards gets a fresh id.
    with instrumentation.get_tracer().start_as_current_span("later") as later:
        pass
    assert later.get_span_context().span_id != first.context.span_id


def test_r6_1_clock_attributes_maps_names_and_rejects_unknown_clocks():
    """R6.1: the four clock keys map to governance.clock.* names; StageClocks works
    directly; a typo is an error."""
    stage = StageClocks(
        queue=timedelta(seconds=1),
        execution=timedelta(milliseconds=2500),
        no_progress=timedelta(seconds=4),
        deadline_remaining=timedelta(minutes=1),
    )
    assert clock_attributes(stage) == {
        "governance.clock.queue_ms": 1000,
        "governance.clock.execution_ms": 2500,
        "governance.clock.no_progress_ms": 4000,
        "governance.clock.deadline_remaining_ms": 60_000,
    }
    assert tuple(clock_attributes(stage)) == CLOCK_ATTRIBUTES
    with pytest.raises(ValueError, match="queue_wait_ms"):
        clock_attributes({"queue_wait_ms": 1})


def _points(reader):
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = (metric.unit, list(metric.data.data_points))
    return out


def test_r6_1_metrics_count_events_and_observe_stage_clocks(metric_reader):
    """R6.1: counters for refusals, re-probes, freezes, fallbacks and notifications;
    histograms of the queue and execution clocks in ms."""
    count("governance.refusals", provider="openai", segment="tenant-a/general")
    count("refusals", provider="openai", segment="tenant-a/general")
    count("governance.reprobes", provider="openai")
    count("governance.freezes", provider="openai")
    count("governance.fallbacks", 3, provider="anthropic")
    count("governance.notifications", severity="critical")
    observe_clocks("model_turn", {"queue_ms": 90_000, "execution_ms": 200})
    observe_clocks("model_turn", clocks(queue=10, execution=800))
    with pytest.raises(ValueError):
        count("governance.refusal")

    points = _points(metric_reader)
    (refusals,) = points["governance.refusals"][1]
    assert refusals.value == 2
    assert dict(refusals.attributes) == {"provider": "openai", "segment": "tenant-a/general"}
    assert points["governance.fallbacks"][1][0].value == 3
    assert dict(points["governance.notifications"][1][0].attributes) == {"severity": "critical"}
    for name in ("governance.reprobes", "governance.freezes"):
        assert points[name][1][0].value == 1
    unit, (queue,) = points["governance.clock.queue"]
    assert unit == "ms"
    assert (queue.count, queue.sum) == (2, 90_010)
    assert dict(queue.attributes) == {"governance.stage_kind": "model_turn"}
    unit, (execution,) = points["governance.clock.execution"]
    assert (unit, execution.count, execution.sum) == ("ms", 2, 1000)


def test_r6_1_naive_times_are_refused(spans):
    """R6.1: span times must be aware datetimes (a naive one would shift the clocks)."""
    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    with pytest.raises(ValueError, match="timezone-aware"):
        end_run_span(carrier, run_id=RUN_ID, started_at=datetime(2041, 1, 1), ended_at=T0)


# --------------------------------------------------------------------------- what the store keeps


class _SeeingSampler:
    """Records the attributes each span has when the sampler is asked."""

    def __init__(self):
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        self.inner = ALWAYS_ON
        self.seen: dict[str, dict] = {}

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, *rest):
        self.seen[name] = dict(attributes or {})
        return self.inner.should_sample(parent_context, trace_id, name, kind, attributes, *rest)

    def get_description(self):
        return "seeing"


def test_r6_1_every_governance_span_is_marked_from_its_start():
    """R6.1: run, queue, execution, attempt, tool and approval-wait spans carry
    governance.span.kind (a closed set) and the run id when they START, so the
    sampler and the span store decide by that mark, never by a name. The store
    keeps all of them but the queue span (the Stage row holds its interval)."""
    from tasks.instrumentation import (
        GOVERNANCE_SPAN_KINDS,
        QUEUE_KIND,
        SPAN_KIND_ATTRIBUTE,
        STORED_SPAN_KINDS,
        is_governance_span,
        stored_in_span_store,
        tool_span,
    )

    sampler = _SeeingSampler()
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentation.use_tracer_provider(provider)
    try:
        carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
        started = T0 + timedelta(seconds=1)
        record_queue_span(
            carrier,
            run_id=RUN_ID,
            stage_id="st-1",
            stage_kind="tool_call",
            enqueued_at=T0,
            started_at=started,
            attributes={**clocks(), SPAN_KIND_ATTRIBUTE: "not-a-kind"},
        )
        with execution_span(
            carrier, run_id=RUN_ID, stage_id="st-1", stage_kind="tool_call", started_at=started
        ) as stage:
            with attempt_span(
                provider_id="p", kind="primary", model="m", started_at=started, segment_key="s"
            ) as attempt:
                attempt.finish(started)
            with tool_span(tool="calculator", call_id="c-1", started_at=started) as tool:
                tool.finish(started + timedelta(seconds=1), effect="succeeded")
            stage.end(started + timedelta(seconds=2))
        instrumentation.record_approval_wait_span(
            carrier, run_id=RUN_ID, stage_id="st-2", tool="notify", requested_at=started,
            decided_at=started + timedelta(minutes=3), answer="approved", decided_by="olga",
        )  # fmt: skip
        end_run_span(carrier, run_id=RUN_ID, started_at=T0, ended_at=T0 + timedelta(seconds=4))
        with instrumentation.get_tracer().start_as_current_span("SELECT"):
            pass
    finally:
        instrumentation.use_tracer_provider(None)
        provider.shutdown()

    expected = {
        "governance.run": "run",
        "governance.stage.queue": "stage.queue",
        "governance.stage.execution": "stage.execution",
        "chat m": "attempt",
        "execute_tool calculator": "tool",
        "governance.approval.wait": "approval.wait",
    }
    assert set(expected.values()) == GOVERNANCE_SPAN_KINDS
    assert QUEUE_KIND == "stage.queue"
    assert set(expected.values()) - {"stage.queue"} == STORED_SPAN_KINDS
    for name, kind in expected.items():
        assert sampler.seen[name][SPAN_KIND_ATTRIBUTE] == kind, name
        assert is_governance_span(sampler.seen[name])
    finished = {s.name: s for s in exporter.get_finished_spans()}
    for name, kind in expected.items():
        # Recorded and marked like the rest; only the store leaves the queue span out.
        assert stored_in_span_store(finished[name].attributes) == (kind != "stage.queue"), name
        assert finished[name].attributes["governance.run_id"] == RUN_ID
    assert finished["governance.stage.queue"].attributes[SPAN_KIND_ATTRIBUTE] == "stage.queue"
    assert not is_governance_span(sampler.seen["SELECT"])
    assert not stored_in_span_store(finished["SELECT"].attributes)
    # A mark without a run, or an unknown kind, is not the store's.
    assert not stored_in_span_store({SPAN_KIND_ATTRIBUTE: "attempt"})
    assert not stored_in_span_store({SPAN_KIND_ATTRIBUTE: "sql", "governance.run_id": RUN_ID})


def test_r6_1_tool_span_is_a_child_of_the_execution_span_with_its_effect(spans, manual_clock):
    """R6.1: a tool call is an ``execute_tool <tool>`` span under the execution
    span; a failed or refused effect is an error, an exception is recorded."""
    from tasks.instrumentation import tool_span

    carrier = new_run_trace(RUN_ID, thread_id="th-1", segment_key="seg")
    manual_clock.set(T0 + timedelta(seconds=9))
    with execution_span(
        carrier, run_id=RUN_ID, stage_id="st-7", stage_kind="tool_call", started_at=T0
    ) as stage:
        with tool_span(tool="kb_search", call_id="c-2", started_at=T0) as tool:
            tool.finish(T0 + timedelta(seconds=1), effect="refused", error="quota used up")
        with (
            pytest.raises(RuntimeError, match="tool blew up"),
            tool_span(tool="webhook", started_at=T0 + timedelta(seconds=1)),
        ):
            raise RuntimeError("tool blew up")
        with tool_span(tool="calculator", call_id="c-3", started_at=T0) as tool:
            tool.finish(T0 + timedelta(seconds=2), effect="succeeded")
        stage.end(T0 + timedelta(seconds=3))

    (execution,) = by_name(spans, "governance.stage.execution")
    (refused,) = by_name(spans, "execute_tool kb_search")
    (crashed,) = by_name(spans, "execute_tool webhook")
    (fine,) = by_name(spans, "execute_tool calculator")
    for span in (refused, crashed, fine):
        assert span.parent.span_id == execution.context.span_id
        assert span.attributes["governance.run_id"] == RUN_ID
        assert span.attributes["governance.stage_id"] == "st-7"
        # The run page draws gen_ai.operation.name spans as provider attempts.
        assert "gen_ai.operation.name" not in span.attributes
    assert refused.attributes["gen_ai.tool.name"] == "kb_search"
    assert refused.attributes["gen_ai.tool.call.id"] == "c-2"
    assert refused.attributes["governance.tool.effect"] == "refused"
    assert refused.attributes["error.type"] == "refused"
    assert refused.status.status_code is StatusCode.ERROR
    assert refused.status.description == "quota used up"
    assert crashed.status.status_code is StatusCode.ERROR
    assert crashed.end_time == ns(T0 + timedelta(seconds=9))
    assert [e.name for e in crashed.events] == ["exception"]
    assert fine.status.status_code is StatusCode.UNSET
    assert fine.end_time - fine.start_time == 2 * 10**9
