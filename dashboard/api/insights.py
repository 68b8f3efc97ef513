"""``GET /api/v1/insights/reprobes``: the Insights page's numbers as JSON.

Needs the ``view_insights`` permission (operators and managers). The tiers,
rates and Wilson intervals are ``governance.rules.insights``; the tiers kept on
the attempts are counted by ``dashboard.queries.insights``, the period's pending
ones tiered first (``dashboard.queries.insights.tiered_insights``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.http import HttpRequest, JsonResponse

from dashboard.api.base import ApiError, api_view, parse_query
from dashboard.api.schemas import InsightsQuery
from dashboard.queries import insights as q
from dashboard.site import permissions
from governance import time_source
from governance.rules.insights import TierRow, tier_label

DEFAULT_PERIOD = timedelta(days=7)
MAX_PERIOD = timedelta(days=366)


def row_json(row: TierRow) -> dict[str, Any]:
    since = row.median_since_refusal
    return {
        "tier": row.tier,
        "step": row.step,
        "boundary_kind": row.boundary_kind or None,
        "label": tier_label(row.tier, row.step, row.boundary_kind),
        "provider_id": row.provider_id or None,
        "model": row.model or None,
        "category": row.category or None,
        "sends": row.sends,
        "accepted": row.accepted,
        "refused": row.refused,
        "failed": row.failed,
        "acceptance_rate": row.rate,
        "interval": {"low": row.interval.low, "high": row.interval.high} if row.interval else None,
        "median_seconds_since_refusal": since.total_seconds() if since is not None else None,
    }


@api_view(("GET",), permission=permissions.VIEW_INSIGHTS)
def reprobes(request: HttpRequest) -> JsonResponse:
    query = parse_query(request, InsightsQuery)
    until = query.until or time_source.now()
    since = query.since or until - DEFAULT_PERIOD
    if since >= until:
        raise ApiError(400, "since", "must be before `until`")
    if until - since > MAX_PERIOD:
        raise ApiError(400, "since", "the period is longer than 366 days: ask one year at a time")
    insights = q.tiered_insights(
        q.InsightsQuery(start=since, end=until, provider=query.provider or "")
    )
    return JsonResponse(
        {
            "since": since.isoformat(),
            "until": until.isoformat(),
            "provider": query.provider,
            "rows": [row_json(row) for row in insights.rows],
            "totals": [row_json(row) for row in insights.totals],
        }
    )
