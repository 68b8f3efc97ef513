"""Registry changes that move tool surfaces (R1.3).

A new listing of an MCP server (at registration, on request, or after the
server said its list changed), and enabling or disabling a registry entry,
change the schemas some threads see. Each is one transaction: the registry row
and the tool-surface boundaries of the threads that see the change
(``threads.follow_tool_schemas``) commit together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from governance.models import Segment, ToolServer
from governance.services import threads, tool_servers


def record_listing(
    name: str,
    tools: Sequence[Mapping[str, Any]] | None,
    now: datetime,
    *,
    error: str = "",
    why: str = "listed again",
) -> tuple[ToolServer, list[Segment]]:
    """Keep a server's listing; when its schemas changed, the threads that see
    them get a tool-surface boundary. Returns (server, segments opened)."""
    with transaction.atomic():
        server, changed = tool_servers.store_listing(name, tools, now, error)
        if not changed:
            return server, []
        opened = threads.follow_tool_schemas(
            name, now, why=f"the tools of {name} changed ({why}; schema version "
            f"{server.schema_version})",
        )  # fmt: skip
    return server, opened


def update_server(
    name: str, *, by: str, now: datetime, reason: str = "", **changes: Any
) -> tuple[ToolServer, list[str], list[Segment]]:
    """Change a registry entry; enabling or disabling it (or an http tool's
    description) changes what threads see, so those get their boundary."""
    with transaction.atomic():
        server, changed = tool_servers.update_tool_server(
            name, by=by, now=now, reason=reason, **changes
        )
        opened: list[Segment] = []
        if {"enabled", "description"} & set(changed):
            state = "enabled" if server.enabled else "disabled"
            opened = threads.follow_tool_schemas(
                name, now, why=f"{name} was {state} by {by}" + (f": {reason}" if reason else "")
            )
    return server, changed, opened
