"""The Insights page (R3.2): how often a refused request flips to accepted.

For operators and managers (``view_insights``). One set of filters drives the
page, its CSV and ``GET /api/v1/insights/reprobes``: the numbers are the same
(``governance.rules.insights`` tiers each send once — kept on the attempt by
``governance.services.insight_tiers``, which tiers the period's pending attempts
before each read — and ``dashboard.queries.insights`` counts the kept tiers).
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse

from dashboard.pages.reports import PeriodForm, csv_safe
from dashboard.pages.streaming import bad_filters, csv_response
from dashboard.queries import insights as q
from dashboard.site import permissions
from dashboard.site.env import parse_duration
from dashboard.site.status import human_duration
from governance import services, time_source
from governance.rules.insights import ScheduleReplay, TierRow, WhatIf, tier_label
from governance.rules.refusal import MAX_SCHEDULE_TIERS, RefusalError, check_schedule

PER_PAGE = 50
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


class InsightsForm(PeriodForm):
    def query(self) -> q.InsightsQuery:
        data = self.cleaned_data
        return q.InsightsQuery(start=data["from"].at, end=data["to"].at, provider=data["provider"])


class WhatIfForm(forms.Form):
    """A proposed re-probe schedule (R3.2): the number of re-probes and their delays."""

    tiers = forms.IntegerField(
        label="Re-probes", min_value=1, max_value=MAX_SCHEDULE_TIERS,
        help_text=f"1 to {MAX_SCHEDULE_TIERS}",
    )  # fmt: skip
    delays = forms.CharField(
        label="Delays after each refusal", max_length=200,
        help_text="comma-separated, e.g. 15m, 1h, 6h (s, m, h)",
    )  # fmt: skip

    def clean_delays(self) -> tuple[timedelta, ...]:
        try:
            return tuple(
                parse_duration(part) for part in self.cleaned_data["delays"].split(",")
                if part.strip()
            )  # fmt: skip
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        tiers, delays = data.get("tiers"), data.get("delays")
        if tiers is not None and delays is not None:
            if len(delays) != tiers:
                raise forms.ValidationError(
                    f"{tiers} re-probe{'s' if tiers != 1 else ''} need{'s' if tiers == 1 else ''} "
                    f"{tiers} delay{'s' if tiers != 1 else ''}, one per re-probe; "
                    f"{len(delays)} given."
                )
            try:
                data["delays"] = check_schedule(delays)
            except RefusalError as exc:
                raise forms.ValidationError(f"{exc}.") from None
        return data


def _what_if_form(request: HttpRequest) -> WhatIfForm:
    if "delays" in request.GET or "tiers" in request.GET:
        return WhatIfForm(request.GET)
    default = services.reprobe_delays()
    return WhatIfForm(
        initial={"tiers": len(default), "delays": ", ".join(_short(d) for d in default)}
    )


def _short(delay: timedelta) -> str:
    return human_duration(delay).replace(" min", "m").replace(" h", "h").replace(" s", "s")


def _schedule_words(delays: tuple[timedelta, ...] | None) -> str:
    if delays is None:
        return "as recorded"
    return ", ".join(human_duration(d) for d in delays)


def _expected(value: float) -> str:
    return f"{value:.1f}"


def _signed(value: float) -> str:
    return f"{value:+.1f}" if abs(value) >= 0.05 else "±0"


def _answers_words(value: float) -> str:
    """'0.7 answers lost', '1.0 answer gained', 'no answer gained or lost'."""
    amount = f"{abs(value):.1f}"
    if amount == "0.0":
        return "no answer gained or lost"
    noun = "answer" if amount == "1.0" else "answers"
    return f"{amount} {noun} {'gained' if value > 0 else 'lost'}"


def _sends_words(value: float) -> str:
    """'1.3 fewer re-probe sends to refusing providers', or 'as many …'."""
    amount = f"{abs(value):.1f}"
    if amount == "0.0":
        return "as many re-probe sends to refusing providers"
    noun = "send" if amount == "1.0" else "sends"
    return f"{amount} {'more' if value > 0 else 'fewer'} re-probe {noun} to refusing providers"


def what_if_view(result: WhatIf) -> dict[str, Any]:
    """The replay as the page says it: the current and the proposed schedule side by side."""

    def column(replay: ScheduleReplay) -> dict[str, str]:
        return {
            "schedule": _schedule_words(replay.delays),
            "sends": _expected(replay.reprobe_sends),
            "answers": _expected(replay.answers),
            "frozen": _expected(replay.frozen),
            "could_freeze": str(replay.could_freeze),
            "median_to_freeze": duration_words(replay.median_to_freeze),
        }

    current, proposed = result.current, result.proposed
    as_run = column(current)
    as_run["schedule"] = (
        "; ".join(_schedule_words(schedule) for schedule in result.schedules_as_run)
        + (" (by segment)" if len(result.schedules_as_run) > 1 else "")
    ) or "—"
    by_pair = {(r.segment_id, r.provider_id): r for r in proposed.replays}
    segments = [
        {
            "segment_id": now.segment_id,
            "provider_id": now.provider_id,
            "refused_at": now.refused_at,
            "current": now.frozen_at,
            "proposed": by_pair[(now.segment_id, now.provider_id)].frozen_at,
        }
        for now in current.replays
    ]
    return {
        "result": result,
        "current": as_run,
        "proposed": column(proposed),
        "extra_sends": _signed(result.extra_sends),
        "gained": _signed(result.answers_gained),
        "answers_words": _answers_words(result.answers_gained),
        "sends_words": _sends_words(result.extra_sends),
        "rates": [
            {
                "step": rate.step,
                "rate": percent(rate.rate) if rate.answered else "no data (counted as 0 %)",
                "sample": rate.answered,
                "accepted": rate.accepted,
                "borrowed": rate.source_step if rate.source_step not in (None, rate.step) else None,
            }
            for rate in result.rates
        ],
        "segments": segments[:WHAT_IF_SEGMENTS],
        "more_segments": max(0, len(segments) - WHAT_IF_SEGMENTS),
    }


WHAT_IF_SEGMENTS = 20


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
        "high": f"{100 * interval.high:.2f}" if interval else None,
    }


def _range_words(form: InsightsForm) -> str:
    start, end = form.cleaned_data["from"], form.cleaned_data["to"]
    if start.is_date and end.is_date:
        if start.text == end.text:
            return f"on {start.text} (UTC)"
        return f"from {start.text} to {end.text} (UTC, both days included)"
    return f"from {start.at:%Y-%m-%d %H:%M} to {end.at:%Y-%m-%d %H:%M} UTC"


@login_required
@permissions.requires(GET=permissions.VIEW_INSIGHTS)
def insights(request: HttpRequest) -> HttpResponse:
    now = time_source.now()
    form = _form(request, now)
    proposal = _what_if_form(request)
    context: dict[str, Any] = {
        "form": form,
        "quick_links": _quick_links(request, now),
        "what_if_form": proposal,
        "period_params": _period_params(request, now),
    }
    if not form.is_valid() or (proposal.is_bound and not proposal.is_valid()):
        if form.is_valid():  # the period is fine: show its numbers with the form's errors
            context.update(_numbers(request, form, q.tiered_insights(form.query())))
        return render(request, "insights/reprobes.html", context, status=400)
    result = q.tiered_insights(
        form.query(),
        proposed=proposal.cleaned_data["delays"] if proposal.is_bound else None,
        default=services.reprobe_delays(),
        now=now,
    )
    context.update(_numbers(request, form, result))
    if result.what_if is not None:
        context["what_if"] = what_if_view(result.what_if)
    return render(request, "insights/reprobes.html", context)


def _period_params(request: HttpRequest, now: datetime) -> list[tuple[str, str]]:
    """The period's filters, carried by the what-if form as hidden fields."""
    data = _with_defaults(request.GET, now)
    return [(name, data.get(name, "")) for name in ("from", "to", "provider")]


def _numbers(request: HttpRequest, form: InsightsForm, result: q.Insights) -> dict[str, Any]:
    page = Paginator(result.rows, PER_PAGE).get_page(request.GET.get("page"))
    params = request.GET.copy()
    for name in ("page", "tiers", "delays"):
        params.pop(name, None)
    query = form.query()
    api_params = QueryDict(mutable=True)
    api_params["since"] = query.start.strftime("%Y-%m-%dT%H:%M:%SZ")
    api_params["until"] = query.end.strftime("%Y-%m-%dT%H:%M:%SZ")
    if query.provider:
        api_params["provider"] = query.provider
    return {
        "result": result,
        "range_words": _range_words(form),
        "totals": [display(row) for row in result.totals],
        "page_obj": page,
        "rows": [display(row) for row in page.object_list],
        "sends": sum(row.sends for row in result.totals),
        "csv_href": f"{reverse('insights-csv')}?{params.urlencode()}",
        "api_href": f"{reverse('api-insights-reprobes')}?{api_params.urlencode()}",
    }


class _Echo:
    def write(self, value: str) -> str:
        return value


@login_required
@permissions.requires(GET=permissions.VIEW_INSIGHTS)
def insights_csv(request: HttpRequest) -> HttpResponse:
    """The same filters as the page: the per-tier totals, then every detailed row."""
    form = _form(request, time_source.now())
    if not form.is_valid():
        return bad_filters(form, "filters")
    query = form.query()

    writer = csv.writer(_Echo())

    def rows() -> list[str]:
        result = q.tiered_insights(query)
        return [
            writer.writerow([csv_safe(cell) for cell in cells(row)])
            for row in [*result.totals, *result.rows]
        ]

    name = f"reprobes-{form.cleaned_data['from'].text}-{form.cleaned_data['to'].text}.csv"
    name = "".join(ch for ch in name if ch.isalnum() or ch in "-.")
    # Streamed: the header goes out at once, the rows once the facts are read.
    return csv_response([writer.writerow(HEADER)], rows, filename=name)
