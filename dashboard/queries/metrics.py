"""The facts Prometheus scrapes, read at the scrape: a few aggregate queries
(GROUP BY over indexed columns and the open segments' refusal rows), never a
query per row. Label values are bounded: provider ids, states, stage kinds —
never a thread, run or segment id.

Each refusal row of an open segment is judged by R3.2's own rule
(``rules.refusal.refusal_verdict``); only segments in trouble have rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Min, Q

from dashboard.queries.refusal_states import STATES, open_refusals, with_state
from governance.models import (
    Incident,
    Notification,
    ProviderHealthState,
    Run,
    Stage,
    ToolApproval,
    ToolReceipt,
)

# By the run index's leading column (status, created_at): no scan of settled runs.
UNSETTLED = (Run.Status.QUEUED, Run.Status.RUNNING, Run.Status.FINALIZING, Run.Status.VERIFYING)


@dataclass
class Gauge:
    name: str
    help: str
    labels: tuple[str, ...] = ()
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)


def fact_gauges(now: datetime) -> list[Gauge]:
    return [
        *_refusal_states(now),
        *_incidents(now),
        _breakers(),
        _runs(),
        *_queues(now),
        _approvals(),
        _unknown_effects(),
    ]


def _refusal_states(now: datetime) -> list[Gauge]:
    """R3.2: per provider, the open segments it is refused in, by state: cooling
    (skipped until its next probe), eligible (its re-probe is due: the next turn
    sends it once) or frozen (until a boundary). A segment where a provider was
    never refused, or was accepted since, has no row: it is in none of these.
    Counted by the database (``refusal_states``), whatever the number of rows."""
    counted = (
        with_state(open_refusals(), now)
        .values_list("provider_id", "refusal_state")
        .annotate(n=Count("id"))
    )
    states: Counter = Counter()
    for provider, state, n in counted:
        states[(provider, state)] += n
    gauge = Gauge(
        "governance_segments_by_refusal_state",
        "Open segments in which a provider was refused (R3.2), by provider and state: "
        "cooling, eligible (its re-probe is due) or frozen",
        ("provider", "state"),
    )
    providers = {provider for provider, _state in states}
    for provider in sorted(providers):
        for state in STATES:
            gauge.samples.append(((provider, state), states[(provider, state)]))
    return [gauge]


def _incidents(now: datetime) -> list[Gauge]:
    """R8.2: incidents by state, and how long the oldest has waited for a person."""
    open_states = (Incident.State.TRIGGERED, Incident.State.ACKNOWLEDGED)
    counts = dict(
        Incident.objects.filter(state__in=open_states)  # by the state index
        .values_list("state")
        .annotate(n=Count("id"))
        .values_list("state", "n")
    )
    by_state = Gauge("governance_incidents_open", "Open incidents by state (R8.2)", ("state",))
    for state in open_states:
        by_state.samples.append(((state,), counts.get(state, 0)))
    oldest = Incident.objects.filter(state=Incident.State.TRIGGERED).aggregate(at=Min("opened_at"))
    # By the partial index of unacknowledged critical notifications.
    unacked = Notification.objects.filter(
        Q(incident__isnull=True) | Q(incident__state__in=open_states),
        severity="critical",
        acked_at__isnull=True,
    )
    waited = Gauge(
        "governance_incident_unacknowledged_oldest_seconds",
        "How long the oldest incident nobody acknowledged has waited (0: none)",
    )
    waited.samples.append(((), (now - oldest["at"]).total_seconds() if oldest["at"] else 0.0))
    critical = Gauge(
        "governance_critical_notifications_unacknowledged",
        "Critical notifications nobody acknowledged, of incidents not resolved",
    )
    critical.samples.append(((), unacked.count()))
    return [by_state, waited, critical]


def _breakers() -> Gauge:
    """R2.2: each provider's breaker, 1 for its current state."""
    gauge = Gauge(
        "governance_provider_breaker", "Each provider's breaker state (R2.2): 1 for the current",
        ("provider", "state"),
    )  # fmt: skip
    for provider, breaker in ProviderHealthState.objects.values_list(
        "provider__provider_id", "breaker"
    ):
        for state in ("closed", "open", "half_open"):
            gauge.samples.append(((provider, state), 1 if breaker == state else 0))
    return gauge


def _runs() -> Gauge:
    gauge = Gauge("governance_runs_unsettled", "Runs not settled yet, by status", ("status",))
    counts = dict(
        Run.objects.filter(status__in=UNSETTLED)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    for status in UNSETTLED:
        gauge.samples.append(((status,), counts.get(status, 0)))
    return gauge


def _queues(now: datetime) -> list[Gauge]:
    """Stages sent and not yet picked up, by kind, and the oldest one's wait."""
    rows = (
        Stage.objects.filter(
            finished_at__isnull=True, started_at__isnull=True, parked_at__isnull=True
        )
        .values_list("kind")
        .annotate(n=Count("id"), oldest=Min("enqueued_at"))
        .values_list("kind", "n", "oldest")
    )
    depth = Gauge("governance_stages_waiting", "Stages waiting for a worker, by kind", ("kind",))
    oldest = Gauge(
        "governance_stage_oldest_wait_seconds",
        "How long the oldest stage waiting for a worker has waited, by kind",
        ("kind",),
    )
    found = {kind: (n, at) for kind, n, at in rows}
    for kind in Stage.Kind.values:
        n, at = found.get(kind, (0, None))
        depth.samples.append(((kind,), n))
        oldest.samples.append(((kind,), max(0.0, (now - at).total_seconds()) if at else 0.0))
    return [depth, oldest]


def _approvals() -> Gauge:
    gauge = Gauge(
        "governance_approvals_waiting",
        "Tool calls waiting for a person's yes or no (their run not settled)",
    )
    gauge.samples.append(
        (
            (),
            ToolApproval.objects.filter(
                state=ToolApproval.State.PENDING, run__status__in=UNSETTLED
            ).count(),
        )
    )
    return gauge


def _unknown_effects() -> Gauge:
    gauge = Gauge(
        "governance_tool_effects_unknown",
        "Tool calls whose effect is unknown and not verified yet (R6.4)",
    )
    gauge.samples.append(
        ((), ToolReceipt.objects.filter(effect="unknown", verified_at__isnull=True).count())
    )
    return gauge
