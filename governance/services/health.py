"""Provider health: the breaker rows the health rules read and move (R2.2)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from governance.models import (
    Provider,
    ProviderHealthState,
)
from governance.rules import breaker as breaker_rules
from governance.rules.classification import Classification
from governance.rules.turns import HealthMove
from governance.services import statements as sql


def provider_health(
    provider: Provider, row: ProviderHealthState | None
) -> breaker_rules.ProviderHealth:
    """The breaker row as the pure value the health rules read (R2.2)."""
    if row is None:
        return breaker_rules.ProviderHealth(provider_id=provider.provider_id)
    return breaker_rules.ProviderHealth(
        provider_id=provider.provider_id,
        breaker=row.breaker,
        consecutive_failures=row.consecutive_failures,
        trips=row.trips,
        open_until=row.open_until,
        last_failure_class=row.last_failure_class or None,
        last_failure_at=row.last_failure_at,
        disabled_config=row.disabled_config or None,
        probe_lease_until=row.probe_lease_until,
        last_success_at=row.last_success_at,
    )


def providers_with_health(provider_ids: Sequence[str]) -> sql.Later[dict[str, Provider]]:
    """The providers named, each with its breaker row read along
    (``provider.health``; a provider with no failure yet has none)."""
    providers, rows = sql.columns(Provider, "p"), sql.columns(ProviderHealthState, "h")

    def loaded(found: list) -> dict[str, Provider]:
        by_id = {}
        for row in found:
            provider = providers.load(row)
            sql.cache_related(provider, "health", rows.load(row, providers.width))
            by_id[provider.provider_id] = provider
        return by_id

    return sql.Later(
        f"SELECT {providers.sql}, {rows.sql} FROM {sql.table(Provider)} p"
        f" LEFT JOIN {sql.table(ProviderHealthState)} h ON h.provider_id = p.id"
        f" WHERE {sql.is_in('p.provider_id', len(provider_ids))} ORDER BY p.provider_id",
        list(provider_ids),
        loaded,
    )


def breaker_policy(provider: Provider) -> breaker_rules.BreakerPolicy:
    return breaker_rules.BreakerPolicy(
        failure_threshold=provider.failure_threshold,
        base_cooldown=timedelta(seconds=provider.base_cooldown_s),
        max_cooldown=timedelta(seconds=max(provider.max_cooldown_s, provider.base_cooldown_s)),
    )


def health_verdicts(providers: Sequence[Provider], now: datetime) -> dict[str, Any]:
    verdicts = {}
    for provider in providers:
        row, _ = ProviderHealthState.objects.select_related("provider").get_or_create(
            provider=provider
        )
        verdicts[provider.provider_id] = breaker_rules.health_verdict(
            provider_health(provider, row),
            now,
            provider.config_fingerprint(),
            enabled=provider.enabled,
        )
    return verdicts


def health_rows_later(providers: Iterable[Provider]) -> sql.Later[dict[Any, ProviderHealthState]]:
    """The providers' health rows by provider key, unlocked, read with others
    (``statements.together``): what :func:`record_provider_result` reads first."""
    keys = sorted({provider.pk for provider in providers})
    shape = sql.columns(ProviderHealthState, "h")
    return sql.Later(
        f"SELECT {shape.sql} FROM {sql.table(ProviderHealthState)} h"
        f" WHERE {sql.is_in('h.provider_id', len(keys))}",
        keys,
        lambda found: {row.provider_id: row for row in map(shape.load, found)},
    )


def record_provider_result(
    provider: Provider,
    classification: Classification | None,
    now: datetime,
    *,
    error: str = "",
    rng: random.Random | None = None,
    read: Mapping[Any, ProviderHealthState] | None = None,
) -> None:
    """R2.2: move the breaker on a time-based failure or a success (row lock).

    A success that changes nothing but a recent "last success" is not written
    (``breaker_rules.health_changed``): the unlocked read decides, so healthy
    traffic never queues on the provider's row. ``read``: that unlocked read,
    made already in this transaction (:func:`health_rows_later`).
    """

    def moved(row: ProviderHealthState | None) -> tuple[Any, Any]:
        value = provider_health(provider, row)
        if classification is None or classification.failure_class is None:
            return value, breaker_rules.record_success(value, now)
        return value, breaker_rules.record_failure(
            value,
            classification,
            now,
            breaker_policy(provider),
            rng or random.Random(),
            provider.config_fingerprint(),
        )

    if read is None:
        read = health_rows_later([provider]).value()
    current = read.get(provider.pk)
    if current is not None and not breaker_rules.health_changed(*moved(current)):
        return
    with transaction.atomic(savepoint=False):
        row = ProviderHealthState.objects.select_for_update().filter(provider=provider).first()
        if row is None:
            # Two first closes for one provider race here: ON CONFLICT DO NOTHING.
            ProviderHealthState.objects.bulk_create(
                [ProviderHealthState(provider=provider)], ignore_conflicts=True
            )
            row = ProviderHealthState.objects.select_for_update().get(provider=provider)
        _value, new = moved(row)
        for field_name in (
            "breaker",
            "consecutive_failures",
            "trips",
            "open_until",
            "last_failure_at",
            "probe_lease_until",
            "last_success_at",
        ):
            setattr(row, field_name, getattr(new, field_name))
        row.last_failure_class = new.last_failure_class or ""
        row.disabled_config = new.disabled_config or ""
        if error:
            row.last_error = error[:2000]
        row.save()


def apply_health_moves(
    providers: Mapping[str, Provider],
    moves: Sequence[HealthMove],
    now: datetime,
    *,
    rng: random.Random,
    read: Mapping[Any, ProviderHealthState] | None = None,
) -> None:
    """R2.2: a turn's breaker moves, in order, inside the stage's closing
    transaction. ``read``: the providers' rows as read at its start
    (:func:`health_rows_later`); a provider's second move reads its row again,
    as its first move may have written it."""
    moved: set[Any] = set()
    for move in moves:
        provider = providers[move.provider_id]
        record_provider_result(
            provider, move.classification, now, error=move.error, rng=rng,
            read=read if provider.pk not in moved else None,
        )  # fmt: skip
        moved.add(provider.pk)
