"""Add, import, list, enable, disable and re-list registry tools from the
shell, through the same services as ``POST``/``PATCH /api/v1/tools``.

    manage.py tool add files --kind mcp --url http://127.0.0.1:9100/mcp
    manage.py tool add time --kind mcp_stdio --command uvx --arg mcp-server-time \\
        --reason "clock for agents"
    manage.py tool add git --kind mcp_stdio --command uvx --env GIT_AUTHOR_NAME \\
        --reason "repository reads" -- mcp-server-git --repository /srv/repo
    manage.py tool add weather --kind http --url https://api.example/weather \\
        --method GET --description "Current weather for a city" \\
        --parameters weather.schema.json --effect read_only
    manage.py tool import claude_desktop_config.json --reason "the team's servers"
    manage.py tool import - --dry-run < .cursor/mcp.json
    manage.py tool list
    manage.py tool disable files --reason "server retired"
    manage.py tool enable files
    manage.py tool refresh files

A bearer token is named by its environment variable (``--token-env``), never
given; a stdio server's environment by its variables' names (``--env``). An
argument that starts with "-" is given as ``--arg=--flag`` or after ``--``.
"""

from __future__ import annotations

import json
import shlex
import sys
from datetime import timedelta
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dashboard.api.tools import refresh_listing, register, tool_json
from dashboard.management.text_table import text_table
from dashboard.queries import tools as tools_query
from governance import time_source
from governance.models import ToolServer
from governance.rules import approvals as approval_rules
from governance.services import ServiceError, tool_import, tool_registry, tool_servers

ACTOR = "manage.py tool"
OPTIONS = {
    "token_env": "--token-env",
    "parameters": "--parameters",
    "verify_url": "--verify-url",
    "timeout_s": "--timeout",
    "approval_overrides": "--tool",
    "approver_role": "--role",
    "approval_wait_s": "--wait",
    "env_names": "--env",
    "args": "--arg",
}
COLUMNS = ("name", "kind", "enabled", "tools", "version", "effect", "url/command", "listing")
PLAN_COLUMNS = ("name", "kind", "runs", "env", "state")


def _schema(path: str | None):
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandError(f"--parameters: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CommandError(f"--parameters: {path} is not JSON: {exc}") from None


def _reaches(row: dict) -> str:
    """Where a registry entry is reached: its URL, or the command line it runs."""
    if row["command"]:
        return shlex.join([row["command"], *row["args"]])
    return row["url"]


def table(rows: list[dict]) -> str:
    cells = [
        [
            row["name"], row["kind"], "yes" if row["enabled"] else "no", row["tool_count"],
            row["schema_version"], row["effect"] or "-", _reaches(row),
            "error: " + row["list_error"][:60] if row["list_error"] else "ok",
        ]
        for row in rows
    ]  # fmt: skip
    return text_table(COLUMNS, cells)


def plan_table(plan: tool_import.ImportPlan) -> str:
    """What an import would register: each server, what it runs or its URL,
    the variables it is given (names only) and whether it can be registered."""
    cells = []
    for s in plan.servers:
        named = (
            ", ".join(s.env_names) if s.stdio else (f"token ${s.token_env}" if s.token_env else "")
        )
        state = "ok" if not s.problems else f"{len(s.problems)} problem(s)"
        cells.append([s.name, s.kind or "?", s.runs or "-", named or "-",
                      state if s.enabled else f"{state}, disabled"])  # fmt: skip
    return text_table(PLAN_COLUMNS, cells)


def _read(source: str, stdin) -> str:
    """The file's text, from a path or ``-`` (standard input)."""
    if source == "-":
        return stdin.read()
    try:
        return Path(source).expanduser().read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise CommandError(f"cannot read {source}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CommandError(f"{source} is not UTF-8 text") from None


def _tools_of(server: ToolServer) -> str:
    return ", ".join(t["name"] for t in server.listed_tools) or "none"


class Command(BaseCommand):
    help = (
        "Add, import, list, enable, disable or re-list registry tools (MCP servers over "
        "Streamable HTTP or stdio, HTTP tools)."
    )
    stealth_options = ("stdin",)  # call_command(..., stdin=StringIO(...)) for "import -"

    def create_parser(self, prog_name, subcommand, **kwargs):
        """``add … -- ARG …``: what follows ``--`` is the stdio command's
        arguments, dashes and all (argparse alone would refuse them after the
        name it already read)."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parse = parser.parse_args

        def parse_args(args=None, namespace=None):
            words = list(sys.argv[2:] if args is None else args)
            tail: list[str] = []
            if "--" in words:
                cut = words.index("--")
                words, tail = words[:cut], words[cut + 1 :]
            options = parse(words, namespace)
            if tail and options.action != "add":
                parser.error("only 'add' takes a command's arguments after --")
            options.tail = tail
            return options

        parser.parse_args = parse_args
        return parser

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser(
            "add", help="register an MCP server (HTTP or stdio) or an HTTP tool"
        )
        add.add_argument("name")
        add.add_argument("--kind", required=True, choices=ToolServer.Kind.values)
        add.add_argument("--url", default="", help="mcp and http kinds")
        add.add_argument(
            "--token-env",
            default="",
            help="NAME of the variable with the token (matching GOVERNANCE_KEY_ENV_ALLOW)",
        )
        add.add_argument("--method", choices=tool_servers.METHODS, help="http kind")
        add.add_argument("--description", default="", help="http kind: what the tool does")
        add.add_argument("--parameters", help="http kind: a JSON file with the JSON Schema")
        add.add_argument("--effect", choices=("read_only", "external_effect"), help="http kind")
        add.add_argument("--verify-url", default="", help="http external_effect: verification")
        add.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")
        add.add_argument("--disabled", action="store_true", help="add it disabled")
        add.add_argument("--command", default="", help="mcp_stdio kind: the command to run")
        add.add_argument(
            "--arg", action="append", default=[], metavar="ARG",
            help="mcp_stdio kind: one argument (repeat it; --arg=--flag for a dash, or -- ARG …)",
        )  # fmt: skip
        add.add_argument(
            "--env", action="append", default=[], metavar="NAME",
            help="mcp_stdio kind: a variable the server gets from the worker's environment "
            "(its NAME; repeat it)",
        )  # fmt: skip
        add.add_argument("--cwd", default="", help="mcp_stdio kind: its working directory")
        add.add_argument(
            "--reason", default="", help="kept in the audit log (required for mcp_stdio)"
        )
        bring = actions.add_parser(
            "import",
            help="register the servers of an mcpServers file (Claude Desktop, Cursor, VS Code)",
        )
        bring.add_argument("file", help="the JSON file, or - for standard input")
        bring.add_argument("--reason", default="", help="kept in the audit log (required)")
        bring.add_argument("--dry-run", action="store_true", help="show the plan, register nothing")
        actions.add_parser("list", help="list the registry as a table")
        for name in ("disable", "enable"):
            sub = actions.add_parser(name, help=f"{name} a registry entry")
            sub.add_argument("name")
            sub.add_argument("--reason", default="", help="kept in the audit log")
        sub = actions.add_parser("refresh", help="list an MCP server's tools again")
        sub.add_argument("name")
        sub = actions.add_parser(
            "approval", help="who must say yes before a call runs (never/side_effects/always)"
        )
        sub.add_argument("name")
        sub.add_argument("policy", choices=approval_rules.POLICIES)
        sub.add_argument("--tool", help="one tool of an MCP server (else the whole server)")
        sub.add_argument("--role", help="the role whose members may answer (default operator)")
        sub.add_argument("--wait", type=float, metavar="SECONDS", help="how long a request waits")
        sub.add_argument("--reason", default="", help="kept in the audit log")

    def handle(self, *args, action, **options):
        try:
            if action == "add":
                self._add(options)
            elif action == "import":
                self._import(options)
            elif action == "list":
                rows = [tool_json(s) for s in tools_query.servers()]
                self.stdout.write(table(rows) if rows else "no tools registered")
            elif action == "refresh":
                self._refresh(options["name"])
            elif action == "approval":
                self._approval(options)
            else:
                self._enable(options["name"], action == "enable", options["reason"])
        except tool_import.ImportRefused as exc:
            raise CommandError(self._refusal(exc.problems)) from None
        except ServiceError as exc:
            raise CommandError(
                f"{OPTIONS.get(exc.field, '--' + exc.field)}: {exc.message}"
            ) from None

    @staticmethod
    def _refusal(problems: list[str]) -> str:
        lines = [f"nothing was registered ({len(problems)} problem(s)):"]
        return "\n".join([*lines, *(f"  {problem}" for problem in problems)])

    def _add(self, options) -> None:
        settings = {
            "token_env": options["token_env"],
            "description": options["description"],
            "verify_url": options["verify_url"],
            "timeout_s": options["timeout"],
            "enabled": not options["disabled"],
        }
        if options["method"]:
            settings["method"] = options["method"]
        if options["effect"]:
            settings["effect"] = options["effect"]
        if options["parameters"]:
            settings["parameters"] = _schema(options["parameters"])
        launch = {
            "command": options["command"],
            "args": [*options["arg"], *options.get("tail", ())],
            "env_names": options["env"],
            "cwd": options["cwd"],
        }
        # The launch fields are a stdio server's: given to another kind, the
        # service says they do not belong there.
        settings.update({k: v for k, v in launch.items() if v})
        server, _opened = register(
            by=ACTOR, name=options["name"], kind=options["kind"], url=options["url"],
            reason=options["reason"], **settings,
        )  # fmt: skip
        if server.kind in tool_servers.MCP_KINDS:
            if server.list_error:
                self.stdout.write(f"added {server.name} ({server.kind}), but {server.list_error}")
                return
            self.stdout.write(f"added {server.name} ({server.kind}): tools {_tools_of(server)}")
        else:
            self.stdout.write(f"added {server.name} (http {server.method}, {server.effect})")

    def _import(self, options) -> None:
        text = _read(options["file"], options.get("stdin") or sys.stdin)
        plan = tool_import.read_plan(text)
        if plan.servers:
            self.stdout.write(plan_table(plan))
        for s in plan.servers:
            if s.ignored:
                self.stdout.write(f"{s.name}: ignored (not read here): {', '.join(s.ignored)}")
        if not plan.ok:
            raise CommandError(self._refusal(plan.every_problem()))
        if options["dry_run"]:
            self.stdout.write(f"dry run: {len(plan.servers)} server(s) would be registered")
            return
        if not options["reason"].strip():
            raise CommandError("--reason: say why these servers are registered (audited)")
        servers = tool_import.register_plan(
            plan, by=ACTOR, reason=options["reason"], register=register
        )
        for server in servers:
            self.stdout.write(
                f"registered {server.name} ({server.kind}): tools {_tools_of(server)}"
            )

    def _refresh(self, name: str) -> None:
        server = self._get(name)
        if server.kind not in tool_servers.MCP_KINDS:
            raise CommandError(f"{name} is an http tool: there is nothing to list")
        server, opened = refresh_listing(server, f"listed again by {ACTOR}")
        if server.list_error:
            raise CommandError(f"{name}: {server.list_error}")
        self.stdout.write(
            f"{name}: {len(server.listed_tools)} tool(s), schema version {server.schema_version}"
            + (f"; boundaries: {', '.join(s.key for s in opened)}" if opened else "")
        )

    def _get(self, name: str) -> ToolServer:
        try:
            return ToolServer.objects.get(name=name)
        except ToolServer.DoesNotExist:
            raise CommandError(f"no tool {name!r}") from None

    def _approval(self, options) -> None:
        server = self._get(options["name"])
        changes: dict = {}
        if options["tool"]:
            overrides = dict(server.approval_overrides or {})
            overrides[options["tool"]] = options["policy"]
            changes["approval_overrides"] = overrides
        else:
            changes["approval"] = options["policy"]
        if options["role"]:
            changes["approver_role"] = options["role"]
        if options["wait"] is not None:
            changes["approval_wait_s"] = options["wait"]
        server, changed, _opened = tool_registry.update_server(
            server.name, by=ACTOR, now=time_source.now(), reason=options["reason"], **changes
        )
        what = f"{server.name}.{options['tool']}" if options["tool"] else server.name
        if not changed:
            self.stdout.write(f"{what}: unchanged")
            return
        self.stdout.write(
            f"{what}: approval {options['policy']}, answered by {server.approver_role} "
            f"within {approval_rules.wait_words(timedelta(seconds=server.approval_wait_s))}"
        )

    def _enable(self, name: str, enabled: bool, reason: str) -> None:
        self._get(name)
        _server, changed, _opened = tool_registry.update_server(
            name, by=ACTOR, now=time_source.now(), reason=reason, enabled=enabled
        )
        state = "enabled" if enabled else "disabled"
        self.stdout.write(f"{name} {state}" if changed else f"{name} was already {state}")
