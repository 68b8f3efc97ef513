"""What the README says about running the system and the API rows of issue 15,
checked against the code that does it."""

from __future__ import annotations

import re

from dashboard.api.schemas import BoundaryApply, RunSubmit, ThreadCreate
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _row(endpoint: str) -> str:
    rows = [line for line in README.splitlines() if line.startswith(f"| `{endpoint}` |")]
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
