"""The Insights page (issue 12): how often a refused request flips to accepted.

For operators and managers (``view_insights``). One set of filters drives the
page, its CSV and ``GET /api/v1/insights/reprobes``: the numbers are the same
(``dashboard.queries.insights`` reads the facts, ``governance.rules.insights``
tiers and counts them).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from dashboard.permissions import VIEW_INSIGHTS
from dashboard.queries import insights as q
from dashboard.report_views import Bound, _parse_bound, csv_safe
from governance import time_source
from governance.rules.insights import TierRow, tier_label

PER_PAGE = 50
MAX_DAYS = 366
DEFAULT_DAYS = 7

HEADER = [
    "tier",
    "provider",
    "model",
    "category",
    "sends",
    "accepted",
    "refused",
    "failed (no answer)",
    "acceptance rate",
    "95% interval low",
    "95% interval high",
    "median time since last refusal (s)",
]


class InsightsForm(forms.Form):
    provider = forms.ChoiceField(label="Provider", required=False)

    def __init__(self, data: QueryDict, *, providers: list[str]) -> None:
        super().__init__(data)
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
                raise forms.ValidationError(f"The range is longer than {MAX_DAYS} days: narrow it.")
        return data

    def query(self) -> q.InsightsQuery:
        data = self.cleaned_data
        return q.InsightsQuery(start=data["from"].at, end=data["to"].at, provider=data["provider"])


def _days(now: datetime, days: int) -> tuple[str, str]:
    today = now.astimezone(UTC).date()
    return (today - timedelta(days=days - 1)).isoformat(), today.isoformat()


def _with_defaults(params: QueryDict, now: datetime) -> QueryDict:
    """Missing fields take their defaults: the last 7 days ending today (UTC)."""
    data = params.copy()
    start, end = _days(now, DEFAULT_DAYS)
    for name, default in (("from", start), ("to", end)):
        if not data.get(name, "").strip():
            data[name] = default
    return data


def _quick_links(request: HttpRequest, now: datetime) -> list[dict[str, Any]]:
    current = _with_defaults(request.GET, now)
    links = []
    for label, days in (
        ("today", 1),
        ("last 7 days", 7),
        ("last 30 days", 30),
        ("last 90 days", 90),
    ):
        start, end = _days(now, days)
        params = current.copy()
        params["from"], params["to"] = start, end
        params.pop("page", None)
        links.append(
            {
                "label": label,
                "href": f"?{params.urlencode()}",
                "current": current.get("from") == start and current.get("to") == end,
            }
        )
    return links


def _form(request: HttpRequest, now: datetime) -> InsightsForm:
    return InsightsForm(_with_defaults(request.GET, now), providers=q.provider_ids())


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def duration_words(value: timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = int(value.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def cells(row: TierRow) -> list[str]:
    """One row as the strings both the CSV and the API's label show."""
    since = row.median_since_refusal
    return [
        tier_label(row.tier, row.step, row.boundary_kind),
        row.provider_id or "all providers",
        row.model,
        row.category,
        str(row.sends),
        str(row.accepted),
        str(row.refused),
        str(row.failed),
        f"{row.rate:.4f}" if row.rate is not None else "",
        f"{row.interval.low:.4f}" if row.interval else "",
        f"{row.interval.high:.4f}" if row.interval else "",
        f"{since.total_seconds():.0f}" if since is not None else "",
    ]


def display(row: TierRow) -> dict[str, Any]:
    interval = row.interval
    return {
        "row": row,
        "label": tier_label(row.tier, row.step, row.boundary_kind),
        "rate": percent(row.rate),
        "interval": f"{percent(interval.low)} – {percent(interval.high)}" if interval else "—",
        "since": duration_words(row.median_since_refusal),
        # The chart: the rate as a bar, the interval as a whisker (percent of the width).
        "bar": f"{100 * row.rate:.2f}" if row.rate is not None else None,
        "low": f"{100 * interval.low:.2f}" if interval else None,
        "span": f"{100 * (interval.high - interval.low):.2f}" if interval else None,
    }


def _range_words(form: InsightsForm) -> str:
    start, end = form.cleaned_data["from"], form.cleaned_data["to"]
    if start.is_date and end.is_date:
        if start.text == end.text:
            return f"on {start.text} (UTC)"
        return f"from {start.text} to {end.text} (UTC, both days included)"
    return f"from {start.at:%Y-%m-%d %H:%M} to {end.at:%Y-%m-%d %H:%M} UTC"


@require_GET
@login_required
@permission_required(VIEW_INSIGHTS, raise_exception=True)
def insights(request: HttpRequest) -> HttpResponse:
    now = time_source.now()
    form = _form(request, now)
    context: dict[str, Any] = {"form": form, "quick_links": _quick_links(request, now)}
    if not form.is_valid():
        return render(request, "insights/reprobes.html", context, status=400)
    result = q.reprobe_insights(form.query())
    page = Paginator(result.rows, PER_PAGE).get_page(request.GET.get("page"))
    params = request.GET.copy()
    params.pop("page", None)
    query = form.query()
    api_params = QueryDict(mutable=True)
    api_params["since"] = query.start.strftime("%Y-%m-%dT%H:%M:%SZ")
    api_params["until"] = query.end.strftime("%Y-%m-%dT%H:%M:%SZ")
    if query.provider:
        api_params["provider"] = query.provider
    context.update(
        result=result,
        range_words=_range_words(form),
        totals=[display(row) for row in result.totals],
        page_obj=page,
        rows=[display(row) for row in page.object_list],
        sends=sum(row.sends for row in result.totals),
        csv_href=f"{reverse('insights-csv')}?{params.urlencode()}",
        api_href=f"{reverse('api-insights-reprobes')}?{api_params.urlencode()}",
    )
    return render(request, "insights/reprobes.html", context)


class _Echo:
    def write(self, value: str) -> str:
        return value


@require_GET
@login_required
@permission_required(VIEW_INSIGHTS, raise_exception=True)
def insights_csv(request: HttpRequest) -> HttpResponse:
    """The same filters as the page: the per-tier totals, then every detailed row."""
    form = _form(request, time_source.now())
    if not form.is_valid():
        errors = "; ".join(
            f"{name}: {' '.join(messages)}" if name != "__all__" else " ".join(messages)
            for name, messages in form.errors.items()
        )
        return HttpResponse(f"Bad filters: {errors}\n", status=400, content_type="text/plain")
    query = form.query()

    def lines() -> Iterator[str]:
        writer = csv.writer(_Echo())
        yield writer.writerow(HEADER)
        result = q.reprobe_insights(query)
        for row in [*result.totals, *result.rows]:
            yield writer.writerow([csv_safe(cell) for cell in cells(row)])

    name = f"reprobes-{form.cleaned_data['from'].text}-{form.cleaned_data['to'].text}.csv"
    name = "".join(ch for ch in name if ch.isalnum() or ch in "-.")
    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
