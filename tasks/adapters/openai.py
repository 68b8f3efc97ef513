"""OpenAI-compatible Chat Completions, streamed (``POST {base_url}/chat/completions``).

Wire format (what real servers send, and what the tests' loopback servers speak):

* request: ``{"model", "messages", "max_tokens", "stream": true,
  "stream_options": {"include_usage": true}, "tools": [{"type": "function",
  "function": {"name", "description", "parameters"}}]}`` with
  ``Authorization: Bearer <key>`` and ``Idempotency-Key`` when given;
* response: SSE ``data: {chunk}`` lines ending with ``data: [DONE]``; a comment
  line (``: keep-alive``) is a heartbeat. A chunk's ``choices[0].delta`` holds
  ``content``, ``refusal``, ``reasoning_content``/``reasoning`` and
  ``tool_calls`` (``index`` + incremental ``function.arguments``);
  ``finish_reason`` comes on the last content chunk and the usage chunk has
  empty ``choices``. A chunk ``{"error": {...}}`` is an error inside the stream.
* non-2xx: ``{"error": {"code", "type", "message"}}`` and ``Retry-After``.

R2.4 refusal evidence: ``finish_reason == "content_filter"``, a non-empty
``delta.refusal`` / ``message.refusal``, or a content-policy error code (on a
400, or in a stream error chunk, which carries no status). ``read_evidence``
reads them into the evidence's refusal category;
``governance.rules.classification.classify_attempt`` decides.
"""

from __future__ import annotations

import json
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
)
from tasks.adapters._evidence import evidence_from, normalized_code
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

__all__ = ["ADAPTER", "CONTENT_POLICY_ERROR_CODES", "build_body", "call_openai", "read_evidence"]

# R2.4: OpenAI-compatible error codes that mean "the content", not "the request"
# (OpenAI's, Azure OpenAI's). Compared case-insensitively.
CONTENT_POLICY_ERROR_CODES: frozenset[str] = frozenset(
    {
        "content_policy_violation",
        "content_filter",
        "content_policy",
        "responsible_ai_policy_violation",
        "responsibleaipolicyviolation",
    }
)


def refusal_category(answer: WireAnswer) -> str | None:
    """R2.4, OpenAI-compatible: the category of a refusal answer, or None."""
    if answer.finish_reason == "content_filter":
        return "content_filter"
    if answer.message_refusal is not None and answer.message_refusal.strip():
        return "refusal"
    code = normalized_code(answer.error_code)
    # A content-policy code on an HTTP 400 (or on a stream error event that
    # carries no status) is about the content, not a malformed request; on
    # another status the status decides.
    if code in CONTENT_POLICY_ERROR_CODES and answer.status_code in (400, None):
        return "content_filter" if code == "content_filter" else "policy"
    return None


def read_evidence(answer: WireAnswer) -> AttemptEvidence:
    """An OpenAI-compatible answer as evidence (R2.1, R2.4)."""
    return evidence_from(answer, refusal_category=refusal_category(answer))


def _message(message: ChatMessage, request: ProviderRequest) -> dict[str, Any]:
    if message.role == "tool":
        if not message.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    wire: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.role == "assistant" and message.tool_calls:
        wire["content"] = message.content or None
        wire["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": request.wire_name(call.name),
                    "arguments": json.dumps(call.arguments),
                },
            }
            for call in message.tool_calls
        ]
    return wire


def build_body(config: ProviderConfig, request: ProviderRequest) -> dict[str, Any]:
    """The JSON body of one streamed chat completion."""
    body: dict[str, Any] = {
        "model": request.model or config.model,
        "messages": [_message(m, request) for m in request.messages],
        "max_tokens": request.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": request.wire_name(tool.name),
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
            for tool in request.tools
        ]
    sampling = dict(request.sampling)
    choice = sampling.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        # A named tool goes by the name the provider was offered.
        function = choice["function"]
        sampling["tool_choice"] = {
            **choice,
            "function": {**function, "name": request.wire_name(str(function.get("name")))},
        }
    for name, value in sampling.items():
        body.setdefault(name, value)  # the request's own fields stay as built
    return body


class _OpenAIParser:
    def on_event(self, item: SseItem, attempt: Attempt) -> None:
        if item.data.strip() == "[DONE]":
            attempt.done = True
            return
        chunk = load_json(item.data)
        if not isinstance(chunk, dict):
            raise MalformedStream(f"chunk is not an object: {item.data[:200]!r}")
        if "error" in chunk:
            code, kind, message = error_fields(chunk)
            attempt.stream_error(code or kind, message)
            return
        self._chunk(chunk, attempt, delta_key="delta")

    def _chunk(self, chunk: dict[str, Any], attempt: Attempt, *, delta_key: str) -> None:
        if isinstance(chunk.get("model"), str):
            attempt.response_model = chunk["model"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or index_of(choice.get("index")) != 0:
                continue  # n=1: only the first choice is ours
            self._delta(obj(choice.get(delta_key)), attempt)
            if choice.get("finish_reason"):
                attempt.finish_reason = str(choice["finish_reason"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            attempt.set_usage(
                input_tokens=usage.get("prompt_tokens"),
                output_tokens=usage.get("completion_tokens"),
            )

    def _delta(self, delta: dict[str, Any], attempt: Attempt) -> None:
        for key in ("reasoning_content", "reasoning"):
            if isinstance(delta.get(key), str):
                attempt.reasoning(delta[key])
        if isinstance(delta.get("refusal"), str) and delta["refusal"]:
            # A refusal is not business progress: it is kept as evidence only.
            attempt.refusal_parts.append(delta["refusal"])
        if isinstance(delta.get("content"), str):
            attempt.text(delta["content"])
        calls = delta.get("tool_calls")
        for position, call in enumerate(calls if isinstance(calls, list) else ()):
            if not isinstance(call, dict):
                continue
            function = obj(call.get("function"))
            name = function.get("name") if isinstance(function.get("name"), str) else None
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                # A complete (non-streamed) message may carry arguments as an object.
                arguments = json.dumps(arguments) if isinstance(arguments, dict) else None
            attempt.tools.update(
                index_of(call.get("index"), position),
                id=call.get("id") if isinstance(call.get("id"), str) else None,
                name=name,
                arguments=arguments,
            )
            if name or arguments:
                attempt.rec.emit("tool_call", name or arguments or "")

    def on_json_body(self, body: Any, attempt: Attempt) -> None:
        if not isinstance(body, dict):
            raise MalformedStream("response body is not an object")
        if "error" in body:
            code, kind, message = error_fields(body)
            attempt.stream_error(code or kind, message)
            return
        self._chunk(body, attempt, delta_key="message")

    def on_error_body(self, body: Any, attempt: Attempt) -> None:
        code, kind, message = error_fields(body)
        attempt.error_code = code or kind
        attempt.error_message = message

    def on_end(self, attempt: Attempt) -> None:
        # [DONE] is the terminator; a server that omits it but did send the
        # finish_reason and then closed cleanly has still delivered the answer.
        if not attempt.done and attempt.finish_reason is None:
            attempt.broken_body("the stream ended without finish_reason or [DONE]")


def call_openai(
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
    if config.api_key:
        headers["Authorization"] = f"Bearer {config.api_key}"
    attempt = Attempt(read_evidence, StreamRecorder(clock, limits, on_event))
    stream_http(
        attempt,
        _OpenAIParser(),
        config=config,
        url=f"{base}/chat/completions",
        headers=headers,
        body=body,
        transport=transport,
    )
    return attempt.response()


ADAPTER = http_adapter(call_openai, read_evidence)
