"""Every rule id of SPEC.md R1–R7 is named by at least one test, and every
governance test names the rule it covers (in its name or docstring)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO_ROOT

RULE_IDS = {
    f"R{section}.{item}"
    for section, count in {1: 4, 2: 4, 3: 9, 4: 5, 5: 4, 6: 5, 7: 4}.items()
    for item in range(1, count + 1)
}
NAME_ID = re.compile(r"(?:^|_)r(\d)_(\d+)(?=_|$)")
TEXT_ID = re.compile(r"\bR(\d)\.(\d+)\b")


def _tests(root: Path):
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                ids = {f"R{a}.{b}" for a, b in NAME_ID.findall(node.name)}
                ids |= {f"R{a}.{b}" for a, b in TEXT_ID.findall(ast.get_docstring(node) or "")}
                yield path, node.name, ids


def test_every_rule_of_r1_to_r7_has_a_test():
    named = set().union(*(ids for _, _, ids in _tests(REPO_ROOT / "tests")))
    assert sorted(RULE_IDS - named) == []


def test_every_governance_test_names_its_rule():
    unnamed = [
        f"{path.name}::{name}"
        for path, name, ids in _tests(REPO_ROOT / "tests" / "governance")
        if not ids
    ]
    assert unnamed == []
