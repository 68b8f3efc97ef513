"""Provider adapters: real clients of the LLM wire protocols (R2, R6.1, R6.2).

The registry (``REGISTRY``) maps each provider kind of
``governance.provider_kinds`` to its adapter, one module of this package;
the two are checked to name the same kinds when this package is imported.
Adding a kind is its module, its entry below and its line in that list.

``call_provider`` performs one attempt and returns a ``ProviderResponse``
whose ``evidence`` is the adapter's reading of its vendor's answer (R2.4: its
refusals, its error codes; the answer itself is kept as ``answer``);
``governance.rules.classification`` classifies it. Provider and network failures
never raise: they are evidence. Only programming errors raise ``ValueError``
(unknown kind, bad config or script, bad limits, a clock that does not return
an aware datetime).

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

from collections.abc import Mapping
from typing import Any

import httpx

from governance import provider_kinds
from governance.rules.classification import AttemptEvidence
from tasks.adapters import anthropic, openai, scripted
from tasks.adapters._common import INVALID_ARGUMENTS_KEY
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
from tasks.adapters.scripted import (
    DEFAULT_SCRIPT_STATE,
    AdjustableClock,
    InMemoryScriptState,
    ScriptState,
    validate_script,
)

__all__ = [
    "DEFAULT_SCRIPT_STATE",
    "INVALID_ARGUMENTS_KEY",
    "REGISTRY",
    "AdjustableClock",
    "InMemoryScriptState",
    "ScriptState",
    "adapter_for",
    "call_provider",
    "check_registry",
    "read_evidence",
    "script_problem",
    "validate_script",
]

# Each provider kind's adapter: one entry per kind of governance.provider_kinds.
REGISTRY: dict[str, Adapter] = {
    "openai": openai.ADAPTER,
    "anthropic": anthropic.ADAPTER,
    "scripted": scripted.ADAPTER,
}


def check_registry(
    registry: Mapping[str, Adapter], kinds: Mapping[str, provider_kinds.ProviderKind]
) -> None:
    """Every kind has an adapter and every adapter a kind, or ImportError names the odd ones."""
    missing = sorted(set(kinds) - set(registry))
    extra = sorted(set(registry) - set(kinds))
    if missing or extra:
        raise ImportError(
            "the adapter registry and governance.provider_kinds disagree: "
            f"kinds without an adapter {missing}, adapters without a kind {extra}"
        )
    for name, adapter in registry.items():
        if not isinstance(adapter, Adapter):
            raise ImportError(f"the registry's entry for {name!r} is not an Adapter")
        if kinds[name].has_script != (adapter.check_script is not None):
            raise ImportError(
                f"{name!r}: a kind whose configuration is a script has its adapter's "
                "check_script, and only such a kind has one"
            )


check_registry(REGISTRY, provider_kinds.KINDS)


def adapter_for(kind: str) -> Adapter:
    """The adapter of ``kind``; ValueError for a kind with none (a programming error)."""
    adapter = REGISTRY.get(kind) if isinstance(kind, str) else None
    if adapter is None or provider_kinds.kind(kind) is None:
        raise ValueError(
            f"unknown adapter {kind!r}: no provider kind of that name "
            f"({', '.join(provider_kinds.names())})"
        )
    return adapter


def script_problem(kind: str, script: Any) -> str | None:
    """What the adapter of ``kind`` would refuse in ``script``; None when it
    runs, or when ``kind`` is unknown or takes no script (the service's
    checks say so, naming the field)."""
    adapter = REGISTRY.get(kind) if isinstance(kind, str) else None
    if adapter is None or adapter.check_script is None:
        return None
    try:
        adapter.check_script(script)
    except ValueError as exc:
        return str(exc)
    return None


def read_evidence(kind: str, answer: WireAnswer) -> AttemptEvidence:
    """``answer`` read as evidence by the adapter of ``kind`` (R2.4)."""
    return adapter_for(kind).read_evidence(answer)


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
    """One provider attempt, by the adapter of ``config.kind``.

    ``transport`` (HTTP kinds) replaces httpx's default transport and is not
    closed here, so a caller may share one. ``script_state`` (scripted kind)
    holds the ``times`` counters; default: one in-memory store per process.
    """
    if not isinstance(config, ProviderConfig):
        raise ValueError(f"config must be ProviderConfig, got {type(config).__name__}")
    if not isinstance(request, ProviderRequest):
        raise ValueError(f"request must be ProviderRequest, got {type(request).__name__}")
    try:
        adapter = adapter_for(config.kind)
    except ValueError as exc:
        raise ValueError(f"{exc} (provider {config.provider_id!r})") from None
    return adapter.call(
        config,
        request,
        limits=limits,
        clock=clock,
        on_event=on_event,
        transport=transport,
        script_state=script_state,
    )
