"""A deterministic in-process provider driven by ``ProviderConfig.script``.

Used by the demo and the tests to produce every kind of provider behaviour
on demand, without a network. It reports ``AttemptEvidence`` exactly as an
HTTP adapter would (kind ``"scripted"``), so the same classifier and the
same clocks apply.

Script format (JSON)::

    {
      "rules": [                       # tried in order; the first match wins
        {"name": "...",                # optional, for people
         "when": {...},                # optional; all conditions must hold
         "times": 2,                   # optional; the rule fires on its first 2
                                       #   matching calls only, then is skipped
         "delay_s": 0,                 # optional; time before the "headers"
         "<action>": {...}}            # exactly one action
      ],
      "default": {"<action>": {...}}   # optional; when no rule matches.
    }                                  # Default: {"answer": {"text": "Echo: {last_user}"}}

Conditions (``when``):

* ``"contains": "forbidden"`` or a list — any message's content (any role,
  system included) contains one of them, case-insensitively;
* ``"last_role": "user"`` / ``"last_role_not": "tool"`` (str or list) — the
  role of the last message;
* ``"has_tool": true`` (the request offers tools) or ``"has_tool": "search"``
  (it offers that tool).

Actions:

* ``"answer": {"text": "...", "chunks": 3, "chunk_interval_s": 0,
  "finish_reason": "stop"}`` — streams the text in ``chunks`` pieces (text
  events are business progress), then usage and finish.
* ``"tool_call": {"name": "search", "arguments": {"q": "{last_user}"},
  "text": "Let me look."}`` (or a list of such objects) — optional preface
  text, then the calls; ``finish_reason "tool_calls"``. Call ids are derived
  from the provider, rule and request bytes, so they are deterministic.
* ``"refuse": {"category": "policy", "text": "I can't help with that."}`` —
  a declared refusal (R2.4: ``scripted_refusal_category``, read as the
  evidence's refusal category).
* ``"fail": {"status": 503, "code": "overloaded", "message": "...",
  "retry_after": "30"}`` — an HTTP error; or ``"fail": {"transport":
  "connect_error"}`` (``connect_timeout``, ``read_timeout``,
  ``connection_reset``) — no response at all.
* ``"stall": {"text": "partial", "chunks": 1}`` — headers and optional
  partial text, then the body breaks with no clock firing (R6.2:
  ``interrupted``, effect unknown).
* ``"heartbeat": {"every_s": 15, "count": null, "then": {"text": "...",
  "chunks": 1}}`` — keep-alives that are *not* progress (R6.1): each one
  first moves time by ``every_s``. With no ``count`` they go on until a limit
  fires (``no_progress`` or the budget); after ``count`` of them the answer
  in ``then`` is streamed, or without ``then`` the body breaks.

Texts and string arguments may use ``{last_user}`` (the last user message),
``{last_message}``, ``{model}`` and ``{provider_id}``.

Time: ``delay_s``, ``chunk_interval_s`` and ``every_s`` move the injected
clock through its ``advance(seconds)`` method when it has one (use
``AdjustableClock`` in tests: no sleeping); a clock without ``advance`` is a
real clock and the adapter sleeps, never past the next limit.

State: ``times`` needs a counter that outlives one call. It lives in a
``ScriptState`` (anything with ``incr(key) -> int``), keyed by provider id,
rule index and a digest of the rule (editing a rule starts it afresh). The
default is one process-wide ``InMemoryScriptState``; pass another (e.g. a
cache-backed one shared by workers) as ``call_provider(..., script_state=...)``.

Examples::

    {"rules": [
      {"when": {"contains": "forbidden"}, "refuse": {"category": "policy"}},
      {"when": {"contains": "flaky"}, "times": 2,
       "fail": {"status": 503, "code": "overloaded", "retry_after": "5"}},
      {"when": {"contains": "hang"}, "stall": {"text": "Partial"}},
      {"when": {"contains": "slow"}, "heartbeat": {"every_s": 10}},
      {"when": {"last_role_not": "tool", "has_tool": "search"},
       "tool_call": {"name": "search", "arguments": {"q": "{last_user}"}}},
      {"when": {"last_role": "tool"}, "answer": {"text": "Found it.", "chunks": 2}}
    ]}
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, runtime_checkable

from governance.rules.classification import TRANSPORT_ERRORS, AttemptEvidence
from tasks.adapters._common import Attempt, StreamRecorder
from tasks.adapters._evidence import evidence_from
from tasks.adapters.base import (
    Adapter,
    CallLimits,
    Clock,
    OnEvent,
    ProviderConfig,
    ProviderRequest,
    ProviderResponse,
    WireAnswer,
)

__all__ = [
    "ACTIONS",
    "ADAPTER",
    "DEFAULT_SCRIPT_STATE",
    "AdjustableClock",
    "InMemoryScriptState",
    "ScriptState",
    "call_scripted",
    "read_evidence",
    "validate_script",
]

ACTIONS = ("answer", "tool_call", "refuse", "fail", "stall", "heartbeat")
_RULE_KEYS = {"name", "when", "times", "delay_s", *ACTIONS}
_WHEN_KEYS = {"contains", "last_role", "last_role_not", "has_tool"}
_ACTION_KEYS = {
    "answer": {"text", "chunks", "chunk_interval_s", "finish_reason"},
    "tool_call": {"name", "arguments", "text", "id"},
    "refuse": {"category", "text"},
    "fail": {"status", "code", "message", "retry_after", "transport"},
    "stall": {"text", "chunks"},
    "heartbeat": {"every_s", "count", "then"},
}
_THEN_KEYS = {"text", "chunks"}
DEFAULT_ACTION: dict[str, Any] = {"answer": {"text": "Echo: {last_user}"}}
# A clock whose advance() does not move time must not spin forever.
_MAX_HEARTBEATS = 100_000


# --------------------------------------------------------------------------- state and clock


@runtime_checkable
class ScriptState(Protocol):
    """Counters for ``times``: ``incr`` adds one and returns the new value, atomically."""

    def incr(self, key: str) -> int: ...


class InMemoryScriptState:
    """Thread-safe counters for one process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def incr(self, key: str) -> int:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            return self._counts[key]

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


DEFAULT_SCRIPT_STATE = InMemoryScriptState()


class AdjustableClock:
    """A clock for tests and demos: ``clock()`` returns the current (aware)
    time, ``advance(seconds)`` moves it. Thread-safe."""

    def __init__(self, start: datetime | None = None) -> None:
        start = start or datetime(2025, 1, 1, tzinfo=UTC)
        if start.utcoffset() is None:
            raise ValueError("AdjustableClock needs an aware start time")
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        if seconds < 0:
            raise ValueError("time does not go back")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now


def _pass_time(rec: StreamRecorder, seconds: float) -> None:
    if seconds <= 0:
        return
    advance = getattr(rec.clock, "advance", None)
    if callable(advance):
        advance(seconds)
        return
    # A real clock: sleep, but never past the next limit (it would fire anyway).
    time.sleep(max(0.0, min(seconds, rec.budget_left_s(), rec.no_progress_left_s())))


# --------------------------------------------------------------------------- validation


def _number(value: Any, where: str, *, minimum: float = 0, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ValueError(f"script: {where} must be a number >= {minimum:g}, got {value!r}")


def _count(value: Any, where: str, *, minimum: int = 1, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"script: {where} must be an integer >= {minimum}, got {value!r}")


def _strings(value: Any, where: str) -> None:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, str) and item for item in items):
        raise ValueError(f"script: {where} must be a non-empty string or list of them")


def _keys(obj: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"script: {where} must be an object, got {type(obj).__name__}")
    unknown = set(obj) - allowed
    if unknown:
        raise ValueError(f"script: {where} has unknown keys {sorted(unknown)}")
    return obj


def _validate_action(rule: dict[str, Any], where: str) -> None:
    actions = [name for name in ACTIONS if name in rule]
    if len(actions) != 1:
        raise ValueError(f"script: {where} needs exactly one action of {ACTIONS}, got {actions}")
    name = actions[0]
    spec = rule[name]
    at = f"{where}.{name}"
    if name == "tool_call" and isinstance(spec, list):
        if not spec:
            raise ValueError(f"script: {at} must not be an empty list")
        for i, call in enumerate(spec):
            _validate_tool_call(call, f"{at}[{i}]")
        return
    if name == "tool_call":
        _validate_tool_call(spec, at)
        return
    spec = _keys(spec, _ACTION_KEYS[name], at)
    for key in ("text", "message", "code", "finish_reason"):
        if key in spec and not isinstance(spec[key], str):
            raise ValueError(f"script: {at}.{key} must be a string")
    if "chunks" in spec:
        _count(spec["chunks"], f"{at}.chunks")
    if name == "answer":
        _number(spec.get("chunk_interval_s", 0), f"{at}.chunk_interval_s")
    elif name == "refuse":
        category = spec.get("category", "policy")
        if not isinstance(category, str) or not category:
            raise ValueError(f"script: {at}.category must name a category")
    elif name == "fail":
        _validate_fail(spec, at)
    elif name == "heartbeat":
        _number(spec.get("every_s"), f"{at}.every_s", minimum=0.001)
        _count(spec.get("count"), f"{at}.count", minimum=0, allow_none=True)
        if "then" in spec:
            then = _keys(spec["then"], _THEN_KEYS, f"{at}.then")
            if not isinstance(then.get("text", ""), str):
                raise ValueError(f"script: {at}.then.text must be a string")
            if "chunks" in then:
                _count(then["chunks"], f"{at}.then.chunks")


def _validate_tool_call(call: Any, at: str) -> None:
    call = _keys(call, _ACTION_KEYS["tool_call"], at)
    if not isinstance(call.get("name"), str) or not call["name"]:
        raise ValueError(f"script: {at}.name must name a tool")
    if not isinstance(call.get("arguments", {}), dict):
        raise ValueError(f"script: {at}.arguments must be an object")
    for key in ("text", "id"):
        if key in call and not isinstance(call[key], str):
            raise ValueError(f"script: {at}.{key} must be a string")


def _validate_fail(spec: dict[str, Any], at: str) -> None:
    if ("status" in spec) == ("transport" in spec):
        raise ValueError(f"script: {at} needs exactly one of status / transport")
    if "status" in spec:
        status = spec["status"]
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"script: {at}.status must be an HTTP error status, got {status!r}")
    elif spec["transport"] not in TRANSPORT_ERRORS:
        raise ValueError(f"script: {at}.transport must be one of {TRANSPORT_ERRORS}")
    retry_after = spec.get("retry_after")
    if retry_after is not None and (
        isinstance(retry_after, bool) or not isinstance(retry_after, str | int | float)
    ):
        raise ValueError(f"script: {at}.retry_after must be a string or a number")


def validate_script(script: Any) -> list[dict[str, Any]]:
    """Check the whole script; return its rules. Raises ValueError on any mistake."""
    script = _keys(script, {"rules", "default"}, "the script")
    rules = script.get("rules", [])
    if not isinstance(rules, list):
        raise ValueError("script: rules must be a list")
    for index, rule in enumerate(rules):
        where = f"rules[{index}]"
        rule = _keys(rule, _RULE_KEYS, where)
        when = _keys(rule.get("when", {}), _WHEN_KEYS, f"{where}.when")
        for key in ("contains", "last_role", "last_role_not"):
            if key in when:
                _strings(when[key], f"{where}.when.{key}")
        if "has_tool" in when and not isinstance(when["has_tool"], bool | str):
            raise ValueError(f"script: {where}.when.has_tool must be true/false or a tool name")
        if "name" in rule and not isinstance(rule["name"], str):
            raise ValueError(f"script: {where}.name must be a string")
        _count(rule.get("times"), f"{where}.times", allow_none=True)
        _number(rule.get("delay_s", 0), f"{where}.delay_s")
        _validate_action(rule, where)
    if "default" in script:
        default = _keys(script["default"], set(ACTIONS), "default")
        _validate_action(default, "default")
    return rules


# --------------------------------------------------------------------------- matching


def _as_list(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value]


def _matches(when: dict[str, Any], request: ProviderRequest) -> bool:
    if "contains" in when:
        haystack = [m.content.casefold() for m in request.messages]
        needles = [n.casefold() for n in _as_list(when["contains"])]
        if not any(needle in text for needle in needles for text in haystack):
            return False
    last_role = request.messages[-1].role if request.messages else None
    if "last_role" in when and last_role not in _as_list(when["last_role"]):
        return False
    if "last_role_not" in when and last_role in _as_list(when["last_role_not"]):
        return False
    if "has_tool" in when:
        wanted = when["has_tool"]
        names = {tool.name for tool in request.tools}
        offered = bool(names) if isinstance(wanted, bool) else wanted in names
        if offered != (wanted is not False):
            return False
    return True


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _request_digest(request: ProviderRequest) -> str:
    return _digest(
        [
            [m.role, m.content, m.tool_call_id, [[c.id, c.name, c.arguments] for c in m.tool_calls]]
            for m in request.messages
        ]
    )


def select_rule(
    config: ProviderConfig, request: ProviderRequest, state: ScriptState
) -> tuple[int | None, dict[str, Any]]:
    """(index, rule) of the first rule that fires, or (None, default action)."""
    script = config.script
    rules = validate_script(script)
    for index, rule in enumerate(rules):
        if not _matches(rule.get("when", {}), request):
            continue
        if rule.get("times") is not None:
            key = f"{config.provider_id}#{index}:{_digest(rule)[:12]}"
            if state.incr(key) > rule["times"]:
                continue  # used up: this rule no longer fires
        return index, rule
    assert script is not None
    return None, script.get("default", DEFAULT_ACTION)


# --------------------------------------------------------------------------- running


def _fill(value: Any, names: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, text in names.items():
            value = value.replace("{" + name + "}", text)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, names) for v in value]
    return value


def split_chunks(text: str, chunks: int) -> list[str]:
    """``text`` in at most ``chunks`` non-empty, nearly equal pieces, in order."""
    if not text:
        return []
    count = max(1, min(chunks, len(text)))
    size, extra = divmod(len(text), count)
    pieces, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def _words(text: str) -> int:
    return len(text.split())


class _Run:
    """One scripted attempt: emits events, checks the limits after each one."""

    def __init__(self, attempt: Attempt, request: ProviderRequest) -> None:
        self.attempt = attempt
        self.rec = attempt.rec
        self.request = request

    def stopped(self) -> bool:
        if (name := self.rec.limit_hit()) is not None:
            self.attempt.cut(name)
            return True
        return False

    def headers(self) -> bool:
        self.attempt.headers(200)
        return not self.stopped()

    def stream_text(self, text: str, chunks: int, interval_s: float = 0.0) -> bool:
        for i, piece in enumerate(split_chunks(text, chunks)):
            if i:
                _pass_time(self.rec, interval_s)
                if self.stopped():
                    return False
            self.attempt.text(piece)
            if self.stopped():
                return False
        return True

    def complete(self, finish_reason: str, output: str) -> None:
        input_words = sum(_words(m.content) for m in self.request.messages)
        self.attempt.set_usage(input_tokens=input_words, output_tokens=_words(output))
        self.attempt.finish_reason = finish_reason
        self.attempt.done = True


def _run_action(run: _Run, action: dict[str, Any], names: dict[str, str], ids_seed: str) -> None:
    attempt = run.attempt
    name = next(key for key in ACTIONS if key in action)
    spec = _fill(action[name], names)

    if name == "fail":
        if "transport" in spec:
            words = f"scripted transport failure: {spec['transport']}"
            attempt.transport(spec["transport"], words)
            return
        attempt.headers(spec["status"])
        attempt.error_code = spec.get("code")
        attempt.error_message = spec.get("message")
        attempt.retry_after = spec.get("retry_after")
        attempt.error = f"HTTP {spec['status']} {spec.get('code') or ''}".strip()
        return

    if not run.headers():
        return

    if name == "refuse":
        category = spec.get("category", "policy")
        attempt.scripted_refusal_category = category
        attempt.finish_reason = "refusal"
        attempt.error = f"refused ({category}): {spec.get('text', '')}".rstrip(": ")
        attempt.done = True
    elif name == "answer":
        text = spec.get("text", "")
        if run.stream_text(text, spec.get("chunks", 1), spec.get("chunk_interval_s", 0)):
            run.complete(spec.get("finish_reason", "stop"), text)
    elif name == "tool_call":
        calls = spec if isinstance(spec, list) else [spec]
        preface = calls[0].get("text", "")
        if not run.stream_text(preface, 1):
            return
        output = preface
        for k, call in enumerate(calls):
            call_id = call.get("id") or f"call_{_digest([ids_seed, k])[:16]}"
            arguments = call.get("arguments", {})
            attempt.tools.update(k, id=call_id, name=call["name"], initial=arguments)
            attempt.rec.emit("tool_call", call["name"])
            if run.stopped():
                return
            output += " " + json.dumps(arguments)
        run.complete("tool_calls", output)
    elif name == "stall":
        run.stream_text(spec.get("text", ""), spec.get("chunks", 1))
        if attempt.timeout_name is None:
            attempt.transport("connection_reset", "scripted stall: the body broke after headers")
    elif name == "heartbeat":
        count = spec.get("count")
        limit = _MAX_HEARTBEATS if count is None else min(count, _MAX_HEARTBEATS)
        for _ in range(limit):
            _pass_time(run.rec, spec["every_s"])
            if run.stopped():
                return
            attempt.rec.emit("heartbeat", "keep-alive")
            if run.stopped():
                return
        then = spec.get("then")
        if then is None:
            attempt.transport("connection_reset", "scripted heartbeats ended without a body")
        elif run.stream_text(then.get("text", ""), then.get("chunks", 1)):
            run.complete("stop", then.get("text", ""))


def read_evidence(answer: WireAnswer) -> AttemptEvidence:
    """A scripted answer as evidence (R2.1; R2.4: the refusal its script declared)."""
    return evidence_from(answer, refusal_category=answer.scripted_refusal_category)


def call_scripted(
    config: ProviderConfig,
    request: ProviderRequest,
    *,
    limits: CallLimits,
    clock: Clock,
    on_event: OnEvent | None = None,
    script_state: ScriptState | None = None,
) -> ProviderResponse:
    """Run the script against ``request``; see the module docstring for the format."""
    if config.script is None:
        raise ValueError(f"scripted provider {config.provider_id!r} has no script")
    validate_script(config.script)
    state = script_state if script_state is not None else DEFAULT_SCRIPT_STATE
    if not isinstance(state, ScriptState):
        raise ValueError("script_state must have incr(key) -> int")
    attempt = Attempt(read_evidence, StreamRecorder(clock, limits, on_event))
    attempt.response_model = request.model or config.model
    run = _Run(attempt, request)
    if run.stopped():
        return attempt.response()  # no time left: nothing is "sent", no counter moves
    index, rule = select_rule(config, request, state)
    users = [m.content for m in request.messages if m.role == "user"]
    names = {
        "last_user": users[-1] if users else "",
        "last_message": request.messages[-1].content if request.messages else "",
        "model": request.model or config.model,
        "provider_id": config.provider_id,
    }
    _pass_time(attempt.rec, float(rule.get("delay_s", 0)))
    if not run.stopped():
        seed = f"{config.provider_id}|{index}|{_request_digest(request)}"
        _run_action(run, rule, names, seed)
    return attempt.response()


def _call(config, request, *, limits, clock, on_event, transport, script_state) -> ProviderResponse:
    # The script names the tools by their own names: nothing to read back.
    return call_scripted(
        config, request, limits=limits, clock=clock, on_event=on_event, script_state=script_state
    )


ADAPTER = Adapter(call=_call, read_evidence=read_evidence, check_script=validate_script)
