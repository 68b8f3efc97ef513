"""A run's facts, read once for the run page: the run with its settlement and
ledger, its stages, attempts, receipts and chunks. (The API's answer of the same
facts, ``dashboard.api.runs.run_json``, is fixed SQL in one round trip: this
ORM read tripled the web's CPU per lone run there, bench/throughput.py.)

Each kind of fact is one query whatever its number (stages, attempts,
receipts, chunks, the ledger), so a run of a hundred turns costs what a run
of one does. Each attempt's stage is one of the run's stages and its provider
one of a few: shared instances, not one joined copy per attempt
(at 100 attempts joined rows cost more than every other query of the page
together, ``bench/scale.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from governance import services
from governance.models import BodyChunk, ProviderAttempt, Run, Settlement, Stage, ToolReceipt
from governance.rules.budget import Balance

# What is read of each attempt: what the page and the API show and price it by
# (``usage``), not its digest, error text, tool names or Insights columns.
ATTEMPT_FIELDS = (
    "id", "run", "stage", "provider", "model", "kind", "started_at", "latency_ms",
    "result", "failure_class", "refusal_category", "status_code", "usage",
)  # fmt: skip


@dataclass
class RunFacts:
    run: Run
    settlement: Settlement | None
    stages: list[Stage]
    attempts: list[ProviderAttempt]  # oldest first, each with its stage and provider
    receipts: list[ToolReceipt]  # in the order they were opened, each with its stage
    chunks: list[BodyChunk]
    budget: dict[str, Balance] | None  # None: the run has no ledger

    @property
    def body(self) -> str:
        """The committed answer: the chunks that have a version (R7.2)."""
        return "".join(chunk.text for chunk in self.chunks if chunk.version is not None)


def settlement_of(run: Run) -> Settlement | None:
    try:
        return run.settlement
    except Run.settlement.RelatedObjectDoesNotExist:
        return None


def run_facts(run_id: uuid.UUID) -> RunFacts | None:
    """The run's facts (None: no such run)."""
    run = (
        Run.objects.select_related("thread", "segment", "settlement", "budget", "previous_run")
        .filter(id=run_id)
        .first()
    )
    if run is None:
        return None
    settlement = settlement_of(run)
    stages = list(run.stages.order_by("seq"))
    stage_of = {stage.id: stage for stage in stages}
    attempts = list(
        ProviderAttempt.objects.filter(run=run)
        .only(*ATTEMPT_FIELDS)
        .prefetch_related("provider")
        .order_by("started_at", "id")
    )
    receipts = list(ToolReceipt.objects.filter(run=run).order_by("id"))
    for row in (*attempts, *receipts):
        if row.stage_id in stage_of:
            row.stage = stage_of[row.stage_id]
    chunks = list(BodyChunk.objects.filter(run=run).order_by("chunk_no"))
    budget = services.budget_view(run) if _has_ledger(run) else None
    return RunFacts(run, settlement, stages, attempts, receipts, chunks, budget)


def _has_ledger(run: Run) -> bool:
    try:
        run.budget  # noqa: B018  (read with the run: select_related)
    except Run.budget.RelatedObjectDoesNotExist:
        return False
    return True
