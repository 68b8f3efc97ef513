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
CLOCKS = {"queue_ms": "queue", "execution_ms": "execution", "no_progress_ms": "no_progress"}

STAGE_CLOCKS = Histogram(
    "governance_stage_clock_seconds",
    "A finished stage's clocks (R6.1): queue, execution and no progress, by stage kind, "
    "with the clock that ran out (timeout) if one did",
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


METRICS = (STAGE_CLOCKS, TURN_EVENTS, NOTIFICATIONS, ATTEMPTS, TOOL_CALLS, DELIVERIES)
