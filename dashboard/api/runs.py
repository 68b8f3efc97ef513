"""Runs over the API: the submit (``POST /api/v1/threads/{id}/runs``), a run's
detail (``GET /api/v1/runs/{id}``, ``?wait=`` answers at its settlement) and
its cancel.
"""

from __future__ import annotations

import time
import uuid
from functools import partial
from typing import Any

from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.api import waits as run_waits
from dashboard.api.base import (
    ApiError,
    api_view,
    iso,
    parse_body,
    parse_query,
    parse_uuid,
    require,
)
from dashboard.api.schemas import RunQuery, RunSubmit
from dashboard.queries import costs
from dashboard.site import permissions
from dashboard.site.responses import WaitedAnswer
from governance import services, time_source
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
from governance.rules.cost import AttemptCost, attempt_cost, summarize_costs
from governance.services import statements as sql
from governance.services.broker import publish
from governance.services.budget import run_budget_view_later
from governance.services.errors import RunSettled
from governance.services.stream import run_is_settled
from tasks import instrumentation as spans

# A run's submit and the answer of its detail (polled, or ``?wait=``) are the API's
# hot requests: fixed SQL (services.statements, fenced), six reads in one round
# trip. The ORM's read of the same facts (dashboard/queries/run_detail.py, the run
# page's) tripled the web's CPU per lone run in bench/throughput.py (10 → 28 ms).
_RUN, _SEG, _SETTLED = sql.table(Run), sql.table(Segment), sql.table(Settlement)
_STAGE, _ATTEMPT, _PROVIDER = sql.table(Stage), sql.table(ProviderAttempt), sql.table(Provider)
RUN = sql.Read(
    {
        **sql.fields_of(
            Run, "id", "thread_id", "status", "phase", "input", "created_at", "deadline_at",
            "last_progress_at", "cancel_requested_at", "decisions",
        ),
        **sql.fields_of(Segment, "key", prefix="segment_"),
        **sql.fields_of(
            Settlement, "outcome", "reason_code", "reason", "unknown_effects", "settled_at",
            prefix="settlement_",
        ),
    },
    f"FROM {_RUN} JOIN {_SEG} ON {_SEG}.id = {_RUN}.segment_id"
    f" LEFT JOIN {_SETTLED} ON {_SETTLED}.run_id = {_RUN}.id WHERE {_RUN}.id = %s",
)  # fmt: skip
RUN_STAGES = sql.Read(
    sql.fields_of(
        Stage, "seq", "kind", "enqueued_at", "started_at", "finished_at", "outcome",
        "timeout_name", "failure_class", "detail", "clocks", "deliveries",
    ),
    f"FROM {_STAGE} WHERE run_id = %s ORDER BY seq",
)  # fmt: skip
# The provider is joined: an attempt's cost adds no query (governance.rules.cost).
RUN_ATTEMPTS = sql.Read(
    {
        **sql.fields_of(
            ProviderAttempt, "model", "kind", "result", "failure_class", "refusal_category",
            "status_code", "latency_ms", "usage",
        ),
        **sql.fields_of(Stage, "seq", prefix="stage_"),
        **sql.fields_of(Segment, "key", prefix="segment_"),
        **sql.fields_of(
            Provider, "provider_id", "price_input_per_mtok", "price_output_per_mtok",
            "price_cached_per_mtok", "currency",
        ),
    },
    f"FROM {_ATTEMPT} JOIN {_STAGE} ON {_STAGE}.id = {_ATTEMPT}.stage_id"
    f" JOIN {_SEG} ON {_SEG}.id = {_ATTEMPT}.segment_id"
    f" JOIN {_PROVIDER} ON {_PROVIDER}.id = {_ATTEMPT}.provider_id"
    f" WHERE {_ATTEMPT}.run_id = %s ORDER BY {_ATTEMPT}.started_at, {_ATTEMPT}.id",
)  # fmt: skip
RUN_RECEIPTS = sql.Read(
    sql.fields_of(
        ToolReceipt, "tool", "idempotency_key", "effect", "verified_at", "error", "server",
        "schema_version", "effect_class", "created_at", "finished_at",
    ),
    f"FROM {sql.table(ToolReceipt)} WHERE run_id = %s ORDER BY id",
)  # fmt: skip
RUN_CHUNKS = sql.Read(
    sql.fields_of(
        BodyChunk, "chunk_no", "version", "text", "final", "committed_at", "sent_at", "observed_at"
    ),
    f"FROM {sql.table(BodyChunk)} WHERE run_id = %s ORDER BY chunk_no",
)


def run_json(run_id: uuid.UUID, *, settled_only: bool = False) -> dict[str, Any] | None:
    """The run as ``GET /api/v1/runs/{id}`` answers it (None: no such run).
    ``settled_only``: None while the run is not settled (nothing is built)."""
    key = db_value(Run, run_id)
    with sql.together():
        reads = [
            read.later(key) for read in (RUN, RUN_STAGES, RUN_ATTEMPTS, RUN_RECEIPTS, RUN_CHUNKS)
        ]
        budget_read = run_budget_view_later(run_id)
    # Read once the block has ended: its end is the round trip.
    found, stages, attempts, receipts, chunks = (read.value() for read in reads)
    budget = budget_read.value()
    if not found or (settled_only and found[0].settlement_settled_at is None):
        return None
    run = found[0]
    priced = [(a, attempt_cost(a.usage, costs.prices_of(a))) for a in attempts]
    return {
        "id": str(run.id),
        "thread_id": str(run.thread_id),
        "segment": run.segment_key,
        "status": run.status,
        "phase": run.phase,
        "input": run.input,
        "created_at": run.created_at.isoformat(),
        "deadline_at": run.deadline_at.isoformat(),
        "last_progress_at": iso(run.last_progress_at),
        "cancel_requested_at": iso(run.cancel_requested_at),
        "lifecycle": run.decisions,
        "stages": [stage_json(stage) for stage in stages],
        "attempts": [attempt_json(attempt, cost) for attempt, cost in priced],
        "cost": costs.summary_json(summarize_costs((a.result, cost) for a, cost in priced)),
        "budget": {
            name: {"limit": b.limit, "used": b.used, "remaining": b.remaining}
            for name, b in (budget or {}).items()
        },
        "receipts": [receipt_json(receipt) for receipt in receipts],
        "chunks": [chunk_json(chunk) for chunk in chunks],
        "body": "".join(chunk.text for chunk in chunks if chunk.version is not None),
        "settlement": settlement_json(run) if run.settlement_settled_at is not None else None,
    }


def stage_json(stage) -> dict[str, Any]:
    return {
        "seq": stage.seq,
        "kind": stage.kind,
        "enqueued_at": iso(stage.enqueued_at),
        "started_at": iso(stage.started_at),
        "finished_at": iso(stage.finished_at),
        "outcome": stage.outcome or None,
        "timeout": stage.timeout_name or None,
        "failure_class": stage.failure_class or None,
        "detail": stage.detail or None,
        "clocks": stage.clocks,
        "deliveries": stage.deliveries,
    }


def attempt_json(attempt, cost: AttemptCost) -> dict[str, Any]:
    return {
        "stage": attempt.stage_seq,
        "provider_id": attempt.provider_id,
        "model": attempt.model,
        "kind": attempt.kind,
        "result": attempt.result,
        "failure_class": attempt.failure_class or None,
        "refusal_category": attempt.refusal_category or None,
        "status_code": attempt.status_code,
        "latency_ms": attempt.latency_ms,
        "segment": attempt.segment_key,
        "cost": costs.attempt_cost_json(cost),
    }


def receipt_json(receipt) -> dict[str, Any]:
    return {
        "tool": receipt.tool,
        "idempotency_key": receipt.idempotency_key,
        "effect": receipt.effect,
        "verified_at": iso(receipt.verified_at),
        "error": receipt.error or None,
        # A registry tool's: its server, schema version and effect class.
        "server": receipt.server or None,
        "schema_version": receipt.schema_version,
        "effect_class": receipt.effect_class or None,
        "latency_ms": receipt_latency_ms(receipt),
    }


def chunk_json(chunk) -> dict[str, Any]:
    return {
        "chunk_no": chunk.chunk_no,
        "version": chunk.version,
        "final": chunk.final,
        "committed_at": iso(chunk.committed_at),
        "sent_at": iso(chunk.sent_at),
        "observed_at": iso(chunk.observed_at),
    }


def settlement_json(run) -> dict[str, Any]:
    """The settlement read with the run (``RUN``'s ``settlement_`` columns)."""
    return {
        "outcome": run.settlement_outcome,
        "reason_code": run.settlement_reason_code,
        "reason": run.settlement_reason,
        "unknown_effects": run.settlement_unknown_effects,
        "settled_at": run.settlement_settled_at.isoformat(),
    }


def db_value(model, value):
    """``value`` of ``model``'s primary key as the database takes it (SQLite: a
    UUID's hex)."""
    return sql.value(model, model._meta.pk.name, value)


THREAD_AND_OPEN_SEGMENT = sql.Read(
    {
        **sql.fields_of(Thread, "id", "callback_url"),
        **sql.fields_of(Segment, "id", "key", prefix="segment_"),
    },
    f"FROM {sql.table(Thread)} LEFT JOIN {sql.table(Segment)}"
    f" ON {sql.table(Segment)}.thread_id = {sql.table(Thread)}.id"
    f" AND {sql.table(Segment)}.closed_at IS NULL"
    f" WHERE {sql.table(Thread)}.id = %s",
)


def _thread_and_open_segment(thread_id: str) -> tuple[Thread, Segment | None]:
    """What a submit needs of the thread and its open segment, in one statement
    (their other fields are read if something asks for them)."""
    found = THREAD_AND_OPEN_SEGMENT.rows(db_value(Thread, parse_uuid(thread_id, "thread")))
    if not found:
        raise ApiError(404, None, "no such thread")
    row = found[0]
    thread = Thread.from_db(connection.alias, ["id", "callback_url"], [row.id, row.callback_url])
    if row.segment_id is None:
        return thread, None  # the service looks for it (and finds none)
    segment = Segment.from_db(
        connection.alias, ["id", "key", "thread_id"], [row.segment_id, row.segment_key, row.id]
    )
    return thread, segment


@api_view(("POST",), atomic=True)
def submit_run(request: HttpRequest, thread_id: str) -> JsonResponse:
    require(request, permissions.SUBMIT_RUN)
    thread, segment = _thread_and_open_segment(thread_id)
    body = parse_body(request, RunSubmit)
    run_id = uuid.uuid4()
    # The run's trace is allocated with its id and stored with the run (no second write).
    carrier = spans.new_run_trace(str(run_id), thread_id=str(thread.id), segment_key="")
    run, stage, created = services.submit_run(
        thread,
        input=body.input,
        user=request.api_user,
        now=time_source.now(),
        idempotency_key=body.idempotency_key,
        limits=body.budget.model_dump(exclude_none=True) if body.budget else None,
        trace_context=carrier,
        run_id=run_id,
        segment=segment,
        deadline_s=body.deadline_s,
        stage_budget_s=body.stage_budget_s,
        no_progress_s=body.no_progress_s,
    )
    if created:
        spans.note_admission_segment(run.segment.key)
        publish([stage])
    return JsonResponse(
        {"run_id": str(run.id), "status": run.status, "created": created,
         "url": f"/api/v1/runs/{run.id}"},
        status=202 if created else 200,
    )  # fmt: skip


@api_view(("GET",))
def run_detail(request: HttpRequest, run_id: str) -> HttpResponse:
    wait_s = parse_query(request, RunQuery).wait if request.GET else None
    key = parse_uuid(run_id, "run")
    if not wait_s:
        answer = run_json(key)
        if answer is None:
            raise ApiError(404, None, "no such run")
        return JsonResponse(answer)

    def answer(*, settled_only: bool) -> bytes | None:
        """The run's answer; with ``settled_only``, None while it is not settled:
        one round trip both tells and answers once the settlement is heard."""
        found = run_json(key, settled_only=settled_only)
        if found is None:
            if settled_only:
                return None
            # Deleted while the answer waited (its 200 is sent).
            found = {"error": {"field": None, "message": "no such run (deleted)"}}
        return JsonResponse(found).content

    looked_at = time.monotonic()
    settled = run_is_settled(key)  # one small read: exists, settled
    if settled is None:
        raise ApiError(404, None, "no such run")
    if settled:
        return HttpResponse(answer(settled_only=False), content_type="application/json")
    # Not settled: the answer waits for the settlement (dashboard/api/waits.py).
    settled_now = partial(run_is_settled, key)
    final_answer = partial(answer, settled_only=False)
    body = (
        run_waits.answer_when_settled(
            str(key),
            wait_s,
            settled_now,
            partial(answer, settled_only=True),
            final_answer,
            looked_at=looked_at,
        )
        if isinstance(request, ASGIRequest)
        else run_waits.answer_when_settled_sync(wait_s, settled_now, final_answer)
    )
    response = WaitedAnswer(body, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


@api_view(("POST",))
def cancel_run(request: HttpRequest, run_id: str) -> JsonResponse:
    try:
        run = Run.objects.get(id=parse_uuid(run_id, "run"))
    except Run.DoesNotExist:
        raise ApiError(404, None, "no such run") from None
    if not permissions.may_stop(request.api_user, run, request.api_scopes):
        raise ApiError(
            403, None, permissions.refusal(permissions.CANCEL_RUN) + " (or your own run)"
        )
    try:
        services.request_cancel(run, by=request.api_user.get_username(), now=time_source.now())
    except RunSettled as exc:
        raise ApiError(409, None, exc.message) from None
    return JsonResponse({"run_id": str(run.id), "cancel_requested": True}, status=202)


def receipt_latency_ms(receipt) -> int | None:
    """From the receipt written before the call to its result (None: not finished)."""
    if receipt.finished_at is None:
        return None
    return max(0, round((receipt.finished_at - receipt.created_at).total_seconds() * 1000))
