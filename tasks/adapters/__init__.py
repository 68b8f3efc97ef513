"""Provider adapters: real clients of the LLM wire protocols (R2, R6.1, R6.2).

``call_provider`` performs one attempt and returns a ``ProviderResponse``
whose ``evidence`` says what was observed; ``governance.rules.health`` classifies
it. Provider and network failures never raise: they are evidence. Only
programming errors raise ``ValueError`` (unknown kind, bad config or script,
bad limits, a clock that does not return an aware datetime).

Clocks (R6.1): every stream event is stamped with ``clock()``; text and
tool-call deltas are business progress, headers/heartbeats/usage/reasoning
are not. The attempt stops reading when ``limits.budget_s`` is used up
(``stage_timeout``, or ``deadline_exceeded`` when ``limits.deadline_bound``)
or when no progress was seen for ``limits.no_progress_s`` since the attempt
started or since the last progress (``no_progress``); then the evidence has
``deadline_evidence=True`` (and ``body_complete=False`` once headers came).
A body that breaks after the headers with no clock firing is left without
deadline evidence: ``interrupted``, effect unknown (R6.2).

Text received before a cut is kept in ``text``; tool calls are returned only
from a complete body (an incomplete call must never be executed). Every
attempt ends with one ``finish`` event (text: finish/stop reason, timeout name
or transport error), so ``on_event`` sees the end of the stream too.
"""

from __future__ import annotations

from dataclasses import replace

import httpx

from governance.rules.tools import tool_name_of
from tasks.adapters._common import INVALID_ARGUMENTS_KEY
from tasks.adapters.anthropic import call_anthropic
from tasks.adapters.base import (
    CallLimits,
    Clock,
    OnEvent,
    ProviderConfig,
    ProviderRequest,
    ProviderResponse,
)
from tasks.adapters.openai import call_openai
from tasks.adapters.scripted import (
    DEFAULT_SCRIPT_STATE,
    AdjustableClock,
    InMemoryScriptState,
    ScriptState,
    call_scripted,
    validate_script,
)

__all__ = [
    "DEFAULT_SCRIPT_STATE",
    "INVALID_ARGUMENTS_KEY",
    "AdjustableClock",
    "InMemoryScriptState",
    "ScriptState",
    "call_provider",
    "validate_script",
]


def call_provider(
    config: ProviderConfig,
    request: ProviderRequest,
    *,
    limits: CallLimits,
    clock: Clock,
    on_event: OnEvent | None = None,
    transport: httpx.BaseTransport | None = None,
    script_state: ScriptState | None = None,
) -> ProviderResponse:
    """One provider attempt, dispatched on ``config.kind``.

    ``transport`` (HTTP kinds) replaces httpx's default transport and is not
    closed here, so a caller may share one. ``script_state`` (scripted kind)
    holds the ``times`` counters; default: one in-memory store per process.
    """
    if not isinstance(config, ProviderConfig):
        raise ValueError(f"config must be ProviderConfig, got {type(config).__name__}")
    if not isinstance(request, ProviderRequest):
        raise ValueError(f"request must be ProviderRequest, got {type(request).__name__}")
    if config.kind == "openai":
        return _tool_names_back(
            request,
            call_openai(
                config, request, limits=limits, clock=clock, on_event=on_event,
                transport=transport,
            ),
        )  # fmt: skip
    if config.kind == "anthropic":
        return _tool_names_back(
            request,
            call_anthropic(
                config, request, limits=limits, clock=clock, on_event=on_event,
                transport=transport,
            ),
        )  # fmt: skip
    if config.kind == "scripted":
        return call_scripted(
            config,
            request,
            limits=limits,
            clock=clock,
            on_event=on_event,
            script_state=script_state,
        )
    raise ValueError(f"unknown provider kind {config.kind!r} for {config.provider_id!r}")


def _tool_names_back(request: ProviderRequest, response: ProviderResponse) -> ProviderResponse:
    """The model's calls by the tools' own names (the wire names read back)."""
    if request.tool_names and response.tool_calls:
        response.tool_calls = tuple(
            replace(call, name=tool_name_of(call.name, request.tool_names))
            for call in response.tool_calls
        )
    return response
