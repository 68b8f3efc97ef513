"""What a provider request cost (issue 12), from the usage the provider reported.

Prices are per million tokens, per provider, in its currency. A request whose
provider reported no usage has no known cost: it says "no usage reported"
and is never counted as 0. Cached tokens are billed at the cached price and
not again at the input price (OpenAI-compatible usage counts cached prompt
tokens inside ``input_tokens``). Refused sends — the original, re-renders,
history-only sends and re-probes that a provider refused (R3.1, R3.2) — are
summed apart: they are the bill for re-sending refused bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

MILLION = Decimal(1_000_000)
NO_USAGE = "no usage reported"
NOT_PRICED = "provider has no price"
_INPUT_KEYS = ("input_tokens", "prompt_tokens")
_OUTPUT_KEYS = ("output_tokens", "completion_tokens")
_CACHED_KEYS = ("cached_tokens", "cache_read_input_tokens")


@dataclass(frozen=True)
class Prices:
    """Per million tokens; None: no price for that kind of token."""

    input: Decimal | None = None
    output: Decimal | None = None
    cached: Decimal | None = None
    currency: str = ""


@dataclass(frozen=True)
class AttemptCost:
    amount: Decimal | None  # None: unknown (see ``note``)
    currency: str
    note: str = ""  # "" when known; NO_USAGE or NOT_PRICED otherwise


def _tokens(usage: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def attempt_cost(usage: Mapping[str, Any] | None, prices: Prices) -> AttemptCost:
    """The cost of one request from its reported usage and its provider's prices."""
    usage = usage or {}
    counts = [_tokens(usage, keys) for keys in (_INPUT_KEYS, _OUTPUT_KEYS, _CACHED_KEYS)]
    if all(count is None for count in counts):
        return AttemptCost(None, prices.currency, NO_USAGE)
    input_tokens, output_tokens, cached = (count or 0 for count in counts)
    billed = (
        (max(0, input_tokens - cached), prices.input),
        (output_tokens, prices.output),
        (cached, prices.cached if prices.cached is not None else prices.input),
    )
    if any(tokens and price is None for tokens, price in billed):
        return AttemptCost(None, prices.currency, NOT_PRICED)
    amount = sum(
        (Decimal(tokens) * price / MILLION for tokens, price in billed if tokens), Decimal(0)
    )
    return AttemptCost(amount, prices.currency)


@dataclass
class CostSummary:
    """Known costs by currency; the requests without a known cost are counted, not priced."""

    total: dict[str, Decimal] = field(default_factory=dict)
    refused: dict[str, Decimal] = field(default_factory=dict)  # refused sends only
    requests: int = 0
    refused_requests: int = 0
    no_usage: int = 0
    not_priced: int = 0
    refused_unknown: int = 0  # refused sends without a known cost


def summarize_costs(items: Iterable[tuple[str, AttemptCost]]) -> CostSummary:
    """``items``: (result, cost) of each request. Refused sends are summed apart too."""
    summary = CostSummary()
    for result, cost in items:
        summary.requests += 1
        refused = result == "refused"
        summary.refused_requests += refused
        if cost.amount is None:
            summary.no_usage += cost.note == NO_USAGE
            summary.not_priced += cost.note != NO_USAGE
            summary.refused_unknown += refused
            continue
        currency = cost.currency or "?"
        summary.total[currency] = summary.total.get(currency, Decimal(0)) + cost.amount
        if refused:
            summary.refused[currency] = summary.refused.get(currency, Decimal(0)) + cost.amount
    return summary
