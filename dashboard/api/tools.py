"""The tool registry over the API: ``GET``/``POST /api/v1/tools``,
``GET``/``PATCH /api/v1/tools/{name}``.

Registering an MCP server lists its tools at once (through the SDK client,
``tasks.mcp_client``); ``PATCH`` with ``"refresh": true`` lists them again.
A stdio server (``kind: "mcp_stdio"``) is listed through a short-lived
process before anything is written (``tasks.mcp_stdio.list_tools_once``): a
command that does not start, never answers ``initialize``, writes something
that is not MCP or lists a schema a provider refuses is a 400 saying so, and
nothing is registered. Registering or changing one needs the
``run_tool_command`` permission as well (an admin's) and a reason.
A listing that changes the schemas a thread sees gives that thread a
tool-surface boundary (R1.3, ``services.tool_registry``). A bearer token is
named by its environment variable, never taken or echoed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from dashboard.api.base import ApiError, api_view, by_method, parse_body
from dashboard.api.schemas import ToolCreate, ToolUpdate
from dashboard.queries import tools as tools_query
from dashboard.queries.tools import tool_detail_json, tool_json
from dashboard.site import permissions
from governance import time_source
from governance.models import ToolServer
from governance.services import ServiceError, tool_registry, tool_servers


def refresh_listing(server: ToolServer, why: str):
    """List an MCP server's tools now and record them (with the boundaries
    they cause); an unreachable server keeps its last listing and says why."""
    # The MCP SDK takes half a second to import: the web imports it when a
    # listing is asked for, not at every start (manage.py commands included).
    if server.kind == ToolServer.Kind.MCP_STDIO:
        listing = stdio_listing(server.command, server.args, server.env_names, server.cwd)
    else:
        from tasks import mcp_client

        listing = mcp_client.list_tools(server)
    return tool_registry.record_listing(
        server.name, listing.tools, time_source.now(), error=listing.error, why=why
    )


def stdio_listing(command: str, args, env_names, cwd: str):
    """A stdio server's tools, listed by starting its command once."""
    from tasks import mcp_stdio

    launch = mcp_stdio.Launch(command, tuple(args or ()), tuple(env_names or ()), cwd or "")
    return mcp_stdio.list_tools_once(launch, timeout_s=settings.GOVERNANCE_MCP_STDIO_START_SECONDS)


def listed_or_refused(command: str, args, env_names, cwd: str) -> list[dict[str, Any]]:
    """A stdio server's tools, or ``ServiceError("command", why)`` when it
    cannot be listed or offered to a model (nothing written either way)."""
    listing = stdio_listing(command, args, env_names, cwd)
    if listing.tools is None:
        raise ServiceError("command", f"its tools could not be listed: {listing.error}")
    if problem := tool_servers.listing_problem(listing.tools):
        raise ServiceError("command", problem)
    return listing.tools


def register(*, by: str, name: str, kind: str, url: str = "", reason: str = "", **settings_):
    """Register a tool the way every door does (the API, ``manage.py tool``,
    the Tools page): judged first, a stdio server listed before anything is
    written, an HTTP MCP server listed right after. Returns (server, boundaries)."""
    now = time_source.now()
    if kind != ToolServer.Kind.MCP_STDIO:
        server = tool_servers.create_tool_server(
            name=name, kind=kind, url=url, by=by, now=now, reason=reason, **settings_
        )
        if server.kind == ToolServer.Kind.MCP:
            return refresh_listing(server, "registered")
        return server, []
    values = tool_servers.checked_new_server(name=name, kind=kind, url=url, **settings_)
    reason = (reason or "").strip()
    if not reason:  # judged before a process is started for nothing
        raise ServiceError("reason", "say why the workers should run this command (audited)")
    if len(reason) > tool_servers.REASON_MAX:
        raise ServiceError("reason", f"at most {tool_servers.REASON_MAX} characters")
    tools = listed_or_refused(values["command"], values["args"], values["env_names"], values["cwd"])
    server = tool_servers.create_tool_server(
        name=name, kind=kind, url=url, by=by, now=time_source.now(), reason=reason,
        listing=tools, **settings_,
    )  # fmt: skip
    return server, []


def _server(name: str) -> ToolServer:
    if not tool_servers.SERVER_NAME.fullmatch(name):
        raise ApiError(404, None, "no such tool")
    try:
        return ToolServer.objects.get(name=name)
    except ToolServer.DoesNotExist:
        raise ApiError(404, None, "no such tool") from None


def _may_run_commands(request: HttpRequest) -> None:
    if not permissions.allowed(request.api_user, permissions.RUN_TOOL_COMMAND, request.api_scopes):
        raise ApiError(403, None, permissions.refusal(permissions.RUN_TOOL_COMMAND))


@api_view(("GET",))
def list_tools(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"items": [tool_json(s) for s in tools_query.servers()]})


@api_view(("POST",), permission=permissions.MANAGE_TOOLS)
def create_tool(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, ToolCreate)
    if body.kind == ToolServer.Kind.MCP_STDIO:
        _may_run_commands(request)
    values = body.model_dump(exclude={"name", "kind", "url", "reason"}, exclude_none=True)
    if body.kind != ToolServer.Kind.MCP_STDIO:  # their defaults are not settings of the others
        for field in ("command", "args", "env_names", "cwd"):
            if not values.get(field):
                values.pop(field, None)
    try:
        server, opened = register(
            by=request.api_user.get_username(), name=body.name, kind=body.kind, url=body.url,
            reason=body.reason, **values,
        )  # fmt: skip
    except tool_servers.ToolServerExists as exc:
        raise ApiError(409, exc.field, exc.message) from None
    return JsonResponse(tool_detail_json(server, opened), status=201)


@api_view(("GET",))
def tool_detail(request: HttpRequest, name: str) -> JsonResponse:
    return JsonResponse(tool_detail_json(_server(name)))


@api_view(("PATCH",), permission=permissions.MANAGE_TOOLS)
def update_tool(request: HttpRequest, name: str) -> JsonResponse:
    server = _server(name)  # 404 before judging the body
    body = parse_body(request, ToolUpdate)
    changes = body.model_dump(exclude={"reason", "refresh"}, exclude_none=True)
    stdio = server.kind == ToolServer.Kind.MCP_STDIO
    if stdio:
        _may_run_commands(request)
    relaunch = stdio and any(
        field in changes and changes[field] != getattr(server, field)
        for field in tool_servers.LAUNCH_FIELDS
    )
    tools = None
    if relaunch:  # judged and listed with the new command before anything changes
        if not body.reason.strip():
            raise ApiError(400, "reason", "say why this stdio server changes (audited)")
        launch = {f: changes.get(f, getattr(server, f)) for f in tool_servers.LAUNCH_FIELDS}
        tool_servers.checked_launch(launch, set(changes))
        tools = listed_or_refused(**launch)
    try:
        server, _changed, opened = tool_registry.update_server(
            name, by=request.api_user.get_username(), now=time_source.now(),
            reason=body.reason, **changes,
        )  # fmt: skip
    except ToolServer.DoesNotExist:
        raise ApiError(404, None, "no such tool") from None
    if tools is not None:
        server, more = tool_registry.record_listing(
            name, tools, time_source.now(), why=f"its command changed ({body.reason})"
        )
        opened = [*opened, *more]
    if body.refresh:
        if server.kind not in tool_servers.MCP_KINDS:
            raise ApiError(400, "refresh", "only an mcp server is listed")
        server, more = refresh_listing(server, f"listed again by {request.api_user}")
        opened = [*opened, *more]
    return JsonResponse(tool_detail_json(server, opened))


tools = by_method(GET=list_tools, POST=create_tool)
tool = by_method(GET=tool_detail, PATCH=update_tool)
