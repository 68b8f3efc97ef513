"""The tool registry as the API and the Tools page show it: each MCP server
(HTTP or stdio) or HTTP tool, its listed tools with their effect class and
wire name, and for a stdio server what each worker process last reported of
its copy (state, pid, uptime, the last lines of its stderr)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dashboard.queries.secrets import secret_present, secret_refused
from governance import time_source
from governance.models import ToolProcess, ToolServer
from governance.rules import tools as tool_rules
from governance.rules.approvals import needs_approval
from governance.services import tool_servers
from governance.services.secrets import mask_url


def _when(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def process_json(row: ToolProcess, now: datetime) -> dict[str, Any]:
    running = row.state == ToolProcess.State.RUNNING and row.started_at is not None
    return {
        "worker": row.worker,
        "state": row.state,
        "pid": row.pid,
        "started_at": _when(row.started_at),
        "uptime_s": round((now - row.started_at).total_seconds(), 1) if running else None,
        "restarts": row.restarts,
        "next_start_at": _when(row.next_start_at),
        "last_error": row.last_error or None,
        "stderr_tail": row.stderr_tail,
        "updated_at": row.updated_at.isoformat(),
    }


def servers():
    """The registry in name order, each stdio server's processes with it."""
    return ToolServer.objects.order_by("name").prefetch_related("processes")


def tool_json(server: ToolServer) -> dict[str, Any]:
    """A registry entry: its token's variable *name*, whether the worker may read it
    and whether it is set, never a token; its URLs with any credentials masked."""
    http = server.kind == ToolServer.Kind.HTTP
    return {
        "name": server.name,
        "kind": server.kind,
        "url": mask_url(server.url),
        "token_env": server.token_env or None,
        "token_env_refused": secret_refused(server.token_env),
        "token_present": secret_present(server.token_env),
        "method": server.method or None,
        "effect": server.effect or None,
        "verify_url": mask_url(server.verify_url) or None,
        "timeout_s": server.timeout_s,
        "enabled": server.enabled,
        "effect_overrides": dict(server.effect_overrides or {}),
        "approval": server.approval,
        "approval_overrides": dict(server.approval_overrides or {}),
        "approver_role": server.approver_role,
        "approval_wait_s": server.approval_wait_s,
        "schema_version": server.schema_version,
        "listed_at": server.listed_at.isoformat() if server.listed_at else None,
        "list_error": server.list_error or None,
        "tool_count": 1 if http else len(server.listed_tools),
        "command": server.command or None,
        "args": list(server.args or ()),
        "env_names": list(server.env_names or ()),
        "cwd": server.cwd or None,
        "processes": [process_json(row, time_source.now()) for row in server.processes.all()],
        "created_at": server.created_at.isoformat(),
        "updated_at": server.updated_at.isoformat(),
    }


def tool_detail_json(server: ToolServer, opened=()) -> dict[str, Any]:
    tools = tool_servers.server_tools(server)
    wire = tool_rules.wire_names(t.name for t in tools)
    return {
        **tool_json(server),
        "tools": [
            {
                "name": t.name,
                "tool": t.tool,
                "description": t.description,
                "parameters": t.parameters,
                "annotations": t.annotations,
                "effect": t.effect_class,
                "approval": t.approval,
                # Whether its calls wait for a person: the rule, not the page, says.
                "approval_needed": needs_approval(t.approval, t.effect_class),
                "wire_name": wire[t.name],
            }
            for t in tools
        ],
        "boundaries": [segment.key for segment in opened],
    }
