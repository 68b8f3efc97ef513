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
CLOCK_READS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}


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


def test_rule_modules_exist():
    names = {p.stem for p in rule_modules()}
    expected = {"refusal", "segments", "health", "routing", "run_clocks", "budget", "lifecycle"}
    assert expected <= names


@pytest.mark.parametrize("path", rule_modules(), ids=lambda p: p.name)
def test_rule_module_imports_no_framework_network_or_clock(path: Path):
    tree = ast.parse(path.read_text())
    assert imported_roots(tree) & FORBIDDEN_IN_RULES == set()


@pytest.mark.parametrize("path", rule_modules(), ids=lambda p: p.name)
def test_rule_module_never_reads_the_clock(path: Path):
    tree = ast.parse(path.read_text())
    reads = [
        f"line {node.lineno}: .{node.func.attr}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCK_READS
        and not node.args
    ]
    assert reads == []


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
