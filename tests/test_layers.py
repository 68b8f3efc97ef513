"""The layers and their import direction (ARCHITECTURE.md).

governance/ rule modules are the spec in code: no Django, Celery, network or
clock. Time is a parameter.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

# Modules of governance/ that hold facts or wire Django, not rules.
NOT_RULES = {
    "__init__.py", "apps.py", "models.py", "services.py", "admin.py", "clock.py", "roles.py",
}  # fmt: skip
FORBIDDEN_IN_RULES = {
    "django", "celery", "kombu", "httpx", "requests", "socket", "urllib", "http",
    "os", "time", "asyncio", "subprocess", "psycopg", "redis", "opentelemetry",
    "tasks", "dashboard",
}  # fmt: skip
CLOCK_READS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}


def rule_modules() -> list[Path]:
    # services*.py hold transactions (Django), like services.py.
    return sorted(
        p
        for p in (REPO_ROOT / "governance").glob("*.py")
        if p.name not in NOT_RULES and not p.name.startswith("services")
    )


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
    expected = {"refusal", "segments", "health", "routing", "clocks", "budget", "lifecycle"}
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
