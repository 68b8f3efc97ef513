"""Read-only queries for the segment pages (R8.1, R8.3).

Per (segment, provider) the refusal state is what ``governance.rules.refusal``
says about the stored two numbers: these helpers only read rows in batches
and ask the rule (``refusal_verdict``); they never re-implement it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.shortcuts import get_object_or_404

from dashboard.site.status import human_duration
from governance import services
from governance.models import (
    HistoryItem,
    Notification,
    Provider,
    ProviderAttempt,
    Run,
    RunEvent,
    Segment,
    SegmentRefusal,
    Stage,
)
from governance.rules.refusal import (
    REFUSAL_REPROBE_DELAYS,
    ProviderRefusal,
    RefusalError,
    ScheduleChoice,
    delays_from_seconds,
    max_sends,
    refusal_from_card,
    refusal_verdict,
    refused_at_datetime,
    reprobe_due,
    schedule_of,
)

# Worst first: a segment's state is its worst provider state.
STATE_ORDER = {"eligible": 0, "cooling": 1, "frozen": 2}
AGES = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}


@dataclass(frozen=True)
class ProviderState:
    """One provider's R8.1 state in one segment, in words and numbers."""

    provider_id: str
    model: str
    state: str  # eligible / cooling / frozen
    refusals: int | None  # None: a legacy row (R3.4), read as frozen
    max_sends: int
    reprobes: int
    refused_at: datetime | None
    next_probe_at: datetime | None
    category: str
    in_chain: bool = True
    schedule: str = ""  # which re-probe schedule applies, in words (R3.2)

    @property
    def reprobe_due(self) -> bool:
        """Eligible again after refusals: the next turn sends the re-probe (R3.2)."""
        return reprobe_due(self.state, self.refusals)


def state_moment(segment: Segment, now: datetime) -> datetime:
    """A closed segment keeps the state it had when it closed; an open one is read now."""
    return segment.closed_at or now


def duration_list(delays: Sequence[timedelta]) -> str:
    return ", ".join(human_duration(delay) for delay in delays)


def provider_models_and_schedules() -> tuple[dict[str, str], dict[str, ScheduleChoice]]:
    """provider_id → model, and each provider's own re-probe schedule (R3.2), for
    those that have one — one query, like ``provider_models``."""
    models: dict[str, str] = {}
    choices: dict[str, ScheduleChoice] = {}
    rows = Provider.objects.order_by("provider_id").values_list(
        "provider_id", "model", "refusal_schedule"
    )
    for provider, model, stored in rows:
        models[provider] = model
        chosen = services.schedule_choice(Provider(provider_id=provider, refusal_schedule=stored))
        if chosen is not None:
            choices[provider] = chosen
    return models, choices


def schedule_words(
    provider_id: str,
    refusal: ProviderRefusal | None,
    choice: ScheduleChoice | None,
    delays: Sequence[timedelta],
) -> str:
    """R3.2: which schedule applies to this provider here, in plain words."""
    default = f"{duration_list(delays)} (R3.2's default)"
    if refusal is not None and refusal.refusals != 0:
        kept = schedule_of(refusal, delays)
        words = (
            f"{duration_list(kept)} ({provider_id}'s own when this refusal started; kept until it "
            "clears)"
            if refusal.delays
            else f"{default}, the one this refusal started under"
        )
        starting = choice.starting(refusal.category) if choice is not None else None
        if tuple(starting or delays) != kept:
            words += f"; a new refusal would get {duration_list(starting or delays)}"
        return words
    if choice is None:
        return default
    own = f"{duration_list(choice.delays)} ({provider_id}'s own)" if choice.delays else default
    categories = "; ".join(
        f"{category}: {duration_list(value)}"
        for category, value in sorted(choice.by_category.items())
    )
    return own + (f"; by refusal category — {categories}" if categories else "")


def provider_states(
    segment: Segment,
    chain: Sequence[str],
    models: dict[str, str],
    now: datetime,
    delays: Sequence[timedelta],
    choices: dict[str, ScheduleChoice] | None = None,
) -> list[ProviderState]:
    """R8.1: every provider of the chain (and any other with refusal rows) with its verdict.

    Reads ``segment.refusals`` through ``services.segment_refusals``, which uses
    the prefetch cache when the caller prefetched ``refusals`` (no N+1). With
    ``choices`` (the providers' own schedules) each state says which schedule applies.
    """
    refusals = services.segment_refusals(segment)
    moment = state_moment(segment, now)
    ids = list(chain) + sorted(set(refusals) - set(chain))
    states = []
    for provider_id in ids:
        refusal = refusals.get(provider_id)
        verdict = refusal_verdict(refusal, moment, delays)
        states.append(
            ProviderState(
                provider_id=provider_id,
                model=(refusal.model if refusal and refusal.model else None)
                or models.get(provider_id, ""),
                state=verdict.state,
                refusals=(refusal.refusals if refusal else 0),
                max_sends=max_sends(schedule_of(refusal, delays)),
                schedule=(
                    schedule_words(provider_id, refusal, choices.get(provider_id), delays)
                    if choices is not None
                    else ""
                ),
                reprobes=verdict.reprobes,
                refused_at=refused_at_datetime(refusal) if refusal else None,
                next_probe_at=verdict.next_probe_at,
                category=(refusal.category or "") if refusal else "",
                in_chain=provider_id in chain,
            )
        )
    return states


def worst_state(states: Iterable[ProviderState]) -> str:
    return max((s.state for s in states), key=STATE_ORDER.__getitem__, default="eligible")


def provider_models() -> dict[str, str]:
    """provider_id → model, in one query (also the provider filter's choices)."""
    return dict(Provider.objects.order_by("provider_id").values_list("provider_id", "model"))


# --------------------------------------------------------------------------- the list


def _state_filter(base: QuerySet[Segment], state: str, provider: str, now: datetime, delays) -> Q:
    """Segments whose worst state (or the chosen provider's state) is ``state``.

    One query over the refusal rows of the candidate segments; the verdict is
    the rule's own (``refusal_verdict``), never a copy of it in SQL. A segment
    without refusal rows is eligible for every provider.
    """
    rows = SegmentRefusal.objects.filter(segment__in=base.values("id"))
    if provider:
        rows = rows.filter(provider_id=provider)
    worst: dict[int, str] = {}
    for segment_id, closed_at, provider_id, refusals, refused_at, delays_s in rows.values_list(
        "segment_id", "segment__closed_at", "provider_id", "refusals", "refused_at", "delays_s"
    ):
        verdict = refusal_verdict(
            ProviderRefusal(
                provider_id=provider_id,
                refusals=refusals,
                refused_at=refused_at,
                delays=delays_from_seconds(delays_s),
            ),
            closed_at or now,
            delays,
        )
        current = worst.get(segment_id, "eligible")
        worst[segment_id] = max(current, verdict.state, key=STATE_ORDER.__getitem__)
    if state == "eligible":
        return ~Q(id__in=[sid for sid, value in worst.items() if value != "eligible"])
    return Q(id__in=[sid for sid, value in worst.items() if value == state])


def segment_list(
    *,
    now: datetime,
    delays: Sequence[timedelta],
    status: str = "open",
    state: str = "",
    provider: str = "",
    thread: str = "",
    age: str = "",
) -> QuerySet[Segment]:
    """The segments page, newest first, filtered; lazy so the paginator slices it."""
    qs = Segment.objects.all()
    if status == "open":
        qs = qs.filter(closed_at__isnull=True)
    elif status == "closed":
        qs = qs.filter(closed_at__isnull=False)
    if age in AGES:
        qs = qs.filter(opened_at__gte=now - AGES[age])
    if thread:
        try:
            qs = qs.filter(thread_id=uuid.UUID(thread.strip()))
        except ValueError:
            qs = qs.filter(thread__title__icontains=thread.strip())
    if provider:
        # In the thread's chain (a JSON list: its text holds '"id"'), or refused here.
        qs = qs.filter(
            Q(thread__provider_chain__icontains=f'"{provider}"')
            | Exists(SegmentRefusal.objects.filter(segment=OuterRef("pk"), provider_id=provider))
        )
    if state in STATE_ORDER:
        qs = qs.filter(_state_filter(qs, state, provider, now, delays))
    return (
        qs.select_related("thread", "session")
        .prefetch_related("refusals")
        .order_by("-opened_at", "-id")
    )


# --------------------------------------------------------------------------- one segment


def segment_for_page(segment_id: int) -> Segment:
    return get_object_or_404(
        Segment.objects.select_related(
            "thread", "session", "next_segment", "previous_segment"
        ).prefetch_related("refusals"),
        pk=segment_id,
    )


def open_segment_of(segment: Segment) -> Segment | None:
    """The thread's open segment (itself when open)."""
    if segment.closed_at is None:
        return segment
    return Segment.objects.filter(thread_id=segment.thread_id, closed_at__isnull=True).first()


def previous_of(segment: Segment) -> Segment | None:
    try:
        return segment.previous_segment
    except Segment.DoesNotExist:
        return None


def history_count(segment: Segment) -> int:
    """Accepted history of the segment's session: what a compact or fresh start replaces."""
    return HistoryItem.objects.filter(session_id=segment.session_id).count()


def switchable_models(segment: Segment) -> list[str]:
    """The configured models: the chain's provider models first, then every enabled
    provider's, then the thread's own; never the segment's current model."""
    chain = list(segment.thread.provider_chain)
    rows = Provider.objects.filter(Q(enabled=True) | Q(provider_id__in=chain)).values_list(
        "provider_id", "model"
    )
    by_provider = dict(rows)
    ordered = [by_provider[p] for p in chain if p in by_provider]
    ordered += sorted(by_provider.values())
    ordered.append(segment.thread.model)
    seen: set[str] = set()
    models = []
    for model in ordered:
        if model and model not in seen and model != segment.model:
            seen.add(model)
            models.append(model)
    return models


# --------------------------------------------------------------------------- timeline

# Inside one instant the runner writes: stage queued → attempts → fallback card
# → notification → stage finished. Newest first reverses that.
ATTEMPT_WORDS = {
    "original": "original",
    "re_render": "re-render",
    "history_only": "history-only",
    "re_probe": "re-probe",
    "fallback": "fallback",
}
_RANK = {"stage-queued": 0, "attempt": 1, "fallback": 2, "notification": 3, "stage": 4}


@dataclass
class TimelineItem:
    kind: str  # attempt / stage / fallback / notification / closed / opened
    at: datetime
    rank: int
    id: int
    obj: Any = None
    card: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    html: str = ""  # the whole entry, when the page writes it in Python (segment_html)

    @property
    def sort_key(self) -> tuple[datetime, int, int]:
        return (self.at, self.rank, self.id)


@dataclass
class Timeline:
    items: list[TimelineItem]
    older: datetime | None  # cursor for "show older" (strictly before), None at the start
    first_page: bool


def _parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            return None
    return None


def card_view(metadata: dict[str, Any]) -> dict[str, Any]:
    """An ``llm-fallback`` card (R3.5) ready to show: per provider its state then.

    Entries of any vintage are read through ``refusal_from_card`` (R3.4); an
    entry that cannot be read is shown as unreadable rather than dropped.
    """
    refusal_entries = []
    raw = metadata.get("refusal")
    if not isinstance(raw, list):
        raw = metadata.get("providers") if isinstance(metadata.get("providers"), list) else []
    for entry in raw:
        if not isinstance(entry, dict):
            continue
        try:
            refusal = refusal_from_card(entry)
        except RefusalError:
            refusal_entries.append({"provider_id": "?", "state": "unknown", "unreadable": True})
            continue
        state = entry.get("state")
        if state not in STATE_ORDER:
            # A card written without its state: the rule's verdict at the refusal
            # (a legacy row or an unknown time reads frozen, R3.4).
            at = refused_at_datetime(refusal) or datetime(1970, 1, 1, tzinfo=UTC)
            state = refusal_verdict(refusal, at, REFUSAL_REPROBE_DELAYS).state
        refusal_entries.append(
            {
                "provider_id": refusal.provider_id,
                "model": refusal.model or "",
                "category": refusal.category or "",
                "refusals": refusal.refusals,
                "refused_at": refused_at_datetime(refusal),
                "state": state,
                "next_probe_at": _parse_time(entry.get("next_probe_at")),
            }
        )
    health_entries = []
    for entry in metadata.get("health") or []:
        if isinstance(entry, dict):
            health_entries.append(
                {
                    "provider_id": entry.get("provider_id") or "?",
                    "model": entry.get("model") or "",
                    "state": entry.get("state") or "unknown",
                    "until": _parse_time(entry.get("until")),
                    "detail": entry.get("detail") or "",
                }
            )
    return {
        "refusal": refusal_entries,
        "health": health_entries,
        "fallback_to": metadata.get("fallback_to") or "",
        "text": metadata.get("text") or "",
    }


# The columns the timeline shows (``templates/segments/detail.html``): not the large
# JSON of every request and stage, nor each request's whole provider and stage rows.
_ATTEMPT_SHOWN = (
    "id", "run", "stage", "provider", "model", "kind", "started_at", "latency_ms", "result",
    "failure_class", "refusal_category", "status_code", "provider__provider_id", "stage__seq",
)  # fmt: skip
_STAGE_SHOWN = ("id", "run", "seq", "kind", "enqueued_at", "finished_at", "outcome", "timeout_name")


def _sources(segment: Segment) -> list[tuple[str, QuerySet, str]]:
    # A stage has no segment of its own: it is found through its run, by the stage's
    # run index; joined (or ``IN (SELECT …)``), PostgreSQL hashes every stage of every
    # run (25–37 ms a query at 50,000 stages, ``bench/scale.py``). On
    # PostgreSQL the runs' ids go in as one array the index is probed with, in the
    # same statement; elsewhere they are read first, as a list.
    runs = Run.objects.filter(segment=segment).order_by().values("id")
    if connection.vendor == "postgresql":
        sql, params = runs.query.sql_with_params()
        stages = Stage.objects.extra(
            where=[f'"governance_stage"."run_id" = ANY(ARRAY({sql}))'], params=params
        )
    else:
        stages = Stage.objects.filter(run_id__in=[row["id"] for row in runs])
    stages = stages.only(*_STAGE_SHOWN)
    return [
        (
            "attempt",
            ProviderAttempt.objects.filter(segment=segment)
            .select_related("provider", "stage")
            .only(*_ATTEMPT_SHOWN),
            "started_at",
        ),
        ("event", RunEvent.objects.filter(segment=segment, kind="llm-fallback"), "at"),
        # A stage's two moments come from its own row (queued, then finished).
        ("stage-queued", stages, "enqueued_at"),
        ("stage-finished", stages.filter(finished_at__isnull=False), "finished_at"),
        (
            "notification",
            Notification.objects.filter(segment=segment).select_related("acked_by"),
            "created_at",
        ),
    ]


def _item(source: str, row: Any, time_field: str) -> TimelineItem:
    at = getattr(row, time_field)
    if source == "event":  # its card is read once it is known to be shown
        return TimelineItem("fallback", at, _RANK["fallback"], row.id, row)
    if source in ("stage-queued", "stage-finished"):
        state = "queued" if source == "stage-queued" else "finished"
        label = f"{row.kind.replace('_', ' ')} {state}"
        rank = _RANK["stage-queued" if state == "queued" else "stage"]
        return TimelineItem("stage", at, rank, row.id, row, {"state": state}, label=label)
    if source == "attempt":
        label = ATTEMPT_WORDS.get(row.kind, row.kind)
        return TimelineItem(source, at, _RANK[source], row.id, row, label=label)
    return TimelineItem(source, at, _RANK[source], row.id, row)


# How many fallback cards are read back to find the one before each re-probe shown.
REPROBE_CARDS = 100


def _number_reprobes(segment: Segment, items: list[TimelineItem]) -> None:
    """R8.1: each re-probe on the page says which it is ("re-probe 2 of 3") and
    when it was planned, read from the last fallback card before it, where the
    refusal state is kept (R3.5): its ``reprobes`` so far, its schedule and its
    ``next_probe_at``. One query, only when the page shows a re-probe."""
    probes = [i for i in items if i.kind == "attempt" and i.obj.kind == "re_probe"]
    if not probes:
        return
    cards = list(
        RunEvent.objects.filter(
            segment=segment, kind="llm-fallback", at__lt=max(p.at for p in probes)
        )
        .order_by("-at", "-id")
        .only("at", "metadata")[:REPROBE_CARDS]
    )
    default_count = len(services.reprobe_delays())
    for probe in probes:
        provider_id = probe.obj.provider.provider_id
        for card in cards:
            if card.at >= probe.at:
                continue
            entries = card.metadata.get("refusal") or []
            entry = next(
                (e for e in entries if isinstance(e, dict) and e.get("provider_id") == provider_id),
                None,
            )
            if entry is None:
                continue
            done = entry.get("reprobes")
            if not isinstance(done, int):
                break  # a card from before re-probes were counted: no number
            count = len(entry.get("delays_s") or ()) or default_count
            probe.label = f"re-probe {done + 1} of {count}"
            probe.card = {"planned": _parse_time(entry.get("next_probe_at"))}
            break


def segment_timeline(segment: Segment, *, before: datetime | None, limit: int = 50) -> Timeline:
    """R8.1: what happened in the segment, newest first, about ``limit`` items a page.

    Each source gives its newest ``limit + 1`` rows before the cursor; the
    merged newest ``limit`` decide the oldest instant shown, and every row of
    that instant is included, so the next page ("strictly before") neither
    repeats nor loses a row written in the same instant.

    A source whose page reached below that instant (or held all its rows) already
    holds every row of the instant and says whether older rows exist; only a source
    whose whole page lies at or above it is asked again (rare: more than ``limit``
    rows of one source in the instants shown).
    """
    fetched: dict[tuple[str, int], TimelineItem] = {}
    sources = _sources(segment)
    pages: dict[str, list[TimelineItem]] = {}
    for source, qs, time_field in sources:
        if before is not None:
            qs = qs.filter(**{f"{time_field}__lt": before})
        page = [
            _item(source, row, time_field)
            for row in qs.order_by(f"-{time_field}", "-id")[: limit + 1]
        ]
        pages[source] = page
        for item in page:
            fetched[(source, item.id)] = item
    merged = sorted(fetched.values(), key=lambda item: item.sort_key, reverse=True)
    older = None
    if len(merged) > limit:
        oldest = merged[limit - 1].at
        items = [item for item in merged if item.at > oldest]
        more = False
        for source, qs, time_field in sources:
            page = pages[source]
            complete = len(page) <= limit or page[-1].at < oldest
            if complete:
                items += [item for item in page if item.at == oldest]
                more = more or any(item.at < oldest for item in page)
            else:
                items += [
                    _item(source, row, time_field) for row in qs.filter(**{time_field: oldest})
                ]
                more = more or qs.filter(**{f"{time_field}__lt": oldest}).exists()
        items.sort(key=lambda item: item.sort_key, reverse=True)
        older = oldest if more else None
    else:
        items = merged
    for item in items:
        if item.kind == "fallback":
            item.card = card_view(item.obj.metadata)
    _number_reprobes(segment, items)
    first_page = before is None
    if first_page and segment.closed_at is not None:
        items.insert(0, TimelineItem("closed", segment.closed_at, 9, 0, segment))
    if older is None:
        items.append(TimelineItem("opened", segment.opened_at, -1, 0, segment))
    return Timeline(items=items, older=older, first_page=first_page)
