"""The ORM is the way to the database; fixed SQL (governance/services/statements.py)
is a fenced exception for the hot path of a run, where building each queryset's
SQL cost most of a stage's CPU (docs/performance.md). A module outside the fence
that imports the fixed-SQL layer fails here: use the ORM there."""

from __future__ import annotations

import ast

from tests.conftest import REPO_ROOT

LAYER = "governance.services.statements"
# Each module inside the fence, and the hot path it serves.
FENCE = {
    "governance/services/stages.py": "the claim with the turn's facts, and the close",
    "governance/services/runs.py": "the submit's rows, the stage's claim, the settlement",
    "governance/services/budget.py": "the ledger's locked read and its admission",
    "governance/services/health.py": "the providers' health rows the claim and close read",
    "governance/services/refusals.py": "the segment's refusal states the claim reads",
    "governance/services/threads.py": "the accepted history the claim reads and the close appends",
    "governance/services/stream.py": "the committed chunks the close writes",
    "dashboard/api/runs.py": "the submit's thread and open segment",
    "dashboard/queries/run_detail.py": "the run's facts its API answer (polled, awaited) reads",
    "dashboard/api/base.py": "the token check on every API request",
    "dashboard/site/permissions.py": "the permissions every API request checks",
}


def users_of_the_layer() -> set[str]:
    users = set()
    for root in ("governance", "tasks", "dashboard"):
        for path in (REPO_ROOT / root).rglob("*.py"):
            name = path.relative_to(REPO_ROOT).as_posix()
            if "migrations" in path.parts or name == "governance/services/statements.py":
                continue
            if imports_the_layer(ast.parse(path.read_text())):
                users.add(name)
    return users


def imports_the_layer(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == LAYER for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == LAYER:
                return True
            if node.module == "governance.services" and any(
                a.name == "statements" for a in node.names
            ):
                return True
    return False


def test_only_the_fenced_hot_path_uses_fixed_sql():
    assert users_of_the_layer() - set(FENCE) == set()


def test_the_fence_lists_no_module_that_no_longer_needs_it():
    """A module that moved to the ORM leaves the fence, so the list stays short."""
    assert set(FENCE) - users_of_the_layer() == set()


def test_the_check_sees_each_way_of_importing_it():
    for source in (
        "from governance.services import statements as sql",
        "from governance.services import errors, statements",
        "import governance.services.statements",
        "from governance.services.statements import together",
    ):
        assert imports_the_layer(ast.parse(source)), source
    assert not imports_the_layer(ast.parse("from governance.services import runs"))
