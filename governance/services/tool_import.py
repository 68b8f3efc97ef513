"""Importing the ``mcpServers`` file people already have (Claude Desktop,
Cursor, Claude Code; VS Code's ``servers``) into the tool registry.

``read_plan`` reads the file into a plan: one entry per server, each judged as
a registration would judge it (``tool_servers.checked_new_server``), with its
problems. ``register_plan`` registers a plan that has none, all or nothing.

Stdio entries (``command``, ``args``, ``env``, ``cwd``) become ``mcp_stdio``
servers; HTTP entries (``url``, ``type`` "http" or "streamable-http",
``headers``) become ``mcp`` servers. Only Streamable HTTP is spoken, so
``type: "sse"`` is refused. The file's secrets are never taken: an ``env``
entry is kept by its name when its value is "" or a reference to the same
variable (``"${NAME}"``, ``"$NAME"``, ``"${env:NAME}"``), and a header only as
``Authorization: "Bearer ${NAME}"`` (the token's variable, ``token_env``).
Any other value is refused with what to write instead, and no message
repeats it.

Registering lists each server's tools (a stdio server through a short-lived
process), which is the web's or the shell's work: the caller hands its
``register`` in (``dashboard.api.tools.register``, the one way any door
registers a tool; this package never imports the dashboard).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.db import transaction
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from governance.models import ToolServer
from governance.rules.secrets import ENV_NAME
from governance.services.errors import ServiceError
from governance.services.secrets import mask_url
from governance.services.tool_servers import REASON_MAX, SERVER_NAME, checked_new_server

FILE_MAX = 256_000  # characters: a configuration, not a data set
SERVERS_MAX = 100
HTTP_TYPES = ("http", "streamable-http", "streamableHttp", "streamable_http")
# The registry's fields in the file's words, for messages about an entry.
FILE_FIELDS = {"env_names": "env", "token_env": "headers.Authorization"}
_REFERENCE = re.compile(
    r"\$\{(?:env:)?(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)
_BEARER = re.compile(r"Bearer\s+(?P<ref>\S+)", re.IGNORECASE)


class McpServerEntry(BaseModel):
    """One server of the file, as Claude Desktop, Cursor and VS Code write it.
    Strict: a number where a string belongs is an error, not a guess. Keys
    other clients add (``autoApprove``, ``timeout`` …) are kept aside and
    shown as ignored."""

    model_config = ConfigDict(strict=True, extra="allow")

    type: str | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, Any] = Field(default_factory=dict)  # values judged one by one, never echoed
    cwd: str | None = None
    url: str | None = None
    server_url: str | None = Field(default=None, alias="serverUrl")  # Windsurf's spelling
    headers: dict[str, Any] = Field(default_factory=dict)
    disabled: bool = False


@dataclass(frozen=True)
class PlannedServer:
    """What one entry of the file would register, or why it cannot."""

    name: str
    kind: str = ""  # ToolServer.Kind; "" when the entry says neither a command nor a URL
    command: str = ""
    args: tuple[str, ...] = ()
    env_names: tuple[str, ...] = ()
    cwd: str = ""
    url: str = ""
    token_env: str = ""
    enabled: bool = True
    problems: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()  # keys of the file this registry does not read
    args_withheld: bool = False  # refused for passing a secret: not shown either

    @property
    def stdio(self) -> bool:
        return self.kind == ToolServer.Kind.MCP_STDIO

    @property
    def runs(self) -> str:
        """What it runs (a shell-quoted command line) or the URL it is reached at,
        as it may be shown: a secret the entry was refused for is not repeated."""
        if not self.stdio:
            return mask_url(self.url)
        if self.args_withheld:
            return f"{shlex.quote(self.command)} … (its arguments are not shown: see the problem)"
        return shlex.join([self.command, *self.args])

    def settings(self) -> dict[str, Any]:
        """The tool settings ``register`` takes (beside name, kind and url)."""
        if self.stdio:
            return {"command": self.command, "args": list(self.args),
                    "env_names": list(self.env_names), "cwd": self.cwd,
                    "enabled": self.enabled}  # fmt: skip
        return {"token_env": self.token_env, "enabled": self.enabled}


@dataclass(frozen=True)
class ImportPlan:
    """The file read: its servers in the file's order, and what is wrong with
    the file as a whole (not JSON, no ``mcpServers`` …)."""

    servers: tuple[PlannedServer, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return bool(self.servers) and not self.every_problem()

    @property
    def has_stdio(self) -> bool:
        return any(s.stdio for s in self.servers)

    def every_problem(self) -> list[str]:
        """Each problem on a line of its own, an entry's led by its name."""
        return [*self.problems, *(f"{s.name}: {p}" for s in self.servers for p in s.problems)]


class ImportRefused(ServiceError):
    """Nothing was registered; ``problems`` says why, one line each."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = list(problems)
        super().__init__("file", "; ".join(self.problems))


# --------------------------------------------------------------------------- reading


def _validation_problems(exc: ValidationError) -> list[str]:
    """Pydantic's findings by place, never with the value found there (it may
    be a secret)."""
    problems = []
    for error in exc.errors(include_input=False, include_url=False):
        place = ".".join(str(part) for part in error["loc"])
        problems.append(f"{place}: {error['msg']}" if place else error["msg"])
    return problems


def _reference(value: str) -> str | None:
    """The variable a value refers to (``${NAME}``, ``$NAME``, ``${env:NAME}``), or None."""
    found = _REFERENCE.fullmatch(value.strip())
    return (found.group("braced") or found.group("bare")) if found else None


def _env_names(env: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The variable names an ``env`` object passes, and its problems."""
    names, problems = [], []
    for key, value in env.items():
        if not ENV_NAME.fullmatch(key):
            problems.append(
                f"env {key!r} is not the name of an environment variable (letters, digits, _)"
            )
            continue
        if value == "" or (isinstance(value, str) and _reference(value) == key):
            names.append(key)
            continue
        referred = _reference(value) if isinstance(value, str) else None
        if referred is not None:
            problems.append(
                f"env {key} refers to ${{{referred}}}: a worker passes each variable under "
                f'its own name, so set {key} in the workers\' environment and write "${{{key}}}"'
                ' (or "") instead'
            )
        elif isinstance(value, str) and "${input:" in value:
            problems.append(
                f"env {key} asks VS Code for an input, which no worker can answer: put the "
                f'value in the workers\' environment and write "${{{key}}}" (or "") instead'
            )
        else:
            problems.append(
                f"env {key} has a value in the file, and values are never stored: put it in "
                f'the workers\' environment and write "${{{key}}}" (or "") instead'
            )
    return names, problems


def _token_env(headers: dict[str, Any]) -> tuple[str, list[str]]:
    """The variable the bearer token is read from, and the headers' problems."""
    token_env, problems = "", []
    for key, value in headers.items():
        if key.strip().lower() != "authorization":
            problems.append(
                f"headers.{key}: only an Authorization header is sent to an MCP server, as "
                '"Bearer ${NAME}" with the token in the workers\' environment; other headers '
                "are not supported"
            )
            continue
        bearer = _BEARER.fullmatch(value.strip()) if isinstance(value, str) else None
        referred = _reference(bearer.group("ref")) if bearer else None
        if referred is None:
            problems.append(
                f"headers.{key} carries a token in the file, and tokens are never stored: put "
                "it in the workers' environment (a name GOVERNANCE_KEY_ENV_ALLOW allows, such "
                'as GOVERNANCE_KEY_...) and write "Bearer ${NAME}" instead'
            )
        else:
            token_env = referred
    return token_env, problems


def _args_problems(args: list[str]) -> list[str]:
    return [
        f"args[{n}] refers to a variable ({arg.strip()!r}), which nothing expands here: write "
        "the value itself (never a secret: the command line is shown on every page)"
        for n, arg in enumerate(args)
        if "${" in arg
    ]


def suggested_name(name: str) -> str | None:
    """A registry name close to ``name`` ("github.com" → "github-com"), or None."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", name)
    slug = re.sub(r"_{2,}", "_", slug).strip("-_")[:40].rstrip("-_")
    return slug if slug and slug != name and SERVER_NAME.fullmatch(slug) else None


def _judged(planned: PlannedServer, problems: list[str], refuse_stdio: str) -> PlannedServer:
    """The entry with what registering it would meet added to its problems."""
    if planned.stdio and refuse_stdio:
        problems.append(refuse_stdio)
    try:
        checked = checked_new_server(
            name=planned.name, kind=planned.kind, url=planned.url, **planned.settings()
        )
    except ServiceError as exc:
        place = FILE_FIELDS.get(exc.field, exc.field)
        message = f"{place}: {exc.message}"
        if exc.field == "name" and (better := suggested_name(planned.name)):
            message += f" (rename it in the file, e.g. {better!r})"
        if exc.field == "args":
            planned = replace(planned, args_withheld=True)
        problems.append(message)
    else:
        planned = replace(planned, env_names=tuple(checked["env_names"]))
    return replace(planned, problems=tuple(problems))


def _planned(name: str, raw: Any, refuse_stdio: str) -> PlannedServer:
    if not isinstance(raw, dict):
        return PlannedServer(name, problems=("an entry is an object (command/args/env or url)",))
    try:
        entry = McpServerEntry.model_validate(raw)
    except ValidationError as exc:
        return PlannedServer(name, problems=tuple(_validation_problems(exc)))
    ignored = tuple(sorted(entry.model_extra or {}))
    url = entry.url or entry.server_url
    kind_type = (entry.type or "").strip()
    problems: list[str] = []
    if entry.command is not None and url is not None:
        problems.append("give either a command (stdio) or a url (HTTP), not both")
    if entry.command is not None:
        if kind_type not in ("", "stdio"):
            problems.append(f'type "{kind_type}" with a command: a command is "stdio"')
        names, env_problems = _env_names(entry.env)
        problems += env_problems + _args_problems(entry.args)
        if entry.headers:
            problems.append("headers are for an HTTP server; a stdio server gets env")
        planned = PlannedServer(
            name, ToolServer.Kind.MCP_STDIO, command=entry.command, args=tuple(entry.args),
            env_names=tuple(names), cwd=entry.cwd or "", enabled=not entry.disabled,
            ignored=ignored,
        )  # fmt: skip
        return _judged(planned, problems, refuse_stdio)
    if url is None:
        return PlannedServer(
            name, problems=("no command (a stdio server) and no url (an HTTP server)",),
            ignored=ignored,
        )  # fmt: skip
    if kind_type == "sse":
        problems.append(
            'type "sse": only Streamable HTTP is supported (the SSE transport is deprecated in '
            "MCP); if the server also speaks Streamable HTTP (often at /mcp), give that URL "
            'with "type": "http"'
        )
    elif kind_type not in ("", *HTTP_TYPES):
        problems.append(f'type "{kind_type}" is not one this registry speaks (http, stdio)')
    token_env, header_problems = _token_env(entry.headers)
    problems += header_problems
    if entry.env or entry.args or entry.cwd:
        problems.append("env, args and cwd are for a stdio server (a command)")
    planned = PlannedServer(
        name, ToolServer.Kind.MCP, url=url, token_env=token_env, enabled=not entry.disabled,
        ignored=ignored,
    )  # fmt: skip
    return _judged(planned, problems, refuse_stdio)


def read_plan(text: str, *, refuse_stdio: str = "") -> ImportPlan:
    """The plan of an ``mcpServers`` file, each entry judged as registering it
    would (a taken name, a command the allow-list refuses, an env name that is
    the system's own …). Reads the database; writes nothing; starts nothing.
    ``refuse_stdio``: why this caller may not register stdio servers, added
    to each stdio entry's problems."""
    if len(text) > FILE_MAX:
        return ImportPlan(problems=(f"the file is over {FILE_MAX:,} characters",))
    repeated: list[tuple[int, str]] = []  # (the object's id, the key it repeats)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for key, value in items:
            if key in seen:
                repeated.append((id(seen), key))
            seen[key] = value
        return seen

    try:
        document = json.loads(text, object_pairs_hook=pairs)
    except ValueError as exc:
        return ImportPlan(problems=(f"the file is not JSON: {exc}",))
    servers = None
    if isinstance(document, dict):
        servers = document.get("mcpServers", document.get("servers"))
    if not isinstance(servers, dict):
        return ImportPlan(
            problems=(
                'the file has no "mcpServers" object ({"mcpServers": {"name": {"command": …}}}, '
                'as Claude Desktop and Cursor write it; VS Code\'s "servers" is read too)',
            )
        )
    if not servers:
        return ImportPlan(problems=('"mcpServers" names no server',))
    if len(servers) > SERVERS_MAX:
        return ImportPlan(problems=(f"at most {SERVERS_MAX} servers in one file",))
    file_problems = [
        f"the server {name!r} appears twice in the file (only the last would count)"
        for where, name in repeated
        if where == id(servers)
    ]
    planned = tuple(_planned(name, raw, refuse_stdio) for name, raw in servers.items())
    return ImportPlan(planned, tuple(dict.fromkeys(file_problems)))


def plan_text(plan: ImportPlan) -> str:
    """The plan as an ``mcpServers`` file of exactly what it registers (no
    ignored keys, env by name): what a preview carries to its Register button,
    read again there (``read_plan``) and judged again before anything is written."""
    servers: dict[str, dict[str, Any]] = {}
    for s in plan.servers:
        if s.stdio:
            entry: dict[str, Any] = {"command": s.command, "args": list(s.args),
                                     "env": dict.fromkeys(s.env_names, "")}  # fmt: skip
            if s.cwd:
                entry["cwd"] = s.cwd
        else:
            entry = {"type": "http", "url": s.url}
            if s.token_env:
                entry["headers"] = {"Authorization": f"Bearer ${{{s.token_env}}}"}
        if not s.enabled:
            entry["disabled"] = True
        servers[s.name] = entry
    return json.dumps({"mcpServers": servers}, indent=2)


# --------------------------------------------------------------------------- registering


def register_plan(
    plan: ImportPlan, *, by: str, reason: str, register: Callable[..., tuple[ToolServer, list]]
) -> list[ToolServer]:
    """Register every server of a plan without problems, or none.

    One transaction around them all: a server that cannot be listed (a command
    that does not start, an HTTP server that does not answer) rolls back the
    ones registered before it, and every such problem is said, not only the
    first. Each stdio server is started once, by ``register`` itself; the
    transaction stays open while they start (seconds, an admin's action)."""
    if not plan.ok:
        raise ImportRefused(plan.every_problem() or ["the file names no server"])
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("reason", "say why these servers are registered (audited)")
    if len(reason) > REASON_MAX:
        raise ServiceError("reason", f"at most {REASON_MAX} characters")
    problems: list[str] = []
    done: list[ToolServer] = []
    with transaction.atomic():
        for planned in plan.servers:
            try:
                server, _opened = register(
                    by=by, name=planned.name, kind=planned.kind, url=planned.url, reason=reason,
                    **planned.settings(),
                )  # fmt: skip
            except ServiceError as exc:
                problems.append(f"{planned.name}: {FILE_FIELDS.get(exc.field, exc.field)}: "
                                f"{exc.message}")  # fmt: skip
                continue
            if server.list_error:
                problems.append(f"{planned.name}: its tools could not be listed: "
                                f"{server.list_error}")  # fmt: skip
            done.append(server)
        if problems:
            transaction.set_rollback(True)
    if problems:
        raise ImportRefused(problems)
    return done
