"""What the work counts, for Prometheus: every web and worker process adds to
the same totals.

prometheus_client's multiprocess mode: ``manage.py up`` gives every process
``PROMETHEUS_MULTIPROC_DIR`` (emptied at its start), each process writes its
counts to its own files there, and any web process's ``GET /metrics`` adds
them up (``dashboard/site/metrics.py``). Without the variable (one process:
the tests, ``runserver``) the counts are the process's own.

Labels are bounded: provider ids, stage kinds, clock and outcome names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Histogram

# Seconds, from 5 ms to an hour: queue waits run to minutes.
CLOCK_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
    1800, 3600,
)  # fmt: skip
# R6.1's four clocks; the overall deadline's is what was left of it when the stage ended.
CLOCKS = {
    "queue_ms": "queue",
    "execution_ms": "execution",
    "no_progress_ms": "no_progress",
    "deadline_remaining_ms": "deadline_remaining",
}

STAGE_CLOCKS = Histogram(
    "governance_stage_clock_seconds",
    "A finished stage's clocks (R6.1): queue, execution, no progress and what was left of "
    "the overall deadline, by stage kind, with the clock that ran out (timeout) if one did",
    ["stage_kind", "clock", "timeout"],
    buckets=CLOCK_BUCKETS_S,
)
TURN_EVENTS = Counter(
    "governance_turn_events",
    "What model turns did (R3): refusals, re-probes, freezes, fallbacks",
    ["event"],
)
NOTIFICATIONS = Counter("governance_notifications", "Notifications raised", ["severity"])
ATTEMPTS = Counter(
    "governance_provider_attempts",
    "Provider attempts by provider and outcome (accepted, or the failure class, R2.1)",
    ["provider", "outcome"],
)
TOOL_CALLS = Counter("governance_tool_calls", "Tool calls by their effect (R4.1, R6.4)", ["effect"])

DELIVERIES = Counter(
    "governance_deliveries",
    "Outbound deliveries by what was delivered (alert, callback), the alert channel's kind "
    "and the state the attempt left it in (delivered, retry, failed, …)",
    ["what", "channel", "state"],
)

REFUSAL_SENDS = Counter(
    "governance_refusal_sends",
    "Sends of the refusal protocol by provider and tier (R3.1, R3.2, R3.8): the refused "
    "original, re-renders, the history-only send, re-probe n, the first send after a "
    "boundary; counted when the send's tier is decided (its turn over, by the beat)",
    ["provider", "tier"],
)
COST = Counter(
    "governance_provider_cost",
    "What provider requests cost, from the usage they reported and the provider's prices, "
    "by provider and currency (requests without usage or prices add nothing)",
    ["provider", "currency"],
)
LEDGER_EXHAUSTIONS = Counter(
    "governance_ledger_exhaustions",
    "Draws a run's ledger refused because a budget was spent (R5), by resource",
    ["resource"],
)

# OpenTelemetry's GenAI client metrics under their Prometheus names (the OTel
# exporter's translation: dots to underscores, the unit as a suffix).
_GENAI_ATTRIBUTES = {
    "gen_ai_operation_name": "gen_ai.operation.name",
    "gen_ai_provider_name": "gen_ai.provider.name",
    "gen_ai_request_model": "gen_ai.request.model",
    "gen_ai_response_model": "gen_ai.response.model",
}
_GENAI_LABELS = list(_GENAI_ATTRIBUTES)
_GENAI_SECONDS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
GENAI_DURATION = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "GenAI operation duration (gen_ai.client.operation.duration)",
    [*_GENAI_LABELS, "error_type"],
    buckets=_GENAI_SECONDS,
)
GENAI_TOKENS = Histogram(
    "gen_ai_client_token_usage",
    "Number of input and output tokens used (gen_ai.client.token.usage)",
    [*_GENAI_LABELS, "gen_ai_token_type"],
    buckets=(
        1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
        67108864,
    ),
)  # fmt: skip
GENAI_FIRST_CHUNK = Histogram(
    "gen_ai_client_operation_time_to_first_chunk_seconds",
    "Time to the first chunk of a streamed answer (gen_ai.client.operation.time_to_first_chunk)",
    _GENAI_LABELS,
    buckets=_GENAI_SECONDS,
)

_EVENTS = {
    "governance.refusals": "refusal",
    "governance.reprobes": "reprobe",
    "governance.freezes": "freeze",
    "governance.fallbacks": "fallback",
}


def count(name: str, amount: int, attributes: Mapping[str, Any]) -> None:
    """``tasks.instrumentation.count``'s counters, as Prometheus counts."""
    if name == "governance.notifications":
        NOTIFICATIONS.labels(str(attributes.get("severity") or "normal")).inc(amount)
    elif name in _EVENTS:
        TURN_EVENTS.labels(_EVENTS[name]).inc(amount)


def stage_clocks(stage_kind: str, clocks_ms: Mapping[str, int], timeout: str) -> None:
    for key, clock in CLOCKS.items():
        value = clocks_ms.get(key)
        if isinstance(value, int | float) and value >= 0:
            STAGE_CLOCKS.labels(stage_kind, clock, timeout or "none").observe(value / 1000)


def attempt(provider: str, failure_class: str) -> None:
    ATTEMPTS.labels(provider, failure_class or "accepted").inc()


def tool_call(effect: str) -> None:
    TOOL_CALLS.labels(effect or "unknown").inc()


def delivery(what: str, channel: str, state: str) -> None:
    DELIVERIES.labels(what, channel or "-", state or "superseded").inc()


def refusal_sends(tally: Mapping[tuple[str, str, int], int]) -> None:
    """Sends whose tier ``rules.insights.tier_sends`` decided, by (provider, tier,
    step), as written by ``services.insight_tiers`` (re-probe n as ``re_probe_n``)."""
    for (provider, tier, step), sends in tally.items():
        REFUSAL_SENDS.labels(provider, f"{tier}_{step}" if step else tier).inc(sends)


def cost(provider: str, currency: str, amount: float) -> None:
    if amount > 0:
        COST.labels(provider, currency or "-").inc(amount)


def ledger_exhausted(resource: str) -> None:
    LEDGER_EXHAUSTIONS.labels(resource).inc()


def genai(
    attributes: Mapping[str, str],
    duration_s: float,
    tokens: Mapping[str, Any],
    first_chunk_s: float | None,
) -> None:
    """One GenAI operation: its duration, its tokens by type and, streamed, its
    time to first chunk (``attributes`` under their OpenTelemetry names)."""
    labels = [str(attributes.get(name, "")) for name in _GENAI_ATTRIBUTES.values()]
    GENAI_DURATION.labels(*labels, str(attributes.get("error.type", ""))).observe(duration_s)
    for token_type, amount in tokens.items():
        if isinstance(amount, int) and amount >= 0:
            GENAI_TOKENS.labels(*labels, token_type).observe(amount)
    if first_chunk_s is not None:
        GENAI_FIRST_CHUNK.labels(*labels).observe(first_chunk_s)


METRICS = (
    STAGE_CLOCKS, TURN_EVENTS, NOTIFICATIONS, ATTEMPTS, TOOL_CALLS, DELIVERIES, REFUSAL_SENDS,
    COST, LEDGER_EXHAUSTIONS, GENAI_DURATION, GENAI_TOKENS, GENAI_FIRST_CHUNK,
)  # fmt: skip
