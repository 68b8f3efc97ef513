"""Providers: adding one, changing its configuration, enabling and disabling it.

The API (``POST``/``PATCH /api/v1/providers``) and ``manage.py provider`` both
come here, and the admin's provider form asks ``check_base_url`` and
``services.secrets.require_key_env``. A provider names the *environment
variable* that holds its key (``api_key_env``), never the key: nothing here
reads, stores or returns a key. The variable must be one a key may live in
(``GOVERNANCE_KEY_ENV_ALLOW``, ``governance.rules.secrets``), and the base URL
carries no credentials and obeys the outbound rules (``GOVERNANCE_OUTBOUND_ALLOW``):
the worker sends the key there. Both are judged when they are given; a row
stored before is judged again at call time, where the worker sends nothing
it refuses. Each change is audited with the fields it changed. A provider id
is never a route's name (``services.routes.require_free_name``).

A script kind's script is checked by its adapter's ``check_script`` in the
caller (``tasks/`` is above this layer); here it only has to be an object.
"""

from __future__ import annotations

import re
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import IntegrityError, transaction

from governance import provider_kinds
from governance.models import Provider
from governance.rules.refusal import (
    RefusalError,
    check_schedule,
    delays_from_seconds,
    delays_seconds,
)
from governance.rules.secrets import ENV_NAME
from governance.services.audit import audit
from governance.services.errors import ServiceError
from governance.services.outbound import require_http_url, require_outbound_url
from governance.services.routes import require_free_name
from governance.services.secrets import require_key_env, require_url_without_credentials

PROVIDER_ID = re.compile(r"[-a-zA-Z0-9_]{1,64}")
ENV_NAME_MAX = 100
MODEL_MAX = 200
BASE_URL_MAX = 200

# Ranges of the numeric settings: (low, high), inclusive.
RANGES: dict[str, tuple[float, float]] = {
    "connect_timeout_s": (0.1, 300.0),
    "read_timeout_s": (1.0, 3600.0),
    "failure_threshold": (1, 100),
    "base_cooldown_s": (1.0, 86_400.0),
    "max_cooldown_s": (1.0, 604_800.0),
}
# What PATCH (and ``provider disable``) may change; kind and provider_id stay.
EDITABLE = (
    "model",
    "base_url",
    "api_key_env",
    "script",
    "connect_timeout_s",
    "read_timeout_s",
    "failure_threshold",
    "base_cooldown_s",
    "max_cooldown_s",
    "enabled",
    *(PRICES := ("price_input_per_mtok", "price_output_per_mtok", "price_cached_per_mtok")),
    "currency",
    "refusal_schedule",
)
MAX_SCHEDULE_CATEGORIES = 20
CATEGORY = re.compile(r"[-a-zA-Z0-9_.]{1,64}")
PRICE_MAX = Decimal(1_000_000)  # per million tokens
CURRENCY = re.compile(r"[A-Z]{3}")
DEFAULTS: dict[str, Any] = {
    "base_url": "",
    "api_key_env": "",
    "script": None,
    "connect_timeout_s": 10.0,
    "read_timeout_s": 120.0,
    # R2.2's breaker defaults, as the model's fields take them from the rule.
    "failure_threshold": Provider._meta.get_field("failure_threshold").default,
    "base_cooldown_s": Provider._meta.get_field("base_cooldown_s").default,
    "max_cooldown_s": Provider._meta.get_field("max_cooldown_s").default,
    "enabled": True,
    "price_input_per_mtok": None,
    "price_output_per_mtok": None,
    "price_cached_per_mtok": None,
    "currency": "",
    "refusal_schedule": {},
}


class ProviderExists(ServiceError):
    """The provider id is taken (the API answers 409)."""


def _base_url_form(base_url: str, field: str) -> None:
    if len(base_url) > BASE_URL_MAX:
        raise ServiceError(field, f"at most {BASE_URL_MAX} characters")
    require_http_url(base_url, field)


def check_base_url(base_url: str, field: str = "base_url") -> None:
    """A server's base URL as it may be given: http(s) with a host, no
    credentials in it, an address the outbound rules let the worker reach
    (resolved now; resolved and checked again at every call)."""
    _base_url_form(base_url, field)
    require_url_without_credentials(base_url, field)
    require_outbound_url(base_url, field)


def _check(values: dict[str, Any], given: frozenset[str] | set[str]) -> None:
    """The whole configuration, as it would be stored; raises ServiceError naming a field.

    Where the worker sends the key (``base_url``) and which variable it reads
    (``api_key_env``) are judged when ``given``: a change of other settings
    (prices, say) of a row stored before these checks is not refused for them,
    and the call-time checks still keep its key from being sent."""
    kind = values["kind"]
    spec = provider_kinds.kind(kind)
    if spec is None:
        raise ServiceError("kind", f"must be one of {', '.join(provider_kinds.names())}")
    model = values["model"]
    if not isinstance(model, str) or not model.strip() or len(model) > MODEL_MAX:
        raise ServiceError("model", f"name the model (1 to {MODEL_MAX} characters)")
    base_url = values["base_url"] or ""
    if spec.has_server:
        if not base_url:
            raise ServiceError("base_url", f"a {kind} provider needs the server's base URL")
        if "base_url" in given:
            check_base_url(base_url)
        else:
            _base_url_form(base_url, "base_url")
    elif base_url:
        raise ServiceError("base_url", f"a {kind} provider has no base URL")
    key_env = values["api_key_env"] or ""
    if key_env and (len(key_env) > ENV_NAME_MAX or not ENV_NAME.fullmatch(key_env)):
        raise ServiceError(
            "api_key_env",
            "the NAME of an environment variable (letters, digits, _), never the key itself",
        )
    if "api_key_env" in given:
        require_key_env(key_env, "api_key_env")
    if spec.has_script:
        if not isinstance(values["script"], dict):
            raise ServiceError("script", f"a {kind} provider needs its script (an object)")
        if key_env:
            raise ServiceError("api_key_env", f"a {kind} provider has no key")
    elif values["script"] is not None:
        scripted = ", ".join(k.name for k in provider_kinds.KINDS.values() if k.has_script)
        raise ServiceError("script", f"only a {scripted} provider has a script, not {kind}")
    for name, (low, high) in RANGES.items():
        value = values[name]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not (low <= value <= high)
        ):
            raise ServiceError(name, f"must be a number from {low:g} to {high:g}")
    if values["failure_threshold"] != int(values["failure_threshold"]):
        raise ServiceError("failure_threshold", "must be a whole number")
    if values["max_cooldown_s"] < values["base_cooldown_s"]:
        raise ServiceError("max_cooldown_s", "must not be below base_cooldown_s")
    if not isinstance(values["enabled"], bool):
        raise ServiceError("enabled", "must be true or false")
    for name in PRICES:
        values[name] = _price(name, values[name])
    currency = values["currency"] or ""
    if currency and not (isinstance(currency, str) and CURRENCY.fullmatch(currency)):
        raise ServiceError("currency", "a three-letter ISO 4217 code in capitals, e.g. USD")
    if any(values[name] is not None for name in PRICES) and not currency:
        raise ServiceError("currency", "name the currency of the prices, e.g. USD")
    values["refusal_schedule"] = _schedule(values["refusal_schedule"])


def _delays(where: str, value: Any) -> list[float]:
    """One schedule in seconds, checked by the rule (R3.2: 1–5, increasing, ≤ the TTL)."""
    field = "refusal_schedule"
    if not isinstance(value, list) or any(
        isinstance(v, bool) or not isinstance(v, int | float) for v in value
    ):
        raise ServiceError(field, f"{where}: a list of delays in seconds, e.g. [900, 3600, 21600]")
    delays = delays_from_seconds(value) if value else ()
    if delays is None:
        raise ServiceError(field, f"{where}: every delay must be a positive number of seconds")
    try:
        return delays_seconds(check_schedule(delays))
    except RefusalError as exc:
        raise ServiceError(field, f"{where}: {exc}") from None


def _schedule(value: Any) -> dict[str, Any]:
    """A provider's own re-probe schedule (R3.2): ``{}`` (R3.2's default),
    ``{"delays_s": [...]}`` and/or ``{"categories": {"policy": [...]}}``."""
    field = "refusal_schedule"
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServiceError(field, 'an object: {"delays_s": [...], "categories": {...}}, or {}')
    unknown = sorted(set(value) - {"delays_s", "categories"})
    if unknown:
        raise ServiceError(field, f"unknown key {unknown[0]!r} (delays_s, categories)")
    schedule: dict[str, Any] = {}
    if value.get("delays_s") is not None:
        schedule["delays_s"] = _delays("delays_s", value["delays_s"])
    categories = value.get("categories") or {}
    if not isinstance(categories, dict) or len(categories) > MAX_SCHEDULE_CATEGORIES:
        raise ServiceError(
            field, f"categories: an object of at most {MAX_SCHEDULE_CATEGORIES} refusal categories"
        )
    checked = {}
    for category, delays in categories.items():
        if not isinstance(category, str) or not CATEGORY.fullmatch(category):
            raise ServiceError(field, f"categories: {category!r} is not a refusal category name")
        checked[category] = _delays(f"categories.{category}", delays)
    if checked:
        schedule["categories"] = dict(sorted(checked.items()))
    return schedule


def _price(name: str, value: Any) -> Decimal | None:
    """A price per million tokens: None (not priced) or a number from 0 to 1,000,000."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ServiceError(name, "must be a price per million tokens (a number), or null")
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        raise ServiceError(name, "must be a price per million tokens (a number), or null") from None
    if not price.is_finite() or not (0 <= price <= PRICE_MAX):
        raise ServiceError(name, "must be a number from 0 to 1,000,000 (per million tokens)")
    return price.quantize(Decimal("0.000001"))


def _values(provider: Provider) -> dict[str, Any]:
    return {name: getattr(provider, name) for name in ("kind", *EDITABLE)}


def _described(values: dict[str, Any]) -> dict[str, Any]:
    """What the audit entry keeps of a change (the script only as 'set')."""
    return {
        name: (
            "(script)"
            if name == "script" and value is not None
            else str(value)
            if isinstance(value, Decimal)
            else value
        )
        for name, value in values.items()
    }


def create_provider(
    *, provider_id: str, kind: str, model: str, by: str, now: datetime, **settings: Any
) -> Provider:
    """A new provider; ``settings`` are the ``EDITABLE`` fields (the rest default)."""
    unknown = sorted(set(settings) - set(EDITABLE))
    if unknown:
        raise ServiceError(unknown[0], "is not a provider setting")
    if not isinstance(provider_id, str) or not PROVIDER_ID.fullmatch(provider_id):
        raise ServiceError("provider_id", "1 to 64 letters, digits, '-' or '_'")
    values = {**DEFAULTS, **settings, "kind": kind, "model": model}
    _check(values, set(values))
    values["failure_threshold"] = int(values["failure_threshold"])
    try:
        with transaction.atomic():
            # A provider id is never a route's name: the door's ``model`` names either.
            require_free_name(provider_id, for_a="provider", field="provider_id")
            provider = Provider.objects.create(provider_id=provider_id, **values)
            audit(
                actor=by,
                action="provider.create",
                target_type="provider",
                target_id=provider_id,
                reason="",
                detail=_described(values),
                now=now,
            )
    except IntegrityError:
        raise ProviderExists("provider_id", f"a provider {provider_id!r} exists already") from None
    return provider


def update_provider(
    provider_id: str, *, by: str, now: datetime, reason: str = "", **changes: Any
) -> tuple[Provider, list[str]]:
    """Change the ``EDITABLE`` fields given; returns the provider and the names
    of the fields that changed (none: nothing is written). Raises
    ``Provider.DoesNotExist`` for an unknown id."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ServiceError(unknown[0], "is not a setting that can be changed")
    with transaction.atomic():
        provider = Provider.objects.select_for_update().get(provider_id=provider_id)
        before = _values(provider)
        after = {**before, **changes}
        if set(changes) - {"enabled"}:
            _check(after, {name for name in changes if changes[name] != before[name]})
        elif not isinstance(after["enabled"], bool):
            # Enabling or disabling alone never fails on an older row's other settings.
            raise ServiceError("enabled", "must be true or false")
        after["failure_threshold"] = int(after["failure_threshold"])
        changed = [name for name in EDITABLE if after[name] != before[name]]
        if not changed:
            return provider, []
        for name in changed:
            setattr(provider, name, after[name])
        provider.save(update_fields=[*changed, "updated_at"])
        audit(
            actor=by,
            action="provider.update",
            target_type="provider",
            target_id=provider_id,
            reason=reason,
            detail={
                "before": _described({n: before[n] for n in changed}),
                "after": _described({n: after[n] for n in changed}),
            },
            now=now,
        )
    return provider, changed


def set_provider_enabled(
    provider_id: str, enabled: bool, *, by: str, now: datetime, reason: str = ""
) -> tuple[Provider, bool]:
    """Enable or disable; returns (provider, changed). A disabled provider is
    skipped by routing ("disabled by an administrator")."""
    provider, changed = update_provider(provider_id, by=by, now=now, reason=reason, enabled=enabled)
    return provider, bool(changed)
