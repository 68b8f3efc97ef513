"""Routes as the API, ``manage.py route``, the Providers page and the
OpenAI-compatible door's model list read them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from governance.models import Provider, Route


def route_json(route: Route) -> dict[str, Any]:
    return {
        "name": route.name,
        "provider_chain": list(route.provider_chain),
        "description": route.description,
        "enabled": route.enabled,
        "created_at": route.created_at.isoformat(),
        "updated_at": route.updated_at.isoformat(),
    }


def routes() -> list[Route]:
    return list(Route.objects.order_by("name"))


@dataclass(frozen=True)
class OfferedModel:
    """A name a request's ``model`` may give: a route's, or a single provider's id."""

    id: str
    created: datetime
    owned_by: str


def offered_models() -> list[OfferedModel]:
    """The enabled routes (by name), then the enabled providers (by id)."""
    by_route = [
        OfferedModel(route.name, route.created_at, "route")
        for route in Route.objects.filter(enabled=True).order_by("name")
    ]
    by_provider = [
        OfferedModel(provider_id, created_at, kind)
        for provider_id, created_at, kind in Provider.objects.filter(enabled=True)
        .order_by("provider_id")
        .values_list("provider_id", "created_at", "kind")
    ]
    return by_route + by_provider
