"""Machinery shared by the adapters: limits on the injected clock, stream
events, SSE parsing, tool-call assembly, httpx timeouts and the mapping of
transport failures to evidence.

Nothing here classifies: an attempt only *records* what it saw (status, codes,
which clock fired, whether the body completed), its adapter reads that into
``AttemptEvidence`` (``_evidence.py``) and ``governance.rules.classification``
names the class.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

import httpx

from governance.rules.run_clocks import name_timeout, stream_event_is_progress
from governance.rules.tools import tool_name_of
from governance.services.secrets import mask_url
from tasks import outbound
from tasks.adapters.base import (
    Adapter,
    CallLimits,
    Clock,
    OnEvent,
    ProviderConfig,
    ProviderRequest,
    ProviderResponse,
    ReadEvidence,
    StreamEvent,
    StreamEventKind,
    ToolCall,
    WireAnswer,
)

# R6.1: only what the run can use counts as business progress. Headers,
# heartbeats, usage and reasoning fragments prove the pipe is alive, nothing more.

# A tool call whose streamed arguments are not a JSON object keeps the raw text
# under this key, so the runner can refuse to execute it instead of guessing.
INVALID_ARGUMENTS_KEY = "_invalid_arguments_json"

# An error body is read only this far: it is evidence, not payload.
MAX_ERROR_BODY_BYTES = 64 * 1024
# Smallest timeout handed to httpx (0 would mean "no wait at all" on some paths).
_MIN_TIMEOUT_S = 0.001

TimeoutName = Literal["stage_timeout", "no_progress", "deadline_exceeded"]


class MalformedStream(Exception):
    """The provider sent bytes that are not the protocol (e.g. a data line that is not JSON)."""


def tool_names_back(request: ProviderRequest, response: ProviderResponse) -> ProviderResponse:
    """The model's calls by the tools' own names (the wire names read back)."""
    if request.tool_names and response.tool_calls:
        response.tool_calls = tuple(
            replace(call, name=tool_name_of(call.name, request.tool_names))
            for call in response.tool_calls
        )
    return response


def http_adapter(call, read_evidence) -> Adapter:
    """The registry entry of an HTTP vendor adapter: ``call`` sends the request,
    and the model's tool names are mapped back from the wire (rules.tools)."""

    def adapted(config, request, *, limits, clock, on_event, transport, script_state):
        response = call(
            config, request, limits=limits, clock=clock, on_event=on_event, transport=transport
        )
        return tool_names_back(request, response)

    return Adapter(call=adapted, read_evidence=read_evidence)


# --------------------------------------------------------------------------- clocks


def check_limits(limits: CallLimits) -> None:
    """Programming errors in the limits raise ValueError (call_provider's contract)."""
    if not isinstance(limits, CallLimits):
        raise ValueError(f"limits must be CallLimits, got {type(limits).__name__}")
    for name in ("budget_s", "no_progress_s"):
        value = getattr(limits, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ValueError(f"limits.{name} must be a number, got {value!r}")
    if limits.no_progress_s <= 0:
        raise ValueError(f"limits.no_progress_s must be > 0, got {limits.no_progress_s!r}")


def _cut_name(
    *, deadline_passed: bool, no_progress_exceeded: bool, stage_budget_exceeded: bool
) -> TimeoutName | None:
    # Inside one attempt the queue clock is over and an interruption is not a
    # cut by a clock, so those two facts are always False here.
    verdict = name_timeout(
        deadline_passed=deadline_passed,
        no_progress_exceeded=no_progress_exceeded,
        stage_budget_exceeded=stage_budget_exceeded,
        queue_wait_exceeded=False,
        body_interrupted_after_headers=False,
    )
    return None if verdict is None else verdict.name.value  # type: ignore[return-value]


class StreamRecorder:
    """Stamps every stream event with the injected clock and watches the limits.

    The no-progress clock of one attempt starts when the attempt starts (the
    runner passes the allowance that is left) and is reset only by
    business-progress events (R6.1, ``run_clocks.stream_event_is_progress``).
    """

    def __init__(self, clock: Clock, limits: CallLimits, on_event: OnEvent | None) -> None:
        check_limits(limits)
        if not callable(clock):
            raise ValueError("clock must be callable and return an aware datetime")
        self.clock = clock
        self.limits = limits
        self.on_event = on_event
        self.events: list[StreamEvent] = []
        self.start = self.now()
        self.last_progress = self.start

    def now(self) -> datetime:
        value = self.clock()
        if not isinstance(value, datetime) or value.utcoffset() is None:
            raise ValueError(f"clock() must return an aware datetime, got {value!r}")
        return value

    def emit(self, kind: StreamEventKind, text: str = "") -> StreamEvent:
        event = StreamEvent(kind=kind, at=self.now(), text=text)
        self.events.append(event)
        if stream_event_is_progress(kind):
            self.last_progress = event.at
        if self.on_event is not None:
            self.on_event(event)
        return event

    def budget_left_s(self) -> float:
        return self.limits.budget_s - (self.now() - self.start).total_seconds()

    def no_progress_left_s(self) -> float:
        return self.limits.no_progress_s - (self.now() - self.last_progress).total_seconds()

    def limit_hit(self) -> TimeoutName | None:
        """The clock that ran out, or None: named by R6.2's one rule
        (``governance.rules.run_clocks.name_timeout``); reaching a limit counts."""
        budget_out = self.budget_left_s() <= 0
        return _cut_name(
            deadline_passed=budget_out and self.limits.deadline_bound,
            no_progress_exceeded=self.no_progress_left_s() <= 0,
            stage_budget_exceeded=budget_out,
        )

    def budget_name(self) -> TimeoutName:
        """The name of a cut by the stage's time budget (itself capped by the deadline)."""
        name = _cut_name(
            deadline_passed=self.limits.deadline_bound,
            no_progress_exceeded=False,
            stage_budget_exceeded=True,
        )
        assert name is not None  # a budget that ran out is always named
        return name

    def no_progress_name(self) -> TimeoutName:
        """The name of a cut by the no-progress bound (R6.2's rule names it)."""
        name = _cut_name(
            deadline_passed=False, no_progress_exceeded=True, stage_budget_exceeded=False
        )
        assert name is not None  # a no-progress bound that ran out is always named
        return name

    def elapsed_ms(self) -> int:
        return max(0, int((self.now() - self.start).total_seconds() * 1000))


# --------------------------------------------------------------------------- tool calls


def parse_arguments(raw: str) -> dict[str, Any]:
    """Streamed arguments → dict; "" is no arguments; anything else is kept raw."""
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {INVALID_ARGUMENTS_KEY: raw}
    return value if isinstance(value, dict) else {INVALID_ARGUMENTS_KEY: raw}


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    initial: dict[str, Any] | None = None


class ToolCallAssembler:
    """Tool calls assembled from fragments, keyed by the provider's index."""

    def __init__(self) -> None:
        self._calls: dict[int, _PartialCall] = {}

    def __bool__(self) -> bool:
        return bool(self._calls)

    def update(
        self,
        index: int,
        *,
        id: str | None = None,
        name: str | None = None,
        arguments: str | None = None,
        initial: dict[str, Any] | None = None,
    ) -> None:
        call = self._calls.setdefault(index, _PartialCall())
        if id:
            call.id = id
        if name:
            # Most servers send the whole name once; some repeat it on every
            # delta, a few stream it in fragments.
            call.name = name if name.startswith(call.name) else call.name + name
        if arguments:
            call.arguments.append(arguments)
        if initial:
            call.initial = initial

    def finish(self) -> tuple[ToolCall, ...]:
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            raw = "".join(call.arguments)
            arguments = parse_arguments(raw) if raw or call.initial is None else dict(call.initial)
            calls.append(
                ToolCall(id=call.id or f"call_{index}", name=call.name, arguments=arguments)
            )
        return tuple(calls)


# --------------------------------------------------------------------------- the attempt


class Attempt:
    """Everything one attempt observed; ``response()`` turns it into the result.

    Fields named like ``WireAnswer``'s are reported there verbatim, and
    ``read_evidence`` (the adapter's own, R2.4) reads that answer into the
    evidence. ``status_in_evidence`` is False for a failure carried by a
    stream error event after a 200: the 200 does not explain that failure
    (the OpenAI adapter reads a content-policy code without a status as a
    refusal, R2.4).
    """

    def __init__(self, read_evidence: ReadEvidence, rec: StreamRecorder):
        self.read_evidence = read_evidence
        self.rec = rec
        self.status_code: int | None = None
        self.status_in_evidence = True
        self.error_code: str | None = None
        self.error_message: str | None = None
        self.finish_reason: str | None = None
        self.refusal_parts: list[str] = []
        self.stop_reason: str | None = None
        self.scripted_refusal_category: str | None = None
        self.transport_error: str | None = None
        self.headers_received = False
        self.body_complete = True
        self.deadline_evidence = False
        self.retry_after: str | float | None = None
        self.text_parts: list[str] = []
        self.tools = ToolCallAssembler()
        self.usage: dict[str, int] = {}
        self.response_model: str | None = None
        self.timeout_name: TimeoutName | None = None
        self.config_refused = False
        self.error = ""
        self.done = False  # the protocol's terminator was seen

    # -- observations -----------------------------------------------------

    def headers(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers_received = True
        self.rec.emit("headers", str(status_code))

    def text(self, fragment: str) -> None:
        if fragment:
            self.text_parts.append(fragment)
            self.rec.emit("text", fragment)

    def reasoning(self, fragment: str) -> None:
        if fragment:
            self.rec.emit("reasoning", fragment)

    def set_usage(self, **counts: Any) -> None:
        changed = False
        for key, value in counts.items():
            if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
                self.usage[key] = value
                changed = True
        if changed:
            self.rec.emit("usage", json.dumps(self.usage, sort_keys=True))

    def stream_error(self, code: str | None, message: str | None) -> None:
        """A failure reported inside a 2xx stream (error event / error chunk)."""
        self.status_in_evidence = False
        self.error_code = code
        self.error_message = message
        self.body_complete = False
        self.done = True
        self.error = f"provider error in the stream: {code or 'unknown'}: {message or ''}".strip()

    def cut(self, name: TimeoutName) -> None:
        """Our own clock fired: stop reading (R6.1/R6.2)."""
        self.timeout_name = name
        self.deadline_evidence = True
        if self.headers_received:
            self.body_complete = False
        seconds = {
            "no_progress": f"no business progress for {self.rec.limits.no_progress_s:g} s",
            "stage_timeout": f"stage budget of {self.rec.limits.budget_s:g} s used up",
            "deadline_exceeded": "the run's deadline was reached",
        }[name]
        self.error = f"{name}: {seconds}; stopped reading"

    def transport(self, error: str, words: str) -> None:
        self.transport_error = error
        if self.headers_received:
            self.body_complete = False
        self.error = words

    def broken_body(self, words: str) -> None:
        self.body_complete = False
        self.error = words

    def refused(self, words: str) -> None:
        """This side refused the configuration: nothing was sent."""
        self.config_refused = True
        self.error = f"configuration refused, nothing was sent: {words}"

    # -- result -------------------------------------------------------------

    @property
    def refusal_text(self) -> str | None:
        text = "".join(self.refusal_parts)
        return text or None

    def answer(self) -> WireAnswer:
        return WireAnswer(
            status_code=self.status_code if self.status_in_evidence else None,
            error_code=self.error_code,
            error_message=self.error_message,
            finish_reason=self.finish_reason,
            message_refusal=self.refusal_text,
            stop_reason=self.stop_reason,
            scripted_refusal_category=self.scripted_refusal_category,
            transport_error=self.transport_error,  # type: ignore[arg-type]
            headers_received=self.headers_received,
            body_complete=self.body_complete,
            deadline_evidence=self.deadline_evidence,
            retry_after=self.retry_after,
            config_refused=self.config_refused,
        )

    def response(self) -> ProviderResponse:
        complete = self.body_complete and self.timeout_name is None and not self.error_code
        # An incomplete tool call must never be executed: only a complete body yields calls.
        tool_calls = self.tools.finish() if complete else ()
        answer = self.answer()
        if not self.error and self.refusal_text:
            self.error = f"refused: {self.refusal_text}"
        reason = self.finish_reason or self.stop_reason
        self.rec.emit("finish", reason or self.timeout_name or self.transport_error or "")
        return ProviderResponse(
            text="".join(self.text_parts),
            tool_calls=tool_calls,
            finish_reason=reason,
            usage=dict(self.usage),
            status_code=self.status_code,
            latency_ms=self.rec.elapsed_ms(),
            response_model=self.response_model,
            events=self.rec.events,
            evidence=self.read_evidence(answer),
            answer=answer,
            error=self.error,
            timeout_name=self.timeout_name,
        )


# --------------------------------------------------------------------------- SSE


@dataclass(frozen=True)
class SseItem:
    """One server-sent event, or one comment line (a keep-alive)."""

    event: str
    data: str
    comment: bool = False


def iter_sse(lines: Iterable[str]) -> Iterator[SseItem]:
    """Parse SSE lines (WHATWG event-stream): ``event:``/``data:`` fields up to a
    blank line make one event; a line starting with ``:`` is a comment, yielded
    at once (it is how providers send keep-alives). ``id:``/``retry:`` are
    ignored. A last event without its blank line is still dispatched."""
    event = ""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield SseItem(event or "message", "\n".join(data))
            event, data = "", []
            continue
        if line.startswith(":"):
            yield SseItem("", line[1:].strip(), comment=True)
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event = value
    if data:
        yield SseItem(event or "message", "\n".join(data))


def obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else {}: a field of the wrong shape is ignored
    rather than allowed to crash the adapter."""
    return value if isinstance(value, dict) else {}


def index_of(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else ""


def load_json(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise MalformedStream(f"not JSON: {data[:200]!r}") from exc


def error_fields(obj: Any) -> tuple[str | None, str | None, str | None]:
    """(code, type, message) from the common error envelopes:
    ``{"error": {"code", "type", "message"}}``, ``{"error": "text"}``,
    ``{"message": ...}``, ``{"detail": ...}``."""
    if not isinstance(obj, dict):
        return None, None, None
    error = obj.get("error", obj)
    if isinstance(error, str):
        return None, None, error
    if not isinstance(error, dict):
        return None, None, None
    code = error.get("code")
    kind = error.get("type")
    message = error.get("message", obj.get("detail"))
    return (
        code if isinstance(code, str) and code else None,
        kind if isinstance(kind, str) and kind else None,
        message if isinstance(message, str) else (json.dumps(message) if message else None),
    )


# --------------------------------------------------------------------------- HTTP


def check_http_config(config: ProviderConfig) -> str:
    """The base URL without a trailing slash; bad configuration raises ValueError."""
    base = (config.base_url or "").strip().rstrip("/")
    if not base:
        raise ValueError(f"provider {config.provider_id!r} ({config.kind}) needs a base_url")
    shown = mask_url(base)
    try:
        url = httpx.URL(base)
    except httpx.InvalidURL as exc:
        raise ValueError(f"provider {config.provider_id!r}: bad base_url {shown!r}: {exc}") from exc
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(
            f"provider {config.provider_id!r}: base_url must be http(s), got {shown!r}"
        )
    for name in ("connect_timeout_s", "read_timeout_s"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(f"provider {config.provider_id!r}: {name} must be > 0, got {value!r}")
    return base


ReadBound = Literal["read", "budget", "no_progress"]


@dataclass(frozen=True)
class TimeoutPlan:
    timeout: httpx.Timeout
    read_bound: ReadBound  # which limit the read timeout stands for
    connect_by_budget: bool  # the connect timeout is the budget left, not the config's


def http_timeouts(config: ProviderConfig, rec: StreamRecorder) -> TimeoutPlan:
    """httpx timeouts bounded by what is left on our clocks (R6.1).

    connect = min(connect_timeout_s, budget left); read = min(read_timeout_s,
    budget left, no-progress allowance): a read that waits longer than either
    could only end in that clock firing. Returns which limit bounds the read,
    so a ReadTimeout can be named by its clock.
    """
    budget = max(_MIN_TIMEOUT_S, rec.budget_left_s())
    no_progress = max(_MIN_TIMEOUT_S, rec.no_progress_left_s())
    candidates: list[tuple[float, int, ReadBound]] = [
        (budget, 0 if rec.limits.deadline_bound else 2, "budget"),
        (no_progress, 1, "no_progress"),
        (float(config.read_timeout_s), 3, "read"),
    ]
    read, _, bound = min(candidates)
    connect = min(float(config.connect_timeout_s), budget)
    return TimeoutPlan(
        timeout=httpx.Timeout(connect=connect, read=read, write=read, pool=connect),
        read_bound=bound,
        connect_by_budget=budget < config.connect_timeout_s,
    )


def retry_after_header(headers: httpx.Headers) -> str | float | None:
    raw = headers.get("retry-after")
    if raw is not None and raw.strip():
        return raw.strip()
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            seconds = float(millis) / 1000
        except ValueError:
            return None
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    return None


class WireParser(Protocol):
    """One provider's stream grammar, fed by ``stream_http``."""

    def on_event(self, item: SseItem, attempt: Attempt) -> None: ...

    def on_json_body(self, obj: Any, attempt: Attempt) -> None: ...

    def on_error_body(self, obj: Any, attempt: Attempt) -> None: ...

    def on_end(self, attempt: Attempt) -> None: ...


def _read_capped(response: httpx.Response) -> bytes:
    body = b""
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) >= MAX_ERROR_BODY_BYTES:
            break
    return body[:MAX_ERROR_BODY_BYTES]


def _name_read_timeout(attempt: Attempt, bound: ReadBound) -> None:
    rec = attempt.rec
    name = rec.limit_hit()
    if name is None and bound == "budget":
        name = rec.budget_name()
    elif name is None and bound == "no_progress":
        name = rec.no_progress_name()
    where = "reading the body" if attempt.headers_received else "waiting for the response"
    attempt.transport("read_timeout", f"read timeout while {where}")
    if name is not None:
        # The read was cut by one of our clocks, not by the provider's read timeout.
        attempt.cut(name)


def _error_answer(response: httpx.Response, parser: WireParser, attempt: Attempt) -> None:
    """A non-2xx answer: its Retry-After and its error body (read only so far) are evidence."""
    attempt.retry_after = retry_after_header(response.headers)
    raw = _read_capped(response)
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = {"error": raw.decode("utf-8", "replace")[:500] or None}
    parser.on_error_body(obj, attempt)
    if not attempt.error:
        attempt.error = (
            f"HTTP {response.status_code} {attempt.error_code or ''}: {attempt.error_message or ''}"
        ).strip()


def stream_http(
    attempt: Attempt,
    parser: WireParser,
    *,
    config: ProviderConfig,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    transport: httpx.BaseTransport | None,
) -> None:
    """POST ``body`` and feed the response to ``parser``; every failure becomes evidence.

    The request goes where the outbound rules let it (``tasks.outbound``: the
    host resolved now, every address checked, the connection pinned to one
    that passed), as a callback's does: a base URL that leads to loopback, a
    private or a metadata address not in ``GOVERNANCE_OUTBOUND_ALLOW`` — given
    so, or by a DNS answer that changed since — gets nothing, its key least
    of all. Neither does a configuration the caller refused (``config.refused``).
    """
    rec = attempt.rec
    if config.refused:
        attempt.refused(config.refused)
        return
    if (name := rec.limit_hit()) is not None:
        attempt.cut(name)  # no time left: nothing is sent
        return
    plan = http_timeouts(config, rec)
    shown = mask_url(url)
    # A caller's transport may be shared: closing our client would close it too.
    client = httpx.Client(transport=transport, timeout=plan.timeout)
    try:
        with outbound.stream(client, "POST", url, json=body, headers=headers) as response:
            attempt.headers(response.status_code)
            if not 200 <= response.status_code < 300:
                _error_answer(response, parser, attempt)
                return
            if (name := rec.limit_hit()) is not None:
                attempt.cut(name)
                return
            content_type = response.headers.get("content-type", "")
            if "json" in content_type and "event-stream" not in content_type:
                # Some compatible servers ignore stream=true and answer in one body.
                parser.on_json_body(load_json(response.read().decode("utf-8", "replace")), attempt)
                attempt.done = True
                return
            lines = response.iter_lines()
            for item in iter_sse(lines):
                if item.comment:
                    rec.emit("heartbeat", item.data)
                else:
                    parser.on_event(item, attempt)
                if attempt.done:
                    _finish_arrived_body(response, lines)
                    break
                if (name := rec.limit_hit()) is not None:
                    attempt.cut(name)
                    return
            parser.on_end(attempt)
    except outbound.OutboundRefused as exc:
        attempt.refused(f"base_url {mask_url(config.base_url)}: {exc.reason}")
    except httpx.LocalProtocolError as exc:
        raise ValueError(f"provider {config.provider_id!r}: cannot send request: {exc}") from exc
    except (httpx.ConnectTimeout, httpx.PoolTimeout):
        attempt.transport("connect_timeout", f"connect timeout to {shown}")
        name = rec.limit_hit() or (rec.budget_name() if plan.connect_by_budget else None)
        if name is not None:
            attempt.cut(name)
    except (httpx.ReadTimeout, httpx.WriteTimeout):
        _name_read_timeout(attempt, plan.read_bound)
    except (httpx.ConnectError, httpx.ProxyError, httpx.UnsupportedProtocol) as exc:
        if attempt.headers_received:
            attempt.transport("connection_reset", f"connection lost: {exc}")
        else:
            attempt.transport("connect_error", f"cannot connect to {shown}: {exc}")
    except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.CloseError) as exc:
        where = "after the headers" if attempt.headers_received else "before any response"
        attempt.transport("connection_reset", f"connection closed {where}: {exc}")
    except httpx.DecodingError as exc:
        attempt.broken_body(f"response body could not be decoded: {exc}")
    except httpx.TransportError as exc:
        kind = "connection_reset" if attempt.headers_received else "connect_error"
        attempt.transport(kind, f"transport error: {exc}")
    except MalformedStream as exc:
        attempt.broken_body(f"malformed stream: {exc}")
    finally:
        if transport is None:
            client.close()


def _finish_arrived_body(response: httpx.Response, lines: Iterator[str]) -> None:
    """The answer is complete. When the whole body has already arrived (its
    Content-Length is in), read its end, so the kept-alive connection goes
    back to the pool instead of being closed: otherwise every attempt pays a
    new connection (and a TLS handshake). Never waits on the network: a
    chunked stream, whose end may still be on its way, is left as it was."""
    length = response.headers.get("content-length", "")
    if length.isdigit() and response.num_bytes_downloaded >= int(length):
        for _rest in lines:
            pass


def base_headers(idempotency_key: str | None) -> dict[str, str]:
    headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
    if idempotency_key:
        headers["Idempotency-Key"] = idempotency_key
    return headers
