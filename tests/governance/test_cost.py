"""The cost rule: from reported usage and per-million prices; no usage is not 0."""

from __future__ import annotations

from decimal import Decimal

from governance.rules.cost import (
    NO_USAGE,
    NOT_PRICED,
    AttemptCost,
    Prices,
    attempt_cost,
    summarize_costs,
)

PRICES = Prices(Decimal("2.50"), Decimal("10"), Decimal("1.25"), "USD")


def test_cost_from_input_output_and_cached_tokens():
    """R3.1: cost from input output and cached tokens."""
    # 1,000 input of which 400 cached, 200 output:
    # 600 × 2.50 + 400 × 1.25 + 200 × 10 = 1500 + 500 + 2000 = 4000 per million = 0.004
    cost = attempt_cost({"input_tokens": 1000, "cached_tokens": 400, "output_tokens": 200}, PRICES)
    assert cost == AttemptCost(Decimal("0.004"), "USD")
    # OpenAI's names read the same
    assert attempt_cost({"prompt_tokens": 1000, "completion_tokens": 0}, PRICES).amount == Decimal(
        "0.0025"
    )


def test_no_usage_reported_is_unknown_not_zero():
    """R3.1: no usage reported is unknown not zero."""
    for usage in (None, {}, {"input_tokens": "12"}, {"output_tokens": True}):
        cost = attempt_cost(usage, PRICES)
        assert cost.amount is None and cost.note == NO_USAGE
    unpriced = attempt_cost({"output_tokens": 5}, Prices(input=Decimal(1), currency="EUR"))
    assert unpriced.amount is None and unpriced.note == NOT_PRICED
    # cached tokens without a cached price are billed at the input price
    assert attempt_cost(
        {"input_tokens": 10, "cached_tokens": 10}, Prices(input=Decimal(1))
    ).amount == Decimal("0.00001")


def test_summary_sums_refused_sends_apart_and_counts_the_unknown():
    """R3.1: summary sums refused sends apart and counts the unknown."""
    items = [
        ("accepted", AttemptCost(Decimal("0.5"), "USD")),
        ("refused", AttemptCost(Decimal("0.25"), "USD")),
        ("refused", AttemptCost(Decimal("1"), "EUR")),
        ("refused", AttemptCost(None, "USD", NO_USAGE)),
        ("failed", AttemptCost(None, "USD", NOT_PRICED)),
    ]
    summary = summarize_costs(items)
    assert summary.total == {"USD": Decimal("0.75"), "EUR": Decimal("1")}
    assert summary.refused == {"USD": Decimal("0.25"), "EUR": Decimal("1")}
    assert (summary.requests, summary.refused_requests) == (5, 3)
    assert (summary.no_usage, summary.not_priced, summary.refused_unknown) == (1, 1, 1)
