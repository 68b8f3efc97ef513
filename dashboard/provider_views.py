"""Providers page (R2.1–R2.3, R8.1): breaker state in words, recent failures by
class, and the open segments where a provider is frozen or cooling. Read-only
for every logged-in role; providers are configured in the Django admin."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard.queries import providers as queries
from governance import time_source
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT
from governance.services.alerts import channel_target_problem

PER_PAGE = 25


def _no_dns(host: str, port: int) -> list[str]:
    """The page never waits on DNS: only ``localhost`` names (RFC 6761) are
    known without asking; other names are judged on their scheme here and
    resolved at send time, which decides."""
    if host == "localhost" or host.endswith(".localhost"):
        return ["127.0.0.1"]
    raise OSError("not resolved on this page")


def _alert_channel_rows(now):
    """The channel rows, each with the refusal its target would meet when
    sending (issue 10: the send would fail permanently and disable it)."""
    rows = queries.alert_channel_rows(now)
    for row in rows:
        channel = row.channel
        row.outbound_problem = (
            channel_target_problem(channel.kind, channel.target, resolver=_no_dns)
            if channel.enabled
            else None
        )
    return rows


@require_GET
@login_required
def providers(request: HttpRequest) -> HttpResponse:
    now = time_source.now()
    rows = queries.provider_rows(now)
    page_obj = Paginator(rows, PER_PAGE).get_page(request.GET.get("page"))
    queries.add_details(list(page_obj.object_list), now)
    unavailable = [row for row in rows if not row.available]
    return render(
        request,
        "providers/list.html",
        {
            "page_obj": page_obj,
            "total": len(rows),
            "unavailable": unavailable,
            "recent_hours": int(queries.RECENT.total_seconds() // 3600),
            "rule_text": RULE_TEXT,
            "boundary_actions": BOUNDARY_ACTIONS_TEXT,
            "alert_channels": _alert_channel_rows(now),
        },
    )
