"""The layers and their import direction (docs/architecture.md).

governance/rules/ is the spec in code: no Django, Celery, network or clock.
Time is a parameter. Everything else of governance/ (facts, services, the
injectable time source) lives outside that folder.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

FORBIDDEN_IN_RULES = {
    "django", "celery", "kombu", "httpx", "requests", "socket", "urllib", "http",
    "os", "time", "asyncio", "subprocess", "psycopg", "redis", "opentelemetry",
    "tasks", "dashboard",
}  # fmt: skip
# Reads of the clock: ``.now()``/``.utcnow()``/``.today()`` with or without a
# zone argument, and the ``time`` module's readers.
CLOCK_READS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}
ZONED_CLOCK_READS = {"now", "utcnow", "today"}


def rule_modules() -> list[Path]:
    return sorted((REPO_ROOT / "governance" / "rules").rglob("*.py"))


def imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def governance_imports(tree: ast.AST) -> set[str]:
    """Modules of ``governance`` a file imports, relative imports resolved
    against ``governance/rules/`` (``..models`` is ``governance.models``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "governance")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["governance", "rules"][: max(0, 2 - (node.level - 1))]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] != "governance":
                continue
            if module in ("governance", "governance.rules"):
                found.update(f"{module}.{a.name}" for a in node.names)
            else:
                found.add(module)
    return found


def clock_reads(tree: ast.AST) -> list[str]:
    return [
        f"line {node.lineno}: .{node.func.attr}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (
            node.func.attr in ZONED_CLOCK_READS or (node.func.attr in CLOCK_READS and not node.args)
        )
    ]


def test_rule_modules_exist():
    names = {p.stem for p in rule_modules()}
    expected = {
        "refusal",
        "segments",
        "routing",
        "run_clocks",
        "budget",
        "lifecycle_input",
        "authority",
        "answers",
        "dispatch",
        "progress",
        "provider_failures",
        "settlement",
        "recovery",
        "effects",
        "run_facts",
        "decision_table",
        "transitions",
        "classification",
        "retry_after",
        "breaker",
        "refusal_memory",
    }
    assert expected <= names


@pytest.mark.parametrize("path", rule_modules(), ids=lambda p: p.name)
def test_rule_module_imports_no_framework_network_or_clock(path: Path):
    tree = ast.parse(path.read_text())
    assert imported_roots(tree) & FORBIDDEN_IN_RULES == set()


@pytest.mark.parametrize("path", rule_modules(), ids=lambda p: p.name)
def test_rule_module_imports_only_other_rules_of_governance(path: Path):
    """Facts, services and the injectable clock live outside rules/: a rule that
    imports them is no longer pure, relative import or not."""
    outside = {
        m
        for m in governance_imports(ast.parse(path.read_text()))
        if not m.startswith("governance.rules.")
    }
    assert outside == set()


@pytest.mark.parametrize("path", rule_modules(), ids=lambda p: p.name)
def test_rule_module_never_reads_the_clock(path: Path):
    assert clock_reads(ast.parse(path.read_text())) == []


# Outside rules/, time is read through governance.time_source (injectable, and
# the rehearsal offset applies). These read the wall clock on purpose.
WALL_CLOCK_ALLOWED = {
    "governance/time_source.py": "the injectable clock itself",
    "tasks/jobs.py": "process liveness: a heartbeat is about real processes, not facts",
    "dashboard/pages/overview.py": "/healthz and the board's status read those heartbeats",
    "dashboard/site/management/commands/up.py": "`up`'s status line reads those heartbeats",
    "dashboard/management/commands/demo.py": "the demo anchors its scenario to the real day",
}


def wall_clock_reads(tree: ast.AST) -> list[str]:
    """``datetime.now()``, ``timezone.now()``, ``date.today()`` and the like: the
    wall clock read directly (``time_source.now()`` is not one)."""
    reads = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
        if node.func.attr in ZONED_CLOCK_READS and name in {"datetime", "timezone", "date"}:
            reads.append(f"line {node.lineno}: {name}.{node.func.attr}()")
    return reads


def test_runtime_reads_the_time_through_time_source():
    offenders = []
    for root in ("governance", "tasks", "dashboard"):
        for path in (REPO_ROOT / root).rglob("*.py"):
            name = str(path.relative_to(REPO_ROOT))
            if "migrations" in path.parts or name in WALL_CLOCK_ALLOWED:
                continue
            reads = wall_clock_reads(ast.parse(path.read_text()))
            offenders += [f"{name} {r}" for r in reads]
    assert offenders == []


def test_the_checks_see_zoned_clock_reads_and_relative_imports():
    """The checks themselves: ``datetime.now(UTC)`` is a clock read, and
    ``from ..models import X`` inside rules/ is an import of governance.models."""
    tree = ast.parse(
        "from datetime import UTC, datetime\nfrom ..models import Run\nfrom . import refusal\n"
        "from governance import time_source\nfrom governance.rules import breaker\n"
        "def f():\n    return datetime.now(UTC), time.monotonic()\n"
    )
    assert [r.split(": ")[1] for r in clock_reads(tree)] == [".now()", ".monotonic()"]
    assert [r.split(": ")[1] for r in wall_clock_reads(tree)] == ["datetime.now()"]
    assert wall_clock_reads(ast.parse("time_source.now(); timezone.now()")) == [
        "line 1: timezone.now()"
    ]
    assert governance_imports(tree) == {
        "governance.models",
        "governance.rules.refusal",
        "governance.time_source",
        "governance.rules.breaker",
    }


@pytest.mark.parametrize("package", ["governance", "tasks"])
def test_imports_point_down_only(package: str):
    above = {"governance": {"tasks", "dashboard"}, "tasks": {"dashboard"}}[package]
    offenders = []
    for path in (REPO_ROOT / package).rglob("*.py"):
        roots = imported_roots(ast.parse(path.read_text()))
        if roots & above:
            offenders.append(f"{path.relative_to(REPO_ROOT)} imports {sorted(roots & above)}")
    assert offenders == []


def test_services_package_has_no_import_circle():
    """governance/services/ is split by topic; its modules import each other
    as a DAG (the package's __init__ only re-exports)."""
    package = REPO_ROOT / "governance" / "services"
    edges: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        if path.name == "__init__.py":
            continue
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module.startswith("governance.services."):
                    targets.add(node.module.rsplit(".", 1)[1])
                elif node.module == "governance.services":
                    targets.update(alias.name for alias in node.names)
        edges[path.stem] = targets & {p.stem for p in package.glob("*.py")}
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def circle_from(module: str, path: list[str]) -> list[str] | None:
        seen[module] = 1
        for target in sorted(edges.get(module, ())):
            if seen.get(target) == 1:
                return [*path, module, target]
            if target not in seen and (found := circle_from(target, [*path, module])):
                return found
        seen[module] = 2
        return None

    circles = [c for m in sorted(edges) if m not in seen and (c := circle_from(m, []))]
    assert circles == []


# --- dashboard/: the platform, the API, the pages, their read models ---------

DASHBOARD = REPO_ROOT / "dashboard"
DASHBOARD_ENTRIES = {
    "__init__.py", "apps.py",
    "site",  # the platform: settings, env readers, URL root, entry points, backends, `up`
    "api",  # the public API, one module per resource, its schemas and OpenAPI builder
    "openai",  # the OpenAI-compatible door under /v1/, in OpenAI's shapes
    "pages",  # the dashboard's pages
    "queries",  # the read models the pages and the API share
    "management",  # manage.py commands for people (demo, provider, tool, tokens)
    "templatetags",  # the pages' template filters (Django looks for them here)
}  # fmt: skip
# What a package of dashboard/ may not import. Only the URL root and the error
# handlers of the platform reach the API, the door and the pages; a page may answer in the
# API's JSON error shape (dashboard.api.base) and show its OpenAPI description.
DASHBOARD_FORBIDDEN = {
    "queries": ("dashboard.api", "dashboard.openai", "dashboard.pages", "dashboard.management"),
    "api": ("dashboard.openai", "dashboard.pages", "dashboard.management"),
    "openai": ("dashboard.api", "dashboard.pages", "dashboard.management"),
    "pages": ("dashboard.api", "dashboard.openai", "dashboard.management"),
    "site": ("dashboard.api", "dashboard.openai", "dashboard.pages"),
}
# The door authenticates with the API's tokens (dashboard.api.base), in its own
# shapes, answers at a run's settlement as ``?wait=`` does and streams a run's
# events as the run stream reads them (one wait and one reading, not two).
DASHBOARD_ALLOWED = {
    "openai": {"dashboard.api.base", "dashboard.api.waits", "dashboard.api.events"},
    # The Tools page registers a tool as the API does (``register``: judged, a
    # stdio server listed by a short-lived process before anything is written):
    # one way for every door, not a copy of it.
    "pages": {"dashboard.api.base", "dashboard.api.openapi", "dashboard.api.tools"},
    "site": {
        "dashboard.api.base",
        "dashboard.api.urls",
        "dashboard.openai.errors",
        "dashboard.openai.urls",
        "dashboard.pages.urls",
    },
}


def imported_modules(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_dashboard_folders_show_the_architecture():
    """Nothing sits at dashboard/'s top level but its packages (a module there
    would be a page, an endpoint or plumbing whose place nobody can tell)."""
    entries = {p.name for p in DASHBOARD.iterdir() if p.name != "__pycache__"}
    assert entries == DASHBOARD_ENTRIES


@pytest.mark.parametrize("package", sorted(DASHBOARD_FORBIDDEN))
def test_dashboard_packages_stay_in_their_places(package: str):
    offenders = []
    for path in (DASHBOARD / package).rglob("*.py"):
        for module in imported_modules(ast.parse(path.read_text())):
            allowed = DASHBOARD_ALLOWED.get(package, set())
            if any(module == a or module.startswith(a + ".") for a in allowed):
                continue
            if any(module == f or module.startswith(f + ".") for f in DASHBOARD_FORBIDDEN[package]):
                offenders.append(f"{path.relative_to(REPO_ROOT)} imports {module}")
    assert offenders == []
