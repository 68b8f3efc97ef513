"""What every provider adapter takes and returns.

An adapter is a real client of one wire protocol. It never decides anything:
it performs one request, streams the response, and reports what it observed
as ``AttemptEvidence`` (classified by ``governance.rules.health``) plus the stream
events the clocks need (R6.1: heartbeats are not progress).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from governance.rules.health import AttemptEvidence
from governance.rules.tools import wire_name as _wire_name

Role = Literal["system", "user", "assistant", "tool"]
StreamEventKind = Literal[
    "headers", "text", "tool_call", "heartbeat", "usage", "reasoning", "finish"
]


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str
    tool_call_id: str | None = None  # role == "tool": which call this answers
    tool_calls: tuple[ToolCall, ...] = ()  # role == "assistant": calls it made


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema


@dataclass(frozen=True)
class ProviderConfig:
    provider_id: str
    kind: Literal["openai", "anthropic", "scripted"]
    model: str
    base_url: str = ""
    api_key: str | None = None  # resolved from the env var named on the provider row
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    script: dict[str, Any] | None = None  # scripted provider only


@dataclass(frozen=True)
class ProviderRequest:
    model: str
    messages: tuple[ChatMessage, ...]  # system message first when there is one
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 1024
    idempotency_key: str | None = None
    # Tool name -> the name on the wire (``rules.tools.wire_names``): registry
    # tools are "{server}.{tool}", which providers' name rules do not allow.
    tool_names: Mapping[str, str] = field(default_factory=dict)

    def wire_name(self, name: str) -> str:
        """The name a provider sees for the tool called ``name`` (offered or in history)."""
        return self.tool_names.get(name) or _wire_name(name)


@dataclass(frozen=True)
class StreamEvent:
    kind: StreamEventKind
    at: datetime
    text: str = ""


@dataclass
class ProviderResponse:
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)  # input_tokens, output_tokens
    status_code: int | None = None
    latency_ms: int = 0
    response_model: str | None = None
    events: list[StreamEvent] = field(default_factory=list)
    evidence: AttemptEvidence | None = None  # always set by the adapter
    error: str = ""  # human words for the dashboard when something went wrong
    timeout_name: str | None = None  # "stage_timeout" / "no_progress" / "deadline_exceeded"


class Clock(Protocol):
    def __call__(self) -> datetime: ...


@dataclass(frozen=True)
class CallLimits:
    """Time limits of one attempt, all measured on the injected clock.

    ``budget_s`` is already min(stage budget, time left to the run deadline)
    (R6.1); ``deadline_bound`` says the deadline was the smaller of the two, so
    running out is ``deadline_exceeded`` rather than ``stage_timeout``.
    """

    budget_s: float
    no_progress_s: float
    deadline_bound: bool = False


OnEvent = Callable[[StreamEvent], None]
