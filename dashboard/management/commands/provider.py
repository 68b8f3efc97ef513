"""Add, list, enable and disable providers from the shell, through the same
service functions as ``POST``/``PATCH /api/v1/providers``.

    manage.py provider add openai-main --kind openai --model gpt-4o-mini \\
        --base-url https://api.openai.com/v1 --key-env OPENAI_API_KEY
    manage.py provider add demo --kind scripted --model demo-v1 --script script.json
    manage.py provider list
    manage.py provider disable openai-main --reason "key rotated"
    manage.py provider enable openai-main

The key is named by its environment variable (``--key-env``), never given;
the variable must match ``GOVERNANCE_KEY_ENV_ALLOW`` (``GOVERNANCE_KEY_*`` and the
conventional provider names by default), and the base URL may carry no
credentials and must obey ``GOVERNANCE_OUTBOUND_ALLOW``. A refusal is one line
on stderr and a non-zero exit, and adds nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from dashboard.api.providers import provider_json, script_problem
from dashboard.management.text_table import text_table
from governance import provider_kinds, time_source
from governance.models import Provider
from governance.services import ServiceError
from governance.services import providers as provider_services

ACTOR = "manage.py provider"
# The service's field names, as this command's options.
OPTIONS = {
    "base_url": "--base-url",
    "api_key_env": "--key-env",
    "script": "--script",
    "connect_timeout_s": "--connect-timeout",
    "read_timeout_s": "--read-timeout",
    "failure_threshold": "--failure-threshold",
    "model": "--model",
    "kind": "--kind",
}
COLUMNS = ("provider_id", "kind", "model", "enabled", "breaker", "key_env", "key", "base_url")


def _script(path: str | None, kind: str):
    if path is None:
        return None
    try:
        script = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CommandError(f"--script: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CommandError(f"--script: {path} is not JSON: {exc}") from None
    problem = script_problem(kind, script)
    if problem:
        raise CommandError(f"--script: {problem}")
    return script


def _key_state(row: dict) -> str:
    if row["key_env_refused"]:
        return "not allowed"  # the worker will not read it (GOVERNANCE_KEY_ENV_ALLOW)
    return "set" if row["key_present"] else "missing"


def table(rows: list[dict]) -> str:
    """The providers as a plain table, one line each (base URLs masked)."""
    cells = [
        [
            row["provider_id"],
            row["kind"],
            row["model"],
            "yes" if row["enabled"] else "no",
            row["breaker"],
            row["key_env"] or "-",
            _key_state(row) if row["key_env"] else "-",
            row["base_url"] or "-",
        ]
        for row in rows
    ]
    return text_table(COLUMNS, cells)


class Command(BaseCommand):
    help = "Add, list, enable or disable providers (the key is named by its env variable)."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="add a provider")
        add.add_argument("provider_id")
        kinds = provider_kinds.KINDS.values()
        add.add_argument("--kind", required=True, choices=provider_kinds.names())
        add.add_argument("--model", required=True)
        add.add_argument(
            "--base-url",
            default="",
            help=" and ".join(k.name for k in kinds if k.has_server) + " kinds",
        )
        add.add_argument(
            "--key-env",
            default="",
            help="NAME of the environment variable holding the key "
            "(matching GOVERNANCE_KEY_ENV_ALLOW, e.g. GOVERNANCE_KEY_OPENAI or OPENAI_API_KEY)",
        )
        add.add_argument(
            "--script",
            help=" and ".join(k.name for k in kinds if k.has_script)
            + " kind: a JSON file with the script",
        )
        add.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS")
        add.add_argument("--read-timeout", type=float, default=120.0, metavar="SECONDS")
        add.add_argument("--failure-threshold", type=int, default=3)
        add.add_argument("--disabled", action="store_true", help="add it disabled")
        for kind in ("input", "output", "cached"):
            add.add_argument(
                f"--price-{kind}", default=None, metavar="PER_MILLION",
                help=f"price per million {kind} tokens (with --currency)",
            )  # fmt: skip
        add.add_argument("--currency", default="", help="ISO 4217 code of the prices, e.g. USD")
        actions.add_parser("list", help="list the providers as a table")
        for name in ("disable", "enable"):
            sub = actions.add_parser(name, help=f"{name} a provider")
            sub.add_argument("provider_id")
            sub.add_argument("--reason", default="", help="kept in the audit log")

    def handle(self, *args, action, **options):
        try:
            if action == "add":
                self._add(options)
            elif action == "list":
                rows = [provider_json(p) for p in Provider.objects.select_related("health")]
                self.stdout.write(table(rows) if rows else "no providers")
            else:
                self._enable(options["provider_id"], action == "enable", options["reason"])
        except ServiceError as exc:
            raise CommandError(f"{OPTIONS.get(exc.field, exc.field)}: {exc.message}") from None

    def _add(self, options) -> None:
        provider = provider_services.create_provider(
            provider_id=options["provider_id"],
            kind=options["kind"],
            model=options["model"],
            base_url=options["base_url"],
            api_key_env=options["key_env"],
            script=_script(options["script"], options["kind"]),
            connect_timeout_s=options["connect_timeout"],
            read_timeout_s=options["read_timeout"],
            failure_threshold=options["failure_threshold"],
            enabled=not options["disabled"],
            price_input_per_mtok=options["price_input"],
            price_output_per_mtok=options["price_output"],
            price_cached_per_mtok=options["price_cached"],
            currency=options["currency"],
            by=ACTOR,
            now=time_source.now(),
        )
        row = provider_json(provider)
        key = ""
        if row["key_env"]:
            key = f", key from ${row['key_env']} ({'set' if row['key_present'] else 'not set'})"
        state = "enabled" if provider.enabled else "disabled"
        self.stdout.write(f"added {provider.provider_id} ({provider.kind}, {state}{key})")

    def _enable(self, provider_id: str, enabled: bool, reason: str) -> None:
        try:
            _provider, changed = provider_services.set_provider_enabled(
                provider_id, enabled, by=ACTOR, now=time_source.now(), reason=reason
            )
        except Provider.DoesNotExist:
            raise CommandError(f"no provider {provider_id!r}") from None
        state = "enabled" if enabled else "disabled"
        self.stdout.write(
            f"{provider_id} {state}" if changed else f"{provider_id} was already {state}"
        )
