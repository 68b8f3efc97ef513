from __future__ import annotations

from datetime import UTC, datetime

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from dashboard.queries import overview as overview_queries
from dashboard.site import permissions
from dashboard.site.status import queue_report, refusal_rule_summary, system_status
from governance import time_source


@login_required
@permissions.requires(GET=None)
def overview(request: HttpRequest) -> HttpResponse:
    """State first: incidents needing a person, refusal trouble, runs, providers, clocks.

    htmx polls the board fragment (and refreshes it right after an
    acknowledgement), so the page updates without a reload.
    """
    now = time_source.now()
    incidents, incident_total = overview_queries.incidents_needing_a_person()
    troubled, troubled_total = overview_queries.troubled_segments(now)
    clocks = overview_queries.clock_percentiles(now)
    context = {
        "components": system_status(datetime.now(UTC)),
        "queues": queue_report(),
        "rule": refusal_rule_summary(),
        "incidents": incidents,
        "incident_total": incident_total,
        "channels_configured": overview_queries.alert_channels_configured(),
        "troubled": troubled,
        "troubled_total": troubled_total,
        "runs": overview_queries.runs_by_state(now),
        "providers": overview_queries.provider_board(now),
        "clocks": clocks,
        "clock_scale": _clock_scale(clocks),
        "can_ack": request.user.has_perm("governance.acknowledge_notification"),
    }
    template = "overview.html#board" if request.htmx else "overview.html"
    return render(request, template, context)


def _clock_scale(clocks: list[dict]) -> int:
    """The largest p95 on the chart, so bars share one scale (at least 1 ms)."""
    values = [c["p95"] for row in clocks for c in row["clocks"] if c["p95"] is not None]
    return max([1, *values])


@permissions.requires(GET=permissions.ANYONE)
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers: 200 when the database and the broker
    answer, else 503 with the same JSON report naming what is down."""
    components = system_status(datetime.now(UTC))
    body = {
        component.name: {
            "ok": component.ok,
            # Never expose connection details unauthenticated.
            "detail": component.detail
            if component.name != "broker"
            else ("reachable" if component.ok else "unreachable"),
            "age_seconds": component.age_seconds,
        }
        for component in components
    }
    # Depth and oldest wait per queue: a backlog is not "down", but it is news.
    body["queues"] = {
        q.name: {"depth": q.depth, "oldest_age_seconds": q.oldest_age_s} for q in queue_report()
    }
    ok = body["database"]["ok"] and body["broker"]["ok"]
    body["ok"] = ok
    body["down"] = [name for name in ("database", "broker") if not body[name]["ok"]]
    return JsonResponse(body, status=200 if ok else 503)
