"""Read-only queries of the Runs pages (R6.1–R6.5, R5, R7.2, R4).

The list annotates its counts (one query per page, whatever the page holds);
the run page reads each kind of fact once — stages, attempts, receipts,
chunks, ledger entries and spans — so its query count does not grow with the
number of stages or attempts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from html import escape
from typing import Any

from django.db.models import (
    Count,
    Exists,
    IntegerField,
    Min,
    OuterRef,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce
from django.http import Http404
from django.utils import timezone
from django.utils.safestring import mark_safe

from dashboard.queries.run_detail import receipt_latency_ms, run_facts
from governance.models import (
    ApiToken,
    BodyChunk,
    BudgetEntry,
    ProviderAttempt,
    Run,
    SpanRecord,
    Stage,
    ToolApproval,
    ToolReceipt,
)
from governance.rules.approvals import stage_awaits_person
from governance.rules.provider_failures import failure_label
from governance.rules.publication import DeliveryEvidence, PublicationError, delivery_evidence
from governance.rules.run_clocks import deadline_reached
from governance.services.deliveries import publication_of
from tasks.instrumentation import (
    APPROVAL_WAIT_KIND,
    ATTEMPT_KIND,
    CLOCK_ATTRIBUTES,
    CLOCK_UNKNOWN,
    EXECUTION_KIND,
    QUEUE_KIND,
    QUEUE_SPAN_NAME,
    RUN_KIND,
    SPAN_KIND_ATTRIBUTE,
)

SETTLEMENT_OUTCOMES = ("completed", "partial", "failed", "cancelled")
NO_SETTLEMENT = "none"

# R6.1: the four clocks, in the order the page shows them, with the timeout
# each one names when it runs out (R6.2).
CLOCKS = (
    ("queue_ms", "Queue", "queue_wait"),
    ("execution_ms", "Execution", "stage_timeout"),
    ("no_progress_ms", "No progress", "no_progress"),
    ("deadline_remaining_ms", "Deadline remaining", "deadline_exceeded"),
)

ATTEMPT_KIND_WORDS = {
    "original": "original",
    "re_render": "re-render",
    "history_only": "history-only",
    "re_probe": "re-probe",
    "fallback": "fallback",
}
PATH_WORDS = {
    "continue": "continue",
    "bounded_recovery": "bounded recovery",
    "finalization_only": "finalization only",
    "settle": "settle",
    "verify_effect": "verify effect",
}
# Colour class of each lifecycle path; the words are always printed too.
PATH_STATE = {
    "continue": "eligible",
    "bounded_recovery": "cooling",
    "finalization_only": "partial",
    "settle": "settled",
    "verify_effect": "unknown",
}
SPANS_PER_RUN = 400  # a run's waterfall stays readable and the query bounded


# --------------------------------------------------------------------------- formatting


def duration_words(delta: timedelta | None) -> str:
    """'850 ms', '12.4 s', '3 min 04 s', '2 h 05 min' — how people read a stopwatch."""
    if delta is None:
        return "—"
    ms = int(delta / timedelta(milliseconds=1))
    return ms_words(ms)


def ms_words(ms: int | float | None) -> str:
    if ms is None:
        return "—"
    ms = int(ms)
    sign = "−" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1000:
        return f"{sign}{ms} ms"
    seconds = ms / 1000
    if seconds < 60:
        return f"{sign}{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours} h"


def _parse_at(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)


def last_path(decisions: Any) -> str:
    if isinstance(decisions, list) and decisions and isinstance(decisions[-1], dict):
        return str(decisions[-1].get("path") or "")
    return ""


# --------------------------------------------------------------------------- list


@dataclass(frozen=True)
class RunFilters:
    status: str = ""
    settlement: str = ""
    provider: str = ""
    thread: uuid.UUID | None = None
    date_from: date | None = None
    date_to: date | None = None

    @property
    def active(self) -> bool:
        return any(
            (self.status, self.settlement, self.provider, self.thread, self.date_from, self.date_to)
        )


def _day_start(day: date) -> datetime:
    return timezone.make_aware(datetime.combine(day, time.min), timezone.get_current_timezone())


def _attempt_count() -> Coalesce:
    # A correlated count, not a JOIN + GROUP BY: the paginator's COUNT(*) drops
    # it, and the provider filter below cannot multiply it.
    per_run = (
        ProviderAttempt.objects.filter(run=OuterRef("pk"))
        .order_by()
        .values("run")
        .annotate(n=Count("pk"))
        .values("n")[:1]
    )
    return Coalesce(Subquery(per_run, output_field=IntegerField()), Value(0))


def run_list(filters: RunFilters) -> QuerySet[Run]:
    """Runs newest first, each with its thread, segment, settlement and attempt count:
    one query per page (plus the paginator's count), whatever the page holds."""
    runs = (
        Run.objects.select_related("thread", "segment", "settlement")
        .defer(
            "authorization",
            "trace_context",
            "thread__system_prompt",
            "segment__system_prompt",
            "segment__close_reason",
        )
        .annotate(attempts_count=_attempt_count())
        .order_by("-created_at", "-id")
    )
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.settlement == NO_SETTLEMENT:
        runs = runs.filter(settlement__isnull=True)
    elif filters.settlement:
        runs = runs.filter(settlement__outcome=filters.settlement)
    if filters.provider:
        runs = runs.filter(
            Exists(
                ProviderAttempt.objects.filter(
                    run=OuterRef("pk"), provider__provider_id=filters.provider
                )
            )
        )
    if filters.thread:
        runs = runs.filter(thread_id=filters.thread)
    if filters.date_from:
        runs = runs.filter(created_at__gte=_day_start(filters.date_from))
    if filters.date_to:
        runs = runs.filter(created_at__lt=_day_start(filters.date_to + timedelta(days=1)))
    return runs


@dataclass(frozen=True)
class RunRow:
    run: Run
    path: str
    path_words: str
    path_state: str
    duration: str
    running: bool  # the duration is still growing

    @property
    def settlement(self):
        return getattr(self.run, "settlement", None)


def run_rows(runs: list[Run], now: datetime) -> list[RunRow]:
    rows = []
    for run in runs:
        settlement = getattr(run, "settlement", None)  # None: not settled (no row)
        end = settlement.settled_at if settlement else now
        path = last_path(run.decisions)
        rows.append(
            RunRow(
                run=run,
                path=path,
                path_words=PATH_WORDS.get(path, path.replace("_", " ")),
                path_state=PATH_STATE.get(path, "info"),
                duration=duration_words(max(end - run.created_at, timedelta(0))),
                running=settlement is None,
            )
        )
    return rows


# --------------------------------------------------------------------------- detail


@dataclass
class Bar:
    """One row of the waterfall: a span (or a stage's time) as a bar."""

    label: str
    detail: str
    kind: str  # run / queue / execution / attempt / other
    left: float  # percent of the run's width
    width: float
    duration: str
    depth: int = 0
    status: str = ""  # "error" colours the bar; the words are in ``detail``
    start: datetime | None = None

    @property
    def center(self) -> float:
        """Where the bar's middle is (percent): a bar too short to see is drawn there."""
        return round(self.left + self.width / 2, 2)


@dataclass
class Waterfall:
    source: str  # "spans" or "stages"
    bars: list[Bar]
    origin: datetime
    end: datetime
    total: str
    ticks: list[tuple[float, str]] = field(default_factory=list)
    # R6.1's other clocks: no progress as a bar of its own (after the spans), the
    # overall deadline as a marker (its place in percent when it falls on the chart).
    clock_bars: list[Bar] = field(default_factory=list)
    deadline_pct: float | None = None
    deadline_words: str = ""


@dataclass
class ClockCell:
    label: str
    value: str
    timed_out: bool
    unknown: bool


@dataclass(frozen=True)
class Moment:
    """A time on the run page: its offset from the run's start ('+1.5 s'), with
    the absolute time kept for the hover title."""

    at: datetime
    offset: str

    def __html__(self) -> str:
        # Written here rather than by two ``date`` filters in a template included per
        # row: the run page's hundred attempts spent half its rendering on those
        # (bench/scale.py). Shown in UTC, as the filters did (settings.TIME_ZONE).
        at = self.at.astimezone(UTC) if self.at.tzinfo is not None else self.at
        return mark_safe(  # every value escaped (format_html's escaping, without its cost)
            f'<time datetime="{escape(at.isoformat())}" title="'
            f'{at.strftime("%Y-%m-%d %H:%M:%S")} UTC">{escape(self.offset)}</time>'
        )

    __str__ = __html__  # a template prints str(value), then escapes what is not safe


def moment(at: datetime | None, origin: datetime) -> Moment | None:
    if at is None:
        return None
    delta = at - origin
    words = duration_words(abs(delta))
    return Moment(at=at, offset=f"−{words}" if delta < timedelta(0) else f"+{words}")


@dataclass
class StageRow:
    stage: Stage
    clocks: list[ClockCell]
    timeout_words: str
    attempts: int
    queued: Moment | None = None
    started: Moment | None = None
    finished: Moment | None = None


@dataclass
class BudgetRow:
    resource: str
    words: str
    limit: int
    used: int
    remaining: int

    @property
    def exhausted(self) -> bool:
        return self.limit > 0 and self.remaining <= 0

    @property
    def used_percent(self) -> float:
        return round(min(100.0, 100.0 * self.used / self.limit), 1) if self.limit else 0.0


@dataclass
class RunPage:
    run: Run
    settlement: Any
    decisions: list[dict[str, Any]]
    stages: list[StageRow]
    waterfall: Waterfall | None
    attempts: list[ProviderAttempt]
    budget: list[BudgetRow]
    reserve: BudgetRow | None
    ledger: list[BudgetEntry]
    unknown_uses: list[BudgetEntry]  # drawn by a holder that stopped mid-call (R5.3)
    receipts: list[ToolReceipt]
    chunks: list[BodyChunk]
    body: str
    approvals: list[ToolApproval]  # the calls a person was asked about, and the answers
    delivery: DeliveryEvidence | None  # R7.3's reading of the chunks; None: unreadable
    duration: str
    deadline_passed: bool = False  # unsettled and past its overall deadline (R6.1)
    awaiting_approval: bool = False  # one of its calls waits for a person now
    # What became of the API token that submitted it (its name is on the run):
    # "" (still active, or no token), "revoked" or "deleted".
    client_token_state: str = ""


RESOURCE_WORDS = {
    "model_requests": "Model requests",
    "tool_calls": "Tool calls",
    "web_searches": "Web searches",
    "provider_concurrency": "Provider concurrency",
    "body_revisions": "Body revisions",
    "output_reserve": "Output reserve",
}


def run_page(run_id: uuid.UUID, now: datetime) -> RunPage:
    """Everything the run page shows, in a fixed number of queries (404 if unknown)."""
    facts = run_facts(run_id)
    if facts is None:
        raise Http404("no such run")
    run, settlement, stages = facts.run, facts.settlement, facts.stages
    attempts, receipts, chunks = facts.attempts, facts.receipts, facts.chunks
    spans = list(SpanRecord.objects.filter(run_id=run.id).order_by("start", "id")[:SPANS_PER_RUN])

    budget, reserve, ledger = [], None, []
    if facts.budget is not None:
        for resource, balance in facts.budget.items():
            row = BudgetRow(
                resource=resource,
                words=RESOURCE_WORDS.get(resource, resource.replace("_", " ")),
                limit=balance.limit,
                used=balance.used,
                remaining=balance.remaining,
            )
            if resource == "output_reserve":
                reserve = row
            else:
                budget.append(row)
        ledger = list(
            BudgetEntry.objects.filter(account__run_id=run.id)
            .select_related("stage")
            .order_by("id")
        )

    per_stage: dict[int, int] = {}
    for attempt in attempts:
        per_stage[attempt.stage_id] = per_stage.get(attempt.stage_id, 0) + 1
    origin = run.created_at
    stage_rows = []
    for stage in stages:
        row = _stage_row(stage, per_stage.get(stage.id, 0))
        row.queued = moment(stage.enqueued_at, origin)
        row.started = moment(stage.started_at, origin)
        row.finished = moment(stage.finished_at, origin)
        stage_rows.append(row)
    # Inside one run, "+1.5 s after the start" says more than "3 h ago" on every row.
    for attempt in attempts:
        attempt.started = moment(attempt.started_at, origin)
    for receipt in receipts:
        receipt.latency_ms = receipt_latency_ms(receipt)
        receipt.opened = moment(receipt.created_at, origin)
        receipt.finished = moment(receipt.finished_at, origin)
        receipt.verified = moment(receipt.verified_at, origin)
    approvals = list(ToolApproval.objects.filter(run_id=run.id).order_by("requested_at", "id"))
    for approval in approvals:
        if approval.decided_at is not None:
            approval.waited = duration_words(approval.decided_at - approval.requested_at)
    for chunk in chunks:
        chunk.generated = moment(chunk.generated_at, origin)
        chunk.committed = moment(chunk.committed_at, origin)
        chunk.sent = moment(chunk.sent_at, origin)
        chunk.observed = moment(chunk.observed_at, origin)
    for entry in ledger:
        entry.at = moment(entry.created_at, origin)

    end = settlement.settled_at if settlement else now
    return RunPage(
        run=run,
        settlement=settlement,
        decisions=_decisions(run.decisions, origin),
        stages=stage_rows,
        waterfall=_waterfall(run, stages, spans, settlement, now),
        attempts=attempts,
        budget=budget,
        reserve=reserve,
        ledger=ledger,
        unknown_uses=[e for e in ledger if e.outcome == "unknown"],
        receipts=receipts,
        chunks=chunks,
        body=facts.body,
        approvals=approvals,
        awaiting_approval=any(
            stage_awaits_person(s.kind, s.parked_at, s.finished_at) for s in stages
        ),
        delivery=_delivery_evidence(chunks),
        duration=duration_words(max(end - run.created_at, timedelta(0))),
        deadline_passed=settlement is None and deadline_reached(now, run.deadline_at),
        client_token_state=client_token_state(run),
    )


def client_token_state(run: Run) -> str:
    """The run's token now: "" (active, or the run had none), "revoked" or
    "deleted" (the run keeps the name it had). One read, for a token's run only."""
    if not run.client_name:
        return ""
    if run.api_token_id is None:
        return "deleted"
    revoked = ApiToken.objects.filter(id=run.api_token_id, revoked_at__isnull=False).exists()
    return "revoked" if revoked else ""


def thread_clients(thread_id: uuid.UUID) -> list[str]:
    """The names of the API tokens that submitted the thread's runs (as each
    run recorded it), the earliest first: one grouped read, however long the thread."""
    return list(
        Run.objects.filter(thread_id=thread_id)
        .exclude(client_name="")
        .values("client_name")
        .annotate(first=Min("created_at"))
        .order_by("first", "client_name")
        .values_list("client_name", flat=True)
    )


def _decisions(raw: Any, origin: datetime) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict):
            continue
        path = str(entry.get("path") or "")
        decision = {
            "at": moment(_parse_at(entry.get("at")), origin),
            "path": path,
            "path_words": PATH_WORDS.get(path, path.replace("_", " ")),
            "path_state": PATH_STATE.get(path, "info"),
            "reason": entry.get("reason") or "",
            "boundary_action_needed": entry.get("boundary_action_needed") or "",
            "times": 1,
        }
        if path == "bounded_recovery" and out and out[-1]["path"] == path:
            # One line for a run of retries: how many, and the latest's words
            # (which retry, from which budget, what is left).
            decision["times"] = out.pop()["times"] + 1
        out.append(decision)
    return out


def _stage_row(stage: Stage, attempts: int) -> StageRow:
    clocks = stage.clocks if isinstance(stage.clocks, dict) else {}
    cells = []
    for key, label, timeout in CLOCKS:
        value = clocks.get(key)
        unknown = not isinstance(value, int | float) or value == CLOCK_UNKNOWN
        cells.append(
            ClockCell(
                label=label,
                value="not recorded" if unknown else ms_words(value),
                timed_out=stage.timeout_name == timeout,
                unknown=unknown,
            )
        )
    words = stage_fact_words(stage.timeout_name, stage.failure_class)
    return StageRow(stage=stage, clocks=cells, timeout_words=words, attempts=attempts)


def stage_fact_words(timeout_name: str, failure_class: str) -> str:
    """R6.2: the clock that ran out and the failure class are two facts; a
    stage says "timed out" only when one of its clocks did."""
    words = [f"timed out: {timeout_name}"] if timeout_name else []
    if failure_class and not (timeout_name and failure_class == "timeout"):
        words.append(failure_label(failure_class))
    return " · ".join(words)


# --------------------------------------------------------------------------- waterfall


def _waterfall(
    run: Run, stages: list[Stage], spans: list[SpanRecord], settlement, now: datetime
) -> Waterfall | None:
    if spans:
        drawn = _span_waterfall(run, stages, spans)
    elif stages:
        drawn = _stage_waterfall(run, stages, settlement, now)
    else:
        return None
    return _with_run_clocks(drawn, run, settlement, now)


def _with_run_clocks(wf: Waterfall, run: Run, settlement, now: datetime) -> Waterfall:
    """The run's other two clocks on the same axis (R6.1): no progress as a bar,
    from the last progress to the run's end (or now), and the deadline as a marker."""
    total = (wf.end - wf.origin).total_seconds()
    stop = min(max(settlement.settled_at if settlement else now, run.last_progress_at), wf.end)
    left, width = _place(run.last_progress_at, stop, wf.origin, total)
    left = min(left, round(100.0 - width, 2))  # a sliver at the very end stays on the track
    limit = duration_words(timedelta(seconds=run.no_progress_limit_s))
    wf.clock_bars.append(
        Bar(
            label="no progress",
            detail=f"since the last progress; the run is stopped after {limit}",
            kind="no_progress",
            left=left,
            width=width,
            duration=duration_words(stop - run.last_progress_at),
            start=run.last_progress_at,
        )
    )
    offset = (run.deadline_at - wf.origin).total_seconds()
    after = duration_words(run.deadline_at - run.created_at)
    if 0 <= offset <= total:
        wf.deadline_pct = round(100.0 * offset / total, 2)
        wf.deadline_words = f"deadline at +{after} (the red line)"
    else:
        wf.deadline_words = f"deadline at +{after}, after the chart's end"
    return wf


def _frame(origin: datetime, end: datetime) -> tuple[datetime, datetime, float]:
    total = (end - origin).total_seconds()
    if total <= 0:
        end = origin + timedelta(milliseconds=1)
        total = 0.001
    return origin, end, total


def _place(start: datetime, stop: datetime, origin: datetime, total: float) -> tuple[float, float]:
    left = max(0.0, min(100.0, 100.0 * (start - origin).total_seconds() / total))
    width = max(0.0, 100.0 * (stop - start).total_seconds() / total)
    width = min(width, 100.0 - left)
    return round(left, 2), round(max(width, 0.4), 2)


def _ticks(total_seconds: float) -> list[tuple[float, str]]:
    return [
        (pct, ms_words(total_seconds * 1000 * pct / 100)) for pct in (0.0, 25.0, 50.0, 75.0, 100.0)
    ]


def _queue_spans(stages: list[Stage], spans: list[SpanRecord]) -> list[SpanRecord]:
    """The queue bars from the stages' own times (the store keeps no queue span),
    shaped as unsaved span rows so they sort and draw like the rest."""
    stored = {
        str((s.attributes or {}).get("governance.stage_id"))
        for s in spans
        if _kind(s) == QUEUE_KIND
    }
    run_span = next((s for s in spans if _kind(s) == RUN_KIND), None)
    execution = {
        str((s.attributes or {}).get("governance.stage_id")): s
        for s in spans
        if _kind(s) == EXECUTION_KIND
    }
    queued = []
    for stage in stages:
        key = str(stage.id)
        if key in stored or stage.started_at is None:
            continue
        clocks = execution.get(key).attributes if key in execution else {}
        queued.append(
            SpanRecord(
                name=QUEUE_SPAN_NAME,
                span_id=f"queue-{stage.id}",
                parent_span_id=run_span.span_id if run_span else "",
                start=stage.enqueued_at,
                end=max(stage.started_at, stage.enqueued_at),
                attributes={
                    SPAN_KIND_ATTRIBUTE: QUEUE_KIND,
                    "governance.stage_id": stage.id,
                    **{k: v for k, v in (clocks or {}).items() if k in CLOCK_ATTRIBUTES},
                },
            )
        )
    return queued


def _span_waterfall(run: Run, stages: list[Stage], spans: list[SpanRecord]) -> Waterfall:
    """Bars positioned by each span's start/end relative to the run span."""
    spans = [*spans, *_queue_spans(stages, spans)]
    run_span = next((s for s in spans if _kind(s) == RUN_KIND), None)
    if run_span is not None:
        origin = run_span.start
        end = max([run_span.end, *(s.end for s in spans)])
    else:
        origin = min(s.start for s in spans)
        end = max(s.end for s in spans)
    origin, end, total = _frame(origin, end)
    by_id = {s.span_id: s for s in spans}
    stage_by_id = {str(stage.id): stage for stage in stages}

    def depth(span: SpanRecord) -> int:
        level, seen, parent = 0, set(), by_id.get(span.parent_span_id)
        while parent is not None and parent.span_id not in seen and level < 6:
            seen.add(parent.span_id)
            level += 1
            parent = by_id.get(parent.parent_span_id)
        return level

    rank = {RUN_KIND: 0, QUEUE_KIND: 1, EXECUTION_KIND: 2}

    def order(span: SpanRecord) -> tuple:
        # The run span first, then by start; at the same instant the earlier
        # stage first, its queue before its execution before its attempts.
        attrs = span.attributes if isinstance(span.attributes, dict) else {}
        stage = stage_by_id.get(str(attrs.get("governance.stage_id", "")))
        return (
            _kind(span) != RUN_KIND,
            span.start,
            stage.seq if stage else 0,
            rank.get(_kind(span), 3),
            depth(span),
            span.end,
            span.id or 0,
        )

    ordered = sorted(spans, key=order)
    bars = []
    for span in ordered:
        attrs = span.attributes if isinstance(span.attributes, dict) else {}
        stage = stage_by_id.get(str(attrs.get("governance.stage_id", "")))
        kind, label, detail = _span_words(span, attrs, stage)
        left, width = _place(span.start, span.end, origin, total)
        bars.append(
            Bar(
                label=label,
                detail=detail,
                kind=kind,
                left=left,
                width=width,
                duration=duration_words(span.end - span.start),
                depth=depth(span),
                status="error" if span.status == "error" else "",
                start=span.start,
            )
        )
    return Waterfall(
        source="spans",
        bars=bars,
        origin=origin,
        end=end,
        total=duration_words(end - origin),
        ticks=_ticks(total),
    )


def _kind(span: SpanRecord) -> str:
    """What a span is to the page (``governance.span.kind``): its name depends on
    the GenAI conventions in use, this mark does not."""
    attrs = span.attributes if isinstance(span.attributes, dict) else {}
    return str(attrs.get(SPAN_KIND_ATTRIBUTE) or "")


def _span_words(
    span: SpanRecord, attrs: dict[str, Any], stage: Stage | None
) -> tuple[str, str, str]:
    """A bar's kind, label and detail, from its span's name and attributes."""
    stage_words = f"stage {stage.seq} · {stage.kind.replace('_', ' ')}" if stage else "stage"
    kind = attrs.get(SPAN_KIND_ATTRIBUTE)
    if kind == RUN_KIND:
        return "run", "Run", ""
    if kind == QUEUE_KIND:
        return "queue", f"{stage_words} · queued", _clock_words(attrs)
    if kind == APPROVAL_WAIT_KIND:
        # R6.1: a person's wait, a clock of its own (no-progress did not run).
        answer = str(attrs.get("governance.approval.answer") or "")
        by = str(attrs.get("governance.approval.decided_by") or "")
        tool = str(attrs.get("governance.tool") or "the call")
        detail = f"{answer} by {by}" if by else (answer or "")
        return "approval", f"{stage_words} · waiting for a person ({tool})", detail
    if kind == EXECUTION_KIND:
        detail = _clock_words(attrs)
        facts = stage_fact_words(
            str(attrs.get("governance.stage.timeout") or ""),
            str(attrs.get("governance.stage.failure_class") or ""),
        )
        return "execution", f"{stage_words} · execution", f"{facts} · {detail}" if facts else detail
    if kind == ATTEMPT_KIND:
        # The provider id (the vendor is gen_ai.provider.name under the latest conventions).
        provider = attrs.get("governance.provider.id") or attrs.get("gen_ai.provider.name")
        provider = provider or "provider"
        attempt_kind = str(attrs.get("governance.attempt.kind") or "")
        label = f"{provider} · {ATTEMPT_KIND_WORDS.get(attempt_kind, attempt_kind)}".rstrip(" ·")
        parts = [str(attrs.get("gen_ai.request.model") or "")]
        failure = attrs.get("governance.failure_class") or attrs.get("error.type")
        parts.append(f"failed: {failure}" if failure else "accepted")
        tokens_in = attrs.get("gen_ai.usage.input_tokens")
        tokens_out = attrs.get("gen_ai.usage.output_tokens")
        if tokens_in is not None or tokens_out is not None:
            parts.append(f"tokens {tokens_in or 0} in / {tokens_out or 0} out")
        return "attempt", label, " · ".join(p for p in parts if p)
    return "other", span.name, ""


def _clock_words(attrs: dict[str, Any]) -> str:
    parts = []
    for (_key, label, _timeout), name in zip(CLOCKS, CLOCK_ATTRIBUTES, strict=True):
        value = attrs.get(name)
        if isinstance(value, int | float) and value != CLOCK_UNKNOWN:
            parts.append(f"{label.lower()} {ms_words(value)}")
    return " · ".join(parts)


def _stage_waterfall(run: Run, stages: list[Stage], settlement, now: datetime) -> Waterfall:
    """No spans in the store: the bars come from the stages' own timestamps."""
    stops = [s.finished_at or s.started_at or s.enqueued_at for s in stages]
    end = settlement.settled_at if settlement else max([now, *stops])
    origin, end, total = _frame(run.created_at, max([end, *stops]))
    bars = []
    for stage in stages:
        words = f"stage {stage.seq} · {stage.kind.replace('_', ' ')}"
        started = stage.started_at
        queue_end = started or (now if stage.finished_at is None else stage.finished_at)
        left, width = _place(stage.enqueued_at, queue_end, origin, total)
        bars.append(
            Bar(
                label=f"{words} · queued",
                detail="" if started else "still queued",
                kind="queue",
                left=left,
                width=width,
                duration=duration_words(queue_end - stage.enqueued_at),
                start=stage.enqueued_at,
            )
        )
        if started is not None:
            stop = stage.finished_at or max(now, started)
            left, width = _place(started, stop, origin, total)
            detail = stage.outcome or ("running" if stage.finished_at is None else "")
            facts = stage_fact_words(stage.timeout_name, stage.failure_class)
            if facts:
                said = detail in (stage.failure_class, "timeout" if stage.timeout_name else "")
                detail = facts if said else f"{facts} · {detail}".rstrip(" ·")
            bars.append(
                Bar(
                    label=f"{words} · execution",
                    detail=detail,
                    kind="execution",
                    left=left,
                    width=width,
                    duration=duration_words(stop - started),
                    status="error" if stage.timeout_name or stage.failure_class else "",
                    start=started,
                )
            )
    return Waterfall(
        source="stages",
        bars=bars,
        origin=origin,
        end=end,
        total=duration_words(end - origin),
        ticks=_ticks(total),
    )


def _delivery_evidence(chunks: list) -> DeliveryEvidence | None:
    """R7.3: what the client demonstrably received, as the rule reads the chunk
    facts (the report's reading: ``services.deliveries.publication_of``)."""
    rows = [(c.chunk_no, c.version, c.final, c.sent_at, c.observed_at) for c in chunks]
    try:
        return delivery_evidence(publication_of(rows))
    except PublicationError:
        return None
