"""Costs of provider requests for the run, segment and report pages (issue 12).

Reads each request's reported usage and its provider's prices; the arithmetic
is ``governance.rules.cost`` (never here).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet

from governance.models import Provider, ProviderAttempt
from governance.rules.cost import AttemptCost, CostSummary, Prices, attempt_cost, summarize_costs


def prices_of(provider: Provider) -> Prices:
    return Prices(
        input=provider.price_input_per_mtok,
        output=provider.price_output_per_mtok,
        cached=provider.price_cached_per_mtok,
        currency=provider.currency,
    )


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


_PRICE_FIELDS = (
    "provider__price_input_per_mtok",
    "provider__price_output_per_mtok",
    "provider__price_cached_per_mtok",
    "provider__currency",
)


def cost_summary(attempts: QuerySet[ProviderAttempt]) -> CostSummary:
    """Cost of a set of attempts, in one query (their providers' prices joined)."""
    rows = attempts.order_by().values_list("result", "usage", *_PRICE_FIELDS)
    return summarize_costs(
        (result, attempt_cost(usage, Prices(p_in, p_out, p_cached, currency)))
        for result, usage, p_in, p_out, p_cached, currency in rows.iterator(chunk_size=2000)
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


def costs_by_run(run_ids: Any) -> dict[Any, list[tuple[str, AttemptCost]]]:
    """(result, cost) of every request of the runs ``run_ids`` (ids or a subquery), by run:
    one query, the providers' prices joined."""
    rows = (
        ProviderAttempt.objects.filter(run_id__in=run_ids)
        .order_by()
        .values_list("run_id", "result", "usage", *_PRICE_FIELDS)
    )
    found: dict[Any, list[tuple[str, AttemptCost]]] = {}
    for run_id, result, usage, p_in, p_out, p_cached, currency in rows.iterator(chunk_size=5000):
        cost = attempt_cost(usage, Prices(p_in, p_out, p_cached, currency))
        found.setdefault(run_id, []).append((result, cost))
    return found


def summary_cells(summary: CostSummary) -> list[str]:
    """The report's three cost cells: known cost, refused sends' cost, requests without a
    known cost. No request: "—"; requests but nothing known: "unknown", never 0."""
    if not summary.requests:
        return ["—", "—", "0"]
    known = money(summary.total) or "unknown"
    refused = (money(summary.refused) or "unknown") if summary.refused_requests else "—"
    return [known, refused, str(summary.no_usage + summary.not_priced)]
