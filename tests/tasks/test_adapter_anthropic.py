"""The Anthropic adapter against a real loopback server speaking the Messages
streaming wire format (R2.1, R2.2, R2.4, R6.1, R6.2)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from tasks.adapters import AdjustableClock, call_provider
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


def ev(kind: str, **data) -> bytes:
    return sse({"type": kind, **data}, event=kind)


def message_start(input_tokens: int = 25) -> bytes:
    return ev(
        "message_start",
        message={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test-2025",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        },
    )


def text_block(index: int, *pieces: str) -> list[bytes]:
    return [
        ev("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *[
            ev("content_block_delta", index=index, delta={"type": "text_delta", "text": piece})
            for piece in pieces
        ],
        ev("content_block_stop", index=index),
    ]


def message_end(stop_reason: str = "end_turn", output_tokens: int = 15) -> list[bytes]:
    return [
        ev(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        ev("message_stop"),
    ]


PING = ev("ping")


def config(url: str, **kw) -> ProviderConfig:
    return ProviderConfig("an", "anthropic", "claude-test", base_url=url, api_key="ak-test", **kw)


def call(url: str, request=None, *, clock=None, limits=LIMITS, on_event=None):
    clock = clock or AdjustableClock(start())
    response = call_provider(
        config(url), request or user("hello"), limits=limits, clock=clock, on_event=on_event
    )
    return response, clock


def error_body(kind: str, message: str = "nope") -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


# --------------------------------------------------------------------------- success


def test_r2_1_anthropic_streamed_answer_with_usage_is_a_success(wire):
    """R2.1: message_start … message_stop with text deltas and usage is no failure;
    ping is a heartbeat."""
    wire.reply(
        Reply(
            chunks=[
                message_start(25),
                *text_block(0, "Hello", "!"),
                PING,
                *message_end("end_turn", 15),
            ]
        )
    )
    response, clock = call(wire.url)
    assert response.text == "Hello!"
    assert response.finish_reason == "end_turn"
    assert response.usage == {"input_tokens": 25, "output_tokens": 15}
    assert response.response_model == "claude-test-2025"
    assert kinds(response) == ["headers", "usage", "text", "text", "heartbeat", "usage", "finish"]
    assert response.answer.stop_reason == "end_turn"
    assert classify(response, clock).failure_class is None


def test_r5_4_anthropic_request_has_system_blocks_tools_headers_and_idempotency_key(wire):
    """R5.4/R2.1: x-api-key, anthropic-version, top-level system, tool_use and merged
    tool_result blocks, tools with input_schema, and the Idempotency-Key."""
    wire.reply(Reply(chunks=[message_start(), *text_block(0, "ok"), *message_end()]))
    request = ProviderRequest(
        model="claude-test",
        messages=(
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Compare Paris and Lyon."),
            ChatMessage(
                "assistant",
                "Checking both.",
                tool_calls=(
                    ToolCall("toolu_1", "weather", {"city": "Paris"}),
                    ToolCall("toolu_2", "weather", {"city": "Lyon"}),
                ),
            ),
            ChatMessage("tool", "21C", tool_call_id="toolu_1"),
            ChatMessage("tool", "19C", tool_call_id="toolu_2"),
        ),
        tools=(ToolSpec("weather", "Current weather", {"type": "object"}),),
        max_tokens=256,
        idempotency_key="run-1:turn-2",
    )
    call(wire.url + "/v1", request)  # a base URL with the version segment works too
    (received,) = wire.received
    assert received.path == "/v1/messages"
    assert received.headers["x-api-key"] == "ak-test"
    assert received.headers["anthropic-version"] == "2023-06-01"
    assert received.headers["idempotency-key"] == "run-1:turn-2"
    assert "authorization" not in received.headers
    assert received.body == {
        "model": "claude-test",
        "max_tokens": 256,
        "stream": True,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Compare Paris and Lyon."}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking both."},
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "weather",
                        "input": {"city": "Paris"},
                    },
                    {
                        "type": "tool_use",
                        "id": "toolu_2",
                        "name": "weather",
                        "input": {"city": "Lyon"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21C"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "19C"},
                ],
            },
        ],
        "tools": [
            {
                "name": "weather",
                "description": "Current weather",
                "input_schema": {"type": "object"},
            }
        ],
    }


def test_r2_1_anthropic_tool_use_is_assembled_from_input_json_deltas(wire):
    """R2.1/R6.1: input_json_delta fragments build the tool input; they are progress."""

    def json_delta(index, fragment):
        return ev(
            "content_block_delta",
            index=index,
            delta={"type": "input_json_delta", "partial_json": fragment},
        )

    wire.reply(
        Reply(
            chunks=[
                message_start(),
                *text_block(0, "Let me check."),
                ev(
                    "content_block_start",
                    index=1,
                    content_block={
                        "type": "tool_use",
                        "id": "toolu_9",
                        "name": "search",
                        "input": {},
                    },
                ),
                json_delta(1, ""),
                json_delta(1, '{"query": "gov'),
                json_delta(1, 'ernance", "limit": 3}'),
                ev("content_block_stop", index=1),
                ev(
                    "content_block_start",
                    index=2,
                    content_block={
                        "type": "tool_use",
                        "id": "toolu_10",
                        "name": "now",
                        "input": {},
                    },
                ),
                ev("content_block_stop", index=2),
                *message_end("tool_use"),
            ]
        )
    )
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=600, no_progress_s=15),
        on_event=lambda e: clock.advance(10) if e.kind == "tool_call" else None,
    )
    assert response.text == "Let me check."
    assert response.finish_reason == "tool_use"
    assert response.tool_calls == (
        ToolCall("toolu_9", "search", {"query": "governance", "limit": 3}),
        ToolCall("toolu_10", "now", {}),
    )
    assert classify(response, clock).failure_class is None


# --------------------------------------------------------------------------- refusal


def test_r2_4_anthropic_stop_reason_refusal_is_a_refusal(wire):
    """R2.4: stop_reason "refusal" → refusal with its category; never a health failure."""
    wire.reply(Reply(chunks=[message_start(), *text_block(0, "I can't"), *message_end("refusal")]))
    response, clock = call(wire.url)
    assert response.answer.stop_reason == "refusal"
    assert response.evidence.refusal_category == "refusal"  # read by the adapter
    assert response.finish_reason == "refusal"
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", "refusal")
    assert not verdict.moves_breaker


# --------------------------------------------------------------------------- HTTP failures


@pytest.mark.parametrize(
    ("status", "kind", "expected"),
    [
        (529, "overloaded_error", "server_error"),
        (503, "api_error", "server_error"),
        (500, "api_error", "server_error"),
        (401, "authentication_error", "auth"),
        (403, "permission_error", "auth"),
        (400, "invalid_request_error", "bad_request"),
        (413, "request_too_large", "bad_request"),
    ],
)
def test_r2_1_anthropic_http_errors_are_classified(wire, status, kind, expected):
    """R2.1: 529 overloaded / 5xx → server_error, 401/403 → auth, 400 → bad_request."""
    wire.reply(json_reply(status, error_body(kind, "msg")))
    response, clock = call(wire.url)
    assert response.status_code == status
    assert (response.answer.error_code, response.answer.error_message) == (kind, "msg")
    assert classify(response, clock).failure_class == expected


def test_r2_2_anthropic_429_with_retry_after_is_rate_limited(wire):
    """R2.2: 429 rate_limit_error → rate_limited, Retry-After honoured."""
    wire.reply(json_reply(429, error_body("rate_limit_error"), headers={"retry-after": "12"}))
    response, clock = call(wire.url)
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.retry_after_seconds) == ("rate_limited", 12.0)


def test_r2_1_anthropic_overloaded_error_event_mid_stream_is_server_error(wire):
    """R2.1: an `error` event (overloaded_error) after a 200 → server_error; the text
    already streamed is kept, no tool call is returned from the broken message."""
    wire.reply(
        Reply(
            chunks=[
                message_start(),
                *text_block(0, "Part"),
                sse(error_body("overloaded_error", "Overloaded"), event="error"),
            ]
        )
    )
    response, clock = call(wire.url)
    assert response.status_code == 200
    assert response.evidence.status_code is None  # the 200 did not explain this failure
    assert response.answer.error_code == "overloaded_error"
    assert response.text == "Part" and response.tool_calls == ()
    assert classify(response, clock).failure_class == "server_error"


# --------------------------------------------------------------------------- transport


def test_r2_1_anthropic_connection_refused_is_network():
    """R2.1: connection refused → connect_error → network."""
    response, clock = call(refused_url())
    assert response.evidence.transport_error == "connect_error"
    assert classify(response, clock).failure_class == "network"


def test_r6_2_anthropic_headers_then_close_mid_body_is_interrupted(wire):
    """R6.2: the body broke after the headers with no clock evidence → interrupted,
    effect unknown (never "timeout")."""
    wire.reply(Reply(chunks=[message_start(), *text_block(0, "a", "b")], break_after=3))
    response, clock = call(wire.url)
    evidence = response.evidence
    assert evidence.headers_received and not evidence.body_complete
    assert not evidence.deadline_evidence and response.timeout_name is None
    assert response.text == "a"
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.effect) == ("interrupted", "unknown")


# --------------------------------------------------------------------------- clocks


def test_r6_1_anthropic_ping_only_stream_ends_as_no_progress(wire):
    """R6.1: pings are heartbeats, not progress: 10 s per ping, limit 30 s → no_progress."""
    wire.reply(Reply(chunks=[message_start()], repeat=PING))
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=600, no_progress_s=30),
        on_event=advance_on_heartbeat(clock, 10),
    )
    assert kinds(response) == ["headers", "usage", "heartbeat", "heartbeat", "heartbeat", "finish"]
    assert response.timeout_name == "no_progress"
    assert clock() - start() == timedelta(seconds=30)
    assert response.evidence.deadline_evidence and not response.evidence.body_complete
    assert classify(response, clock).failure_class == "timeout"


def test_r6_1_anthropic_thinking_is_reasoning_not_progress(wire):
    """R6.1: thinking deltas are reasoning fragments: not text, not progress."""
    thinking = ev(
        "content_block_delta", index=0, delta={"type": "thinking_delta", "thinking": "hmm"}
    )
    wire.reply(
        Reply(
            chunks=[
                message_start(),
                ev("content_block_start", index=0, content_block={"type": "thinking"}),
                *[thinking] * 5,
                *text_block(1, "x"),
                *message_end(),
            ]
        )
    )
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=600, no_progress_s=20),
        on_event=advance_on_heartbeat(clock, 10),
    )
    assert response.text == "" and response.timeout_name == "no_progress"
    assert kinds(response).count("reasoning") == 2


def test_r6_2_anthropic_deadline_bound_budget_is_deadline_exceeded(wire):
    """R6.2: when the run deadline bounds the budget, running out is deadline_exceeded."""
    wire.reply(Reply(chunks=[message_start(), *text_block(0, *"abcdefgh"), *message_end()]))
    clock = AdjustableClock(start())
    response, _ = call(
        wire.url,
        clock=clock,
        limits=CallLimits(budget_s=30, no_progress_s=20, deadline_bound=True),
        on_event=lambda e: clock.advance(10) if e.kind == "text" else None,
    )
    assert response.timeout_name == "deadline_exceeded"
    assert response.text == "abc"
    assert classify(response, clock).failure_class == "timeout"


def test_r2_1_anthropic_odd_shaped_fields_are_ignored_not_fatal(wire):
    """R2.1: fields of the wrong JSON type are ignored; unknown event types too."""
    wire.reply(
        Reply(
            chunks=[
                ev("message_start", message="not an object"),
                ev("content_block_start", index="zero", content_block=5),
                ev("content_block_delta", index=0, delta=[1, 2]),
                ev("some_future_event", payload={"x": 1}),
                *text_block(0, "fine"),
                *message_end(),
            ]
        )
    )
    response, clock = call(wire.url)
    assert response.text == "fine"
    assert classify(response, clock).failure_class is None
