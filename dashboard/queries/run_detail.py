"""A run's facts, read once for its API answer (``GET /api/v1/runs/{id}``) and
its page: the run with its thread, segment and settlement, its stages,
attempts (each with its stage, segment and provider), receipts, chunks and
budget balances.

Fixed SQL (``services.statements``, fenced): the API's answer is polled, and
awaited with ``?wait=``, once per run by every client, and the ORM's read of the
same facts tripled the web's CPU per lone run in bench/throughput.py (lone run
p50 21 → 38–46 ms): building six querysets' SQL cost more than the reads. Here
the six reads are sent together, one round trip on PostgreSQL, and loaded as
model instances, so the page's code reads them as it would the ORM's.

Each kind of fact is one read whatever its number, so a run of a hundred turns
costs what a run of one does; an attempt's stage is one of the run's stages,
the same instance, not a joined copy (``bench/scale.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from functools import cache

from governance.models import (
    BodyChunk,
    Provider,
    ProviderAttempt,
    Run,
    Segment,
    Settlement,
    Stage,
    Thread,
    ToolReceipt,
)
from governance.rules.budget import Balance
from governance.services import statements as sql
from governance.services.budget import run_budget_view_later

# What is read of each attempt: what the page and the API show and price it by
# (``usage``), not its digest, error text, tool names or Insights columns.
ATTEMPT_FIELDS = (
    "id", "run", "stage", "segment", "provider", "model", "kind", "started_at", "latency_ms",
    "result", "failure_class", "refusal_category", "status_code", "finish_reason", "usage",
)  # fmt: skip
# A stage without its payload (what the worker was asked: nothing shows it).
STAGE_FIELDS = tuple(
    f.name for f in Stage._meta.concrete_fields if f.name not in ("payload", "holder")
)


@dataclass
class RunFacts:
    run: Run  # with its thread (id, title, door session), segment and settlement
    settlement: Settlement | None
    stages: list[Stage]
    attempts: list[ProviderAttempt]  # oldest first, each with its stage, segment and provider
    receipts: list[ToolReceipt]  # in the order they were opened, each with its stage
    chunks: list[BodyChunk]
    budget: dict[str, Balance] | None  # None: the run has no ledger

    @property
    def body(self) -> str:
        """The committed answer: the chunks that have a version (R7.2)."""
        return "".join(chunk.text for chunk in self.chunks if chunk.version is not None)

    @property
    def answer_text(self) -> str:
        """The committed answer's text, without the chunk that hands the
        client's tool calls over (its words are for people, not the client)."""
        texts = [c.text for c in self.chunks if c.version is not None and not c.tool_calls]
        return "".join(texts)

    @property
    def handed_calls(self) -> list[dict]:
        """The client's tool calls the answer hands over ({"id", "name", "arguments"})."""
        return [
            call for chunk in self.chunks if chunk.version is not None for call in chunk.tool_calls
        ]


@dataclass(frozen=True)
class _Shapes:
    run: sql.Columns
    thread: sql.Columns
    segment: sql.Columns
    settlement: sql.Columns
    stage: sql.Columns
    attempt: sql.Columns
    attempt_segment: sql.Columns
    provider: sql.Columns
    receipt: sql.Columns
    chunk: sql.Columns
    run_sql: str
    stages_sql: str
    attempts_sql: str
    receipts_sql: str
    chunks_sql: str


@cache
def _shapes() -> _Shapes:
    """The statements and their columns, built once per process."""
    run = sql.columns(Run, "r")
    thread = sql.Columns(Thread, "t", only=("id", "title", "client_session_key"))
    segment, settlement = sql.columns(Segment, "s"), sql.columns(Settlement, "x")
    stage = sql.Columns(Stage, "st", only=STAGE_FIELDS)
    attempt = sql.Columns(ProviderAttempt, "a", only=ATTEMPT_FIELDS)
    attempt_segment = sql.Columns(Segment, "s", only=("id", "key"))
    provider, receipt, chunk = (
        sql.columns(Provider, "p"), sql.columns(ToolReceipt, "c"), sql.columns(BodyChunk, "b")
    )  # fmt: skip
    return _Shapes(
        run, thread, segment, settlement, stage, attempt, attempt_segment, provider, receipt,
        chunk,
        run_sql=f"SELECT {run.sql}, {thread.sql}, {segment.sql}, {settlement.sql}"
        f" FROM {sql.table(Run)} r JOIN {sql.table(Thread)} t ON t.id = r.thread_id"
        f" JOIN {sql.table(Segment)} s ON s.id = r.segment_id"
        f" LEFT JOIN {sql.table(Settlement)} x ON x.run_id = r.id WHERE r.id = %s",
        stages_sql=f"SELECT {stage.sql} FROM {sql.table(Stage)} st"
        " WHERE st.run_id = %s ORDER BY st.seq",
        attempts_sql=f"SELECT {attempt.sql}, {attempt_segment.sql}, {provider.sql}"
        f" FROM {sql.table(ProviderAttempt)} a JOIN {sql.table(Segment)} s ON s.id = a.segment_id"
        f" JOIN {sql.table(Provider)} p ON p.id = a.provider_id"
        " WHERE a.run_id = %s ORDER BY a.started_at, a.id",
        receipts_sql=f"SELECT {receipt.sql} FROM {sql.table(ToolReceipt)} c"
        " WHERE c.run_id = %s ORDER BY c.id",
        chunks_sql=f"SELECT {chunk.sql} FROM {sql.table(BodyChunk)} b"
        " WHERE b.run_id = %s ORDER BY b.chunk_no",
    )  # fmt: skip


def run_facts(run_id: uuid.UUID, *, settled_only: bool = False) -> RunFacts | None:
    """The run's facts (None: no such run; with ``settled_only``, also None
    while the run is not settled, and nothing is built)."""
    shape = _shapes()
    key = sql.value(Run, "id", run_id)
    with sql.together():
        reads = [
            sql.Later(text, [key], list)
            for text in (
                shape.run_sql, shape.stages_sql, shape.attempts_sql,
                shape.receipts_sql, shape.chunks_sql,
            )
        ]  # fmt: skip
        budget_read = run_budget_view_later(run_id)
    # Read once the block has ended: its end is the round trip.
    found, stage_rows, attempt_rows, receipt_rows, chunk_rows = (read.value() for read in reads)
    if not found:
        return None
    run, settlement = _run_of(found[0], shape)
    if settled_only and settlement is None:
        return None
    stages = [shape.stage.load(row) for row in stage_rows]
    stage_of = {stage.id: stage for stage in stages}
    for stage in stages:
        sql.cache_related(stage, "run", run)
    return RunFacts(
        run=run,
        settlement=settlement,
        stages=stages,
        attempts=[_attempt_of(row, shape, stage_of) for row in attempt_rows],
        receipts=[_with_stage(shape.receipt.load(row), stage_of) for row in receipt_rows],
        chunks=[shape.chunk.load(row) for row in chunk_rows],
        budget=budget_read.value(),
    )


def _run_of(row, shape: _Shapes) -> tuple[Run, Settlement | None]:
    run = shape.run.load(row)
    at = shape.run.width
    sql.cache_related(run, "thread", shape.thread.load(row, at))
    at += shape.thread.width
    sql.cache_related(run, "segment", shape.segment.load(row, at))
    settlement = shape.settlement.load(row, at + shape.segment.width)
    sql.cache_related(run, "settlement", settlement)
    return run, settlement


def _attempt_of(row, shape: _Shapes, stage_of: dict[int, Stage]) -> ProviderAttempt:
    attempt = _with_stage(shape.attempt.load(row), stage_of)
    at = shape.attempt.width
    sql.cache_related(attempt, "segment", shape.attempt_segment.load(row, at))
    sql.cache_related(
        attempt, "provider", shape.provider.load(row, at + shape.attempt_segment.width)
    )
    return attempt


def _with_stage(row, stage_of: dict[int, Stage]):
    if row.stage_id in stage_of:
        sql.cache_related(row, "stage", stage_of[row.stage_id])
    return row


def receipt_latency_ms(receipt: ToolReceipt) -> int | None:
    """From the receipt written before the call to its result (None: not finished)."""
    if receipt.finished_at is None:
        return None
    return max(0, round((receipt.finished_at - receipt.created_at).total_seconds() * 1000))
