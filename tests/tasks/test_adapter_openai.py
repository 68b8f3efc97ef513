"""The OpenAI-compatible adapter against a real loopback server speaking the
Chat Completions streaming wire format (R2.1, R2.2, R2.4, R6.1, R6.2)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import httpx
import pytest

from tasks.adapters import INVALID_ARGUMENTS_KEY, AdjustableClock, call_provider
from tasks.adapters.base import (
    CallLimits,
    ChatMessage,
    ProviderConfig,
    ProviderRequest,
    ToolCall,
    ToolSpec,
)
from tests.tasks.test_adapter_wire import (
    LIMITS,
    Reply,
    WireServer,
    advance_on_heartbeat,
    classify,
    json_reply,
    kinds,
    refused_url,
    sse,
    start,
    user,
)


@pytest.fixture
def wire():
    with WireServer() as server:
        yield server


KEEP_ALIVE = b": keep-alive\n\n"
DONE = sse("[DONE]")


def chunk(delta=None, finish=None, **extra) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "gpt-test-2025",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    body.update(extra)
    return sse(body)


def usage_chunk(prompt: int, completion: int) -> bytes:
    return sse(
        {
            "id": "chatcmpl-1",
            "model": "gpt-test-2025",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    )


def config(url: str, **kw) -> ProviderConfig:
    return ProviderConfig("oa", "openai", "gpt-test", base_url=url, api_key="sk-test", **kw)


def call(url: str, request=None, *, clock=None, limits=LIMITS, on_event=None, **kw):
    clock = clock or AdjustableClock(start())
    response = call_provider(
        config(url, **kw),
        request or user("hello"),
        limits=limits,
        clock=clock,
        on_event=on_event,
    )
    return response, clock


def error_body(code, message="nope", kind="invalid_request_error") -> dict:
    return {"error": {"code": code, "type": kind, "message": message, "param": None}}


# --------------------------------------------------------------------------- success


def _answer_chunks() -> list[bytes]:
    return [chunk({"role": "assistant", "content": "Hi"}), chunk({}, finish="stop"), DONE]


def test_a_finished_answer_whose_body_has_arrived_keeps_the_connection_for_the_next(wire):
    """A stream sent with a Content-Length ends with [DONE]: its end is read, so a
    shared transport sends the next attempt on the same connection."""
    wire.reply(Reply(body=b"".join(_answer_chunks())))
    transport = httpx.HTTPTransport(retries=0)
    try:
        for _ in range(3):
            response = call_provider(
                config(wire.url), user("hello"), limits=LIMITS,
                clock=AdjustableClock(start()), transport=transport,
            )  # fmt: skip
            assert response.text == "Hi" and response.error == ""
    finally:
        transport.close()
    assert len(wire.received) == 3
    assert wire.connections == 1


def test_a_finished_answer_never_waits_for_a_chunked_stream_to_end(wire):
    """After [DONE] a chunked stream that keeps writing is not read to its end:
    the answer is complete, and that connection is given up instead."""
    wire.reply(Reply(chunks=_answer_chunks(), repeat=KEEP_ALIVE, delay_s=0.05, repeat_max=400))
    transport = httpx.HTTPTransport(retries=0)
    began = time.monotonic()
    try:
        response = call_provider(
            config(wire.url), user("hello"), limits=LIMITS,
            clock=AdjustableClock(start()), transport=transport,
        )  # fmt: skip
    finally:
        transport.close()
    assert response.text == "Hi" and response.error == "" and response.finish_reason == "stop"
    assert time.monotonic() - began < 10  # the server goes on for 20 s


def test_r2_1_openai_streamed_answer_with_usage_is_a_success(wire):
    """R2.1: a complete stream (content, finish_reason, usage chunk, [DONE]) is no failure."""
    wire.reply(
        Reply(
            chunks=[
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hello"}),
                chunk({"content": ", world"}),
                chunk({}, finish="stop"),
                usage_chunk(12, 3),
                DONE,
            ]
        )
    )
    seen = []
    response, clock = call(wire.url, on_event=seen.append)
    assert response.text == "Hello, world"
    assert response.finish_reason == "stop"
    assert response.usage == {"input_tokens": 12, "output_tokens": 3}
    assert response.response_model == "gpt-test-2025"
    assert response.status_code == 200
    assert response.tool_calls == ()
    assert response.timeout_name is None and response.error == ""
    assert kinds(response) == ["headers", "text", "text", "usage", "finish"]
    assert seen == response.events
    assert all(event.at == clock() for event in response.events)
    assert response.evidence.body_complete and response.evidence.headers_received
    verdict = classify(response, clock)
    assert verdict.failure_class is None and verdict.effect == "none"


def test_r5_4_openai_request_has_messages_tools_auth_and_idempotency_key(wire):
    """R5.4/R2.1: the body the server receives is a streamed chat completion with
    the replayed history (R1.1), tools in function format, Bearer auth and the
    attempt's Idempotency-Key."""
    wire.reply(Reply(chunks=[chunk({"content": "ok"}, finish="stop"), DONE]))
    request = ProviderRequest(
        model="gpt-test",
        messages=(
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Weather in Paris?"),
            ChatMessage(
                "assistant",
                "",
                tool_calls=(ToolCall("call_1", "weather", {"city": "Paris"}),),
            ),
            ChatMessage("tool", '{"temp": 21}', tool_call_id="call_1"),
        ),
        tools=(
            ToolSpec(
                "weather",
                "Current weather",
                {"type": "object", "properties": {"city": {"type": "string"}}},
            ),
        ),
        max_tokens=77,
        idempotency_key="run-9:turn-3:attempt-1",
    )
    call(wire.url + "/v1/", request)
    (received,) = wire.received
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == "Bearer sk-test"
    assert received.headers["idempotency-key"] == "run-9:turn-3:attempt-1"
    assert received.headers["content-type"] == "application/json"
    body = received.body
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 77
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]


def test_r2_1_openai_tool_calls_are_assembled_from_interleaved_fragments(wire):
    """R2.1/R6.1: index-based tool-call deltas are joined per index; they are progress."""

    def tc(index, args, call_id=None, name=None):
        function = {"arguments": args}
        if name:
            function["name"] = name
        entry = {"index": index, "function": function}
        if call_id:
            entry.update(id=call_id, type="function")
        return chunk({"tool_calls": [entry]})

    wire.reply(
        Reply(
            chunks=[
                tc(0, "", "call_a", "search"),
                tc(0, '{"q": "par'),
                tc(1, "", "call_b", "weather"),
                tc(1, '{"city":'),
                tc(0, 'is"}'),
                tc(1, ' "Lyon"}'),
                tc(2, "", "call_c", "broken"),
                tc(2, '{"x": '),
                chunk({}, finish="tool_calls"),
                usage_chunk(30, 9),
                DONE,
            ]
        )
    )
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=600, no_progress_s=15),
        # 10 s per tool-call delta, 80 s in all: only because they are progress
        # does a 15 s no-progress limit not fire.
        on_event=lambda e: clock.advance(10) if e.kind == "tool_call" else None,
    )
    assert response.timeout_name is None
    assert response.finish_reason == "tool_calls"
    assert response.tool_calls == (
        ToolCall("call_a", "search", {"q": "paris"}),
        ToolCall("call_b", "weather", {"city": "Lyon"}),
        ToolCall("call_c", "broken", {INVALID_ARGUMENTS_KEY: '{"x": '}),
    )
    assert kinds(response).count("tool_call") == 8
    assert classify(response, clock).failure_class is None


# --------------------------------------------------------------------------- refusals


def test_r2_4_openai_finish_reason_content_filter_is_a_refusal(wire):
    """R2.4: finish_reason "content_filter" → refusal, category content_filter."""
    wire.reply(Reply(chunks=[chunk({"content": "I"}), chunk({}, finish="content_filter"), DONE]))
    response, clock = call(wire.url)
    assert response.answer.finish_reason == "content_filter"
    assert response.evidence.refusal_category == "content_filter"  # read by the adapter
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", "content_filter")
    assert not verdict.moves_breaker


def test_r2_4_openai_delta_refusal_is_a_refusal_and_not_progress(wire):
    """R2.4: a non-empty streamed delta.refusal → refusal; it is evidence, not body text."""
    wire.reply(
        Reply(
            chunks=[
                chunk({"role": "assistant", "refusal": ""}),
                chunk({"refusal": "I can't help "}),
                chunk({"refusal": "with that."}),
                chunk({}, finish="stop"),
                DONE,
            ]
        )
    )
    response, clock = call(wire.url)
    assert response.text == ""
    assert response.answer.message_refusal == "I can't help with that."
    assert response.evidence.refusal_category == "refusal"
    assert "text" not in kinds(response)
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", "refusal")


def test_r2_4_openai_message_refusal_in_a_non_streamed_body_is_a_refusal(wire):
    """R2.4: a server that ignores stream=true answers one JSON body; message.refusal counts."""
    body = {
        "id": "chatcmpl-2",
        "model": "gpt-test-2025",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, "refusal": "No."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    wire.reply(json_reply(200, body))
    response, clock = call(wire.url)
    assert response.answer.message_refusal == "No."
    assert response.usage == {"input_tokens": 5, "output_tokens": 1}
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", "refusal")


@pytest.mark.parametrize(
    ("code", "category"),
    [("content_policy_violation", "policy"), ("content_filter", "content_filter")],
)
def test_r2_4_openai_400_with_a_content_policy_code_is_a_refusal(wire, code, category):
    """R2.4: an HTTP 400 whose error code is a content-policy code → refusal, category kept."""
    wire.reply(json_reply(400, error_body(code, "Your request was flagged.")))
    response, clock = call(wire.url)
    assert response.status_code == 400
    assert response.answer.error_code == code
    assert response.answer.error_message == "Your request was flagged."
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", category)


def test_r2_4_openai_content_policy_error_inside_the_stream_is_a_refusal(wire):
    """R2.4: an error chunk in a 200 stream carries no status of its own."""
    wire.reply(
        Reply(chunks=[chunk({"content": "Sure"}), sse(error_body("content_filter", "flagged"))])
    )
    response, clock = call(wire.url)
    assert response.status_code == 200
    assert response.evidence.status_code is None
    assert response.text == "Sure"
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", "content_filter")


# --------------------------------------------------------------------------- HTTP failures


def test_r2_2_openai_429_with_retry_after_is_rate_limited(wire):
    """R2.2: 429 → rate_limited, Retry-After honoured (seconds)."""
    wire.reply(
        json_reply(
            429,
            error_body("rate_limit_exceeded", "slow down", "requests"),
            headers={"Retry-After": "7"},
        )
    )
    response, clock = call(wire.url)
    assert response.evidence.retry_after == "7"
    verdict = classify(response, clock)
    assert verdict.failure_class == "rate_limited"
    assert verdict.retry_after_seconds == 7.0
    assert verdict.moves_breaker


def test_r2_2_openai_429_with_http_date_retry_after(wire):
    """R2.2: an HTTP-date Retry-After is passed through raw and resolved by health."""
    clock = AdjustableClock(start())
    later = (clock() + timedelta(seconds=90)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    wire.reply(
        json_reply(429, error_body("insufficient_quota", "quota"), headers={"Retry-After": later})
    )
    response, _ = call(wire.url, clock=clock)
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.retry_after_seconds) == ("rate_limited", 90.0)


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [
        (503, None, "server_error"),
        (500, "server_error", "server_error"),
        (401, "invalid_api_key", "auth"),
        (403, None, "auth"),
        (400, "context_length_exceeded", "bad_request"),
        (400, None, "bad_request"),
        (404, "model_not_found", "bad_request"),
    ],
)
def test_r2_1_openai_http_errors_are_classified_from_status_and_code(wire, status, code, expected):
    """R2.1: 5xx → server_error, 401/403 → auth, other 400 → bad_request."""
    wire.reply(json_reply(status, error_body(code, "msg")))
    response, clock = call(wire.url)
    assert response.status_code == status
    assert response.answer.error_code == (code or "invalid_request_error")
    assert str(status) in response.error
    assert classify(response, clock).failure_class == expected


def test_r2_1_openai_non_json_error_body_is_still_evidence(wire):
    """R2.1: a proxy's HTML 502 page is a server error with the text kept."""
    wire.reply(Reply(status=502, body=b"<html>Bad gateway</html>", content_type="text/html"))
    response, clock = call(wire.url)
    assert "Bad gateway" in response.answer.error_message
    assert classify(response, clock).failure_class == "server_error"


# --------------------------------------------------------------------------- transport


def test_r2_1_openai_connection_refused_is_network():
    """R2.1: nothing listening → connect_error → network; no headers, no events but finish."""
    response, clock = call(refused_url())
    assert response.evidence.transport_error == "connect_error"
    assert not response.evidence.headers_received
    assert kinds(response) == ["finish"]
    verdict = classify(response, clock)
    assert verdict.failure_class == "network" and verdict.effect == "none"


def test_r6_2_openai_headers_then_connection_closed_is_interrupted(wire):
    """R6.2: headers arrived, the body broke, no clock fired → interrupted, effect unknown."""
    wire.reply(
        Reply(
            chunks=[chunk({"content": "Half an ans"}), chunk({"content": "wer"}), DONE],
            break_after=1,
        )
    )
    response, clock = call(wire.url)
    evidence = response.evidence
    assert evidence.headers_received and not evidence.body_complete
    assert not evidence.deadline_evidence
    assert evidence.transport_error == "connection_reset"
    assert response.timeout_name is None
    assert response.text == "Half an ans"
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.effect) == ("interrupted", "unknown")


def test_r6_2_openai_stream_without_terminator_is_interrupted(wire):
    """R6.2: a clean end of the chunked body before finish_reason/[DONE] is a broken body."""
    wire.reply(Reply(chunks=[chunk({"content": "partial"})]))
    response, clock = call(wire.url)
    assert not response.evidence.body_complete
    assert classify(response, clock).failure_class == "interrupted"


def test_r6_2_openai_malformed_chunk_is_a_broken_body(wire):
    """R6.2: a data line that is not JSON means content was lost: body incomplete."""
    wire.reply(Reply(chunks=[chunk({"content": "a"}), b"data: {not json\n\n", DONE]))
    response, clock = call(wire.url)
    assert "malformed" in response.error
    assert classify(response, clock).failure_class == "interrupted"


@pytest.mark.parametrize(
    ("limits", "timeout_name", "deadline_evidence"),
    [
        # The provider's own read timeout (config) is the shortest: a transport fact.
        (CallLimits(budget_s=60, no_progress_s=30), None, False),
        # The budget left is shorter than the read timeout: our clock fired.
        (CallLimits(budget_s=0.25, no_progress_s=30), "stage_timeout", True),
        (
            CallLimits(budget_s=0.25, no_progress_s=30, deadline_bound=True),
            "deadline_exceeded",
            True,
        ),
    ],
)
def test_r6_2_openai_read_timeout_is_named_by_the_clock_that_bounds_it(
    wire, limits, timeout_name, deadline_evidence
):
    """R6.1/R6.2: read timeout = min(read_timeout_s, budget left); a ReadTimeout is
    a timeout, named stage_timeout/deadline_exceeded when the budget bounded it."""
    wire.reply(Reply(chunks=[chunk({"content": "late"}, finish="stop"), DONE], hang_s=1.0))
    response, clock = call(wire.url, limits=limits, read_timeout_s=0.25)
    assert response.evidence.transport_error == "read_timeout"
    assert response.evidence.headers_received and not response.evidence.body_complete
    assert response.timeout_name == timeout_name
    assert response.evidence.deadline_evidence is deadline_evidence
    assert classify(response, clock).failure_class == "timeout"


# --------------------------------------------------------------------------- clocks


def test_r6_1_openai_keep_alive_only_stream_ends_as_no_progress(wire):
    """R6.1: keep-alives are heartbeats, never progress; with a clock moving 10 s per
    heartbeat and no_progress_s=30 the adapter stops after the third one."""
    wire.reply(Reply(chunks=[chunk({"role": "assistant", "content": ""})], repeat=KEEP_ALIVE))
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=600, no_progress_s=30),
        on_event=advance_on_heartbeat(clock, 10),
    )
    assert kinds(response) == ["headers", "heartbeat", "heartbeat", "heartbeat", "finish"]
    assert response.timeout_name == "no_progress"
    evidence = response.evidence
    assert evidence.deadline_evidence and not evidence.body_complete
    assert evidence.transport_error is None
    assert clock() - start() == timedelta(seconds=30)
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.effect) == ("timeout", "none")


@pytest.mark.parametrize(("no_progress_s", "finishes"), [(25, True), (15, False)])
def test_r6_1_openai_text_resets_no_progress_but_heartbeats_do_not(wire, no_progress_s, finishes):
    """R6.1: two heartbeats (20 s) between text chunks pass a 25 s no-progress
    limit because text resets it; with 15 s the same stream is cut as no_progress."""
    wire.reply(
        Reply(
            chunks=[
                KEEP_ALIVE,
                KEEP_ALIVE,
                chunk({"content": "one "}),
                KEEP_ALIVE,
                KEEP_ALIVE,
                chunk({"content": "two"}, finish="stop"),
                DONE,
            ]
        )
    )
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=600, no_progress_s=no_progress_s),
        on_event=advance_on_heartbeat(clock, 10),
    )
    if finishes:
        assert response.text == "one two" and response.timeout_name is None
        assert classify(response, clock).failure_class is None
    else:
        assert response.text == "" and response.timeout_name == "no_progress"
        assert classify(response, clock).failure_class == "timeout"


def test_r6_1_openai_reasoning_fragments_are_not_progress(wire):
    """R6.1: reasoning_content deltas are reasoning events, not body text nor progress."""
    thinking = chunk({"reasoning_content": "hmm "})
    wire.reply(Reply(chunks=[thinking] * 5 + [chunk({"content": "x"}, finish="stop"), DONE]))
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=600, no_progress_s=30),
        on_event=advance_on_heartbeat(clock, 10),  # also advances on reasoning
    )
    assert kinds(response) == ["headers", "reasoning", "reasoning", "reasoning", "finish"]
    assert response.text == "" and response.timeout_name == "no_progress"


@pytest.mark.parametrize(
    ("deadline_bound", "name"), [(False, "stage_timeout"), (True, "deadline_exceeded")]
)
def test_r6_2_openai_budget_used_up_while_progressing(wire, deadline_bound, name):
    """R6.2: progress keeps no_progress quiet, but the budget still runs out: the
    cut is stage_timeout, or deadline_exceeded when the run deadline bound it."""
    wire.reply(Reply(chunks=[chunk({"content": f"{i} "}) for i in range(10)] + [DONE]))
    clock = AdjustableClock(start())

    def tick(event):
        if event.kind == "text":
            clock.advance(10)

    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=25, no_progress_s=15, deadline_bound=deadline_bound),
        on_event=tick,
    )
    assert response.timeout_name == name
    assert response.text == "0 1 2 "
    assert response.evidence.deadline_evidence and not response.evidence.body_complete
    assert classify(response, clock).failure_class == "timeout"


def test_r6_1_openai_no_budget_left_sends_nothing(wire):
    """R6.1: a stage may not wait past the run's end: budget 0 → no request at all."""
    wire.reply(Reply(chunks=[DONE]))
    response, clock = call(wire.url, limits=CallLimits(0, 30, deadline_bound=True))
    assert wire.received == []
    assert response.timeout_name == "deadline_exceeded"
    assert classify(response, clock).failure_class == "timeout"


def test_r6_1_openai_on_event_sees_each_event_while_the_stream_is_open(wire):
    """R6.1: events reach on_event as they arrive (the runner updates progress live):
    the server holds the rest of the stream until the first text was observed."""
    gate = threading.Event()
    wire.reply(
        Reply(
            chunks=[
                chunk({"content": "first"}),
                chunk({"content": " second"}, finish="stop"),
                DONE,
            ],
            gate=gate,
            gate_after=1,
        )
    )
    order = []

    def on_event(event):
        if event.kind == "text":
            order.append((event.text, gate.is_set()))
            gate.set()

    response, _ = call(wire.url, on_event=on_event)
    assert order == [("first", False), (" second", True)]
    assert response.text == "first second"


def test_r2_1_openai_odd_shaped_fields_are_ignored_not_fatal(wire):
    """R2.1: fields of the wrong JSON type in a chunk are ignored; the adapter never
    crashes on a provider's output."""
    wire.reply(
        Reply(
            chunks=[
                sse({"choices": "x"}),
                sse({"choices": [{"index": 0, "delta": "text?"}]}),
                sse({"choices": [{"index": 0, "delta": {"tool_calls": {"a": 1}}}]}),
                sse({"choices": [{"index": 0, "delta": {"tool_calls": [{"function": 3}]}}]}),
                sse({"choices": [{"index": 1, "delta": {"content": "other choice"}}]}),
                sse({"choices": [], "usage": {"prompt_tokens": "many"}}),
                chunk({"content": "fine"}, finish="stop"),
                DONE,
            ]
        )
    )
    response, clock = call(wire.url)
    assert response.text == "fine" and response.usage == {}
    assert classify(response, clock).failure_class is None
