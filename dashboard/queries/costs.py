"""Costs of provider requests for the run, segment and report pages.

Reads each request's reported usage and its provider's prices; the arithmetic
is ``governance.rules.cost`` (never here).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from governance.models import ProviderAttempt
from governance.rules.cost import (
    AttemptCost,
    CostSummary,
    Prices,
    UsageShape,
    attempt_cost,
    summarize_costs,
    summarize_shapes,
)
from governance.services.usage import merge_shape, prices_of, usage_shapes


def money(amounts: dict[str, Decimal]) -> str:
    if not amounts:
        return ""
    return " + ".join(f"{amount:.4f} {currency}" for currency, amount in sorted(amounts.items()))


def cost_text(cost: AttemptCost) -> str:
    return cost.note if cost.amount is None else f"{cost.amount:.6f} {cost.currency or '?'}"


def loaded_costs(attempts: Iterable[ProviderAttempt]) -> CostSummary:
    """Cost of attempts already read with their provider; each gets ``cost_words``."""
    items = []
    for attempt in attempts:
        cost = attempt_cost(attempt.usage, prices_of(attempt.provider))
        attempt.cost_words = cost_text(cost)
        items.append((attempt.result, cost))
    return summarize_costs(items)


def cost_summary(attempts: QuerySet[ProviderAttempt]) -> CostSummary:
    """Cost of a set of attempts: one query, whatever their number."""
    shapes, prices = usage_shapes(attempts, by_run=False)
    return summarize_shapes(
        (result, shape, prices[provider]) for _, provider, result, shape in shapes
    )


def summary_view(summary: CostSummary) -> dict[str, Any]:
    """What the pages say: the known cost, the refused sends' share, and what is unknown."""
    return {
        "summary": summary,
        "total": money(summary.total) or ("0" if not summary.requests else ""),
        "refused": money(summary.refused),
        "unknown": summary.no_usage + summary.not_priced,
    }


def amounts_json(amounts: dict[str, Decimal]) -> dict[str, str]:
    """Known amounts by currency, as decimal strings (JSON has no decimals)."""
    return {currency: f"{amount:.6f}" for currency, amount in sorted(amounts.items())}


def attempt_cost_json(cost: AttemptCost) -> dict[str, Any]:
    """One request's cost in the API: an amount, or null and the reason (never 0)."""
    return {
        "amount": f"{cost.amount:.6f}" if cost.amount is not None else None,
        "currency": cost.currency or None,
        "unknown_because": cost.note or None,
    }


def summary_json(summary: CostSummary) -> dict[str, Any]:
    """A run's cost in the API: known totals by currency, refused sends apart, and
    how many requests have no known cost (they are not counted as 0)."""
    return {
        "total": amounts_json(summary.total),
        "refused_sends": amounts_json(summary.refused),
        "requests": summary.requests,
        "refused_requests": summary.refused_requests,
        "without_usage": summary.no_usage,
        "not_priced": summary.not_priced,
        "refused_without_known_cost": summary.refused_unknown,
    }


RunCosts = dict[Any, list[tuple[int, str, UsageShape]]]


def costs_by_run(run_ids: Any) -> tuple[RunCosts, dict[int, Prices]]:
    """The requests of the runs ``run_ids`` (ids or a subquery) by run, as
    (provider pk, result, shape) summed by shape, and the providers' prices: one
    query, whatever their number. ``summarize`` prices them."""
    shapes, prices = usage_shapes(ProviderAttempt.objects.filter(run_id__in=run_ids), by_run=True)
    found: RunCosts = {}
    for run_id, provider, result, shape in shapes:
        found.setdefault(run_id, []).append((provider, result, shape))
    return found, prices


def summarize(items: Any, prices: dict[int, Prices]) -> CostSummary:
    """``items``: (provider pk, result, shape); like shapes are summed before pricing."""
    merged: dict[tuple, UsageShape] = {}
    for provider, result, shape in items:
        merge_shape(merged, (provider, result, shape.kinds, shape.reported), shape)
    return summarize_shapes((key[1], shape, prices[key[0]]) for key, shape in merged.items())


def summary_cells(summary: CostSummary) -> list[str]:
    """The report's three cost cells: known cost, refused sends' cost, requests without a
    known cost. No request: "—"; requests but nothing known: "unknown", never 0."""
    if not summary.requests:
        return ["—", "—", "0"]
    known = money(summary.total) or "unknown"
    refused = (money(summary.refused) or "unknown") if summary.refused_requests else "—"
    return [known, refused, str(summary.no_usage + summary.not_priced)]
