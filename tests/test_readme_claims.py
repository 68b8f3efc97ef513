"""What the README and the docs it links say about running the system, the API's
endpoints and the speed targets, checked against the code that does it."""

from __future__ import annotations

import ast
import re

from dashboard.api.schemas import BoundaryApply, RunSubmit, ThreadCreate
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
API_DOC = (REPO_ROOT / "docs" / "api.md").read_text()  # the endpoints, in short
PERFORMANCE = (REPO_ROOT / "docs" / "performance.md").read_text()  # the README's Speed, moved


def _row(endpoint: str) -> str:
    rows = [line for line in API_DOC.splitlines() if line.startswith(f"| `{endpoint}` |")]
    assert len(rows) == 1, endpoint
    return rows[0]


def test_introduction_names_both_databases():
    intro = " ".join(README.split("## ")[0].split())
    assert "Every fact lives in PostgreSQL" not in intro
    assert "SQLite" in intro and "PostgreSQL when `DATABASE_URL`" in intro


def test_boundary_row_says_what_is_required():
    required = {name for name, field in BoundaryApply.model_fields.items() if field.is_required()}
    assert required == {"kind", "reason", "idempotency_key"}
    row = _row("POST /api/v1/threads/{id}/boundaries")
    assert "`reason` and `idempotency_key`, all three required" in row


def test_thread_row_says_the_model_default():
    assert ThreadCreate.model_fields["model"].default == ""  # filled in by create_thread
    assert "first provider's model" in ThreadCreate.model_fields["model"].description
    row = _row("POST /api/v1/threads")
    assert "`provider_chain` (required)" in row
    assert "`model` (default: the first provider's model)" in row


def test_run_row_keeps_idempotency_key_optional():
    assert not RunSubmit.model_fields["idempotency_key"].is_required()
    assert "optional `idempotency_key`" in _row("POST /api/v1/threads/{id}/runs")


def test_run_section_documents_port_host_verbose_and_the_root_warning():
    run = README.split("## Run the whole system", 1)[1].split("\n## ", 1)[0]
    for said in ("make run PORT=8001", "HOST=0.0.0.0", "make run VERBOSE=1", "LOG_LEVEL=INFO"):
        assert said in run, said
    assert "### Running as root" in run and "SecurityWarning" in run
    assert re.search(r"GOVERNANCE_UP_STATUS_SECONDS", run)


def test_readme_links_every_doc_it_names_and_they_exist():
    for doc in ("docs/rules.md", "docs/architecture.md", "docs/performance.md", "docs/api.md"):
        assert f"]({doc})" in README, doc
        assert (REPO_ROOT / doc).is_file(), doc
    assert "](deploy/)" in README and (REPO_ROOT / "deploy" / "compose.yaml").is_file()
    for image in ("docs/img/overview.png", "docs/img/incident.png"):
        assert f"]({image})" in README and (REPO_ROOT / image).is_file(), image


def test_readme_gives_the_makefiles_two_commands():
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    top = README.split("## Submit a run", 1)[0]
    assert "make run " in top and "make test " in top


def _bench_targets() -> dict[str, tuple[str, float]]:
    """bench/throughput.py's TARGETS, read without importing the bench."""
    tree = ast.parse((REPO_ROOT / "bench" / "throughput.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "TARGETS":
            return ast.literal_eval(node.value)
    raise AssertionError("bench/throughput.py defines no TARGETS")


def test_performance_table_states_the_benchs_targets():
    rows = {
        "runs_per_s": "| single-turn runs settled per second",
        "lone_p50_ms": "| lone run, client submit → settlement in hand",
        "overhead_p50_ms": "| governance overhead per turn",
        "submit_p50_ms": "| `POST /api/v1/threads/{id}/runs`, p50",
        "commits_per_run": "| database commits per single-turn run",
        "inserts_per_run": "| rows inserted per single-turn run",
    }
    targets = _bench_targets()
    for key, start in rows.items():
        op, value = targets[key]
        (row,) = [line for line in PERFORMANCE.splitlines() if line.startswith(start)]
        target = row.split("|")[2].strip()
        assert target.startswith("≥ " if op == ">=" else "≤ "), (key, target)
        assert float(target.split()[1]) == value, (key, target)


def test_performance_names_how_to_reproduce_and_every_bench():
    assert ".venv/bin/python bench/throughput.py 300 30" in PERFORMANCE
    for bench in sorted((REPO_ROOT / "bench").glob("*.py")):
        assert f"bench/{bench.name}" in PERFORMANCE, bench.name
    assert re.search(r"Measured on \d{4}-\d{2}-\d{2} .* on tree `[0-9a-f]{7,}`", PERFORMANCE)


def test_performance_shows_an_ab_row_for_each_piece_of_speed_machinery():
    """Each piece measured with and without it, and a verdict: what stays and
    what went is decided by measurement (median of five alternating runs)."""
    section = PERFORMANCE.split("## A/B measurements", 1)[1]
    assert "| piece | figure it serves | with (A) | without (B) | change | verdict |" in section
    for piece in (
        "cursor bypass", "pipeline mode", "sync-chain ASGI entry", "LISTEN reader",
        "pool check without a query", "insert_together",
    ):  # fmt: skip
        row = next(line for line in section.splitlines() if line.startswith(f"| {piece} |"))
        assert row.rstrip().endswith(("stays |", "went |")) or "went:" in row, row
