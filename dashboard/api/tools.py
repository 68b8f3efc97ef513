"""The tool registry over the API: ``GET``/``POST /api/v1/tools``,
``GET``/``PATCH /api/v1/tools/{name}``.

Registering an MCP server lists its tools at once (through the SDK client,
``tasks.mcp_client``); ``PATCH`` with ``"refresh": true`` lists them again.
A listing that changes the schemas a thread sees gives that thread a
tool-surface boundary (R1.3, ``services.tool_registry``). A bearer token is
named by its environment variable, never taken or echoed.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from dashboard.api.base import ApiError, api_view, by_method, parse_body
from dashboard.api.schemas import ToolCreate, ToolUpdate
from dashboard.queries.tools import tool_detail_json, tool_json
from dashboard.site import permissions
from governance import time_source
from governance.models import ToolServer
from governance.services import tool_registry, tool_servers


def refresh_listing(server: ToolServer, why: str):
    """List an MCP server's tools now and record them (with the boundaries
    they cause); an unreachable server keeps its last listing and says why."""
    # The MCP SDK takes half a second to import: the web imports it when a
    # listing is asked for, not at every start (manage.py commands included).
    from tasks import mcp_client

    listing = mcp_client.list_tools(server)
    return tool_registry.record_listing(
        server.name, listing.tools, time_source.now(), error=listing.error, why=why
    )


def _server(name: str) -> ToolServer:
    if not tool_servers.SERVER_NAME.fullmatch(name):
        raise ApiError(404, None, "no such tool")
    try:
        return ToolServer.objects.get(name=name)
    except ToolServer.DoesNotExist:
        raise ApiError(404, None, "no such tool") from None


@api_view(("GET",))
def list_tools(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"items": [tool_json(s) for s in ToolServer.objects.order_by("name")]})


@api_view(("POST",), permission=permissions.MANAGE_TOOLS)
def create_tool(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, ToolCreate)
    values = body.model_dump(exclude={"name", "kind", "url"}, exclude_none=True)
    try:
        server = tool_servers.create_tool_server(
            name=body.name, kind=body.kind, url=body.url,
            by=request.api_user.get_username(), now=time_source.now(), **values,
        )  # fmt: skip
    except tool_servers.ToolServerExists as exc:
        raise ApiError(409, exc.field, exc.message) from None
    opened = []
    if server.kind == ToolServer.Kind.MCP:
        server, opened = refresh_listing(server, "registered")
    return JsonResponse(tool_detail_json(server, opened), status=201)


@api_view(("GET",))
def tool_detail(request: HttpRequest, name: str) -> JsonResponse:
    return JsonResponse(tool_detail_json(_server(name)))


@api_view(("PATCH",), permission=permissions.MANAGE_TOOLS)
def update_tool(request: HttpRequest, name: str) -> JsonResponse:
    server = _server(name)  # 404 before judging the body
    body = parse_body(request, ToolUpdate)
    changes = body.model_dump(exclude={"reason", "refresh"}, exclude_none=True)
    try:
        server, _changed, opened = tool_registry.update_server(
            name, by=request.api_user.get_username(), now=time_source.now(),
            reason=body.reason, **changes,
        )  # fmt: skip
    except ToolServer.DoesNotExist:
        raise ApiError(404, None, "no such tool") from None
    if body.refresh:
        if server.kind != ToolServer.Kind.MCP:
            raise ApiError(400, "refresh", "only an mcp server is listed")
        server, more = refresh_listing(server, f"listed again by {request.api_user}")
        opened = [*opened, *more]
    return JsonResponse(tool_detail_json(server, opened))


tools = by_method(GET=list_tools, POST=create_tool)
tool = by_method(GET=tool_detail, PATCH=update_tool)
