"""Providers over the API: ``GET``/``POST /api/v1/providers``, ``GET``/``PATCH …/{id}``."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse
from pydantic import BaseModel

from dashboard.api.base import ApiError, api_view, by_method, parse_body
from dashboard.api.schemas import ProviderCreate, ProviderUpdate
from dashboard.queries.secrets import secret_present, secret_refused
from dashboard.site import permissions
from governance import services, time_source
from governance.models import Provider, ProviderHealthState
from governance.services import providers as provider_services
from governance.services.routes import NameTaken
from governance.services.secrets import mask_url


def provider_json(provider: Provider) -> dict[str, Any]:
    """A provider's configuration: its key's variable *name*, whether the worker may
    read it and whether it is set, never a key; the base URL with any credentials masked."""
    try:
        breaker = provider.health.breaker
    except ProviderHealthState.DoesNotExist:
        breaker = "closed"
    return {
        "provider_id": provider.provider_id,
        "kind": provider.kind,
        "model": provider.model,
        "base_url": mask_url(provider.base_url),
        "key_env": provider.api_key_env or None,
        "key_env_refused": secret_refused(provider.api_key_env),
        "key_present": secret_present(provider.api_key_env),
        "has_script": provider.script is not None,
        "connect_timeout_s": provider.connect_timeout_s,
        "read_timeout_s": provider.read_timeout_s,
        "failure_threshold": provider.failure_threshold,
        "base_cooldown_s": provider.base_cooldown_s,
        "max_cooldown_s": provider.max_cooldown_s,
        "enabled": provider.enabled,
        "breaker": breaker,
        **{
            name: None if getattr(provider, name) is None else str(getattr(provider, name))
            for name in ("price_input_per_mtok", "price_output_per_mtok", "price_cached_per_mtok")
        },
        "currency": provider.currency or None,
        "refusal_schedule": provider.refusal_schedule or {},
        "created_at": provider.created_at.isoformat(),
        "updated_at": provider.updated_at.isoformat(),
    }


def script_problem(kind: str, script: Any) -> str | None:
    """What the adapter of ``kind`` would refuse in ``script`` (None: it runs,
    or the kind takes no script, which the service says)."""
    from tasks.adapters import script_problem as adapter_problem

    return adapter_problem(kind, script)


def _provider_settings(body: BaseModel, *, kind: str, exclude_none: bool) -> dict[str, Any]:
    values = body.model_dump(exclude_none=exclude_none, exclude={"provider_id", "reason"})
    if "key_env" in values:
        values["api_key_env"] = values.pop("key_env")
    if values.get("script") is not None and (problem := script_problem(kind, values["script"])):
        raise ApiError(400, "script", problem)
    return values


def _provider_problem(exc: services.ServiceError) -> ApiError:
    """A service's refusal, named by the API's field (``key_env`` is ``api_key_env`` there)."""
    return ApiError(400, "key_env" if exc.field == "api_key_env" else exc.field, exc.message)


def _provider(provider_id: str) -> Provider:
    if not provider_services.PROVIDER_ID.fullmatch(provider_id):
        raise ApiError(404, None, "no such provider")
    try:
        return Provider.objects.select_related("health").get(provider_id=provider_id)
    except Provider.DoesNotExist:
        raise ApiError(404, None, "no such provider") from None


@api_view(("GET",))
def list_providers(request: HttpRequest) -> JsonResponse:
    rows = Provider.objects.select_related("health").order_by("provider_id")
    return JsonResponse({"items": [provider_json(p) for p in rows]})


@api_view(("POST",), permission=permissions.MANAGE_PROVIDERS)
def create_provider(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, ProviderCreate)
    values = _provider_settings(body, kind=body.kind, exclude_none=False)
    try:
        provider = provider_services.create_provider(
            provider_id=body.provider_id,
            by=request.api_user.get_username(),
            now=time_source.now(),
            **values,
        )
    except (provider_services.ProviderExists, NameTaken) as exc:
        raise ApiError(409, exc.field, exc.message) from None
    except services.ServiceError as exc:
        raise _provider_problem(exc) from None
    return JsonResponse(provider_json(provider), status=201)


@api_view(("GET",))
def provider_detail(request: HttpRequest, provider_id: str) -> JsonResponse:
    return JsonResponse(provider_json(_provider(provider_id)))


@api_view(("PATCH",), permission=permissions.MANAGE_PROVIDERS)
def update_provider(request: HttpRequest, provider_id: str) -> JsonResponse:
    kind = _provider(provider_id).kind  # 404 before judging the body
    body = parse_body(request, ProviderUpdate)
    try:
        provider, _changed = provider_services.update_provider(
            provider_id,
            by=request.api_user.get_username(),
            now=time_source.now(),
            reason=body.reason,
            **_provider_settings(body, kind=kind, exclude_none=True),
        )
    except Provider.DoesNotExist:
        raise ApiError(404, None, "no such provider") from None
    except services.ServiceError as exc:
        raise _provider_problem(exc) from None
    return JsonResponse(provider_json(_provider(provider.provider_id)))


providers = by_method(GET=list_providers, POST=create_provider)
provider = by_method(GET=provider_detail, PATCH=update_provider)
