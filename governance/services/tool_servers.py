"""The tool registry: MCP servers (Streamable HTTP or stdio) and HTTP
tools, their cached listings, and what a tool surface may name.

The API (``/api/v1/tools``) and ``manage.py tool`` both come here. A bearer
token is named by its environment variable (``token_env``), never taken or
stored; the variable must be one a key may live in (``GOVERNANCE_KEY_ENV_ALLOW``,
``governance.rules.secrets``) and the URLs carry no credentials. Each change
is audited. What a listing change does to the threads
that see it (a tool-surface boundary, R1.3) is ``services.tool_registry``.

A stdio server is a command each worker process runs (``tasks.mcp_stdio``):
registering or changing one needs the ``run_tool_command`` permission (no
role holds it: an admin's) and a reason, which the audit keeps; with
``DJANGO_DEBUG=0`` only the commands of ``GOVERNANCE_MCP_STDIO_COMMANDS`` may
be registered. Its environment is named (``env_names``), never stored: the
values come from the worker's environment.

Names: a server is a slug without "." or "__" (its tools are
``"{name}.{tool}"``, and the wire name ``"{name}__{tool}"`` must read back);
an HTTP tool is called by its name alone, so no name may be a built-in's.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jsonschema
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from governance.models import ToolServer
from governance.rules import approvals as approval_rules
from governance.rules import tools as tool_rules
from governance.rules.secrets import ENV_NAME, secret_query_name
from governance.rules.segments import SURFACE_WILDCARD
from governance.services.audit import audit
from governance.services.errors import ServiceError
from governance.services.outbound import require_http_url, require_outbound_url
from governance.services.secrets import (
    passed_env_problem,
    require_key_env,
    require_url_without_credentials,
)

BUILTIN_TOOL_NAMES = ("calculator", "kb_search", "webhook")
SERVER_NAME = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]|_(?!_)){0,39}")
ENV_NAME_MAX = 100
URL_MAX = 500
DESCRIPTION_MAX = 2_000
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
TIMEOUT_RANGE = (0.1, 600.0)
SURFACE_MAX = 100
TOOL_NAME_MAX = 200  # ToolReceipt.tool
# Who must say yes before a call runs (rules.approvals).
APPROVAL_FIELDS = ("approval", "approval_overrides", "approver_role", "approval_wait_s")
APPROVAL_DEFAULTS = {
    "approval": approval_rules.ApprovalPolicy.NEVER.value, "approval_overrides": {},
    "approver_role": approval_rules.DEFAULT_APPROVER_ROLE,
    "approval_wait_s": approval_rules.DEFAULT_WAIT.total_seconds(),
}  # fmt: skip
EDITABLE = ("enabled", "effect_overrides", "description", "timeout_s", "token_env", "verify_url",
            "command", "args", "env_names", "cwd", *APPROVAL_FIELDS)  # fmt: skip
# What a stdio server runs; changing it is an admin's action (``run_tool_command``).
LAUNCH_FIELDS = ("command", "args", "env_names", "cwd")
MCP_KINDS = (ToolServer.Kind.MCP, ToolServer.Kind.MCP_STDIO)
COMMAND_MAX = 500
ARGS_MAX = 100
ARG_MAX = 2_000
ENV_NAMES_MAX = 50
REASON_MAX = 500


class ToolServerExists(ServiceError):
    """The name is taken (the API answers 409)."""


@dataclass(frozen=True)
class RegistryTool:
    """One tool the registry offers: what the model sees and how it is governed."""

    name: str  # "files.read" (mcp) or "weather" (http)
    server: str
    kind: str
    tool: str  # the server's own name for it (mcp); the server's name (http)
    description: str
    parameters: dict[str, Any]
    effect_class: str
    schema_version: int
    annotations: dict[str, Any]
    # Who must say yes first (rules.approvals): the policy, the role, the wait.
    approval: str = approval_rules.ApprovalPolicy.NEVER.value
    approver_role: str = approval_rules.DEFAULT_APPROVER_ROLE
    approval_wait_s: float = approval_rules.DEFAULT_WAIT.total_seconds()

    @property
    def external(self) -> bool:
        return self.effect_class == "external_effect"


def check_url(value: Any, field: str, *, required: bool = True) -> str:
    """A tool's URL as it may be given: http(s) with a host, no credentials in
    it, an address the outbound rules let the worker reach (checked again at send)."""
    if not value:
        if required:
            raise ServiceError(field, "an http:// or https:// URL is required")
        return ""
    if not isinstance(value, str) or len(value) > URL_MAX:
        raise ServiceError(field, f"an http(s) URL of at most {URL_MAX} characters")
    require_http_url(value, field)
    require_url_without_credentials(value, field)
    require_outbound_url(value, field)
    return value


def _no_nul(value: str, field: str) -> None:
    if "\x00" in value:
        raise ServiceError(field, "may not contain a NUL character")


def _secret_arg(arg: str, previous: str) -> str | None:
    """The option name when ``arg`` (or ``previous`` + ``arg``) passes a
    key-looking value on the command line (``--api-key=…``, ``--token …``)."""
    if arg.startswith("-") and "=" in arg:
        option, _eq, value = arg.partition("=")
        return option if value and secret_query_name(option.lstrip("-")) else None
    if previous.startswith("-") and "=" not in previous and not arg.startswith("-"):
        return previous if secret_query_name(previous.lstrip("-")) else None
    return None


def _check_launch(values: dict[str, Any], given: frozenset[str] | set[str]) -> None:
    """A stdio server's command, arguments, environment names and directory."""
    command = values.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ServiceError("command", "the command that starts the server is required")
    if len(command) > COMMAND_MAX:
        raise ServiceError("command", f"at most {COMMAND_MAX} characters")
    _no_nul(command, "command")
    args = values.get("args") or []
    if (
        not isinstance(args, list | tuple)
        or len(args) > ARGS_MAX
        or any(not isinstance(a, str) or len(a) > ARG_MAX for a in args)
    ):
        raise ServiceError(
            "args", f"a list of at most {ARGS_MAX} strings of at most {ARG_MAX} characters"
        )
    for n, arg in enumerate(args):
        _no_nul(arg, "args")
        if option := _secret_arg(arg, args[n - 1] if n else ""):
            raise ServiceError(
                "args",
                f"{option} passes a secret on the command line (every page and the audit "
                "show it): name an environment variable in env_names instead",
            )
    values["args"] = list(args)
    names = values.get("env_names") or []
    if not isinstance(names, list | tuple) or len(names) > ENV_NAMES_MAX:
        raise ServiceError("env_names", f"a list of at most {ENV_NAMES_MAX} variable names")
    for name in names:
        if problem := passed_env_problem(name):
            raise ServiceError("env_names", problem)
    values["env_names"] = sorted(set(names))
    cwd = values.get("cwd") or ""
    if not isinstance(cwd, str) or len(cwd) > URL_MAX or (cwd and not cwd.startswith("/")):
        raise ServiceError("cwd", "an absolute directory path (or nothing: the worker's own)")
    _no_nul(cwd, "cwd")
    values["cwd"] = cwd
    if "command" in given:
        allowed = settings.GOVERNANCE_MCP_STDIO_COMMANDS
        if allowed is not None and command not in allowed:
            listed = ", ".join(allowed) if allowed else "none are listed"
            raise ServiceError(
                "command",
                f"{command!r} is not one of the commands the workers may run: "
                f"GOVERNANCE_MCP_STDIO_COMMANDS ({listed})",
            )
        if shutil.which(command) is None:
            where = "is not an executable file" if "/" in command else "is not found on the PATH"
            raise ServiceError("command", f"{command!r} {where}")
    if "cwd" in given and cwd and not os.path.isdir(cwd):
        raise ServiceError("cwd", f"{cwd} is not a directory")


def checked_launch(values: dict[str, Any], given: frozenset[str] | set[str]) -> dict[str, Any]:
    """A stdio server's ``command``, ``args``, ``env_names`` and ``cwd`` as
    they would be stored (``ServiceError`` naming the field); only the
    fields ``given`` are checked against the allow-list and the disk."""
    values = {f: values.get(f) for f in LAUNCH_FIELDS}
    _check_launch(values, given)
    return values


def _schema(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ServiceError("parameters", "a JSON Schema object for the arguments")
    try:
        jsonschema.validators.validator_for(value).check_schema(value)
    except jsonschema.SchemaError as exc:
        raise ServiceError("parameters", f"not a valid JSON Schema: {exc.message}") from None
    if value.get("type", "object") != "object":
        raise ServiceError("parameters", 'the arguments are an object: use "type": "object"')
    return value


def _check(values: dict[str, Any], given: frozenset[str] | set[str]) -> dict[str, Any]:
    """The whole configuration, as it would be stored; raises ServiceError naming a field.

    The URLs (credentials, outbound rules) and the variable the token is read
    from (the allow-list) are judged when they are ``given``: disabling a row
    stored before these checks is never refused for them, and the call-time
    checks keep its token from being sent where they refuse."""
    kind = values["kind"]
    if kind not in ToolServer.Kind.values:
        raise ServiceError("kind", f"must be one of {', '.join(ToolServer.Kind.values)}")
    stdio = kind == ToolServer.Kind.MCP_STDIO
    if stdio:
        if values.get("url") or values.get("token_env"):
            field = "url" if values.get("url") else "token_env"
            raise ServiceError(field, "a stdio server is a command: give command and args")
        _check_launch(values, given)
    else:
        for name in LAUNCH_FIELDS:
            if values.get(name):
                raise ServiceError(name, "only a stdio server (kind mcp_stdio) has this setting")
        values.update(command="", args=[], env_names=[], cwd="")
    if "url" in given and not stdio:
        values["url"] = check_url(values["url"], "url")
    key_env = values.get("token_env") or ""
    if key_env and (len(key_env) > ENV_NAME_MAX or not ENV_NAME.fullmatch(key_env)):
        raise ServiceError(
            "token_env",
            "the NAME of an environment variable (letters, digits, _), never the token itself",
        )
    if "token_env" in given:
        require_key_env(key_env, "token_env")
    timeout = values["timeout_s"]
    low, high = TIMEOUT_RANGE
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not low <= timeout <= high
    ):
        raise ServiceError("timeout_s", f"must be a number from {low:g} to {high:g}")
    description = values.get("description") or ""
    if not isinstance(description, str) or len(description) > DESCRIPTION_MAX:
        raise ServiceError("description", f"at most {DESCRIPTION_MAX} characters")
    if kind == ToolServer.Kind.HTTP:
        if values.get("method") not in METHODS:
            raise ServiceError("method", f"one of {', '.join(METHODS)}")
        if not description.strip():
            raise ServiceError("description", "say what the tool does (the model reads it)")
        values["parameters"] = _schema(values.get("parameters"))
        if values.get("effect") not in tool_rules.EFFECT_CLASSES:
            raise ServiceError("effect", f"one of {', '.join(tool_rules.EFFECT_CLASSES)}")
        verify_url = values.get("verify_url") or ""
        if "verify_url" in given:
            verify_url = check_url(verify_url, "verify_url", required=False)
        values["verify_url"] = verify_url
        if values["verify_url"] and values["effect"] != "external_effect":
            raise ServiceError("verify_url", "only an external_effect tool is verified")
        if values.get("effect_overrides"):
            raise ServiceError("effect_overrides", "an http tool has one effect: set 'effect'")
    else:
        for name in ("method", "parameters", "effect", "verify_url"):
            if values.get(name):
                raise ServiceError(name, "an mcp server lists its tools; this is for http tools")
        values["method"], values["parameters"], values["effect"] = "", {}, ""
        values["verify_url"] = ""
        overrides = values.get("effect_overrides") or {}
        if not isinstance(overrides, dict) or any(
            not isinstance(k, str) or v not in tool_rules.EFFECT_CLASSES
            for k, v in overrides.items()
        ):
            raise ServiceError(
                "effect_overrides",
                f"an object of tool name to one of {', '.join(tool_rules.EFFECT_CLASSES)}",
            )
    if not isinstance(values["enabled"], bool):
        raise ServiceError("enabled", "must be true or false")
    _check_approval(values, kind, given)
    return values


def _check_approval(values: dict[str, Any], kind: str, given: frozenset[str] | set[str]) -> None:
    """The approval policy: known words, a role that exists (when it is
    given: a group deleted later never blocks another change), a wait in range."""
    policies = approval_rules.POLICIES
    if values.get("approval") not in policies:
        raise ServiceError("approval", f"one of {', '.join(policies)}")
    overrides = values.get("approval_overrides") or {}
    if kind == ToolServer.Kind.HTTP and overrides:
        raise ServiceError("approval_overrides", "an http tool is one tool: set 'approval'")
    if not isinstance(overrides, dict) or any(
        not isinstance(k, str) or v not in policies for k, v in overrides.items()
    ):
        raise ServiceError(
            "approval_overrides", f"an object of tool name to one of {', '.join(policies)}"
        )
    values["approval_overrides"] = overrides
    role = values.get("approver_role")
    if not isinstance(role, str) or (
        "approver_role" in given and not Group.objects.filter(name=role).exists()
    ):
        known = ", ".join(Group.objects.order_by("name").values_list("name", flat=True))
        raise ServiceError("approver_role", f"the name of a role ({known})")
    wait = values.get("approval_wait_s")
    low, high = approval_rules.WAIT_RANGE_S
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not low <= wait <= high:
        raise ServiceError("approval_wait_s", f"seconds, from {low:g} to {high:g}")


def checked_new_server(*, name: str, kind: str, url: str = "", **settings: Any) -> dict[str, Any]:
    """A new registry entry's configuration as it would be stored, judged
    without writing anything (``ServiceError`` naming the field; a taken
    name is ``ToolServerExists``)."""
    allowed = {"token_env", "method", "description", "parameters", "effect", "verify_url",
               "timeout_s", "enabled", "effect_overrides", *LAUNCH_FIELDS,
               *APPROVAL_FIELDS}  # fmt: skip
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ServiceError(unknown[0], "is not a tool setting")
    if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
        raise ServiceError(
            "name", "1 to 40 letters, digits, '-' or single '_' (no '.': its tools are name.tool)"
        )
    if name in BUILTIN_TOOL_NAMES:
        raise ServiceError("name", f"{name!r} is a built-in tool")
    if ToolServer.objects.filter(name=name).exists():
        raise ToolServerExists("name", f"a tool {name!r} exists already")
    values = {"timeout_s": 30.0, "enabled": True, "effect_overrides": {}, **APPROVAL_DEFAULTS,
              **settings, "kind": kind, "url": url or ""}  # fmt: skip
    # The default role is not judged: a database without the roles' groups still
    # registers tools whose calls nobody is asked about.
    values = _check(values, set(values) - (set(APPROVAL_DEFAULTS) - set(settings)))
    return {k: ("" if v is None and k != "parameters" else v) for k, v in values.items()}


def listing_problem(tools: Sequence[Mapping[str, Any]]) -> str | None:
    """Why a server's listing cannot be offered to a model (None: it can):
    each tool's input schema must be a JSON Schema of an object, as the
    providers require of a function's parameters."""
    for tool in normalized_listing(tools):
        try:
            _schema(tool["input_schema"])
        except ServiceError as exc:
            return (
                f"its tool {tool['name']!r} has an input schema a provider refuses: {exc.message}"
            )
    return None


def create_tool_server(
    *,
    name: str,
    kind: str,
    url: str = "",
    by: str,
    now: datetime,
    reason: str = "",
    listing: Sequence[Mapping[str, Any]] | None = None,
    **settings: Any,
) -> ToolServer:
    """A new registry entry, audited with ``by`` and ``reason`` (required for
    a stdio server: the workers will run its command). ``listing``: its tools,
    listed before anything was written, kept in the same transaction (an HTTP
    MCP server's is recorded afterwards by ``tool_registry``)."""
    values = checked_new_server(name=name, kind=kind, url=url, **settings)
    reason = (reason or "").strip()
    if kind == ToolServer.Kind.MCP_STDIO and not reason:
        raise ServiceError("reason", "say why the workers should run this command (audited)")
    if len(reason) > REASON_MAX:
        raise ServiceError("reason", f"at most {REASON_MAX} characters")
    try:
        with transaction.atomic():
            server = ToolServer.objects.create(name=name, **values)
            audit(
                actor=by, action="tool.create", target_type="tool", target_id=name,
                reason=reason, detail={k: v for k, v in values.items() if k != "parameters"},
                now=now,
            )  # fmt: skip
            if listing is not None:
                server, _changed = store_listing(name, listing, now)
    except IntegrityError:
        raise ToolServerExists("name", f"a tool {name!r} exists already") from None
    return server


def update_tool_server(
    name: str, *, by: str, now: datetime, reason: str = "", **changes: Any
) -> tuple[ToolServer, list[str]]:
    """Change the ``EDITABLE`` fields given; returns the row and what changed.
    Raises ``ToolServer.DoesNotExist`` for an unknown name."""
    unknown = sorted(set(changes) - set(EDITABLE))
    if unknown:
        raise ServiceError(unknown[0], "is not a setting that can be changed")
    with transaction.atomic():
        server = ToolServer.objects.select_for_update().get(name=name)
        if server.kind == ToolServer.Kind.MCP_STDIO and not (reason or "").strip():
            raise ServiceError("reason", "say why this stdio server changes (audited)")
        before = {f: getattr(server, f) for f in ("kind", "url", "method", "parameters",
                                                   "effect", *EDITABLE)}  # fmt: skip
        after = _check({**before, **changes}, {f for f in changes if changes[f] != before[f]})
        overrides = after.get("effect_overrides") or {}
        listed = {t["name"] for t in server.listed_tools}
        strangers = sorted(set(overrides) - listed)
        if strangers and "effect_overrides" in changes:
            raise ServiceError("effect_overrides", f"{name} lists no tool named {strangers[0]!r}")
        strangers = sorted(set(after.get("approval_overrides") or {}) - listed)
        if strangers and "approval_overrides" in changes:
            raise ServiceError("approval_overrides", f"{name} lists no tool named {strangers[0]!r}")
        changed = [f for f in EDITABLE if after[f] != before[f]]
        if not changed:
            return server, []
        for f in changed:
            setattr(server, f, after[f])
        server.save(update_fields=[*changed, "updated_at"])
        audit(
            actor=by, action="tool.update", target_type="tool", target_id=name, reason=reason,
            detail={"before": {f: before[f] for f in changed},
                    "after": {f: after[f] for f in changed}},
            now=now,
        )  # fmt: skip
    return server, changed


def normalized_listing(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A server's ``tools/list`` as the registry keeps it, in name order."""
    rows = []
    for tool in tools:
        name = tool.get("name")
        if not isinstance(name, str) or not name or len(name) > 128 or "\x00" in name:
            continue  # not a name anything could call
        schema = tool.get("input_schema")
        rows.append(
            {
                "name": name,
                "description": str(tool.get("description") or "")[:DESCRIPTION_MAX],
                "input_schema": schema if isinstance(schema, dict) else {"type": "object"},
                "annotations": dict(tool.get("annotations") or {}),
            }
        )
    return sorted(rows, key=lambda row: row["name"])


def store_listing(
    name: str, tools: Sequence[Mapping[str, Any]] | None, now: datetime, error: str = ""
) -> tuple[ToolServer, bool]:
    """Keep a server's listing (``tools`` None with ``error``: it could not be
    listed, the last listing stays). Returns (server, schemas changed); a change
    bumps ``schema_version``. Call inside the caller's transaction."""
    server = ToolServer.objects.select_for_update().get(name=name)
    if tools is None:
        server.list_error = error[:2000]
        server.save(update_fields=["list_error", "updated_at"])
        return server, False
    listing = normalized_listing(tools)
    fingerprint = tool_rules.schema_fingerprint(listing)
    changed = fingerprint != server.schema_fingerprint
    server.listed_tools, server.listed_at, server.list_error = listing, now, ""
    fields = ["listed_tools", "listed_at", "list_error", "updated_at"]
    if changed:
        server.schema_fingerprint = fingerprint
        server.schema_version += 1
        fields += ["schema_fingerprint", "schema_version"]
    server.save(update_fields=fields)
    return server, changed


# --------------------------------------------------------------------------- surfaces


def _servers(names: Sequence[str]) -> dict[str, ToolServer]:
    wanted = set(names) - set(BUILTIN_TOOL_NAMES)
    if not wanted:  # built-ins only: no query
        return {}
    return {s.name: s for s in ToolServer.objects.filter(name__in=wanted)}


def surface_problem(tool_surface: Sequence[str]) -> str | None:
    """Why a thread may not have this tool surface (None: it may). Each entry
    is a built-in, an enabled HTTP tool, ``"{server}.*"`` or a listed
    ``"{server}.{tool}"`` of an enabled MCP server."""
    if len(tool_surface) > SURFACE_MAX:
        return f"at most {SURFACE_MAX} entries"
    servers = _servers([tool_rules.split_tool_name(e)[0] for e in tool_surface])
    unknown = []
    for entry in tool_surface:
        if entry in BUILTIN_TOOL_NAMES:
            continue
        server_name, tool = tool_rules.split_tool_name(entry)
        server = servers.get(server_name)
        if server is None:
            unknown.append(entry)
        elif not server.enabled:
            return f"{server_name} is disabled in the tool registry"
        elif tool is None:
            if server.kind != ToolServer.Kind.HTTP:
                return f"{entry} is an MCP server: name {entry}.* or one of its tools"
        elif server.kind not in MCP_KINDS:
            return f"{server_name} is an http tool: name it alone"
        elif entry != f"{server_name}{SURFACE_WILDCARD}" and tool not in {
            t["name"] for t in server.listed_tools
        }:
            return f"{server_name} lists no tool named {tool!r}"
    if unknown:
        return f"unknown tool(s): {', '.join(sorted(unknown))}"
    return None


def _tool(server: ToolServer, listed: Mapping[str, Any] | None) -> RegistryTool:
    if server.kind == ToolServer.Kind.HTTP:
        return RegistryTool(
            name=server.name, server=server.name, kind=server.kind, tool=server.name,
            description=server.description, parameters=server.parameters or {"type": "object"},
            effect_class=server.effect, schema_version=server.schema_version, annotations={},
            approval=server.approval, approver_role=server.approver_role,
            approval_wait_s=server.approval_wait_s,
        )  # fmt: skip
    assert listed is not None
    return RegistryTool(
        name=tool_rules.registry_tool_name(server.name, listed["name"]),
        server=server.name,
        kind=server.kind,
        tool=listed["name"],
        description=listed.get("description") or "",
        parameters=listed.get("input_schema") or {"type": "object"},
        effect_class=tool_rules.effect_class(
            listed.get("annotations"), (server.effect_overrides or {}).get(listed["name"])
        ),
        schema_version=server.schema_version,
        annotations=dict(listed.get("annotations") or {}),
        approval=approval_rules.policy_for(
            server.approval, server.approval_overrides, listed["name"]
        ).value,
        approver_role=server.approver_role,
        approval_wait_s=server.approval_wait_s,
    )


def server_tools(server: ToolServer) -> list[RegistryTool]:
    """Every tool a registry entry offers (its cached listing, for mcp)."""
    if server.kind == ToolServer.Kind.HTTP:
        return [_tool(server, None)]
    return [_tool(server, listed) for listed in server.listed_tools]


def surface_tools(tool_surface: Sequence[str]) -> list[RegistryTool]:
    """The registry tools a surface offers now (enabled servers only), in name order."""
    servers = _servers([tool_rules.split_tool_name(e)[0] for e in tool_surface])
    enabled = {n: s for n, s in servers.items() if s.enabled}
    listed = {
        n: [t["name"] for t in s.listed_tools] for n, s in enabled.items() if s.kind in MCP_KINDS
    }
    wanted = set(tool_rules.surface_names(tool_surface, listed))
    tools = [t for s in enabled.values() for t in server_tools(s) if t.name in wanted]
    return sorted(tools, key=lambda t: t.name)


def registry_tool(name: str) -> RegistryTool | None:
    """The enabled registry tool called ``name``, or None."""
    server_name, tool = tool_rules.split_tool_name(name)
    server = ToolServer.objects.filter(name=server_name, enabled=True).first()
    if server is None:
        return None
    if server.kind == ToolServer.Kind.HTTP:
        return _tool(server, None) if tool is None else None
    for listed in server.listed_tools:
        if listed["name"] == tool:
            return _tool(server, listed)
    return None


def surface_schemas(tool_surface: Sequence[str]) -> str:
    """The fingerprint of the registry schemas a surface sees ("" when it names
    none): stored on the segment, so a change of them is a boundary (R1.3)."""
    tools = surface_tools(tool_surface)
    if not tools:
        return ""
    return tool_rules.schema_fingerprint(
        {"name": t.name, "description": t.description, "input_schema": t.parameters,
         "annotations": t.annotations}
        for t in tools
    )  # fmt: skip
