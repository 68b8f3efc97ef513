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
    db_value,
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
from governance.rules.cost import Prices, attempt_cost, summarize_costs
from governance.services import statements as sql
from governance.services.broker import publish
from governance.services.budget import run_budget_view_later
from governance.services.errors import RunSettled
from governance.services.stream import run_is_settled
from tasks import instrumentation as spans

# --------------------------------------------------------------------------- plain reads
# A run's submit and the poll of its detail are the API's hot requests. Their
# reads are fixed SQL texts: building a queryset's SQL costs more CPU than the
# statement's round trip. Each value is still read as the ORM reads its field
# (Django's converters: JSON from text; SQLite's dates, UUIDs and decimals).


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
    "FROM governance_run"
    " JOIN governance_segment ON governance_segment.id = governance_run.segment_id"
    " LEFT JOIN governance_settlement ON governance_settlement.run_id = governance_run.id"
    " WHERE governance_run.id = %s",
)  # fmt: skip
RUN_STAGES = sql.Read(
    sql.fields_of(
        Stage, "seq", "kind", "enqueued_at", "started_at", "finished_at", "outcome",
        "timeout_name", "failure_class", "detail", "clocks", "deliveries",
    ),
    "FROM governance_stage WHERE run_id = %s ORDER BY seq",
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
    "FROM governance_providerattempt"
    " JOIN governance_stage ON governance_stage.id = governance_providerattempt.stage_id"
    " JOIN governance_segment ON governance_segment.id = governance_providerattempt.segment_id"
    " JOIN governance_provider ON governance_provider.id = governance_providerattempt.provider_id"
    " WHERE governance_providerattempt.run_id = %s"
    " ORDER BY governance_providerattempt.started_at, governance_providerattempt.id",
)  # fmt: skip
RUN_RECEIPTS = sql.Read(
    sql.fields_of(
        ToolReceipt, "tool", "idempotency_key", "effect", "verified_at", "error", "server",
        "schema_version", "effect_class", "created_at", "finished_at",
    ),
    "FROM governance_toolreceipt WHERE run_id = %s ORDER BY id",
)  # fmt: skip
RUN_CHUNKS = sql.Read(
    sql.fields_of(
        BodyChunk, "chunk_no", "version", "text", "final", "committed_at", "sent_at", "observed_at"
    ),
    "FROM governance_bodychunk WHERE run_id = %s ORDER BY chunk_no",
)


def run_json(run_id: uuid.UUID, *, settled_only: bool = False) -> dict[str, Any] | None:
    """The run as ``GET /api/v1/runs/{id}`` answers it (None: no such run), read
    with plain statements: a client polls it to see its run settle.
    ``settled_only``: None while the run is not settled (nothing is built)."""
    key = db_value(Run, run_id)
    # Six reads, one round trip (on PostgreSQL): a waiting client's answer is
    # on the path from the settlement to the client.
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
    attempt_costs = [
        attempt_cost(
            attempt.usage,
            Prices(
                input=attempt.price_input_per_mtok,
                output=attempt.price_output_per_mtok,
                cached=attempt.price_cached_per_mtok,
                currency=attempt.currency,
            ),
        )
        for attempt in attempts
    ]
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
        "stages": [
            {
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
            for stage in stages
        ],
        "attempts": [
            {
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
            for attempt, cost in zip(attempts, attempt_costs, strict=True)
        ],
        "cost": costs.summary_json(
            summarize_costs(
                (attempt.result, cost)
                for attempt, cost in zip(attempts, attempt_costs, strict=True)
            )
        ),
        "budget": {
            name: {"limit": b.limit, "used": b.used, "remaining": b.remaining}
            for name, b in (budget or {}).items()
        },
        "receipts": [
            {
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
            for receipt in receipts
        ],
        "chunks": [
            {
                "chunk_no": chunk.chunk_no,
                "version": chunk.version,
                "final": chunk.final,
                "committed_at": iso(chunk.committed_at),
                "sent_at": iso(chunk.sent_at),
                "observed_at": iso(chunk.observed_at),
            }
            for chunk in chunks
        ],
        "body": "".join(chunk.text for chunk in chunks if chunk.version is not None),
        "settlement": (
            {
                "outcome": run.settlement_outcome,
                "reason_code": run.settlement_reason_code,
                "reason": run.settlement_reason,
                "unknown_effects": run.settlement_unknown_effects,
                "settled_at": run.settlement_settled_at.isoformat(),
            }
            if run.settlement_settled_at is not None  # a settlement always has its time
            else None
        ),
    }


THREAD_AND_OPEN_SEGMENT = sql.Read(
    {
        **sql.fields_of(Thread, "id", "callback_url"),
        **sql.fields_of(Segment, "id", "key", prefix="segment_"),
    },
    "FROM governance_thread LEFT JOIN governance_segment"
    " ON governance_segment.thread_id = governance_thread.id"
    " AND governance_segment.closed_at IS NULL"
    " WHERE governance_thread.id = %s",
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
