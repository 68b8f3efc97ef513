"""Registry tools at run time: what the model is offered, and the
executor of one call — under the same rules as the built-ins (R4.1, R5, R6.4).

The tool-call stage admits the call on the ledger and writes the receipt
before anything here runs; this module checks the arguments against the
tool's JSON Schema (``jsonschema``; an invalid call is a failed tool fact,
nothing is sent), calls the MCP server (``tasks.mcp_client`` over Streamable
HTTP, ``tasks.mcp_stdio`` for a command the worker runs; both on the official
SDK) or the HTTP endpoint (``tasks.tools.http_tool``), and reports a
``ToolResult``. Never raises (R4.2).
"""

from __future__ import annotations

import logging
from typing import Any

import jsonschema
from celery import shared_task
from django.core.exceptions import ImproperlyConfigured

from governance import time_source
from governance.models import ToolReceipt, ToolServer
from governance.rules import tools as tool_rules
from governance.services import tool_registry, tool_servers
from governance.services.secrets import named_secret
from governance.services.tool_servers import RegistryTool
from tasks import mcp_client, mcp_stdio
from tasks.adapters.base import ToolSpec
from tasks.tools import TOOL_SPECS, ToolResult, http_tool, verify_webhook

MAX_SCHEMA_ERRORS = 3
logger = logging.getLogger(__name__)


def offered_specs(names: tuple[str, ...]) -> tuple[tuple[ToolSpec, ...], dict[str, str]]:
    """The tools a turn offers (built-ins and the registry's, from its cached
    schemas) and the map of their names to wire names (``rules.tools.wire_names``)."""
    specs = [TOOL_SPECS[name] for name in names if name in TOOL_SPECS]
    registry = [n for n in names if n not in TOOL_SPECS]
    if registry:
        specs += [
            ToolSpec(tool.name, tool.description or tool.name, tool.parameters)
            for tool in tool_servers.surface_tools(registry)
        ]
    return tuple(specs), tool_rules.wire_names(spec.name for spec in specs)


def argument_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """Why the arguments do not match the tool's JSON Schema (None: they do)."""
    try:
        validator_class = jsonschema.validators.validator_for(schema)
        validator = validator_class(schema)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    except (jsonschema.SchemaError, TypeError, ValueError) as exc:
        return f"the tool's schema cannot be used: {exc}"
    if not errors:
        return None
    words = "; ".join(
        f"{'/'.join(str(p) for p in e.path) or '(arguments)'}: {e.message}"
        for e in errors[:MAX_SCHEMA_ERRORS]
    )
    return f"the arguments do not match the tool's schema: {words}"[:1000]


def _token(server: ToolServer) -> str | None:
    """The bearer token; ImproperlyConfigured when the allow-list refuses its variable."""
    return named_secret(server.token_env, "token_env") if server.token_env else None


def run(
    tool: RegistryTool,
    arguments: Any,
    *,
    idempotency_key: str,
    now,
    limit_s: float | None = None,
) -> ToolResult:
    """Run one registry tool call, waiting at most the server's timeout (and
    ``limit_s``, what the run's clocks leave, R6.1); a listing the server
    announced as changed during the call is recorded (a tool-surface boundary
    for the threads that see it, R1.3)."""
    external = tool.external
    if not isinstance(arguments, dict) or (problem := argument_problem(tool.parameters, arguments)):
        problem = problem if isinstance(arguments, dict) else "the arguments must be an object"
        return ToolResult("failed", {"request_sent": False}, f"{tool.name}: {problem}", external)
    server = ToolServer.objects.get(name=tool.server)
    timeout_s = server.timeout_s if limit_s is None else max(min(server.timeout_s, limit_s), 0.001)
    if server.kind == ToolServer.Kind.HTTP:
        try:
            token = _token(server)
        except ImproperlyConfigured as exc:  # nothing was sent
            return ToolResult("failed", {"request_sent": False}, f"{tool.name}: {exc}", external)
        return http_tool(
            arguments, url=server.url, method=server.method, effect_class=tool.effect_class,
            idempotency_key=idempotency_key, timeout_s=timeout_s, token=token,
        )  # fmt: skip
    if server.kind == ToolServer.Kind.MCP_STDIO:
        outcome = mcp_stdio.POOL.call_tool(
            server, tool.tool, arguments, timeout_s=timeout_s, limit_s=limit_s
        )
    else:
        outcome = mcp_client.call_tool(server, tool.tool, arguments, timeout_s=timeout_s)
    if outcome.relisted is not None:
        try:
            tool_registry.record_listing(
                server.name, outcome.relisted, now, why="the server said its tool list changed"
            )
        except Exception:  # R4.2: bookkeeping of the listing never changes the call's fact
            logger.exception("recording the new listing of %s failed", server.name)
    effect = tool_rules.call_effect(outcome.end, tool.effect_class)
    return ToolResult(effect, outcome.output, outcome.error, external)  # type: ignore[arg-type]


def verify(receipt: ToolReceipt) -> tuple[ToolResult, bool]:
    """R6.4: ask the executor of a registry tool whether the effect of
    ``receipt`` happened. An HTTP tool with a verification URL answers by the
    webhook's contract (``verify_webhook``: GET with the idempotency key);
    anything else (MCP over HTTP or stdio) has no way to tell — (unknown,
    False): not verifiable, so never replayed."""
    server = ToolServer.objects.filter(name=receipt.server).first()
    if server is None or server.kind != ToolServer.Kind.HTTP or not server.verify_url:
        why = (
            f"{receipt.tool} has no verification contract (MCP has none; an http tool "
            "declares a verify_url): the effect stays unknown"
        )
        return ToolResult("unknown", {"seen": None}, why, True), False
    result = verify_webhook(
        {"url": server.verify_url}, idempotency_key=receipt.idempotency_key,
        timeout_s=server.timeout_s,
    )  # fmt: skip
    return result, True


@shared_task(name="tasks.registry_tools.relist_tools", ignore_result=True)
def relist_tools() -> dict[str, int]:
    """List every enabled HTTP MCP server again (beat,
    ``GOVERNANCE_TOOL_RELIST_SECONDS``): a change announced while no session
    of ours was open is caught here. A server that does not answer keeps its
    last listing and says why. A stdio server is not started for this: its
    sessions stay open in the workers that use it, which hear its changes."""
    changed = failed = 0
    for server in ToolServer.objects.filter(kind=ToolServer.Kind.MCP, enabled=True):
        listing = mcp_client.list_tools(server)
        before = server.schema_version
        try:
            after, _opened = tool_registry.record_listing(
                server.name, listing.tools, time_source.now(), error=listing.error,
                why="listed again on schedule",
            )  # fmt: skip
        except Exception:  # one server's trouble does not stop the others
            logger.exception("recording the listing of %s failed", server.name)
            failed += 1
            continue
        failed += listing.tools is None
        changed += after.schema_version != before
    return {"changed": changed, "failed": failed}
