"""Runs over the API: the submit (``POST /api/v1/threads/{id}/runs``), a run's
detail (``GET /api/v1/runs/{id}``, ``?wait=`` answers at its settlement) and
its cancel.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

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
    require_visible,
)
from dashboard.api.schemas import RunQuery, RunSubmit
from dashboard.queries import costs
from dashboard.queries.run_detail import RunFacts, receipt_latency_ms, run_facts
from dashboard.site import permissions
from governance import services, time_source
from governance.models import (
    Run,
    Segment,
    Settlement,
    Thread,
)
from governance.rules.approvals import stage_awaits_person
from governance.rules.cost import AttemptCost, attempt_cost, summarize_costs
from governance.services import statements as sql
from governance.services.broker import publish
from governance.services.errors import RunSettled
from governance.services.stream import run_settled_and_owner
from tasks import instrumentation as spans


def run_json(run_id: uuid.UUID, *, settled_only: bool = False) -> dict[str, Any] | None:
    """The run as ``GET /api/v1/runs/{id}`` answers it (None: no such run).
    ``settled_only``: None while the run is not settled (nothing is built)."""
    facts = run_facts(run_id, settled_only=settled_only)
    return None if facts is None else run_answer(facts)


def run_answer(facts: RunFacts) -> dict[str, Any]:
    run = facts.run
    priced = [(a, attempt_cost(a.usage, costs.prices_of(a.provider))) for a in facts.attempts]
    return {
        "id": str(run.id),
        "thread_id": str(run.thread_id),
        "segment": run.segment.key,
        "status": run.status,
        "phase": run.phase,
        # One of its calls waits for a person's yes or no (GET /api/v1/approvals).
        "awaiting_approval": any(
            stage_awaits_person(s.kind, s.parked_at, s.finished_at) for s in facts.stages
        ),
        "input": run.input,
        # The name of the API token that submitted it (None: not by a token).
        "client": run.client_name or None,
        "created_at": run.created_at.isoformat(),
        "deadline_at": run.deadline_at.isoformat(),
        "last_progress_at": iso(run.last_progress_at),
        "cancel_requested_at": iso(run.cancel_requested_at),
        "lifecycle": run.decisions,
        "stages": [stage_json(stage) for stage in facts.stages],
        "attempts": [attempt_json(attempt, cost) for attempt, cost in priced],
        "cost": costs.summary_json(summarize_costs((a.result, cost) for a, cost in priced)),
        "budget": {
            name: {"limit": b.limit, "used": b.used, "remaining": b.remaining}
            for name, b in (facts.budget or {}).items()
        },
        "receipts": [receipt_json(receipt) for receipt in facts.receipts],
        "chunks": [chunk_json(chunk) for chunk in facts.chunks],
        "body": facts.body,
        "settlement": settlement_json(facts.settlement) if facts.settlement else None,
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
        "stage": attempt.stage.seq,
        "provider_id": attempt.provider.provider_id,
        "model": attempt.model,
        "kind": attempt.kind,
        "result": attempt.result,
        "failure_class": attempt.failure_class or None,
        "refusal_category": attempt.refusal_category or None,
        "status_code": attempt.status_code,
        "latency_ms": attempt.latency_ms,
        "segment": attempt.segment.key,
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
        # The client's tool calls the chunk hands over (the door's client tools).
        "tool_calls": list(chunk.tool_calls),
    }


def settlement_json(settlement: Settlement) -> dict[str, Any]:
    return {
        "outcome": settlement.outcome,
        "reason_code": settlement.reason_code,
        "reason": settlement.reason,
        "unknown_effects": settlement.unknown_effects,
        "settled_at": settlement.settled_at.isoformat(),
    }


def db_value(model, value):
    """``value`` of ``model``'s primary key as the database takes it (SQLite: a
    UUID's hex)."""
    return sql.value(model, model._meta.pk.name, value)


THREAD_AND_OPEN_SEGMENT = sql.Read(
    {
        **sql.fields_of(Thread, "id", "callback_url", "created_by"),
        **sql.fields_of(Segment, "id", "key", prefix="segment_"),
    },
    f"FROM {sql.table(Thread)} LEFT JOIN {sql.table(Segment)}"
    f" ON {sql.table(Segment)}.thread_id = {sql.table(Thread)}.id"
    f" AND {sql.table(Segment)}.closed_at IS NULL"
    f" WHERE {sql.table(Thread)}.id = %s",
)


def _thread_and_open_segment(request: HttpRequest, thread_id: str) -> tuple[Thread, Segment | None]:
    """What a submit needs of the thread and its open segment, in one statement
    (their other fields are read if something asks for them); 404 for a thread
    the token's user may not see."""
    found = THREAD_AND_OPEN_SEGMENT.rows(db_value(Thread, parse_uuid(thread_id, "thread")))
    if not found:
        raise ApiError(404, None, "no such thread")
    row = found[0]
    require_visible(request, row.created_by, "thread")
    thread = Thread.from_db(connection.alias, ["id", "callback_url"], [row.id, row.callback_url])
    if row.segment_id is None:
        return thread, None  # the service looks for it (and finds none)
    segment = Segment.from_db(
        connection.alias, ["id", "key", "thread_id"], [row.segment_id, row.segment_key, row.id]
    )
    return thread, segment


@api_view(("POST",), permission=permissions.SUBMIT_RUN, atomic=True)
def submit_run(request: HttpRequest, thread_id: str) -> JsonResponse:
    thread, segment = _thread_and_open_segment(request, thread_id)
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
        api_token=request.api_token,
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
        facts = run_facts(key)
        if facts is None:
            raise ApiError(404, None, "no such run")
        require_visible(request, facts.run.owner_id, "run")
        return JsonResponse(run_answer(facts))

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
    found = run_settled_and_owner(key)  # one small read: exists, settled, whose
    if found is None:
        raise ApiError(404, None, "no such run")
    settled, owner_id = found
    require_visible(request, owner_id, "run")
    if settled:
        return HttpResponse(answer(settled_only=False), content_type="application/json")
    # Not settled: the answer waits for the settlement (dashboard/api/waits.py).
    return run_waits.waited_answer(request, key, wait_s, answer, looked_at=looked_at)


@api_view(("POST",), permission=(permissions.CANCEL_RUN, permissions.OWN_RUN))
def cancel_run(request: HttpRequest, run_id: str) -> JsonResponse:
    try:
        run = Run.objects.get(id=parse_uuid(run_id, "run"))
    except Run.DoesNotExist:
        raise ApiError(404, None, "no such run") from None
    require_visible(request, run.owner_id, "run")
    if not permissions.may_stop(request.api_user, run, request.api_scopes):
        raise ApiError(
            403, None, permissions.refusal(permissions.CANCEL_RUN) + " (or your own run)"
        )
    try:
        services.request_cancel(run, by=request.api_user.get_username(), now=time_source.now())
    except RunSettled as exc:
        raise ApiError(409, None, exc.message) from None
    return JsonResponse({"run_id": str(run.id), "cancel_requested": True}, status=202)
