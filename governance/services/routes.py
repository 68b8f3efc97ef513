"""Routes: a named provider chain, and the one namespace of the names a
request's ``model`` may give (the OpenAI-compatible door: a route's name or a
single provider's id).

The API (``POST``/``PATCH /api/v1/routes``) and ``manage.py route`` both come
here; each change is audited with the fields it changed. A route's name is
never a provider id and a provider id never a route's name:
``require_free_name`` is asked by both services when a name is taken, under a
lock on the name, so a route and a provider added at once cannot both take it.
The chain check is the threads' too (``check_provider_chain``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from governance.models import Provider, Route
from governance.services.audit import audit
from governance.services.errors import ServiceError
from governance.services.locks import hold_until_commit

# The same form as a provider id: both are what a request's ``model`` names.
ROUTE_NAME = re.compile(r"[-a-zA-Z0-9_]{1,64}")
CHAIN_MAX = 20
DESCRIPTION_MAX = 2_000
# What PATCH may change; the name stays (clients call it by name).
EDITABLE = ("provider_chain", "description", "enabled")


class RouteExists(ServiceError):
    """The name is taken, by a route or a provider (the API answers 409)."""


class NameTaken(ServiceError):
    """A route's name or a provider's id that the other already uses (the API answers 409)."""


def check_provider_chain(chain: Any, field: str = "provider_chain") -> list[str]:
    """Provider ids tried in order: 1 to ``CHAIN_MAX``, each once, each an
    existing provider (enabled or not: a disabled one is skipped by routing)."""
    if (
        not isinstance(chain, list | tuple)
        or not chain
        or not all(isinstance(p, str) and p for p in chain)
    ):
        raise ServiceError(field, "list at least one provider id")
    chain = list(chain)
    if len(chain) > CHAIN_MAX:
        raise ServiceError(field, f"at most {CHAIN_MAX} providers")
    if len(set(chain)) != len(chain):
        raise ServiceError(field, "a provider appears twice")
    known = set(
        Provider.objects.filter(provider_id__in=chain).values_list("provider_id", flat=True)
    )
    missing = [p for p in chain if p not in known]
    if missing:
        raise ServiceError(field, f"unknown provider(s): {', '.join(missing)}")
    return chain


def require_free_name(name: str, *, for_a: str, field: str) -> None:
    """Inside the transaction that takes ``name`` for a route or a provider
    (``for_a``): refused when the other kind holds it already."""
    hold_until_commit(f"name:{name}")
    if for_a == "route" and Provider.objects.filter(provider_id=name).exists():
        raise NameTaken(
            field, f"a provider {name!r} exists: a route's name must not be a provider id"
        )
    if for_a == "provider" and Route.objects.filter(name=name).exists():
        raise NameTaken(field, f"a route {name!r} exists: a provider may not take its name")


def _check(values: dict[str, Any], given: Sequence[str]) -> None:
    """The route as it would be stored. The chain is judged when given: turning
    a route off never fails on a provider removed from its chain since."""
    if "provider_chain" in given:
        values["provider_chain"] = check_provider_chain(values["provider_chain"])
    description = values["description"]
    if not isinstance(description, str) or len(description) > DESCRIPTION_MAX:
        raise ServiceError("description", f"text of at most {DESCRIPTION_MAX} characters")
    if not isinstance(values["enabled"], bool):
        raise ServiceError("enabled", "must be true or false")


def create_route(
    *,
    name: str,
    provider_chain: Sequence[str],
    by: str,
    now: datetime,
    description: str = "",
    enabled: bool = True,
) -> Route:
    """A new route; refused (nothing written) on a bad name, chain or description."""
    if not isinstance(name, str) or not ROUTE_NAME.fullmatch(name):
        raise ServiceError("name", "1 to 64 letters, digits, '-' or '_'")
    values = {"provider_chain": provider_chain, "description": description, "enabled": enabled}
    _check(values, EDITABLE)
    try:
        with transaction.atomic():
            require_free_name(name, for_a="route", field="name")
            route = Route.objects.create(name=name, created_at=now, updated_at=now, **values)
            audit(
                actor=by,
                action="route.create",
                target_type="route",
                target_id=name,
                reason="",
                detail=values,
                now=now,
            )
    except IntegrityError:
        raise RouteExists("name", f"a route {name!r} exists already") from None
    return route


def update_route(
    name: str, /, *, by: str, now: datetime, reason: str = "", **changes: Any
) -> tuple[Route, list[str]]:
    """Change the ``EDITABLE`` fields given; returns the route and the names of
    the fields that changed (none: nothing is written). Raises
    ``Route.DoesNotExist`` for an unknown name."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ServiceError(unknown[0], "is not a setting that can be changed")
    with transaction.atomic():
        route = Route.objects.select_for_update().get(name=name)
        before = {field: getattr(route, field) for field in EDITABLE}
        after = {**before, **changes}
        _check(after, list(changes))
        changed = [field for field in EDITABLE if after[field] != before[field]]
        if not changed:
            return route, []
        for field in changed:
            setattr(route, field, after[field])
        route.updated_at = now
        route.save(update_fields=[*changed, "updated_at"])
        audit(
            actor=by,
            action="route.update",
            target_type="route",
            target_id=name,
            reason=reason,
            detail={
                "before": {field: before[field] for field in changed},
                "after": {field: after[field] for field in changed},
            },
            now=now,
        )
    return route, changed
