"""A run's spans against OpenTelemetry's GenAI conventions (R6.1), with and
without ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``.

One run on the real stage path: the first provider refuses (R3.1's ladder),
the second calls the calculator, then answers. Without the opt-in the names
emitted before stay; with it the run is an ``invoke_agent`` span, every GenAI
span names the conversation (the thread), a refusal's finish reason is
``content_filter`` and an answer's time to first chunk is there. Contents are
in no span unless the capture setting asks for them.
"""

from __future__ import annotations

import json

import pytest
from opentelemetry.trace import SpanKind

from tasks import instrumentation
from tasks.instrumentation import CLOCK_ATTRIBUTES, SPAN_KIND_ATTRIBUTE, semconv_from

pytestmark = pytest.mark.django_db(transaction=True)

SECRET_WORDS = "the launch code is 0000"
REFUSES = {"default": {"refuse": {"category": "policy"}}}
CALLS_THEN_ANSWERS = {
    "rules": [
        {
            "when": {"last_role_not": "tool", "has_tool": "calculator"},
            "tool_call": {"name": "calculator", "arguments": {"expression": "6*7"}},
        }
    ],
    "default": {"answer": {"text": "It is 42.", "chunks": 2}},
}
CONTENT_ATTRIBUTES = {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.prompt"}


@pytest.fixture
def conventions():
    """Set the conventions as the two standard settings would; restored after."""
    previous = instrumentation.current_semconv()

    def use(opt_in: str, capture: str = "") -> None:
        instrumentation.use_semconv(semconv_from(opt_in, capture, "agent-governance"))

    yield use
    instrumentation.use_semconv(previous)


def one_run(api, scripted_provider, span_exporter) -> tuple[dict, dict]:
    scripted_provider("shy", REFUSES)
    scripted_provider("able", CALLS_THEN_ANSWERS)
    thread = api.post(
        "/api/v1/threads",
        {"provider_chain": ["shy", "able"], "tool_surface": ["calculator"]},
        expect=201,
    ).json()
    run = api.run_and_wait(thread["id"], f"What is six times seven? ({SECRET_WORDS})")
    assert run["settlement"]["outcome"] == "completed", run["settlement"]
    return thread, {"spans": span_exporter.get_finished_spans()}


def of_kind(spans, kind: str) -> list:
    return [s for s in spans if s.attributes.get(SPAN_KIND_ATTRIBUTE) == kind]


def test_r6_1_without_the_opt_in_the_names_emitted_before_stay(
    api, worker, manual_clock, scripted_provider, span_exporter, conventions
):
    conventions("")
    thread, found = one_run(api, scripted_provider, span_exporter)
    spans = found["spans"]
    (run_span,) = of_kind(spans, "run")
    assert run_span.name == "governance.run"
    assert "gen_ai.operation.name" not in run_span.attributes
    attempts = of_kind(spans, "attempt")
    assert {s.attributes["gen_ai.provider.name"] for s in attempts} == {"shy", "able"}
    assert all(s.name == f"chat {s.attributes['gen_ai.request.model']}" for s in attempts)
    assert all(s.kind is SpanKind.CLIENT for s in attempts)
    assert not any("gen_ai.conversation.id" in s.attributes for s in spans)
    refused = [s for s in attempts if s.attributes.get("governance.failure_class") == "refusal"]
    assert len(refused) == 1  # R3.1: no increment to quarantine; then cooling (R3.2)
    assert not any("gen_ai.response.time_to_first_chunk" in s.attributes for s in attempts)
    (tool,) = of_kind(spans, "tool")
    assert tool.name == "execute_tool calculator"
    assert tool.attributes["gen_ai.tool.name"] == "calculator"
    assert "gen_ai.operation.name" not in tool.attributes
    assert not any(CONTENT_ATTRIBUTES & set(s.attributes) for s in spans)
    assert str(thread["id"]) not in {str(v) for s in attempts for v in s.attributes.values()}


def test_r6_1_with_the_opt_in_spans_speak_the_latest_genai_conventions(
    api, worker, manual_clock, scripted_provider, span_exporter, conventions
):
    conventions("http,gen_ai_latest_experimental")
    thread, found = one_run(api, scripted_provider, span_exporter)
    spans = found["spans"]
    conversation = str(thread["id"])

    (run_span,) = of_kind(spans, "run")
    assert run_span.name == "invoke_agent agent-governance"
    assert run_span.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run_span.attributes["gen_ai.agent.name"] == "agent-governance"
    assert run_span.attributes["gen_ai.conversation.id"] == conversation
    assert run_span.attributes["governance.settlement"] == "completed"  # ours stay beside

    attempts = of_kind(spans, "attempt")
    assert {s.attributes["governance.provider.id"] for s in attempts} == {"shy", "able"}
    for attempt in attempts:
        assert attempt.name == f"chat {attempt.attributes['gen_ai.request.model']}"
        assert attempt.attributes["gen_ai.operation.name"] == "chat"
        assert attempt.attributes["gen_ai.provider.name"] == "scripted"  # the vendor
        assert attempt.attributes["gen_ai.conversation.id"] == conversation
        assert attempt.attributes["governance.segment_key"]
    refused = [s for s in attempts if s.attributes["governance.provider.id"] == "shy"]
    assert len(refused) == 1  # R3.1: no increment to quarantine; then cooling (R3.2)
    assert all(
        s.attributes["gen_ai.response.finish_reasons"] == ("content_filter",) for s in refused
    )
    answered = [s for s in attempts if s.attributes["governance.provider.id"] == "able"]
    assert answered and all(
        s.attributes["gen_ai.response.time_to_first_chunk"] >= 0 for s in answered
    )
    assert all(s.attributes["gen_ai.response.finish_reasons"] != ("",) for s in answered)

    (tool,) = of_kind(spans, "tool")
    assert tool.name == "execute_tool calculator"
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.type"] == "function"
    assert tool.attributes["gen_ai.conversation.id"] == conversation

    for stage in of_kind(spans, "stage.execution"):
        assert set(CLOCK_ATTRIBUTES) <= set(stage.attributes)  # R6.1 beside the conventions
    assert not any(CONTENT_ATTRIBUTES & set(s.attributes) for s in spans)


def test_r6_1_contents_only_when_the_capture_setting_asks(
    api, worker, manual_clock, scripted_provider, span_exporter, conventions
):
    conventions("gen_ai_latest_experimental", capture="SPAN_ONLY")
    _thread, found = one_run(api, scripted_provider, span_exporter)
    answered = [
        s
        for s in of_kind(found["spans"], "attempt")
        if s.attributes["governance.provider.id"] == "able"
    ]
    sent = json.loads(answered[0].attributes["gen_ai.input.messages"])
    assert any(SECRET_WORDS in str(m.get("content")) for m in sent)
    said = [json.loads(s.attributes["gen_ai.output.messages"]) for s in answered]
    assert any("42" in str(m[0]["content"]) for m in said)


def test_r6_1_the_capture_setting_alone_changes_nothing():
    """Contents are a latest-conventions attribute: without the opt-in they stay out."""
    assert not semconv_from("", "true", "a").capture_content
    assert semconv_from("gen_ai_latest_experimental", "true", "a").capture_content
    assert not semconv_from("gen_ai_latest_experimental", "NO_CONTENT", "a").capture_content
    assert semconv_from(" http , gen_ai_latest_experimental ", "", "a").latest
    assert not semconv_from("gen_ai_latest", "", "a").latest
