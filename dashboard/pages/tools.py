"""Tools page: the tool registry as the runtime governs it — each
MCP server or HTTP tool, its listed tools with their effect class and wire
name, the schema version and when it was last listed. Read-only for every
logged-in role; registering and changing go through the API or
``manage.py tool`` (the ``change_toolserver`` permission)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.queries import tools as tools_query
from dashboard.queries.tools import tool_detail_json
from dashboard.site import permissions
from tasks.tools import TOOL_SPECS


@login_required
@permissions.requires(GET=None)
def tools(request: HttpRequest) -> HttpResponse:
    rows = [tool_detail_json(server) for server in tools_query.servers()]
    return render(request, "tools/list.html", {"rows": rows, "builtins": sorted(TOOL_SPECS)})
