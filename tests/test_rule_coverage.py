"""The rules live in the repository, and the tests follow them.

``docs/rules.md`` is the reference for the rule ids: every id it states is
named by at least one test, every governance test names the rule it covers,
every id the code cites is stated there, and no file outside ``docs/`` points
at a rule text outside the repository.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections import Counter
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.test_one_voice import CONTRADICTIONS

RULES = REPO_ROOT / "docs" / "rules.md"
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
# A rule paragraph starts with its id: "R3.9 **Acceptance scenario** …".
RULE_PARAGRAPH = re.compile(r"^R(\d)\.(\d+)\s", re.MULTILINE)
SECTION = re.compile(r"^## R(\d) ", re.MULTILINE)
NAME_ID = re.compile(r"(?:^|_)r(\d)_(\d+)(?=_|$)")
TEXT_ID = re.compile(r"\bR(\d)\.(\d+)\b")
CODE = ("governance", "tasks", "dashboard")
CODE_SUFFIXES = {".py", ".html", ".txt", ".md", ".json"}
# Pointers to rule texts that are not part of this repository.
OUTSIDE = re.compile(rb"\.\./shared|SPEC\.md")
THIS_FILE = Path(__file__).resolve()


def rule_ids() -> list[str]:
    return [f"R{a}.{b}" for a, b in RULE_PARAGRAPH.findall(RULES.read_text())]


def _tests(root: Path):
    for path in sorted(root.rglob("test_*.py")):
        if path.resolve() == THIS_FILE:
            continue  # this file quotes ids without testing them
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test_"
            ):
                ids = {f"R{a}.{b}" for a, b in NAME_ID.findall(node.name)}
                ids |= {f"R{a}.{b}" for a, b in TEXT_ID.findall(ast.get_docstring(node) or "")}
                yield path, node.name, ids


def test_docs_rules_md_states_r1_to_r8_each_numbered_without_gaps():
    text = RULES.read_text()
    ids = rule_ids()
    assert [rid for rid, n in Counter(ids).items() if n > 1] == []
    sections = sorted({int(rid[1]) for rid in ids})
    assert sections == list(range(1, 9))
    assert sorted(int(n) for n in SECTION.findall(text)) == sections
    for section in sections:
        items = [int(rid.split(".")[1]) for rid in ids if int(rid[1]) == section]
        assert items == list(range(1, len(items) + 1)), f"R{section}: {items}"


def test_every_rule_of_r1_to_r8_has_a_test():
    named = set().union(*(ids for _, _, ids in _tests(REPO_ROOT / "tests")))
    assert sorted(set(rule_ids()) - named) == []


def test_every_governance_test_names_its_rule():
    unnamed = [
        f"{path.name}::{name}"
        for path, name, ids in _tests(REPO_ROOT / "tests" / "governance")
        if not ids
    ]
    assert unnamed == []


def test_every_rule_id_the_code_cites_is_stated_in_docs_rules_md():
    stated = set(rule_ids())
    unknown = sorted(
        f"{path.relative_to(REPO_ROOT)}: R{a}.{b}"
        for top in CODE
        for path in (REPO_ROOT / top).rglob("*")
        if path.suffix in CODE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts
        for a, b in set(TEXT_ID.findall(path.read_text(errors="replace")))
        if f"R{a}.{b}" not in stated
    )
    assert unknown == []


UNTRACKED_DIRS = {".git", ".venv", "var", "test-output", "__pycache__", ".pytest_cache"}


def _tracked_files() -> list[Path]:
    """The repository's files: git's list, or (an export without .git) the tree
    itself less what the project never commits."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [
            path
            for path in REPO_ROOT.rglob("*")
            if path.is_file() and not UNTRACKED_DIRS & set(path.relative_to(REPO_ROOT).parts)
        ]
    return [REPO_ROOT / name for name in listed.decode().split("\0") if name]


def test_no_tracked_file_outside_docs_points_outside_the_repository():
    offenders = [
        str(path.relative_to(REPO_ROOT))
        for path in _tracked_files()
        if path.parts[len(REPO_ROOT.parts)] != "docs"
        and path.resolve() != THIS_FILE
        and path.is_file()
        and OUTSIDE.search(path.read_bytes())
    ]
    assert offenders == []


def test_docs_point_nowhere_outside_the_repository_and_speak_with_one_voice():
    """The docs follow the one-voice rule of refusals (its id is in test_one_voice)."""
    for path in (RULES, ARCHITECTURE):
        text = path.read_text()
        assert OUTSIDE.search(text.encode()) is None, path.name
        assert "seeds/" not in text, path.name
        assert [m.group(0) for m in CONTRADICTIONS.finditer(text)] == [], path.name


def test_readme_links_the_rules_and_the_architecture():
    readme = (REPO_ROOT / "README.md").read_text()
    assert "(docs/rules.md)" in readme and "(docs/architecture.md)" in readme
