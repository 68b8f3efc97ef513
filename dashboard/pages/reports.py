"""The delivery-versus-settlement report for managers (R7.4, R8.4).

One set of filters drives the page and its CSV: the CSV holds exactly the
aggregate rows and the discrepancy rows the page shows (every page of the list).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse

from dashboard.pages import report_html
from dashboard.pages.streaming import bad_filters, csv_response
from dashboard.queries import costs
from dashboard.queries import report as q
from dashboard.site import permissions
from dashboard.site.time_zones import zone_for
from governance import time_source
from governance.services import deliveries

PER_PAGE = 25
MAX_DAYS = 366
CHART_MAX_GROUPS = 60
PERMISSION = permissions.VIEW_REPORT

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?$")

GROUP_CHOICES = [("day", "Day"), ("provider", "Provider"), ("outcome", "Outcome")]
OUTCOME_WORDS = {
    "completed": "completed",
    "partial": "partial",
    "failed": "failed",
    "cancelled": "cancelled",
}
VERDICT_WORDS = {
    "client_received_all_committed": "all acknowledged",
    "client_received_part": "part acknowledged",
    "no_client_evidence": "no acknowledgement",
    "nothing_committed": "nothing committed",
}


# --------------------------------------------------------------------------- filters


@dataclass(frozen=True)
class Bound:
    text: str  # as typed: "2025-03-07" or "2025-03-07T14:05"
    at: datetime  # the instant it stands for (for "to": the exclusive end)
    is_date: bool


def _parse_bound(text: str, *, end: bool) -> Bound:
    text = text.strip()
    if _DATE.match(text):
        try:
            day = date.fromisoformat(text)
        except ValueError:
            raise forms.ValidationError(f"“{text}” is not a real date") from None
        start = datetime.combine(day, time.min, tzinfo=UTC)
        # A "to" day is inclusive: the window ends at the next midnight (UTC).
        return Bound(text, start + timedelta(days=1) if end else start, True)
    if _DATETIME.match(text):
        try:
            moment = datetime.fromisoformat(text).replace(tzinfo=UTC)
        except ValueError:
            raise forms.ValidationError(f"“{text}” is not a real date and time") from None
        return Bound(text, moment, False)
    raise forms.ValidationError(
        f"“{text}” is not a date: write it as YYYY-MM-DD (or YYYY-MM-DDTHH:MM, UTC)"
    )


class PeriodForm(forms.Form):
    """A period (from, to: UTC dates or date-times, "to" inclusive) and a
    provider: what the delivery report and the Insights page are filtered by."""

    provider = forms.ChoiceField(label="Provider", required=False)
    too_long = "narrow it."  # what to do about a period over MAX_DAYS

    def __init__(self, data: QueryDict, *, providers: list[str]) -> None:
        super().__init__(data)
        # "from" is a Python keyword, so these two are added here.
        self.fields = {
            "from": forms.CharField(label="From (UTC)", max_length=40),
            "to": forms.CharField(label="To (UTC, inclusive)", max_length=40),
            **self.fields,
        }
        self.fields["provider"].choices = [("", "All providers"), *((p, p) for p in providers)]

    def clean_from(self) -> Bound:
        return _parse_bound(self.cleaned_data["from"], end=False)

    def clean_to(self) -> Bound:
        return _parse_bound(self.cleaned_data["to"], end=True)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        start, end = data.get("from"), data.get("to")
        if isinstance(start, Bound) and isinstance(end, Bound):
            if start.at >= end.at:
                raise forms.ValidationError("“From” must be before “To”.")
            if end.at - start.at > timedelta(days=MAX_DAYS):
                raise forms.ValidationError(
                    f"The range is longer than {MAX_DAYS} days: {self.too_long}"
                )
        return data


class ReportForm(PeriodForm):
    group = forms.ChoiceField(label="Group by", choices=GROUP_CHOICES)
    outcome = forms.ChoiceField(
        label="Outcome",
        required=False,
        choices=[("", "All outcomes"), *((o, o) for o in q.OUTCOMES)],
    )
    too_long = "narrow it, or export one year at a time."

    def __init__(self, data: QueryDict, *, providers: list[str]) -> None:
        super().__init__(data, providers=providers)
        # The form's order: the period, then group, provider, outcome.
        order = ["from", "to", "group", "provider", "outcome"]
        self.fields = {name: self.fields[name] for name in order}

    def query(self) -> q.ReportQuery:
        data = self.cleaned_data
        return q.ReportQuery(
            start=data["from"].at,
            end=data["to"].at,
            group=data["group"],
            provider=data["provider"],
            outcome=data["outcome"],
        )

    def input_type(self, name: str) -> str:
        """date, datetime-local for a time of day, text to show a bad value as typed."""
        value = str(self.data.get(name, ""))
        if self.errors.get(name) or not (_DATE.match(value) or _DATETIME.match(value)):
            return "text"
        return "datetime-local" if "T" in value else "date"

    def range_fields(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "label": self.fields[name].label,
                "value": self.data.get(name, ""),
                "type": self.input_type(name),
                "errors": self.errors.get(name, []),
            }
            for name in ("from", "to")
        ]


def _default_days(now: datetime, days: int) -> tuple[str, str]:
    today = now.astimezone(UTC).date()
    return (today - timedelta(days=days - 1)).isoformat(), today.isoformat()


def _with_defaults(params: QueryDict, now: datetime) -> QueryDict:
    """Missing or empty fields take their defaults: the last 7 days ending today (UTC)."""
    data = params.copy()
    start, end = _default_days(now, 7)
    for name, default in (("from", start), ("to", end), ("group", "day")):
        if not data.get(name, "").strip():
            data[name] = default
    return data


def _quick_links(request: HttpRequest, now: datetime) -> list[dict[str, Any]]:
    """'last 24 h', 'last 7 days', 'last 30 days' — keeping grouping and narrowing."""
    minute = now.astimezone(UTC).replace(second=0, microsecond=0)
    ceiling = minute + timedelta(minutes=1) if now > minute else minute
    stamp = "%Y-%m-%dT%H:%M"
    ranges = [
        ("last 24 h", (ceiling - timedelta(hours=24)).strftime(stamp), ceiling.strftime(stamp)),
        ("last 7 days", *_default_days(now, 7)),
        ("last 30 days", *_default_days(now, 30)),
    ]
    current = _with_defaults(request.GET, now)
    links = []
    for label, start, end in ranges:
        params = current.copy()
        params["from"], params["to"] = start, end
        params.pop("page", None)
        links.append(
            {
                "label": label,
                "href": f"?{params.urlencode()}",
                "current": label != "last 24 h"
                and current.get("from") == start
                and current.get("to") == end,
            }
        )
    return links


# --------------------------------------------------------------------------- tables (screen = CSV)


def group_label(group: str, key: Any) -> str:
    if key is None:
        return "Total"
    if group == "day":
        return key.isoformat() if isinstance(key, date) else str(key)
    if group == "provider":
        return key or "no provider attempt"
    return q.OUTCOMES[key] if isinstance(key, int) and key < len(q.OUTCOMES) else "other"


AGGREGATE_HEADER = [
    "runs",
    *(f"outcome {o}" for o in q.OUTCOMES),
    "chunks committed",
    "chunks sent",
    "chunks observed",
    *(f"runs {VERDICT_WORDS[v]}" for v in q.VERDICTS),
    "runs with discrepancies",
    # The cost of the runs' provider requests; refused sends apart; and the
    # requests whose cost is unknown (no usage reported, or no price): never counted as 0.
    "cost",
    "cost of refused sends",
    "requests without a known cost",
]
COST_COLUMNS = 3
DISCREPANCY_HEADER = [
    "run",
    "settled at (UTC)",
    "provider",
    "outcome",
    "chunks committed",
    "chunks sent",
    "chunks observed",
    "callback",
    "code",
    "discrepancy",
]


def aggregate_cells(report: q.Report, row: q.GroupRow) -> list[str]:
    """One aggregate row as the strings both the page and the CSV show."""
    return [
        group_label(report.query.group, row.key),
        str(row.runs),
        *(str(row.outcomes.get(o, 0)) for o in q.OUTCOMES),
        str(row.committed),
        str(row.sent),
        str(row.observed),
        *(str(row.evidence[v]) for v in q.VERDICTS),
        str(row.with_discrepancies),
        *costs.summary_cells(row.cost),
    ]


def settled_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def discrepancy_cells(row: q.DiscrepancyRow) -> list[str]:
    run = row.run
    return [
        str(run.run_id),
        settled_text(run.settled_at),
        run.provider or "no provider attempt",
        run.outcome,
        str(run.committed),
        str(run.sent),
        str(run.observed),
        run.callback.label,
        row.code,
        row.text,
    ]


# --------------------------------------------------------------------------- chart


@dataclass(frozen=True)
class BarSegment:
    kind: str
    words: str
    count: int
    x: str  # "12.5%": percent of the chart width, so the bars follow any screen width
    width: str
    middle: str
    label: bool  # wide enough to carry its number


@dataclass(frozen=True)
class ChartRow:
    label: str
    runs: int
    flagged: int
    y: int
    outcome_bar: list[BarSegment]
    evidence_bar: list[BarSegment]


ROW_HEIGHT = 74
BAR_HEIGHT = 20


def _bar(parts: list[tuple[str, str, int]], scale: int) -> list[BarSegment]:
    segments, x = [], 0.0
    for kind, words, count in parts:
        if count <= 0:
            continue
        width = 100.0 * count / scale
        segments.append(
            BarSegment(
                kind,
                words,
                count,
                f"{x:.3f}%",
                f"{width:.3f}%",
                f"{x + width / 2:.3f}%",
                width >= 5,
            )
        )
        x += width
    return segments


def chart_of(report: q.Report) -> dict[str, Any] | None:
    """Server-drawn stacked bars per group: runs by outcome over runs by client evidence."""
    if not report.groups or len(report.groups) > CHART_MAX_GROUPS:
        return None
    scale = max(row.runs for row in report.groups) or 1
    rows = []
    for index, row in enumerate(report.groups):
        rows.append(
            ChartRow(
                label=group_label(report.query.group, row.key),
                runs=row.runs,
                flagged=row.with_discrepancies,
                y=index * ROW_HEIGHT,
                outcome_bar=_bar(
                    [(o, OUTCOME_WORDS[o], row.outcomes.get(o, 0)) for o in q.OUTCOMES], scale
                ),
                evidence_bar=_bar(
                    [(v, VERDICT_WORDS[v], row.evidence[v]) for v in q.VERDICTS], scale
                ),
            )
        )
    total = report.total
    return {
        "rows": rows,
        "rows_svg": report_html.chart_rows(rows, BAR_HEIGHT),
        "description": report_html.chart_description(rows),
        "height": len(rows) * ROW_HEIGHT,
        "bar_height": BAR_HEIGHT,
        "outcome_legend": [(o, OUTCOME_WORDS[o], total.outcomes[o]) for o in q.OUTCOMES],
        "evidence_legend": [(v, VERDICT_WORDS[v], total.evidence[v]) for v in q.VERDICTS],
    }


# --------------------------------------------------------------------------- views


def _form(request: HttpRequest, now: datetime) -> ReportForm:
    return ReportForm(_with_defaults(request.GET, now), providers=q.provider_ids())


def _range_words(form: ReportForm) -> str:
    start, end = form.cleaned_data["from"], form.cleaned_data["to"]
    if start.is_date and end.is_date:
        if start.text == end.text:
            return f"on {start.text} (UTC)"
        return f"from {start.text} to {end.text} (UTC, both days included)"
    return f"from {start.at:%Y-%m-%d %H:%M} to {end.at:%Y-%m-%d %H:%M} UTC"


def _split(cells: list[str]) -> tuple[list[str], list[str]]:
    """The delivery cells and the cost cells, drawn apart on the page."""
    return cells[:-COST_COLUMNS], cells[-COST_COLUMNS:]


@login_required
@permissions.requires(GET=PERMISSION)
def delivery_report(request: HttpRequest) -> HttpResponse:
    """R7.4/R8.4: outcome vs committed/sent/observed chunks and callbacks, per run and group."""
    now = time_source.now()
    form = _form(request, now)
    fragment = request.htmx and not request.htmx.history_restore_request
    template = "reports/delivery.html#report-body" if fragment else "reports/delivery.html"
    context: dict[str, Any] = {"form": form, "quick_links": _quick_links(request, now)}
    if not form.is_valid():
        return render(request, template, context, status=400)
    query = form.query()
    deliveries.judge_unjudged(start=query.start, end=query.end)
    report = q.delivery_report(query)
    page = Paginator(report.discrepancies, PER_PAGE).get_page(request.GET.get("page"))
    params = request.GET.copy()
    params.pop("page", None)
    shown = [(row, discrepancy_cells(row)) for row in page.object_list]
    context.update(
        report=report,
        range_words=_range_words(form),
        group_word=dict(GROUP_CHOICES)[report.query.group].lower(),
        aggregate_header=AGGREGATE_HEADER,
        aggregate_rows_html=report_html.aggregate_rows(
            (_split(aggregate_cells(report, row)) for row in report.groups),
            by_outcome=report.query.group == "outcome",
        ),
        total_row=_split(aggregate_cells(report, report.total)),
        cost=costs.summary_view(report.total.cost),
        page_obj=page,
        discrepancy_rows=shown,
        discrepancy_rows_html=report_html.discrepancy_rows(shown, zone_for(request)),
        chart=chart_of(report),
        chart_max_groups=CHART_MAX_GROUPS,
        verdict_words=VERDICT_WORDS,
        csv_href=f"{reverse('report-csv')}?{params.urlencode()}",
    )
    return render(request, template, context)


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value: str) -> str:
    """A cell a spreadsheet will not run as a formula (CSV injection)."""
    return "'" + value if value.startswith(_FORMULA_START) else value


def _filename_part(bound: Any) -> str:
    return re.sub(r"[^0-9A-Za-z-]", "", bound.text)


@login_required
@permissions.requires(GET=PERMISSION)
def delivery_report_csv(request: HttpRequest) -> HttpResponse:
    """R8.4: the same filters and grouping as the page: aggregate rows, then discrepancy rows."""
    form = _form(request, time_source.now())
    if not form.is_valid():
        return bad_filters(form, "report filters")
    query = form.query()
    name = (
        f"delivery-report-{_filename_part(form.cleaned_data['from'])}-"
        f"{_filename_part(form.cleaned_data['to'])}.csv"
    )

    writer = csv.writer(_Echo())

    def write(cells: list[str]) -> str:
        return writer.writerow([csv_safe(cell) for cell in cells])

    def rows() -> list[str]:
        deliveries.judge_unjudged(start=query.start, end=query.end)
        report = q.delivery_report(query)
        lines = [write(aggregate_cells(report, row)) for row in report.groups]
        if report.groups:
            lines.append(write(aggregate_cells(report, report.total)))
        lines += [writer.writerow([]), write(DISCREPANCY_HEADER)]
        lines += [write(discrepancy_cells(row)) for row in report.discrepancies]
        return lines

    # Streamed: the header goes out at once, the rows once the report is read.
    header = write([f"group ({query.group})", *AGGREGATE_HEADER])
    return csv_response([header], rows, filename=name)


class _Echo:
    """A file that hands back what is written: csv.writer's rows as strings."""

    def write(self, value: str) -> str:
        return value
