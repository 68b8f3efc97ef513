"""Registry tool names on the wire: ``files.read`` is offered and
replayed as ``files__read`` to OpenAI- and Anthropic-compatible servers (their
names must match ``[a-zA-Z0-9_-]{1,64}``), and a model's call is read back
under the tool's own name."""

from __future__ import annotations

import dataclasses

import pytest

from governance.rules.tools import wire_names
from tasks.adapters import anthropic as anthropic_adapter
from tasks.adapters import openai as openai_adapter
from tasks.adapters._common import tool_names_back
from tasks.adapters.base import (
    ChatMessage,
    ProviderConfig,
    ProviderRequest,
    ProviderResponse,
    ToolCall,
    ToolSpec,
)

SPECS = (
    ToolSpec("calculator", "Arithmetic", {"type": "object"}),
    ToolSpec("files.read", "Read a file", {"type": "object", "required": ["path"]}),
)
HISTORY = (
    ChatMessage("user", "read a.txt"),
    ChatMessage("assistant", "", tool_calls=(ToolCall("c1", "files.read", {"path": "a.txt"}),)),
    ChatMessage("tool", "contents", tool_call_id="c1"),
    # A tool no longer offered still goes out under a valid name.
    ChatMessage("assistant", "", tool_calls=(ToolCall("c2", "old.gone/tool", {}),)),
    ChatMessage("tool", "gone", tool_call_id="c2"),
)


def request() -> ProviderRequest:
    return ProviderRequest(
        model="m", messages=HISTORY, tools=SPECS,
        tool_names=wire_names(spec.name for spec in SPECS),
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_offered_and_replayed_tool_names_are_valid_wire_names(kind):
    config = ProviderConfig("p", kind, "m", base_url="http://127.0.0.1:9/v1")
    if kind == "openai":
        body = openai_adapter.build_body(config, request())
        offered = [t["function"]["name"] for t in body["tools"]]
        replayed = [
            call["function"]["name"]
            for message in body["messages"]
            for call in message.get("tool_calls", [])
        ]
    else:
        body = anthropic_adapter.build_body(config, request())
        offered = [t["name"] for t in body["tools"]]
        replayed = [
            block["name"]
            for turn in body["messages"]
            for block in turn["content"]
            if block["type"] == "tool_use"
        ]
    assert offered == ["calculator", "files__read"]
    assert replayed[0] == "files__read"
    assert replayed[1].startswith("old_gone_tool-")  # readable prefix and a digest


def test_a_models_call_is_read_back_under_the_tools_own_name():
    response = ProviderResponse(
        tool_calls=(ToolCall("c1", "files__read", {"path": "b"}), ToolCall("c2", "nope", {}))
    )
    back = tool_names_back(request(), response)
    assert [c.name for c in back.tool_calls] == ["files.read", "nope"]  # nope: refused later
    assert back.tool_calls[0].arguments == {"path": "b"}


def test_the_clients_sampling_reaches_each_protocol_where_it_has_a_place():
    sampled = dataclasses.replace(
        request(),
        max_tokens=77,
        sampling={
            "temperature": 0.4, "top_p": 0.9, "stop": "END", "seed": 3,
            "tool_choice": {"type": "function", "function": {"name": "files.read"}},
            "stream": False,  # never overrides what the adapter itself sets
        },
    )  # fmt: skip
    config = ProviderConfig("p", "openai", "m", base_url="http://127.0.0.1:9/v1")
    body = openai_adapter.build_body(config, sampled)
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (
        77, 0.4, 0.9, 3,
    )  # fmt: skip
    assert body["stop"] == "END" and body["stream"] is True
    # A named tool goes by the name the provider was offered.
    assert body["tool_choice"]["function"]["name"] == "files__read"
    body = anthropic_adapter.build_body(config, sampled)
    assert (body["max_tokens"], body["temperature"], body["top_p"]) == (77, 0.4, 0.9)
    assert body["stop_sequences"] == ["END"] and "seed" not in body
