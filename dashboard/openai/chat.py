"""``POST /v1/chat/completions``: an OpenAI client's request is one run of
one model turn on a thread of the token's user, through the same stage path
as every run (``services.submit_run`` and ``publish``), answered in OpenAI's
shape when the run settles (``dashboard.api.waits``), or streamed as its
chunks commit (``stream: true``, read as the run stream reads its events).

The conversation is the thread named by ``X-Session-Id`` (or
``metadata.session_id``), found and brought in line with the client's
history by ``services.conversations``. The client's own tools are offered to
the model; their calls are the run's answer (``finish_reason: tool_calls``)
and their results the next request's increment. Without a session id, a
request continues the thread of the run whose answer its history ends with.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pydantic_core
from django.core.handlers.asgi import ASGIRequest
from django.db import connection as db_connection
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from pydantic import ValidationError

import dashboard.api.events as events
import dashboard.api.waits as run_waits
from dashboard.api.base import ApiError, authenticate
from dashboard.openai.errors import method_not_allowed, openai_error
from dashboard.openai.schemas import ChatCompletionRequest
from dashboard.queries.run_detail import RunFacts, run_facts
from dashboard.site import permissions
from dashboard.site.loop_db import off_loop
from dashboard.site.responses import Answered
from governance import services, time_source
from governance.models import Provider, Route, Run
from governance.rules.cost import usage_tokens
from governance.rules.door import DoorFailure, door_failure
from governance.rules.refusal import refusal_answer_text
from governance.rules.settlement import ReasonCode
from governance.rules.tools import client_tool_list
from governance.services import conversations, stream
from governance.services.admission import Overloaded
from governance.services.broker import publish
from governance.services.refusals import reprobe_delays, segment_refusals
from tasks import instrumentation as spans

METHODS = ("POST",)
WAIT_MARGIN_S = 5.0  # past the run's deadline: the watchdog settles it by then
# The run already tried its route's fallbacks and retries (rules.door).
NO_RETRY = {"x-should-retry": "false"}


class DoorError(Exception):
    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@csrf_exempt
def chat_completions(request: HttpRequest) -> HttpResponse:
    if request.method not in METHODS:
        return method_not_allowed(METHODS)
    try:
        with transaction.atomic():
            try:
                request.api_user = authenticate(request)
            except ApiError as exc:
                raise DoorError(401, exc.message, code="invalid_api_key") from None
            if refused := permissions.door_refusal(request.api_user, request.api_scopes):
                raise DoorError(403, refused)
            body = _parse(request)
            run, stage, created, segment_key = _admit(request, body)
        if created:
            spans.note_admission_segment(segment_key)
            publish([stage])
    except DoorError as exc:
        return openai_error(exc.status, exc.message, param=exc.param, code=exc.code)
    except services.ServiceError as exc:
        return openai_error(400, exc.message, param=exc.field)
    except Overloaded as exc:
        response = openai_error(429, exc.message, code="overloaded")
        response["Retry-After"] = str(exc.retry_after_s)
        return response
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(request, run, segment_key, include_usage)
    return _answer_when_settled(request, run, segment_key)


def _parse(request: HttpRequest) -> ChatCompletionRequest:
    raw = request.body or b""
    try:
        # NaN and Infinity are not JSON (RFC 8259); the schema's parser would take them.
        pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise DoorError(400, f"the body is not valid JSON: {exc}") from None
    try:
        body = ChatCompletionRequest.model_validate_json(raw)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        loc = [str(p) for p in error["loc"]]
        param = loc[0] if loc else (error.get("ctx") or {}).get("param")
        message = error["msg"].removeprefix("Value error, ")
        raise DoorError(400, f"{'.'.join(loc)}: {message}" if loc else message, param) from None
    return body


def _provider_chain(model: str) -> list[str]:
    """The route's chain, or the one provider's; 404 in OpenAI's words otherwise."""
    route = Route.objects.filter(name=model, enabled=True).only("provider_chain").first()
    if route is not None:
        return list(route.provider_chain)
    if Provider.objects.filter(provider_id=model, enabled=True).exists():
        return [model]
    raise DoorError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        "model",
        "model_not_found",
    )


def _admit(request: HttpRequest, body: ChatCompletionRequest):
    chain = _provider_chain(body.model)
    idempotency_key = request.headers.get("Idempotency-Key") or None
    if idempotency_key:
        # A repeat answers the first run's answer: its history already holds
        # that turn, so it must not be compared again (it would look edited).
        first = Run.objects.filter(idempotency_key=idempotency_key).select_related("segment")
        first = first.first()
        if first is not None and first.owner_id == request.api_user.pk:
            return first, None, False, first.segment.key
    system = "\n\n".join(m.text for m in body.messages if m.role in ("system", "developer"))
    said = [_said(m) for m in body.messages if m.role not in ("system", "developer")]
    # The turn's increment: what came after the client's last assistant message.
    start = max((at + 1 for at, m in enumerate(said) if m.role == "assistant"), default=0)
    earlier, increment = said[:start], said[start:]
    session_key = request.headers.get("X-Session-Id") or (body.metadata or {}).get("session_id")
    if session_key is not None and not 0 < len(session_key) <= 200:
        raise DoorError(400, "a session id is 1 to 200 characters", "X-Session-Id")
    now = time_source.now()
    first_user = next((m.content for m in said if m.role == "user" and m.content.strip()), "")
    conversation = conversations.conversation_for_turn(
        request.api_user,
        session_key=session_key,
        client_model=body.model,
        provider_chain=chain,
        system_prompt=system,
        client_tools=client_tool_list(
            t.function.model_dump(exclude_none=True) for t in body.tools or ()
        ),
        earlier=earlier,
        # A new thread is titled by the conversation's first user message.
        title=(first_user.strip().splitlines() or ["conversation"])[0][:200],
        now=now,
    )
    thread, segment = conversation.thread, conversation.segment
    run_id = uuid.uuid4()
    carrier = spans.new_run_trace(str(run_id), thread_id=str(thread.id), segment_key="")
    run, stage, created = services.submit_run(
        thread,
        input=_input_words(increment),
        user=request.api_user,
        now=now,
        idempotency_key=idempotency_key,
        trace_context=carrier,
        run_id=run_id,
        segment=segment,
        increment=[m.as_item() for m in increment],
        request_options=_request_options(body),
        client_prefix=conversations.prefix_of(said),
        api_token=request.api_token,
    )
    request.door_boundary = (conversation.boundary, conversation.trimmed)
    return run, stage, created, run.segment.key


def _said(message) -> conversations.Message:
    return conversations.Message.of(
        message.role,
        message.text,
        [call.as_call() for call in message.tool_calls or ()],
        message.tool_call_id or "",
    )


def _input_words(increment: list[conversations.Message]) -> str:
    """What the run was asked, in words for its page: the user's text, or
    which tool results it brings."""
    users = [m.content for m in increment if m.role == "user" and m.content.strip()]
    if users:
        return users[-1]
    return f"Results of {len(increment)} tool call(s) of the client"


def _request_options(body: ChatCompletionRequest) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if max_tokens := body.max_completion_tokens or body.max_tokens:
        options["max_tokens"] = max_tokens
    if sampling := body.sampling():
        options["sampling"] = sampling
    return options


def _answer_when_settled(request: HttpRequest, run, segment_key: str) -> HttpResponse:
    key = run.id
    wait_s = max(1.0, (run.deadline_at - time_source.now()).total_seconds()) + WAIT_MARGIN_S

    def answer(*, settled_only: bool) -> bytes | None:
        facts = run_facts(key, settled_only=settled_only)
        if facts is None:
            return None if settled_only else _not_found_body()
        body = completion(facts)
        failure = failure_of(facts, body)
        if failure is None:
            return JsonResponse(body).content
        return Answered(
            JsonResponse(_failure_body(request, facts, body, failure)).content,
            failure.status, NO_RETRY,
        )  # fmt: skip

    response = run_waits.waited_answer(request, key, wait_s, answer)
    return _with_run_headers(response, request, run, segment_key)


def _with_run_headers(response: HttpResponse, request: HttpRequest, run, segment_key: str):
    response["X-Governance-Run-Id"] = str(run.id)
    response["X-Governance-Thread-Id"] = str(run.thread_id)
    response["X-Governance-Segment"] = segment_key
    response["X-Governance-Run-Url"] = request.build_absolute_uri(
        reverse("run", kwargs={"run_id": run.id})
    )
    boundary, trimmed = getattr(request, "door_boundary", ("", 0))
    if boundary:
        # An operator's boundary applies: the client's history before it is not forwarded.
        response["X-Governance-Boundary"] = boundary
        response["X-Governance-Trimmed-Messages"] = str(trimmed)
    return response


# --------------------------------------------------------------------------- stream: true


def _stream(request: HttpRequest, run, segment_key: str, include_usage: bool) -> HttpResponse:
    """``chat.completion.chunk`` events as the run's chunks commit, read as the
    run stream reads them (``dashboard.api.events``): the owner's stream
    records delivery evidence (R7.2), and a disconnect detaches it; the run
    still settles (R7.1). A re-versioned chunk cannot be taken back in
    OpenAI's stream: its text is sent as it comes."""
    connection_id = uuid.uuid4().hex
    stream.connect_viewer(run, connection_id=connection_id, last_event_id=0, now=time_source.now())
    if isinstance(request, ASGIRequest):
        # The request's own thread would otherwise hold a database connection
        # for the stream's whole life (as the run stream does).
        db_connection.close()
        body = _achunks(run, connection_id, include_usage, request)
    else:
        body = _sync_chunks(run, connection_id, include_usage, request)
    response = StreamingHttpResponse(body, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return _with_run_headers(response, request, run, segment_key)


def _chunk(
    run, delta: dict | None, finish_reason: str | None = None, model: str = "", **extra
) -> bytes:
    """One ``chat.completion.chunk`` event; ``delta`` None: no choices (the usage
    chunk). ``model``: the provider's model that answered, once known (the tail);
    until then the segment's."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
    data = {
        "id": f"chatcmpl-{run.id}",
        "object": "chat.completion.chunk",
        "created": int(run.created_at.timestamp()),
        "model": model or run.segment.model,
        "choices": [] if delta is None else [choice],
        **extra,
    }
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _deltas(run, batch) -> bytes:
    sent = b"".join(
        _chunk(run, _delta(m)) for _id, kind, m in batch if kind == "chunk" and m.get("text")
    )
    # Something for every batch: the batch counts as sent once it is written.
    return sent or events.KEEPALIVE


def _delta(chunk: dict) -> dict:
    """A committed chunk as OpenAI's delta: its text, or the client's tool
    calls it hands over (whose text is words for people, not content)."""
    calls = chunk.get("tool_calls")
    if not calls:
        return {"content": chunk["text"]}
    return {"tool_calls": [{"index": i, **_wire_call(call)} for i, call in enumerate(calls)]}


def _wire_call(call: dict) -> dict:
    return {
        "id": call["id"],
        "type": "function",
        "function": {
            "name": call["name"],
            "arguments": json.dumps(call.get("arguments") or {}, ensure_ascii=False),
        },
    }


def _tail(run, include_usage: bool, request: HttpRequest | None = None) -> bytes:
    """The final chunk (finish reason, refusal), the usage chunk if asked, [DONE];
    for a run that did not answer, OpenAI's error event instead (its SDKs raise it)."""
    facts = run_facts(run.id)
    answer = completion(facts) if facts is not None else None
    if answer is None:
        return b"data: [DONE]\n\n"
    failure = failure_of(facts, answer)
    if failure is not None:
        error = json.dumps(_failure_body(request, facts, answer, failure), ensure_ascii=False)
        return f"data: {error}\n\ndata: [DONE]\n\n".encode()
    choice = answer["choices"][0]
    refusal = choice["message"]["refusal"]
    model = answer["model"]
    out = _chunk(run, {"refusal": refusal} if refusal else {}, choice["finish_reason"], model)
    if include_usage:
        # OpenAI's usage chunk: no choices, the whole run's usage.
        out += _chunk(run, None, model=model, usage=answer["usage"])
    return out + b"data: [DONE]\n\n"


def _sync_chunks(run, connection_id: str, include_usage: bool, request) -> Iterator[bytes]:
    yield _chunk(run, {"role": "assistant", "content": ""})
    with contextlib.closing(events.event_batches_sync(run.id, 0, connection_id)) as batches:
        for batch in batches:
            yield _deltas(run, batch)
    yield _tail(run, include_usage, request)


async def _achunks(run, connection_id: str, include_usage: bool, request) -> AsyncIterator[bytes]:
    yield _chunk(run, {"role": "assistant", "content": ""})
    async with contextlib.aclosing(events.event_batches(run.id, 0, connection_id)) as batches:
        async for batch in batches:
            yield _deltas(run, batch)
    yield await off_loop(_tail)(run, include_usage, request)


def _not_found_body() -> bytes:
    # Deleted while the answer waited (its 200 is sent).
    return JsonResponse(
        {"error": {"message": "the run was deleted", "type": "server_error", "param": None,
                   "code": None}}
    ).content  # fmt: skip


def completion(facts: RunFacts) -> dict[str, Any]:
    """The settled run as OpenAI's ``chat.completion``."""
    run = facts.run
    accepted = [a for a in facts.attempts if a.result == "accepted"]
    answered_by = accepted[-1] if accepted else None
    calls = facts.handed_calls
    refusal = None
    finish_reason = "tool_calls" if calls else "stop"
    if answered_by is None and (
        any(a.result == "refused" for a in facts.attempts)
        # Every provider skipped, none asked: each is cooling or frozen here.
        or (facts.settlement and facts.settlement.reason_code == ReasonCode.NO_ELIGIBLE_PROVIDER)
    ):
        # R3.7: every provider of the chain refused (cooling or frozen) here.
        finish_reason = "content_filter"
        refusal = refusal_answer_text(
            run.segment.key, segment_refusals(run.segment), time_source.now(), reprobe_delays()
        )
    elif answered_by is not None and answered_by.finish_reason == "length":
        finish_reason = "length"
    usage = _usage(facts)
    return {
        "id": f"chatcmpl-{run.id}",
        "object": "chat.completion",
        "created": int(run.created_at.timestamp()),
        "model": answered_by.model if answered_by else run.segment.model,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": facts.answer_text or (None if calls else ""),
                    "refusal": refusal,
                    **({"tool_calls": [_wire_call(call) for call in calls]} if calls else {}),
                },
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage,
        "system_fingerprint": None,
        # Not OpenAI's: which provider answered, and how the run settled.
        "governance": {
            "provider_id": answered_by.provider.provider_id if answered_by else None,
            "outcome": facts.settlement.outcome if facts.settlement else None,
            "reason": facts.settlement.reason if facts.settlement else None,
        },
    }


def failure_of(facts: RunFacts, body: dict[str, Any]) -> DoorFailure | None:
    """R6.5: a settled run that gave the client nothing is an error (rules.door)."""
    if facts.settlement is None:
        return None
    choice = body["choices"][0]
    return door_failure(
        facts.settlement.outcome, facts.settlement.reason_code,
        answered=bool(choice["message"]["content"] or choice["message"].get("tool_calls")),
        refused=choice["finish_reason"] == "content_filter",
    )  # fmt: skip


def _failure_body(
    request: HttpRequest | None, facts: RunFacts, body: dict[str, Any], failure: DoorFailure
) -> dict[str, Any]:
    """OpenAI's error shape, saying why in the settlement's words, and where to look."""
    run = facts.run
    where = reverse("run", kwargs={"run_id": run.id})
    if request is not None:
        where = request.build_absolute_uri(where)
    said = (
        f"the run was stopped by {run.cancel_requested_by or 'someone'}"
        if run.cancel_requested_at else "the run did not answer"
    )  # fmt: skip
    return {
        "error": {
            "message": f"{said}: {facts.settlement.reason} (run {where})",
            "type": failure.type, "param": None, "code": failure.code,
        },
        "governance": body["governance"],
    }  # fmt: skip


def _usage(facts: RunFacts) -> dict[str, int]:
    """Every attempt's tokens: the run paid for the refused ones too."""
    counted = [usage_tokens(a.usage) for a in facts.attempts]
    prompt = sum(tokens_in for tokens_in, _ in counted)
    completion_tokens = sum(tokens_out for _, tokens_out in counted)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


permissions.declare(chat_completions, {"POST": permissions.USE_OPENAI_DOOR})
