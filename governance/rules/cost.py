"""What a provider request cost, from the usage the provider reported.

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
# The usage keys each kind of token is reported under, first found wins.
INPUT_KEYS = ("input_tokens", "prompt_tokens")
OUTPUT_KEYS = ("output_tokens", "completion_tokens")
CACHED_KEYS = ("cached_tokens", "cache_read_input_tokens")


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


def usage_tokens(usage: Mapping[str, Any] | None) -> tuple[int, int]:
    """(input, output) tokens a provider reported, under whichever key; 0 when unreported."""
    usage = usage or {}
    return _tokens(usage, INPUT_KEYS) or 0, _tokens(usage, OUTPUT_KEYS) or 0


@dataclass(frozen=True)
class UsageShape:
    """The billed tokens of one request — or of several whose usage bills the same
    kinds of token (the same ``kinds``), summed: their cost is the sum of theirs."""

    requests: int
    reported: bool  # False: no usage reported (no amount, never 0)
    billed_input: int  # input tokens not cached: max(0, input - cached) per request
    output: int
    cached: int

    @property
    def kinds(self) -> tuple[bool, bool, bool]:
        """Which kinds of token it bills: requests are summed only with the same kinds."""
        return (self.billed_input > 0, self.output > 0, self.cached > 0)


def usage_shape(usage: Mapping[str, Any] | None) -> UsageShape:
    """One request's billed tokens from the usage its provider reported."""
    usage = usage or {}
    counts = [_tokens(usage, keys) for keys in (INPUT_KEYS, OUTPUT_KEYS, CACHED_KEYS)]
    if all(count is None for count in counts):
        return UsageShape(1, False, 0, 0, 0)
    input_tokens, output_tokens, cached = (count or 0 for count in counts)
    return UsageShape(1, True, max(0, input_tokens - cached), output_tokens, cached)


def shape_cost(shape: UsageShape, prices: Prices) -> AttemptCost:
    """What the requests of ``shape`` cost: cached tokens at the cached price (else the
    input price); a kind of token it bills without a price: no known cost."""
    if not shape.reported:
        return AttemptCost(None, prices.currency, NO_USAGE)
    billed = (
        (shape.billed_input, prices.input),
        (shape.output, prices.output),
        (shape.cached, prices.cached if prices.cached is not None else prices.input),
    )
    if any(tokens and price is None for tokens, price in billed):
        return AttemptCost(None, prices.currency, NOT_PRICED)
    amount = sum(
        (Decimal(tokens) * price / MILLION for tokens, price in billed if tokens), Decimal(0)
    )
    return AttemptCost(amount, prices.currency)


def attempt_cost(usage: Mapping[str, Any] | None, prices: Prices) -> AttemptCost:
    """The cost of one request from its reported usage and its provider's prices."""
    return shape_cost(usage_shape(usage), prices)


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
        add_cost(summary, result, cost, 1)
    return summary


def summarize_shapes(items: Iterable[tuple[str, UsageShape, Prices]]) -> CostSummary:
    """``items``: (result, shape, prices) of requests summed by shape (``UsageShape``)."""
    summary = CostSummary()
    for result, shape, prices in items:
        add_cost(summary, result, shape_cost(shape, prices), shape.requests)
    return summary


def add_cost(summary: CostSummary, result: str, cost: AttemptCost, requests: int) -> None:
    """Count ``requests`` requests of one result whose cost, together, is ``cost``."""
    summary.requests += requests
    refused = result == "refused"
    summary.refused_requests += requests * refused
    if cost.amount is None:
        summary.no_usage += requests * (cost.note == NO_USAGE)
        summary.not_priced += requests * (cost.note != NO_USAGE)
        summary.refused_unknown += requests * refused
        return
    currency = cost.currency or "?"
    summary.total[currency] = summary.total.get(currency, Decimal(0)) + cost.amount
    if refused:
        summary.refused[currency] = summary.refused.get(currency, Decimal(0)) + cost.amount
