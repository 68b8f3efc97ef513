"""The billed tokens of many provider requests, summed: read by the
run, segment and report pages and by the delivery judgement
(``governance.services.deliveries``). The arithmetic is ``governance.rules.cost``.
"""

from __future__ import annotations

from django.db import connection
from django.db.models import QuerySet

from governance.models import Provider, ProviderAttempt
from governance.rules.cost import Prices, UsageShape, usage_shape


def prices_of(provider: Provider) -> Prices:
    """A provider's prices (or a row read with its provider's price columns)."""
    return Prices(
        input=provider.price_input_per_mtok,
        output=provider.price_output_per_mtok,
        cached=provider.price_cached_per_mtok,
        currency=provider.currency,
    )


_PRICE_FIELDS = (
    "provider__price_input_per_mtok",
    "provider__price_output_per_mtok",
    "provider__price_cached_per_mtok",
    "provider__currency",
)


# Generated columns of governance_providerattempt on PostgreSQL (migration 0013): the
# cost rule's reading of ``usage`` (governance.rules.cost.usage_shape) stored by the
# database whoever writes the row, so a sum over many requests reads no JSON.
GENERATED = ("usage_reported", "usage_billed_input", "usage_output", "usage_cached")


def merge_shape(found: dict, key: tuple, shape: UsageShape) -> None:
    had = found.get(key)
    found[key] = shape if had is None else UsageShape(
        had.requests + shape.requests, shape.reported, had.billed_input + shape.billed_input,
        had.output + shape.output, had.cached + shape.cached,
    )  # fmt: skip


def usage_shapes(
    attempts: QuerySet[ProviderAttempt], *, by_run: bool
) -> tuple[list[tuple], dict[int, Prices]]:
    """The requests of ``attempts`` summed by (run, when ``by_run``), provider, refused
    or not, and shape (``rules.cost.UsageShape``: the kinds of token billed): rows of
    ``(run_id | None, provider pk, "refused" | "other", shape)``, and the prices of
    the providers concerned.

    One query (the prices joined). On PostgreSQL the sums are taken there (a
    million requests stay in the database); elsewhere each request is read and
    summed here, alike."""
    found: dict[tuple, UsageShape] = {}
    prices: dict[int, Prices] = {}
    base = attempts.order_by().values("run_id", "provider_id", "result", "usage", *_PRICE_FIELDS)
    if connection.vendor == "postgresql":
        columns = {name: f'"governance_providerattempt"."{name}"' for name in GENERATED}
        inner, params = (
            attempts.order_by()
            .extra(select=columns)
            .values("run_id", "provider_id", "result", *_PRICE_FIELDS, *GENERATED)
            .query.sql_with_params()
        )
        priced = ", ".join(f'"{name}"' for name in _PRICE_FIELDS)
        sql = f"""
            SELECT {"run_id" if by_run else "NULL"}, provider_id, {priced}, result = 'refused',
                   usage_reported, count(*), sum(usage_billed_input), sum(usage_output),
                   sum(usage_cached)
            FROM ({inner}) AS chosen
            GROUP BY 1, 2, 3, 4, 5, 6, 7, 8,
                     usage_billed_input > 0, usage_output > 0, usage_cached > 0
        """
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = [
                (run_id, provider, Prices(p_in, p_out, p_cached, currency),
                 "refused" if refused else "other",
                 UsageShape(n, reported, int(billed), int(output), int(cached)))
                for run_id, provider, p_in, p_out, p_cached, currency, refused, reported, n,
                billed, output, cached in cursor.fetchall()
            ]  # fmt: skip
    else:
        rows = [
            (row["run_id"] if by_run else None, row["provider_id"],
             Prices(*(row[name] for name in _PRICE_FIELDS)),
             "refused" if row["result"] == "refused" else "other", usage_shape(row["usage"]))
            for row in base.iterator(chunk_size=5000)
        ]  # fmt: skip
    for run_id, provider, price, result, shape in rows:
        prices[provider] = price
        merge_shape(found, (run_id, provider, result, shape.kinds, shape.reported), shape)
    return [(key[0], key[1], key[2], shape) for key, shape in found.items()], prices
