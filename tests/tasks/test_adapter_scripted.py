"""The scripted provider: every rule, the N-times counter, determinism
(R2.1, R2.2, R2.4, R6.1, R6.2). Time moves only through AdjustableClock."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasks.adapters import (
    AdjustableClock,
    InMemoryScriptState,
    ScriptState,
    call_provider,
    validate_script,
)
from tasks.adapters.base import (
    CallLimits,
    ChatMessage,
    ProviderConfig,
    ProviderRequest,
    ToolCall,
    ToolSpec,
)
from tasks.adapters.scripted import split_chunks
from tests.tasks.test_adapter_wire import LIMITS, classify, kinds, start, user

SEARCH = ToolSpec("search", "Search the web", {"type": "object"})


def scripted(script: dict[str, Any], provider_id: str = "sc") -> ProviderConfig:
    return ProviderConfig(provider_id, "scripted", "script-1", script=script)


def run(
    script: dict[str, Any] | ProviderConfig,
    request: ProviderRequest | str = "hello",
    *,
    state: ScriptState | None = None,
    clock: AdjustableClock | None = None,
    limits: CallLimits = LIMITS,
    on_event=None,
):
    config = script if isinstance(script, ProviderConfig) else scripted(script)
    request = user(request) if isinstance(request, str) else request
    clock = clock or AdjustableClock(start())
    response = call_provider(
        config,
        request,
        limits=limits,
        clock=clock,
        on_event=on_event,
        script_state=state if state is not None else InMemoryScriptState(),
    )
    return response, clock


# --------------------------------------------------------------------------- answers


def test_r2_1_scripted_default_echoes_the_last_user_message():
    """R2.1: with no rule matching, the default answer echoes; a success with usage."""
    response, clock = run({}, "How are you?")
    assert response.text == "Echo: How are you?"
    assert response.finish_reason == "stop"
    assert response.usage == {"input_tokens": 3, "output_tokens": 4}
    assert response.response_model == "m-1"  # the requested model
    assert kinds(response) == ["headers", "text", "usage", "finish"]
    assert classify(response, clock).failure_class is None


def test_r6_1_scripted_answer_streams_in_n_chunks_as_progress():
    """R6.1: an answer in N chunks gives N text events (business progress)."""
    script = {"rules": [{"answer": {"text": "abcdefghij", "chunks": 3}}]}
    seen = []
    response, _ = run(script, on_event=seen.append)
    assert [e.text for e in response.events if e.kind == "text"] == ["abcd", "efg", "hij"]
    assert seen == response.events
    assert response.text == "abcdefghij"


def test_r2_1_scripted_custom_default_and_placeholders():
    """R2.1: `default` replaces the echo; {model}/{provider_id}/{last_user} are filled."""
    script = {"default": {"answer": {"text": "{provider_id}/{model}: {last_user}"}}}
    response, _ = run(script, "ping")
    assert response.text == "sc/m-1: ping"


def test_r2_1_scripted_rules_are_tried_in_order_first_match_wins():
    """R2.1: the first matching rule decides; later matches are not consulted."""
    script = {
        "rules": [
            {"when": {"contains": "alpha"}, "answer": {"text": "first"}},
            {"when": {"contains": "beta"}, "answer": {"text": "second"}},
            {"answer": {"text": "catch-all"}},
        ]
    }
    assert run(script, "alpha and beta")[0].text == "first"
    assert run(script, "only beta")[0].text == "second"
    assert run(script, "gamma")[0].text == "catch-all"


# --------------------------------------------------------------------------- refusals


def test_r2_4_scripted_refusal_is_declared_by_trigger_with_its_category():
    """R2.4: a trigger in any message (case-insensitive, tool results included) makes
    the scripted provider refuse with the declared category."""
    script = {
        "rules": [
            {
                "when": {"contains": ["FORBIDDEN", "secret plan"]},
                "refuse": {"category": "policy", "text": "Not this."},
            }
        ]
    }
    request = ProviderRequest(
        model="script-1",
        messages=(
            ChatMessage("system", "You are helpful."),
            ChatMessage("user", "Summarise the search."),
            ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "search", {}),)),
            ChatMessage("tool", "…the Forbidden text…", tool_call_id="c1"),
        ),
    )
    response, clock = run(script, request)
    assert response.answer.scripted_refusal_category == "policy"
    assert response.evidence.refusal_category == "policy"  # read by the adapter
    assert response.text == "" and "Not this." in response.error
    assert "text" not in kinds(response)
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", "policy")
    assert not verdict.moves_breaker
    # Without the trigger the same provider answers.
    assert classify(run(script, "harmless")[0], clock).failure_class is None


def test_r2_4_scripted_refusal_repeats_for_the_same_bytes():
    """R2.4/R2.3: a refusal is a fact about the bytes: the same request is refused
    every time (no counter), so re-probes of refused history stay refused."""
    script = {"rules": [{"when": {"contains": "x-refuse"}, "refuse": {"category": "content"}}]}
    state = InMemoryScriptState()
    for _ in range(5):
        response, clock = run(script, "please x-refuse", state=state)
        assert classify(response, clock).refusal_category == "content"


# --------------------------------------------------------------------------- failures


def test_r2_2_scripted_fails_n_times_with_retry_after_then_stops_failing():
    """R2.2: `times: 2` → two 429s with Retry-After (rate_limited), then the rule is
    used up and the next rule answers."""
    script = {
        "rules": [
            {
                "when": {"contains": "flaky"},
                "times": 2,
                "fail": {"status": 429, "code": "rate_limit_exceeded", "retry_after": "5"},
            }
        ]
    }
    state = InMemoryScriptState()
    classes = []
    for _ in range(4):
        response, clock = run(script, "flaky call", state=state)
        verdict = classify(response, clock)
        classes.append((verdict.failure_class, verdict.retry_after_seconds))
    assert classes == [("rate_limited", 5.0), ("rate_limited", 5.0), (None, None), (None, None)]


def test_r2_2_scripted_counter_counts_only_matching_calls_per_provider():
    """R2.2: the N-times counter is keyed by provider id and rule; calls that do not
    match the rule, or go to another provider, do not use it up."""
    rules = {"rules": [{"when": {"contains": "flaky"}, "times": 1, "fail": {"status": 503}}]}
    state = InMemoryScriptState()
    first, second = scripted(rules, "p1"), scripted(rules, "p2")
    assert classify(*run(first, "calm", state=state)).failure_class is None
    assert classify(*run(first, "flaky", state=state)).failure_class == "server_error"
    assert classify(*run(second, "flaky", state=state)).failure_class == "server_error"
    assert classify(*run(first, "flaky", state=state)).failure_class is None


def test_r2_2_scripted_state_is_pluggable():
    """R2.2: any object with incr(key) -> int holds the counters (e.g. a cache)."""

    class Recording:
        def __init__(self) -> None:
            self.keys: list[str] = []

        def incr(self, key: str) -> int:
            self.keys.append(key)
            return len(self.keys)

    state = Recording()
    script = {"rules": [{"times": 1, "fail": {"status": 500}}]}
    assert classify(*run(script, state=state)).failure_class == "server_error"
    assert classify(*run(script, state=state)).failure_class is None
    assert len(state.keys) == 2 and state.keys[0] == state.keys[1]
    assert state.keys[0].startswith("sc#0:")


def test_r2_2_scripted_counter_is_thread_safe():
    """R2.2: concurrent workers sharing one state see exactly N failures in all."""
    script = {"rules": [{"times": 5, "fail": {"status": 503}}]}
    state = InMemoryScriptState()
    results: list[str | None] = []
    lock = threading.Lock()

    def worker() -> None:
        verdict = classify(*run(script, state=state))
        with lock:
            results.append(verdict.failure_class)

    threads = [threading.Thread(target=worker) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count("server_error") == 5 and results.count(None) == 15


@pytest.mark.parametrize(
    ("transport", "expected"),
    [
        ("connect_error", "network"),
        ("connection_reset", "network"),
        ("connect_timeout", "timeout"),
        ("read_timeout", "timeout"),
    ],
)
def test_r2_1_scripted_transport_failures(transport, expected):
    """R2.1: a scripted failure before any response is network or timeout."""
    response, clock = run({"rules": [{"fail": {"transport": transport}}]})
    assert not response.evidence.headers_received
    assert kinds(response) == ["finish"]
    assert classify(response, clock).failure_class == expected


@pytest.mark.parametrize(
    ("status", "code", "expected"),
    [(529, "overloaded_error", "server_error"), (401, None, "auth"), (400, None, "bad_request")],
)
def test_r2_1_scripted_http_failures(status, code, expected):
    """R2.1: a scripted HTTP status is reported like a real one."""
    fail = {"status": status, **({"code": code} if code else {})}
    response, clock = run({"rules": [{"fail": fail}]})
    assert response.status_code == status
    assert classify(response, clock).failure_class == expected


def test_r6_2_scripted_stall_after_headers_is_interrupted():
    """R6.2: headers, partial text, then the body breaks with no clock firing →
    interrupted, effect unknown; the partial text is kept, nothing else claimed."""
    response, clock = run(
        {"rules": [{"when": {"contains": "hang"}, "stall": {"text": "Par"}}]}, "hang"
    )
    evidence = response.evidence
    assert evidence.headers_received and not evidence.body_complete
    assert not evidence.deadline_evidence and response.timeout_name is None
    assert response.text == "Par"
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.effect) == ("interrupted", "unknown")


# --------------------------------------------------------------------------- clocks


def test_r6_1_scripted_heartbeats_move_the_clock_but_are_not_progress():
    """R6.1: each heartbeat advances the injected clock by every_s; only heartbeats
    arrive, so no_progress fires at 30 s although the budget is 600 s."""
    script = {"rules": [{"when": {"contains": "slow"}, "heartbeat": {"every_s": 10}}]}
    response, clock = run(script, "slow please", limits=CallLimits(600, 30))
    assert kinds(response) == ["headers", "heartbeat", "heartbeat", "finish"]
    beats = [e.at - start() for e in response.events if e.kind == "heartbeat"]
    assert beats == [timedelta(seconds=10), timedelta(seconds=20)]
    assert clock() - start() == timedelta(seconds=30)
    assert response.timeout_name == "no_progress"
    assert response.evidence.deadline_evidence and not response.evidence.body_complete
    verdict = classify(response, clock)
    assert (verdict.failure_class, verdict.effect) == ("timeout", "none")


@pytest.mark.parametrize(
    ("deadline_bound", "name"), [(False, "stage_timeout"), (True, "deadline_exceeded")]
)
def test_r6_2_scripted_heartbeats_until_the_budget_is_named_by_its_clock(deadline_bound, name):
    """R6.2: a budget shorter than the no-progress limit fires first, named by its clock."""
    script = {"rules": [{"heartbeat": {"every_s": 10}}]}
    response, _ = run(script, limits=CallLimits(25, 60, deadline_bound=deadline_bound))
    assert response.timeout_name == name


def test_r6_1_scripted_heartbeats_then_answer():
    """R6.1: after `count` heartbeats the `then` answer is streamed (progress)."""
    script = {"rules": [{"heartbeat": {"every_s": 5, "count": 2, "then": {"text": "done"}}}]}
    response, clock = run(script, limits=CallLimits(600, 30))
    assert kinds(response) == ["headers", "heartbeat", "heartbeat", "text", "usage", "finish"]
    assert response.text == "done"
    assert classify(response, clock).failure_class is None


def test_r6_2_scripted_heartbeats_then_nothing_is_interrupted():
    """R6.2: heartbeats that end without a body and without a clock firing: interrupted."""
    response, clock = run({"rules": [{"heartbeat": {"every_s": 1, "count": 3}}]})
    assert classify(response, clock).failure_class == "interrupted"


def test_r6_2_scripted_slow_chunks_use_up_the_stage_budget_despite_progress():
    """R6.2: chunks 10 s apart keep no_progress quiet but the 25 s budget runs out."""
    script = {"rules": [{"answer": {"text": "abcdef", "chunks": 6, "chunk_interval_s": 10}}]}
    response, clock = run(script, limits=CallLimits(25, 15))
    assert response.timeout_name == "stage_timeout"
    assert response.text == "abc"
    assert classify(response, clock).failure_class == "timeout"


def test_r6_2_scripted_delay_before_headers_is_a_timeout_without_headers():
    """R6.2: time to first byte beyond the budget: timeout, no headers were seen."""
    script = {"rules": [{"delay_s": 90, "answer": {"text": "late"}}]}
    response, clock = run(script, limits=CallLimits(60, 120))
    assert response.timeout_name == "stage_timeout"
    assert not response.evidence.headers_received
    assert classify(response, clock).failure_class == "timeout"


def test_r6_1_scripted_no_budget_left_moves_no_counter():
    """R6.1: with no time left nothing is sent, so a `times` rule is not used up."""
    state = InMemoryScriptState()
    script = {"rules": [{"times": 1, "fail": {"status": 503}}]}
    response, _ = run(script, state=state, limits=CallLimits(0, 30, deadline_bound=True))
    assert response.timeout_name == "deadline_exceeded"
    assert classify(*run(script, state=state)).failure_class == "server_error"


# --------------------------------------------------------------------------- tools


def tool_script() -> dict[str, Any]:
    return {
        "rules": [
            {
                "when": {"last_role_not": "tool", "has_tool": "search"},
                "tool_call": {
                    "name": "search",
                    "arguments": {"query": "{last_user}", "limit": 3},
                    "text": "Searching.",
                },
            },
            {"when": {"last_role": "tool"}, "answer": {"text": "Result: {last_message}"}},
        ]
    }


def test_r2_1_scripted_tool_call_until_a_tool_result_arrives():
    """R2.1: a tool call when the last message is not a tool result (and the tool is
    offered); after the tool result, an answer."""
    first = ProviderRequest("script-1", (ChatMessage("user", "cats"),), tools=(SEARCH,))
    response, clock = run(tool_script(), first)
    (call,) = response.tool_calls
    assert (call.name, call.arguments) == ("search", {"query": "cats", "limit": 3})
    assert call.id.startswith("call_")
    assert response.text == "Searching." and response.finish_reason == "tool_calls"
    assert kinds(response) == ["headers", "text", "tool_call", "usage", "finish"]
    assert classify(response, clock).failure_class is None

    second = ProviderRequest(
        "script-1",
        (
            ChatMessage("user", "cats"),
            ChatMessage("assistant", "Searching.", tool_calls=(call,)),
            ChatMessage("tool", "3 cats", tool_call_id=call.id),
        ),
        tools=(SEARCH,),
    )
    response, _ = run(tool_script(), second)
    assert response.tool_calls == () and response.text == "Result: 3 cats"


def test_r2_1_scripted_tool_call_needs_the_tool_offered():
    """R2.1: has_tool — without the search tool in the request the rule does not match."""
    response, _ = run(tool_script(), "cats")
    assert response.tool_calls == () and response.text == "Echo: cats"


def test_r2_1_scripted_several_tool_calls():
    """R2.1: a list of tool calls is returned in order."""
    script = {"rules": [{"tool_call": [{"name": "a"}, {"name": "b", "arguments": {"x": 1}}]}]}
    response, _ = run(script)
    assert [(c.name, c.arguments) for c in response.tool_calls] == [("a", {}), ("b", {"x": 1})]
    assert len({c.id for c in response.tool_calls}) == 2


# --------------------------------------------------------------------------- determinism


def test_r2_1_scripted_provider_is_deterministic():
    """R2.1: same script, request, clock start and fresh state → the same response,
    event for event (tool-call ids included)."""
    request = ProviderRequest("script-1", (ChatMessage("user", "dogs"),), tools=(SEARCH,))
    a, _ = run(tool_script(), request)
    b, _ = run(tool_script(), request)
    assert a == b
    other, _ = run(
        tool_script(), ProviderRequest("script-1", (ChatMessage("user", "cows"),), tools=(SEARCH,))
    )
    assert other.tool_calls[0].id != a.tool_calls[0].id


@given(st.text(max_size=60), st.integers(min_value=1, max_value=20))
def test_r6_1_answer_chunks_rejoin_to_the_text(text, chunks):
    """R6.1: the chunked body is exactly the text, in at most N non-empty chunks."""
    pieces = split_chunks(text, chunks)
    assert "".join(pieces) == text
    assert len(pieces) == (min(chunks, len(text)) if text else 0)
    assert all(pieces)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "script",
    [
        [],
        {"rule": []},
        {"rules": {}},
        {"rules": [{}]},
        {"rules": [{"answer": {}, "refuse": {}}]},
        {"rules": [{"when": {"contains": ""}, "answer": {}}]},
        {"rules": [{"when": {"sometimes": True}, "answer": {}}]},
        {"rules": [{"times": 0, "answer": {}}]},
        {"rules": [{"answer": {"chunks": 0}}]},
        {"rules": [{"answer": {"text": 3}}]},
        {"rules": [{"fail": {}}]},
        {"rules": [{"fail": {"status": 200}}]},
        {"rules": [{"fail": {"status": 500, "transport": "connect_error"}}]},
        {"rules": [{"fail": {"transport": "dns"}}]},
        {"rules": [{"refuse": {"category": ""}}]},
        {"rules": [{"heartbeat": {}}]},
        {"rules": [{"heartbeat": {"every_s": 0}}]},
        {"rules": [{"tool_call": {"arguments": {}}}]},
        {"rules": [{"tool_call": []}]},
        {"default": {"echo": True}},
    ],
)
def test_r2_1_bad_scripts_are_programming_errors(script):
    """R2.1: a mistyped script raises ValueError instead of behaving silently."""
    with pytest.raises(ValueError):
        validate_script(script)
    with pytest.raises(ValueError):
        run(ProviderConfig("sc", "scripted", "m", script=script))


def test_r6_1_scripted_heartbeats_on_a_real_clock_sleep_until_the_limit():
    """R6.1: a clock without advance() is real: the adapter sleeps between
    heartbeats, never past the no-progress limit."""
    script = {"rules": [{"heartbeat": {"every_s": 0.05}}]}
    began = time.monotonic()
    response = call_provider(
        scripted(script),
        user("x"),
        limits=CallLimits(budget_s=5, no_progress_s=0.2),
        clock=lambda: datetime.now(UTC),
        script_state=InMemoryScriptState(),
    )
    assert response.timeout_name == "no_progress"
    assert 0.2 <= time.monotonic() - began < 1.0
    assert kinds(response).count("heartbeat") >= 2
