"""Routes over the API: ``GET``/``POST /api/v1/routes``, ``GET``/``PATCH …/{name}``.

A route is provider configuration: writing one needs ``change_provider``."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from dashboard.api.base import ApiError, api_view, by_method, parse_body
from dashboard.api.schemas import RouteCreate, RouteUpdate
from dashboard.queries import routes as queries
from dashboard.site import permissions
from governance import time_source
from governance.models import Route
from governance.services import routes as route_services


def _route(name: str) -> Route:
    if not route_services.ROUTE_NAME.fullmatch(name):
        raise ApiError(404, None, "no such route")
    try:
        return Route.objects.get(name=name)
    except Route.DoesNotExist:
        raise ApiError(404, None, "no such route") from None


@api_view(("GET",))
def list_routes(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"items": [queries.route_json(r) for r in queries.routes()]})


@api_view(("POST",), permission=permissions.MANAGE_PROVIDERS)
def create_route(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, RouteCreate)
    try:
        route = route_services.create_route(
            **body.model_dump(), by=request.api_user.get_username(), now=time_source.now()
        )
    except (route_services.RouteExists, route_services.NameTaken) as exc:
        raise ApiError(409, exc.field, exc.message) from None
    return JsonResponse(queries.route_json(route), status=201)


@api_view(("GET",))
def route_detail(request: HttpRequest, name: str) -> JsonResponse:
    return JsonResponse(queries.route_json(_route(name)))


@api_view(("PATCH",), permission=permissions.MANAGE_PROVIDERS)
def update_route(request: HttpRequest, name: str) -> JsonResponse:
    _route(name)  # 404 before judging the body
    body = parse_body(request, RouteUpdate)
    try:
        route, _changed = route_services.update_route(
            name,
            by=request.api_user.get_username(),
            now=time_source.now(),
            reason=body.reason,
            **body.model_dump(exclude_none=True, exclude={"reason"}),
        )
    except Route.DoesNotExist:
        raise ApiError(404, None, "no such route") from None
    return JsonResponse(queries.route_json(route))


routes = by_method(GET=list_routes, POST=create_route)
route = by_method(GET=route_detail, PATCH=update_route)
