"""One copy of each rule, and the runtime calls it (docs/architecture.md).

Every public function of governance/rules/ must have a caller outside
tests/: a rule only tests call is a second copy waiting to drift from the one
that runs. A call from its own module counts (a helper of a rule that runs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO_ROOT

RULES = REPO_ROOT / "governance" / "rules"
SOURCE_ROOTS = ("governance", "tasks", "dashboard")
# Public surface kept on purpose, each with its reason.
KEPT = {
    "refusal.refusal_notice": "the refusal rule's fixed public surface (the most severe notice)",
    "publication.declare_attachment": "R7.2 attachment facts: no attachment store exists yet",
    "publication.mark_attachment_saved": "R7.2 attachment facts: no attachment store exists yet",
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


def callers(name: str, module: Path, sources: dict[Path, str]) -> list[str]:
    call = re.compile(rf"(?<![\w.])(?:\w+\.)?{re.escape(name)}\b")
    found = []
    for path, text in sources.items():
        hits = len(call.findall(text))
        if path == module:
            hits -= 1  # its own definition
        if hits > 0:
            found.append(path.name)
    return found


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
    module.write_text("def used():\n    return 1\n\n\ndef unused():\n    return used()\n")
    other = tmp_path / "runtime.py"
    other.write_text("from rule import used\nused()\n")
    sources = {module: module.read_text(), other: other.read_text()}
    assert callers("used", module, sources) == ["rule.py", "runtime.py"]
    assert callers("unused", module, sources) == []
