"""Add, list, enable, disable and re-list registry tools from the shell,
through the same services as ``POST``/``PATCH /api/v1/tools``.

    manage.py tool add files --kind mcp --url http://127.0.0.1:9100/mcp
    manage.py tool add weather --kind http --url https://api.example/weather \\
        --method GET --description "Current weather for a city" \\
        --parameters weather.schema.json --effect read_only
    manage.py tool list
    manage.py tool disable files --reason "server retired"
    manage.py tool enable files
    manage.py tool refresh files

A bearer token is named by its environment variable (``--token-env``), never given.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dashboard.api.tools import refresh_listing, tool_json
from dashboard.management.text_table import text_table
from dashboard.queries import tools as tools_query
from governance import time_source
from governance.models import ToolServer
from governance.services import ServiceError, tool_registry, tool_servers

ACTOR = "manage.py tool"
OPTIONS = {
    "token_env": "--token-env",
    "parameters": "--parameters",
    "verify_url": "--verify-url",
    "timeout_s": "--timeout",
}
COLUMNS = ("name", "kind", "enabled", "tools", "version", "effect", "url", "listing")


def _schema(path: str | None):
    if path is None:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandError(f"--parameters: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CommandError(f"--parameters: {path} is not JSON: {exc}") from None


def table(rows: list[dict]) -> str:
    cells = [
        [
            row["name"], row["kind"], "yes" if row["enabled"] else "no", row["tool_count"],
            row["schema_version"], row["effect"] or "-", row["url"],
            "error: " + row["list_error"][:60] if row["list_error"] else "ok",
        ]
        for row in rows
    ]  # fmt: skip
    return text_table(COLUMNS, cells)


class Command(BaseCommand):
    help = "Add, list, enable, disable or re-list registry tools (MCP servers, HTTP tools)."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="register an MCP server or an HTTP tool")
        add.add_argument("name")
        add.add_argument("--kind", required=True, choices=ToolServer.Kind.values)
        add.add_argument("--url", required=True)
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
        actions.add_parser("list", help="list the registry as a table")
        for name in ("disable", "enable"):
            sub = actions.add_parser(name, help=f"{name} a registry entry")
            sub.add_argument("name")
            sub.add_argument("--reason", default="", help="kept in the audit log")
        sub = actions.add_parser("refresh", help="list an MCP server's tools again")
        sub.add_argument("name")

    def handle(self, *args, action, **options):
        try:
            if action == "add":
                self._add(options)
            elif action == "list":
                rows = [tool_json(s) for s in tools_query.servers()]
                self.stdout.write(table(rows) if rows else "no tools registered")
            elif action == "refresh":
                self._refresh(options["name"])
            else:
                self._enable(options["name"], action == "enable", options["reason"])
        except ServiceError as exc:
            raise CommandError(
                f"{OPTIONS.get(exc.field, '--' + exc.field)}: {exc.message}"
            ) from None

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
        server = tool_servers.create_tool_server(
            name=options["name"], kind=options["kind"], url=options["url"],
            by=ACTOR, now=time_source.now(), **settings,
        )  # fmt: skip
        if server.kind == ToolServer.Kind.MCP:
            server, _opened = refresh_listing(server, "registered")
            if server.list_error:
                self.stdout.write(f"added {server.name} (mcp), but {server.list_error}")
                return
            names = ", ".join(t["name"] for t in server.listed_tools) or "none"
            self.stdout.write(f"added {server.name} (mcp): tools {names}")
        else:
            self.stdout.write(f"added {server.name} (http {server.method}, {server.effect})")

    def _refresh(self, name: str) -> None:
        server = self._get(name)
        if server.kind != ToolServer.Kind.MCP:
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

    def _enable(self, name: str, enabled: bool, reason: str) -> None:
        self._get(name)
        _server, changed, _opened = tool_registry.update_server(
            name, by=ACTOR, now=time_source.now(), reason=reason, enabled=enabled
        )
        state = "enabled" if enabled else "disabled"
        self.stdout.write(f"{name} {state}" if changed else f"{name} was already {state}")
