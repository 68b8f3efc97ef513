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
