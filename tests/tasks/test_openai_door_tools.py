"""The door with the client's own tools (a round trip through the official
``openai`` SDK, R1.3, R3.1, R4.4) and with an operator's boundaries reaching
the bytes it forwards (R1.2): against the live server, the real worker and
loopback OpenAI-compatible providers."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from governance import time_source
from governance.models import HistoryItem, Provider, Run, Segment, Thread
from governance.services import routes as route_services
from governance.services.threads import apply_boundary
from tests.tasks.openai_door import TOKEN, TRIGGER, LoopbackProvider, sdk

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def session(live_server, key: str):
    return sdk(live_server).with_options(default_headers={"X-Session-Id": key})


def test_a_tool_round_trip_hands_the_call_to_the_client_and_continues_the_segment(
    live_server, worker, door
):
    """R4.4: the client's tool call is the run's answer; its result is the next
    turn's increment, on the same segment (R1.3: same tools, same prompt)."""
    client = session(live_server, "tools-1")
    said = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(
        model="chat", messages=said, tools=[WEATHER], temperature=0.3, max_tokens=50
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name) == ("call_w1", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    sent = LoopbackProvider.requests[-1]
    assert sent["tools"] == [WEATHER]
    # What the client asked of the reply reaches the provider as given.
    assert (sent["temperature"], sent["max_tokens"]) == (0.3, 50)
    run = Run.objects.get()
    assert run.settlement.outcome == "completed"
    assert "Calls the client's tools: get_weather" in run.chunks.get().text
    # The run's API shows the calls the answer handed over.
    shown = httpx.get(
        f"{live_server.url}/api/v1/runs/{run.id}", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    assert shown["chunks"][0]["tool_calls"] == [
        {"id": "call_w1", "name": "get_weather", "arguments": {"city": "Paris"}}
    ]

    said += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    second = client.chat.completions.create(model="chat", messages=said, tools=[WEATHER])
    assert second.choices[0].message.content == "Tool said: 18 C and sunny"
    assert second.choices[0].finish_reason == "stop"
    forwarded = LoopbackProvider.requests[-1]["messages"]
    assert [m["role"] for m in forwarded] == ["user", "assistant", "tool"]
    assert forwarded[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    thread = Thread.objects.get()
    assert Segment.objects.filter(thread=thread).count() == 1
    assert list(
        HistoryItem.objects.filter(session__thread=thread).values_list("role", flat=True)
    ) == ["user", "assistant", "tool", "assistant"]
    later = Run.objects.exclude(pk=run.pk).get()
    assert later.input == "Results of 1 tool call(s) of the client"


def test_a_streamed_tool_call_is_reassembled_by_the_sdk(live_server, worker, door):
    stream = sdk(live_server).chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER],
        stream=True,
    )
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [tc for d in deltas for tc in d.delta.tool_calls or ()]
    assert [(c.id, c.function.name) for c in calls] == [("call_w1", "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert deltas[-1].finish_reason == "tool_calls"
    assert not any(d.delta.content for d in deltas)  # the handover's words are not content


def test_another_tool_list_is_a_tool_surface_change_of_the_same_session(live_server, worker, door):
    client = session(live_server, "tools-2")
    said = [{"role": "user", "content": "hello"}]
    answer = client.chat.completions.create(model="chat", messages=said, tools=[WEATHER])
    said += [{"role": "assistant", "content": answer.choices[0].message.content}]
    said += [{"role": "user", "content": "again"}]
    client.chat.completions.create(model="chat", messages=said)  # no tools now
    first, second = Segment.objects.order_by("opened_at", "id")
    assert (first.closed_kind, first.closed_by) == ("tool_surface_change", "openai-door")
    assert first.session_id == second.session_id and second.client_tools == ""
    assert json.loads(first.client_tools)[0]["name"] == "get_weather"


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        (
            [
                {"role": "user", "content": "x"},
                {"role": "tool", "tool_call_id": "c9", "content": "r"},
            ],
            "messages",
            "no assistant tool call 'c9' precedes this tool result",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{}"}}]},
                {"role": "user", "content": "y"},
            ],
            "messages",
            "the tool call(s) c1 have no result before this message",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "[1]"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "r"},
            ],
            "messages",
            "arguments must be a JSON object",
        ),
    ],
)  # fmt: skip
def test_tool_messages_that_do_not_fit_are_a_400_naming_messages(
    live_server, door, messages, param, words
):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(live_server).chat.completions.create(model="chat", messages=messages, tools=[WEATHER])
    assert refused.value.body["param"] == param
    assert words in refused.value.body["message"]
    assert not Thread.objects.exists() and not Run.objects.exists()


def test_a_refused_tool_result_is_accepted_reworded_and_the_clients_bytes_still_match(
    live_server, worker, door
):
    """R3.1: a tool result the provider refuses is quarantined and re-rendered;
    the client keeps sending its own bytes, which match what was accepted, so
    the conversation goes on in the same session and the refused bytes are
    never forwarded again."""
    client = session(live_server, "tools-3")
    said = [{"role": "user", "content": "What is the weather in Paris?"}]
    call = client.chat.completions.create(model="chat", messages=said, tools=[WEATHER])
    said += [
        call.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": "call_w1", "content": f"page says {TRIGGER}"},
    ]
    answer = client.chat.completions.create(model="chat", messages=said, tools=[WEATHER])
    assert answer.choices[0].finish_reason == "stop"
    kinds = list(Run.objects.order_by("created_at").last().attempts.values_list("kind", "result"))
    assert kinds[0] == ("original", "refused") and kinds[-1][1] == "accepted"
    seen_before = len(LoopbackProvider.requests)
    said += [
        {"role": "assistant", "content": answer.choices[0].message.content},
        {"role": "user", "content": "thanks"},
    ]
    client.chat.completions.create(model="chat", messages=said, tools=[WEATHER])
    assert Segment.objects.count() == 1  # no new session: the client's bytes matched
    for request in LoopbackProvider.requests[seen_before:]:
        assert TRIGGER not in json.dumps(request["messages"])


@pytest.fixture
def fallback_route(door, lenient_server):
    """The route ``guarded``: the refusing ``echo``, then ``fallback`` (lenient)."""
    Provider.objects.create(
        provider_id="fallback", kind="openai", model="echo-2", base_url=lenient_server,
        api_key_env="GOVERNANCE_KEY_ECHO",
    )  # fmt: skip
    route_services.create_route(
        name="guarded", provider_chain=["echo", "fallback"], by="tests", now=time_source.now()
    )


def test_an_operators_fresh_start_drops_the_refused_history_from_what_is_forwarded(
    live_server, worker, door, fallback_route
):
    """R1.2: after an operator's fresh start the client still sends its whole
    history; the door forwards the new session's (none), so the provider that
    refused the old bytes is asked again without them, and later requests
    that carry the old prefix are trimmed the same way."""
    client = session(live_server, "boundary-1")
    said = [{"role": "user", "content": f"about {TRIGGER}"}]
    for text in ("next", None):
        answer = client.chat.completions.create(model="guarded", messages=said)
        assert answer.model == "echo-2"  # the refusing provider's fallback answered
        said.append({"role": "assistant", "content": answer.choices[0].message.content})
        if text:
            said.append({"role": "user", "content": text})
    refused_before = len(LoopbackProvider.requests)
    assert refused_before == 1  # refused once, then cooling in this segment (R3)
    thread = Thread.objects.get()
    apply_boundary(
        thread, "fresh_start", by="oncall", reason="drop the refused history",
        now=time_source.now(),
    )  # fmt: skip
    for text in ("fresh", "on"):
        said.append({"role": "user", "content": text})
        raw = client.chat.completions.with_raw_response.create(model="guarded", messages=said)
        answer = raw.parse()
        assert raw.headers["X-Governance-Boundary"] == "fresh_start"
        assert raw.headers["X-Governance-Trimmed-Messages"] == "4"
        assert answer.model == "echo-1"  # the first provider answers the new segment
        said.append({"role": "assistant", "content": answer.choices[0].message.content})
    forwarded = [r["messages"] for r in LoopbackProvider.requests[refused_before:]]
    assert forwarded[0] == [{"role": "user", "content": "fresh"}]
    assert [m["content"] for m in forwarded[1]] == ["fresh", "Echo: fresh", "on"]
    # The door opened no session of its own: the client's prefix was recognized.
    assert not Segment.objects.filter(closed_by="openai-door").exists()
