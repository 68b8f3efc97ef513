"""Add and list routes from the shell, through the same service as
``POST /api/v1/routes``.

    manage.py route add fast --chain openai-main,anthropic-backup --description "low latency"
    manage.py route list

A route's name is never a provider's id (one namespace: the OpenAI-compatible
door's ``model`` names either). A refusal is one line on stderr and a non-zero
exit, and adds nothing.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from dashboard.management.text_table import text_table
from dashboard.queries import routes as queries
from governance import time_source
from governance.services import ServiceError
from governance.services import routes as route_services

ACTOR = "manage.py route"
# The service's field names, as this command's arguments.
OPTIONS = {"name": "NAME", "provider_chain": "--chain", "description": "--description"}
COLUMNS = ("name", "provider_chain", "enabled", "description")


def table(rows) -> str:
    """The routes as a plain table, one line each."""
    cells = [
        [
            route.name,
            ",".join(route.provider_chain),
            "yes" if route.enabled else "no",
            route.description or "-",
        ]
        for route in rows
    ]
    return text_table(COLUMNS, cells)


class Command(BaseCommand):
    help = "Add or list routes (named provider chains a request's model may name)."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="add a route")
        add.add_argument("name")
        add.add_argument(
            "--chain", required=True, help="provider ids, tried in order, comma-separated"
        )
        add.add_argument("--description", default="")
        add.add_argument("--disabled", action="store_true", help="add it disabled")
        actions.add_parser("list", help="list the routes as a table")

    def handle(self, *args, action, **options):
        try:
            if action == "add":
                self._add(options)
            else:
                rows = queries.routes()
                self.stdout.write(table(rows) if rows else "no routes")
        except ServiceError as exc:
            raise CommandError(f"{OPTIONS.get(exc.field, exc.field)}: {exc.message}") from None

    def _add(self, options) -> None:
        chain = [part.strip() for part in options["chain"].split(",") if part.strip()]
        route = route_services.create_route(
            name=options["name"],
            provider_chain=chain,
            description=options["description"],
            enabled=not options["disabled"],
            by=ACTOR,
            now=time_source.now(),
        )
        state = "enabled" if route.enabled else "disabled"
        self.stdout.write(f"added {route.name} ({' → '.join(route.provider_chain)}, {state})")
