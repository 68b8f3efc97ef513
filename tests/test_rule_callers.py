"""One copy of each rule, and the runtime calls it (docs/architecture.md).

Every public function of governance/rules/ must have a caller outside
tests/: a rule only tests call is a second copy waiting to drift from the one
that runs. A call from its own module counts (a helper of a rule that runs).
"""

from __future__ import annotations

import ast
from collections import Counter
from functools import cache
from pathlib import Path

from tests.conftest import REPO_ROOT

RULES = REPO_ROOT / "governance" / "rules"
SOURCE_ROOTS = ("governance", "tasks", "dashboard")
# Public surface kept on purpose, each with its reason.
KEPT = {
    "refusal.refusal_notice": "the refusal rule's fixed public surface (the most severe notice)",
    "publication.declare_attachment": "R7.2 attachment facts: no attachment store exists yet",
    "publication.mark_attachment_saved": "R7.2 attachment facts: no attachment store exists yet",
    "budget.release": "R5.2's provider-concurrency gauge: the runtime acquires no slot yet",
}


def public_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    ]


def runtime_sources() -> dict[Path, str]:
    return {
        path: path.read_text()
        for root in SOURCE_ROOTS
        for path in (REPO_ROOT / root).rglob("*.py")
        if "migrations" not in path.parts
    }


def _references(text: str) -> Counter:
    """The names a module's code uses (``f`` and ``x.f``), read from its syntax
    tree: a name in a comment, a docstring or a string is no use of it."""
    used: Counter = Counter()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Name):
            used[node.id] += 1
        elif isinstance(node, ast.Attribute):
            used[node.attr] += 1
        elif isinstance(node, ast.alias):
            used[node.name.rsplit(".", 1)[-1]] += 0  # an import alone is no use
    return used


@cache
def _references_of(text: str) -> Counter:
    return _references(text)


def callers(name: str, module: Path, sources: dict[Path, str]) -> list[str]:
    return [path.name for path, text in sources.items() if _references_of(text)[name] > 0]


def test_every_public_rule_function_has_a_caller_outside_tests():
    sources = runtime_sources()
    uncalled = [
        f"{path.stem}.{name}"
        for path in sorted(RULES.glob("*.py"))
        for name in public_functions(path)
        if f"{path.stem}.{name}" not in KEPT and not callers(name, path, sources)
    ]
    assert uncalled == []


def test_kept_functions_exist_and_still_need_their_reason():
    """The allow-list shrinks when a kept function gains a caller or goes away."""
    sources = runtime_sources()
    stale = []
    for entry in KEPT:
        module, name = entry.split(".")
        path = RULES / f"{module}.py"
        if name not in public_functions(path) or callers(name, path, sources):
            stale.append(entry)
    assert stale == []


def test_the_caller_check_finds_an_uncalled_function(tmp_path):
    """The check itself: a function called only in its own definition has no caller."""
    module = tmp_path / "rule.py"
    module.write_text(
        'def used():\n    return 1\n\n\ndef unused():\n    """unused() says so."""\n'
        "    return used()  # not unused\n"
    )
    other = tmp_path / "runtime.py"
    other.write_text("import rule\nfrom rule import unused\nrule.used()\nprint('unused()')\n")
    sources = {module: module.read_text(), other: other.read_text()}
    assert callers("used", module, sources) == ["rule.py", "runtime.py"]
    # Named in a docstring, a comment, an import and a string: never used.
    assert callers("unused", module, sources) == []
