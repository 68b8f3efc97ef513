"""What the overview shows first: incidents, refusal trouble, runs, providers, clocks."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Case, Count, Max, Value, When

from dashboard.queries import incidents as incident_queries
from dashboard.queries.refusal_states import open_refusals, with_state
from governance import services
from governance.models import (
    AlertChannel,
    Incident,
    Provider,
    ProviderHealthState,
    Run,
    Segment,
    SegmentRefusal,
    Stage,
)
from governance.rules.breaker import health_verdict
from governance.rules.refusal import max_sends, refusal_verdict, schedule_of

CLOCK_NAMES = ("queue_ms", "execution_ms", "no_progress_ms", "deadline_remaining_ms")
MAX_CLOCK_SAMPLES = 5000


def incidents_needing_a_person(limit: int = 10) -> tuple[list[Incident], int]:
    """Triggered incidents (R8.2), newest first: acknowledged or resolved ones
    never ask for a person."""
    rows = Incident.objects.filter(state__in=incident_queries.NEEDS_A_PERSON)
    total = rows.count()
    found = rows.select_related("segment", "segment__thread").order_by("-opened_at", "-id")
    return list(found[:limit]), total


def alert_channels_configured() -> bool:
    return AlertChannel.objects.filter(enabled=True).exists()


@dataclass(frozen=True)
class TroubledSegment:
    segment: Segment
    providers: list[dict]  # provider_id, state, refusals, next_probe_at, refused_at
    worst: str


def troubled_segments(now: datetime, limit: int = 10) -> tuple[list[TroubledSegment], int]:
    """Open segments with a frozen or cooling provider, frozen first, newest first.

    The database picks the ``limit`` segments to show and counts the others
    (``refusal_states``: R3.2's verdict as SQL can filter by it), so the page
    reads those segments' rows only, whatever the number of segments in
    trouble; each card is then the rule's own verdict of its rows."""
    delays = services.reprobe_delays()
    troubled = with_state(open_refusals(), now).exclude(refusal_state="eligible")
    by_segment_rows = troubled.values("segment_id").annotate(
        frozen=Max(Case(When(refusal_state="frozen", then=Value(1)), default=Value(0))),
        opened=Max("segment__opened_at"),
    )
    total = by_segment_rows.count()
    shown = [
        row["segment_id"]
        for row in by_segment_rows.order_by("-frozen", "-opened", "segment_id")[:limit]
    ]
    # The card shows a segment's key and link only: its other columns (tool schemas,
    # system prompt, the thread) are not read for every troubled row.
    rows = (
        SegmentRefusal.objects.filter(segment_id__in=shown)
        .select_related("segment")
        .only(
            "segment", "provider_id", "model", "category", "refusals", "refused_at",
            "delays_s", "segment__id", "segment__key", "segment__opened_at",
        )
        .order_by("segment_id", "provider_id")
    )  # fmt: skip
    by_segment: dict[int, TroubledSegment] = {}
    grouped: dict[int, list[dict]] = defaultdict(list)
    segments: dict[int, Segment] = {}
    for row in rows:
        refusal = services.refusal_of(row)
        verdict = refusal_verdict(refusal, now, delays)
        if verdict.state == "eligible":
            continue
        segments[row.segment_id] = row.segment
        grouped[row.segment_id].append(
            {
                "provider_id": row.provider_id,
                "state": verdict.state,
                "refusals": row.refusals,
                "max_sends": max_sends(schedule_of(refusal, delays)),  # its own, if any
                "next_probe_at": verdict.next_probe_at,
                "refused_at": row.refused_at,
            }
        )
    for segment_id, providers in grouped.items():
        worst = "frozen" if any(p["state"] == "frozen" for p in providers) else "cooling"
        by_segment[segment_id] = TroubledSegment(segments[segment_id], providers, worst)
    ordered = sorted(
        by_segment.values(),
        key=lambda t: (t.worst != "frozen", -t.segment.opened_at.timestamp(), t.segment.id),
    )
    return ordered, total


def runs_by_state(now: datetime) -> dict[str, list[tuple[str, int]]]:
    """Runs not yet settled by status, and settled in the last 24 h by outcome."""
    shown = ("queued", "running", "finalizing", "verifying")
    # The statuses shown, by name (every status but settled): the (status, created_at)
    # index answers it, where "not settled" read every run (bench/scale.py).
    active = dict(
        Run.objects.filter(status__in=shown)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    settled = dict(
        Run.objects.filter(
            status=Run.Status.SETTLED, settlement__settled_at__gte=now - timedelta(hours=24)
        )
        .values_list("settlement__outcome")
        .annotate(n=Count("id"))
        .values_list("settlement__outcome", "n")
    )
    return {
        "active": [(s, active.get(s, 0)) for s in shown],
        "settled": [
            (o, settled.get(o, 0)) for o in ("completed", "partial", "failed", "cancelled")
        ],
    }


@dataclass(frozen=True)
class ProviderBoard:
    provider: Provider
    state: str
    reason: str
    last_error: str
    last_failure_at: datetime | None


def provider_board(now: datetime) -> list[ProviderBoard]:
    states = {row.provider_id: row for row in ProviderHealthState.objects.all()}
    board = []
    for provider in Provider.objects.order_by("provider_id"):
        row = states.get(provider.pk)
        verdict = health_verdict(
            services.provider_health(provider, row),
            now,
            provider.config_fingerprint(),
            enabled=provider.enabled,
        )
        shown = row if provider.enabled else None  # the switch, not old failures
        board.append(
            ProviderBoard(
                provider,
                verdict.state,
                verdict.reason or ("no failures recorded" if row is None else ""),
                shown.last_error if shown else "",
                shown.last_failure_at if shown else None,
            )
        )
    return board


def _percentile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(share * (len(ordered) - 1))))
    return ordered[index]


def clock_percentiles(now: datetime) -> list[dict]:
    """p50/p95 of the four clocks per stage kind, stages finished in the last hour."""
    samples: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    counts: Counter = Counter()
    rows = (
        Stage.objects.filter(finished_at__gte=now - timedelta(hours=1))
        .exclude(clocks={})
        .order_by("-finished_at")
        .values_list("kind", "clocks")[:MAX_CLOCK_SAMPLES]
    )
    for kind, clocks in rows:
        counts[kind] += 1
        for name in CLOCK_NAMES:
            if isinstance(clocks.get(name), int) and clocks[name] >= 0:
                samples[kind][name].append(clocks[name])
    table = []
    for kind in sorted(samples):
        entry = {"kind": kind, "stages": counts[kind], "clocks": []}
        for name in CLOCK_NAMES:
            values = samples[kind][name]
            entry["clocks"].append(
                {
                    "name": name.removesuffix("_ms").replace("_", " "),
                    "p50": _percentile(values, 0.5) if values else None,
                    "p95": _percentile(values, 0.95) if values else None,
                }
            )
        table.append(entry)
    return table
