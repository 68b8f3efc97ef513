"""Anthropic Messages API, streamed (``POST {base_url}/v1/messages``).

Wire format:

* request: ``{"model", "max_tokens", "stream": true, "system": "...",
  "messages": [...], "tools": [{"name", "description", "input_schema"}]}`` with
  headers ``x-api-key`` and ``anthropic-version: 2023-06-01`` (plus
  ``Idempotency-Key`` when given). System messages become the top-level
  ``system``; an assistant turn with tool calls becomes ``text`` + ``tool_use``
  blocks; tool results become ``tool_result`` blocks of a user turn
  (consecutive ones merged into one turn, as the API requires).
* response: SSE ``event: <type>`` + ``data: {...}``: ``message_start``
  (model, input usage), ``content_block_start`` (``text`` / ``tool_use`` /
  ``thinking``), ``content_block_delta`` (``text_delta``, ``input_json_delta``,
  ``thinking_delta``), ``content_block_stop``, ``message_delta``
  (``stop_reason`` — incl. ``"refusal"`` — and output usage), ``message_stop``,
  ``ping`` (a heartbeat) and ``error`` (e.g. ``overloaded_error`` mid-stream).
* non-2xx: ``{"type": "error", "error": {"type", "message"}}``, ``Retry-After``;
  529 is "overloaded".

R2.4 refusal evidence is ``stop_reason == "refusal"``, read by
``read_evidence`` into the evidence's refusal category; classification is
``governance.rules.classification``'s job. A content-policy code is no refusal here:
on a 400 it is a bad request.
"""

from __future__ import annotations

from typing import Any

import httpx

from governance.rules.classification import AttemptEvidence
from tasks.adapters._common import (
    Attempt,
    MalformedStream,
    SseItem,
    StreamRecorder,
    base_headers,
    check_http_config,
    error_fields,
    http_adapter,
    index_of,
    load_json,
    obj,
    stream_http,
    text_of,
)
from tasks.adapters._evidence import evidence_from
from tasks.adapters.base import (
    CallLimits,
    ChatMessage,
    Clock,
    OnEvent,
    ProviderConfig,
    ProviderRequest,
    ProviderResponse,
    WireAnswer,
)

__all__ = ["ADAPTER", "ANTHROPIC_VERSION", "build_body", "call_anthropic", "read_evidence"]

ANTHROPIC_VERSION = "2023-06-01"


def read_evidence(answer: WireAnswer) -> AttemptEvidence:
    """An Anthropic answer as evidence (R2.1, R2.4: ``stop_reason "refusal"``)."""
    category = "refusal" if answer.stop_reason == "refusal" else None
    return evidence_from(answer, refusal_category=category)


def _blocks(message: ChatMessage, request: ProviderRequest) -> list[dict[str, Any]]:
    if message.role == "tool":
        if not message.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return [
            {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}
        ]
    blocks: list[dict[str, Any]] = []
    if message.content:
        blocks.append({"type": "text", "text": message.content})
    for call in message.tool_calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": request.wire_name(call.name),
                "input": call.arguments,
            }
        )
    return blocks


def build_body(config: ProviderConfig, request: ProviderRequest) -> dict[str, Any]:
    """The JSON body of one streamed Messages request."""
    system = [m.content for m in request.messages if m.role == "system" and m.content]
    turns: list[dict[str, Any]] = []
    for message in request.messages:
        if message.role == "system":
            continue
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message, request)
        if not blocks:
            continue  # the API rejects empty content
        if turns and turns[-1]["role"] == role:
            # Roles must alternate: tool results and the user text that follows
            # them form one user turn.
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    body: dict[str, Any] = {
        "model": request.model or config.model,
        "max_tokens": request.max_tokens,
        "stream": True,
        "messages": turns,
    }
    if system:
        body["system"] = "\n\n".join(system)
    if request.tools:
        body["tools"] = [
            {
                "name": request.wire_name(t.name),
                "description": t.description,
                "input_schema": t.parameters,
            }
            for t in request.tools
        ]
    # The client's sampling parameters this protocol has a place for.
    for name in ("temperature", "top_p"):
        if request.sampling.get(name) is not None:
            body[name] = request.sampling[name]
    stop = request.sampling.get("stop")
    if stop:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return body


class _AnthropicParser:
    def on_event(self, item: SseItem, attempt: Attempt) -> None:
        data = load_json(item.data)
        if not isinstance(data, dict):
            raise MalformedStream(f"event data is not an object: {item.data[:200]!r}")
        kind = data.get("type") or item.event
        if kind == "ping":
            attempt.rec.emit("heartbeat", "ping")
        elif kind == "message_start":
            message = obj(data.get("message"))
            if isinstance(message.get("model"), str):
                attempt.response_model = message["model"]
            usage = obj(message.get("usage"))
            attempt.set_usage(
                input_tokens=usage.get("input_tokens"), output_tokens=usage.get("output_tokens")
            )
        elif kind == "content_block_start":
            self._block_start(data, attempt)
        elif kind == "content_block_delta":
            self._block_delta(data, attempt)
        elif kind == "message_delta":
            delta = obj(data.get("delta"))
            if delta.get("stop_reason"):
                attempt.stop_reason = str(delta["stop_reason"])
            usage = obj(data.get("usage"))
            attempt.set_usage(output_tokens=usage.get("output_tokens"))
        elif kind == "message_stop":
            attempt.done = True
        elif kind == "error":
            _, error_type, message = error_fields(data)
            attempt.stream_error(error_type, message)
        # content_block_stop and unknown (newer) event types carry nothing we need.

    def _block_start(self, data: dict[str, Any], attempt: Attempt) -> None:
        block = obj(data.get("content_block"))
        index = index_of(data.get("index"))
        if block.get("type") == "text":
            attempt.text(text_of(block.get("text")))
        elif block.get("type") == "tool_use":
            initial = block.get("input")
            attempt.tools.update(
                index,
                id=text_of(block.get("id")),
                name=text_of(block.get("name")),
                initial=initial if isinstance(initial, dict) else None,
            )
            attempt.rec.emit("tool_call", text_of(block.get("name")))
        elif block.get("type") in ("thinking", "redacted_thinking"):
            attempt.reasoning(text_of(block.get("thinking")))

    def _block_delta(self, data: dict[str, Any], attempt: Attempt) -> None:
        delta = obj(data.get("delta"))
        kind = delta.get("type")
        if kind == "text_delta":
            attempt.text(text_of(delta.get("text")))
        elif kind == "input_json_delta":
            fragment = text_of(delta.get("partial_json"))
            if fragment:
                attempt.tools.update(index_of(data.get("index")), arguments=fragment)
                attempt.rec.emit("tool_call", fragment)
        elif kind == "thinking_delta":
            attempt.reasoning(text_of(delta.get("thinking")))

    def on_json_body(self, body: Any, attempt: Attempt) -> None:
        if not isinstance(body, dict):
            raise MalformedStream("response body is not an object")
        if body.get("type") == "error":
            _, error_type, message = error_fields(body)
            attempt.stream_error(error_type, message)
            return
        if isinstance(body.get("model"), str):
            attempt.response_model = body["model"]
        content = body.get("content")
        for index, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block, dict):
                self._block_start({"index": index, "content_block": block}, attempt)
        if body.get("stop_reason"):
            attempt.stop_reason = str(body["stop_reason"])
        usage = obj(body.get("usage"))
        attempt.set_usage(
            input_tokens=usage.get("input_tokens"), output_tokens=usage.get("output_tokens")
        )

    def on_error_body(self, body: Any, attempt: Attempt) -> None:
        code, error_type, message = error_fields(body)
        attempt.error_code = error_type or code
        attempt.error_message = message

    def on_end(self, attempt: Attempt) -> None:
        if not attempt.done and attempt.stop_reason is None:
            attempt.broken_body("the stream ended without stop_reason or message_stop")


def call_anthropic(
    config: ProviderConfig,
    request: ProviderRequest,
    *,
    limits: CallLimits,
    clock: Clock,
    on_event: OnEvent | None = None,
    transport: httpx.BaseTransport | None = None,
) -> ProviderResponse:
    base = check_http_config(config)
    body = build_body(config, request)
    headers = base_headers(request.idempotency_key)
    headers["anthropic-version"] = ANTHROPIC_VERSION
    if config.api_key:
        headers["x-api-key"] = config.api_key
    attempt = Attempt(read_evidence, StreamRecorder(clock, limits, on_event))
    stream_http(
        attempt,
        _AnthropicParser(),
        config=config,
        # Accept a base URL given with or without the version segment.
        url=f"{base}/messages" if base.endswith("/v1") else f"{base}/v1/messages",
        headers=headers,
        body=body,
        transport=transport,
    )
    return attempt.response()


ADAPTER = http_adapter(call_anthropic, read_evidence)
