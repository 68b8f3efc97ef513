"""What every provider adapter takes and returns.

An adapter is a real client of one wire protocol. It never decides anything:
it performs one request, streams the response, keeps what the wire showed in
its vendor's words (``WireAnswer``), reads that into ``AttemptEvidence``
(R2.4: its vendor's refusal, its error codes; classified by
``governance.rules.classification``) and reports the stream events the clocks need
(R6.1: heartbeats are not progress). ``Adapter`` is one kind's entry in the
registry (``tasks/adapters/__init__.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from governance.rules.classification import AttemptEvidence, TransportError
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
    kind: str  # a name of governance.provider_kinds, with its adapter in the registry
    model: str
    base_url: str = ""
    api_key: str | None = None  # resolved from the env var named on the provider row
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 120.0
    script: dict[str, Any] | None = None  # scripted provider only
    # Why this configuration may not be used, found by the caller (a key variable
    # the allow-list refuses, a key that cannot be read): nothing is sent, and the
    # attempt says so (the auth class, R2.1: a configuration change re-enables it).
    refused: str = ""


@dataclass(frozen=True)
class ProviderRequest:
    model: str
    messages: tuple[ChatMessage, ...]  # system message first when there is one
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int = 1024
    # What the client asked of the reply beyond its length, in OpenAI's words
    # (``temperature``, ``top_p``, ``stop``, ``seed``, ``tool_choice``, …):
    # each adapter sends what its protocol has a place for.
    sampling: Mapping[str, Any] = field(default_factory=dict)
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


@dataclass(frozen=True)
class WireAnswer:
    """What one attempt's wire showed, in its vendor's words: the adapter's
    raw material for ``AttemptEvidence`` (its ``read_evidence``), kept on the
    response for people and tests. No rule reads it.

    ``status_code`` is None for a failure carried by a stream error event
    after a 200: the 200 does not explain that failure. ``finish_reason`` and
    ``message_refusal`` are OpenAI's words, ``stop_reason`` Anthropic's,
    ``scripted_refusal_category`` the scripted provider's declared refusal.
    ``config_refused``: nothing was sent because this side refused the
    configuration (its key variable, or where its base URL leads).
    """

    status_code: int | None = None
    error_code: str | None = None
    error_message: str | None = None
    finish_reason: str | None = None
    message_refusal: str | None = None
    stop_reason: str | None = None
    scripted_refusal_category: str | None = None
    transport_error: TransportError | None = None
    headers_received: bool = False
    body_complete: bool = True
    deadline_evidence: bool = False
    retry_after: str | float | None = None
    config_refused: bool = False


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
    answer: WireAnswer | None = None  # what the evidence was read from (always set)
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


ReadEvidence = Callable[[WireAnswer], AttemptEvidence]


class AdapterCall(Protocol):
    """One attempt (``tasks.adapters.call_provider`` passes every argument;
    a kind uses the ones it needs: ``transport`` for HTTP, ``script_state``
    for a script)."""

    def __call__(
        self,
        config: ProviderConfig,
        request: ProviderRequest,
        *,
        limits: CallLimits,
        clock: Clock,
        on_event: OnEvent | None,
        transport: Any,
        script_state: Any,
    ) -> ProviderResponse: ...


@dataclass(frozen=True)
class Adapter:
    """One provider kind's entry in the registry: ``call`` performs an attempt;
    ``read_evidence`` is its reading of its vendor's answer (R2.1, R2.4), the
    same one ``call`` uses; ``check_script``, for a kind whose configuration
    is a script, raises ValueError naming what in a script would not run."""

    call: AdapterCall
    read_evidence: ReadEvidence
    check_script: Callable[[Any], None] | None = None
