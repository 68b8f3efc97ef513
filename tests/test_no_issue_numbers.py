"""No text of the repository cites a tracker number ("issue" and a number).

A tracker number means nothing to a reader of the repository: code, docs and
tests name the rule id instead (R1–R8, docs/rules.md) or say the reason in
plain words. Migrations are history and are not scanned.
"""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

# Built from pieces so that this file does not match itself.
ISSUE_NUMBER = re.compile(r"\b" + "issue" + r"s? ?#?[0-9]+", re.IGNORECASE)

SCANNED = (
    "governance",
    "tasks",
    "dashboard",
    "templates",
    "tests",
    "bench",
    "docs",
    "deploy",
    "README.md",
    "Makefile",
    "pyproject.toml",
)
SKIPPED_PARTS = {".venv", "migrations", "__pycache__"}
BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".svg", ".woff", ".woff2", ".pyc"}


def _scanned_files():
    for top in SCANNED:
        root = REPO_ROOT / top
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        for path in paths:
            relative = path.relative_to(REPO_ROOT)
            if not path.is_file() or SKIPPED_PARTS & set(relative.parts):
                continue
            if path.suffix.lower() in BINARY_SUFFIXES:
                continue
            yield relative.as_posix(), path.read_text(errors="replace")


def test_no_text_cites_an_issue_number():
    offenders = [
        f"{relative}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)!r}"
        for relative, text in _scanned_files()
        for match in ISSUE_NUMBER.finditer(text)
    ]
    assert offenders == []


def test_the_scan_sees_what_it_should():
    """The pattern finds the forms once used, and the scan reaches every top folder."""
    word = "issue"  # the forms below are written apart so that this file does not match
    for cited in (f"{word} 12", f"({word.title()} 8)", f"{word}s 10", f"{word} #4", f"{word}13"):
        assert ISSUE_NUMBER.search(cited), cited
    for plain in ("R6.7", "tissue 3", "an issue with 3 runs"):
        assert not ISSUE_NUMBER.search(plain), plain
    seen = {relative.split("/")[0] for relative, _text in _scanned_files()}
    assert seen == set(SCANNED)
