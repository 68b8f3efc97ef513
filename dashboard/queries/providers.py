"""Reads for the Providers page (R2.1–R2.3, R3.6, R8.1, R8.2). Read-only.

The breaker verdict is computed like ``governance.services.health_verdicts``
(the rule ``governance.rules.breaker.health_verdict`` with the provider's
``config_fingerprint()``), but from rows fetched in one query and without
creating missing health rows: a page view never writes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.core.exceptions import ObjectDoesNotExist
from django.db.models import Case, Count, F, Q, Value, When, Window
from django.db.models.functions import RowNumber

from dashboard.queries.refusal_states import with_state
from dashboard.queries.secrets import secret_present, secret_refused
from governance import services
from governance.models import (
    AlertChannel,
    NotificationDelivery,
    Provider,
    ProviderAttempt,
    ProviderHealthState,
    Segment,
    SegmentRefusal,
)
from governance.rules.breaker import HealthVerdict, health_verdict
from governance.rules.classification import FAILURE_CLASSES, TIME_BASED_CLASSES
from governance.rules.refusal import max_sends, refusal_verdict, schedule_of
from governance.services.secrets import mask_url

RECENT = timedelta(hours=24)
MAX_SEGMENTS_SHOWN = 10

# What each failure class means for the provider (R2.1, R2.3, R6.2), said once here.
CLASS_MEANING = {
    "server_error": "moves the breaker",
    "rate_limited": "moves the breaker; Retry-After honoured",
    "timeout": "moves the breaker (short cooldown)",
    "network": "moves the breaker (short cooldown)",
    "auth": "disables the provider until its configuration changes",
    "bad_request": "the request, not provider health",
    "refusal": "the segment's content, not provider health",
    "interrupted": "effect unknown, not provider health",
}


@dataclass
class FailureCount:
    failure_class: str
    count: int
    meaning: str
    moves_breaker: bool


@dataclass
class FrozenSegment:
    segment_id: int
    segment_key: str
    thread_title: str
    state: str  # frozen / cooling
    refusals: int | None
    max_sends: int
    refused_at: datetime | None
    next_probe_at: datetime | None


@dataclass
class ProviderRow:
    provider: Provider
    health: ProviderHealthState | None
    verdict: HealthVerdict
    # closed / open / half_open / disabled / unknown, and why when disabled.
    state: str
    disabled_by: str = ""  # "auth" or "admin"
    probe_in_flight: bool = False
    attempts_24h: int = 0
    accepted_24h: int = 0
    failures_24h: list[FailureCount] = field(default_factory=list)
    segments: list[FrozenSegment] = field(default_factory=list)
    more_segments: int = 0

    @property
    def provider_id(self) -> str:
        return self.provider.provider_id

    @property
    def available(self) -> bool:
        return self.verdict.available

    @property
    def shown_base_url(self) -> str:
        """The base URL as it may be shown: credentials stored in it masked."""
        return mask_url(self.provider.base_url)

    @property
    def key_refused(self) -> str | None:
        """Why the worker will not read the key's variable (GOVERNANCE_KEY_ENV_ALLOW)."""
        return secret_refused(self.provider.api_key_env)

    @property
    def key_present(self) -> bool:
        return secret_present(self.provider.api_key_env)


def _row_for(provider: Provider, now: datetime) -> ProviderRow:
    try:
        health = provider.health
    except ObjectDoesNotExist:
        health = None  # never failed, never succeeded: a closed breaker
    try:
        verdict = health_verdict(
            services.provider_health(provider, health),
            now,
            provider.config_fingerprint(),
            enabled=provider.enabled,
        )
    except (AssertionError, TypeError, ValueError) as exc:
        # A row the rules cannot read is shown as such, not hidden.
        verdict = HealthVerdict(False, "unknown", None, f"health row unreadable: {exc}")
        return ProviderRow(provider, health, verdict, "unknown")
    return ProviderRow(
        provider,
        health,
        verdict,
        verdict.state,
        disabled_by=verdict.disabled_by,
        probe_in_flight=verdict.probe_in_flight,
    )


def provider_rows(now: datetime) -> list[ProviderRow]:
    """Every provider with its breaker verdict (one query; providers are few)."""
    providers = Provider.objects.select_related("health").order_by("provider_id")
    return [_row_for(provider, now) for provider in providers]


def add_details(rows: list[ProviderRow], now: datetime) -> None:
    """Failures by class over 24 h and refusal freezes in open segments, for
    the providers on one page: two aggregated queries, whatever the count."""
    if not rows:
        return
    _add_failures(rows, now)
    _add_refused_segments(rows, now)


def _add_failures(rows: list[ProviderRow], now: datetime) -> None:
    """Each row's attempts, accepted ones and failures by class over 24 h."""
    by_pk = {row.provider.pk: row for row in rows}
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    # Every provider's, then those of the page: narrowed to the page's providers in SQL,
    # PostgreSQL matched the provider index against every attempt ever made (a million
    # rows: 35 ms) rather than reading the last day's by time (7 ms, bench/scale.py).
    attempts = (
        ProviderAttempt.objects.filter(started_at__gte=now - RECENT)
        .values("provider_id", "result", "failure_class")
        .annotate(n=Count("id"))
        .order_by()
    )
    for item in attempts:
        row = by_pk.get(item["provider_id"])
        if row is None:
            continue  # a provider of another page
        row.attempts_24h += item["n"]
        if item["result"] == "accepted":
            row.accepted_24h += item["n"]
        if item["failure_class"]:
            per_class = counts[item["provider_id"]]
            per_class[item["failure_class"]] = per_class.get(item["failure_class"], 0) + item["n"]
    order = {name: index for index, name in enumerate(FAILURE_CLASSES)}
    for pk, per_class in counts.items():
        by_pk[pk].failures_24h = [
            FailureCount(
                name,
                count,
                CLASS_MEANING.get(name, ""),
                name in TIME_BASED_CLASSES,
            )
            for name, count in sorted(per_class.items(), key=lambda kv: order.get(kv[0], 99))
        ]


def _add_refused_segments(rows: list[ProviderRow], now: datetime) -> None:
    """Each row's open segments where it is cooling or frozen (R3.2), frozen first.

    The database counts each provider's segments in trouble and picks the
    ``MAX_SEGMENTS_SHOWN`` it shows (``refusal_states``: R3.2's verdict as SQL
    can filter by it), so the page reads those rows only, whatever the number
    of segments in trouble; each one shown is then the rule's own verdict."""
    by_id = {row.provider_id: row for row in rows}
    delays = services.reprobe_delays()
    # The open segments' ids from their partial index (no row read), then only the
    # refusals among them: joined on ``closed_at``, PostgreSQL read every open segment's
    # row to keep the few with a refusal (bench/scale.py: 2,000 rows for 95, 9 ms).
    open_segments = Segment.objects.filter(closed_at__isnull=True).values("id")
    troubled = with_state(
        SegmentRefusal.objects.filter(provider_id__in=by_id, segment_id__in=open_segments),
        now,
    ).exclude(refusal_state="eligible")
    totals = dict(troubled.order_by().values_list("provider_id").annotate(n=Count("id")))
    # Frozen first, then the latest refusal first (an unknown time first: it reads frozen).
    first = Window(
        RowNumber(),
        partition_by=[F("provider_id")],
        order_by=[
            Case(When(refusal_state="frozen", then=Value(0)), default=Value(1)).asc(),
            F("refused_at").desc(nulls_first=True),
            F("id").asc(),
        ],
    )
    # Only what a row shows (the segment's key, the thread's title).
    refusals = (
        troubled.annotate(place=first)
        .filter(place__lte=MAX_SEGMENTS_SHOWN)
        .select_related("segment", "segment__thread")
        .only(
            "segment", "provider_id", "model", "category", "refusals", "refused_at",
            "delays_s", "segment__key", "segment__thread__title",
        )
    )  # fmt: skip
    found: dict[str, list[FrozenSegment]] = defaultdict(list)
    for row in refusals:
        refusal = services.refusal_of(row)
        verdict = refusal_verdict(refusal, now, delays)
        if verdict.state == "eligible":
            continue  # a re-probe is due: not skipped right now
        found[row.provider_id].append(
            FrozenSegment(
                segment_id=row.segment_id,
                segment_key=row.segment.key,
                thread_title=str(row.segment.thread),
                state=verdict.state,
                refusals=row.refusals,
                max_sends=max_sends(schedule_of(refusal, delays)),  # its own, if any
                refused_at=row.refused_at,
                next_probe_at=verdict.next_probe_at,
            )
        )
    for provider_id, segments in found.items():
        segments.sort(
            key=lambda s: (
                s.state != "frozen",
                -(s.refused_at.timestamp() if s.refused_at else float("inf")),
            )
        )
        row = by_id[provider_id]
        row.segments = segments[:MAX_SEGMENTS_SHOWN]
        row.more_segments = max(0, totals.get(provider_id, 0) - len(row.segments))


# --- alert channels (R8.2): a channel a permanent failure disabled stays visible ---


@dataclass
class AlertChannelRow:
    channel: AlertChannel
    state: str  # enabled / disabled
    disabled_by: str = ""  # "failure" (with the reason) or "admin"
    delivered_24h: int = 0
    waiting: int = 0  # pending, retrying or in flight
    failed_24h: int = 0
    dropped_today: int = 0  # over the daily budget of non-critical pushes
    last_error: str = ""


def alert_channel_rows(now: datetime) -> list[AlertChannelRow]:
    """Every alert channel with its state and delivery counts (two queries)."""
    State = NotificationDelivery.State
    channels = list(AlertChannel.objects.order_by("escalation_order", "name"))
    if not channels:
        return []
    since, day = now - RECENT, now.replace(hour=0, minute=0, second=0, microsecond=0)
    counts = (
        NotificationDelivery.objects.filter(channel__in=channels)
        .values("channel_id")
        .annotate(
            delivered=Count("id", filter=Q(state=State.DELIVERED, delivered_at__gte=since)),
            waiting=Count("id", filter=Q(state__in=(State.PENDING, State.RETRY, State.SENDING))),
            failed=Count("id", filter=Q(state=State.FAILED, created_at__gte=since)),
            dropped=Count("id", filter=Q(state=State.DROPPED, created_at__gte=day)),
        )
        .order_by()
    )
    by_channel = {item["channel_id"]: item for item in counts}
    last_errors = {
        channel.id: NotificationDelivery.objects.filter(
            channel=channel, state__in=(State.FAILED, State.RETRY)
        )
        .exclude(last_error="")
        .order_by("-id")
        .values_list("last_error", flat=True)
        .first()
        or ""
        for channel in channels  # channels are few
    }
    rows = []
    for channel in channels:
        item = by_channel.get(channel.id, {})
        rows.append(
            AlertChannelRow(
                channel=channel,
                state="enabled" if channel.enabled else "disabled",
                disabled_by=""
                if channel.enabled
                else ("failure" if channel.disabled_reason else "admin"),
                delivered_24h=item.get("delivered", 0),
                waiting=item.get("waiting", 0),
                failed_24h=item.get("failed", 0),
                dropped_today=item.get("dropped", 0),
                last_error=last_errors.get(channel.id, ""),
            )
        )
    return rows
