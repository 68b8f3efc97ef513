"""JSON API under /api/v1/, token-authenticated (``Authorization: Bearer <token>``).

Bad input answers 4xx with ``{"error": {"field": …, "message": …}}`` and
writes nothing. Every change goes through ``governance.services``.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from functools import partial, wraps
from typing import Any, TypeVar

import pydantic_core
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIRequest
from django.db import connection, transaction
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from dashboard import permissions, run_waits
from dashboard.api_schemas import (
    BoundaryApply,
    NotificationQuery,
    ProviderCreate,
    ProviderUpdate,
    RunQuery,
    RunSubmit,
    ThreadCreate,
    ThreadQuery,
)
from dashboard.queries import costs
from governance import services, time_source
from governance.models import (
    ApiToken,
    BodyChunk,
    Notification,
    Provider,
    ProviderAttempt,
    ProviderHealthState,
    Run,
    Segment,
    Settlement,
    Stage,
    Thread,
    ToolReceipt,
)
from governance.rules.cost import Prices, attempt_cost, summarize_costs
from governance.rules.refusal import RefusalError, parse_segment_key
from governance.services import providers as provider_services
from governance.services import statements as sql
from governance.services.admission import Overloaded
from governance.services.broker import publish
from governance.services.budget import run_budget_view_later
from governance.services.errors import RunSettled
from governance.services.stream import run_is_settled
from governance.services.tokens import token_digest
from tasks import instrumentation as spans

BodyT = TypeVar("BodyT", bound=BaseModel)
QueryT = TypeVar("QueryT", bound=BaseModel)


class ApiError(Exception):
    def __init__(self, status: int, field: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


def error_response(status: int, field: str | None, message: str) -> JsonResponse:
    response = JsonResponse({"error": {"field": field, "message": message}}, status=status)
    if status == 401:
        # RFC 9110 §15.5.2: a 401 names the scheme the client should use.
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


# --------------------------------------------------------------------------- plain reads
# A run's submit and the poll of its detail are the API's hot requests. Their
# reads are fixed SQL texts: building a queryset's SQL costs more CPU than the
# statement's round trip. Each value is still read as the ORM reads its field
# (Django's converters: JSON from text; SQLite's dates, UUIDs and decimals).


def _db_value(model, value):
    """``value`` of ``model``'s primary key as the database takes it (SQLite: a
    UUID's hex)."""
    return sql.value(model, model._meta.pk.name, value)


User = get_user_model()
USER_FIELDS = tuple(User._meta.concrete_fields)
USER_ATTNAMES = [field.attname for field in USER_FIELDS]
TOKEN_AND_USER = sql.Read(
    {
        **sql.fields_of(ApiToken, "id", "last_used_at", "scopes"),
        **{f"user_{field.attname}": field for field in USER_FIELDS},
    },
    "FROM governance_apitoken JOIN auth_user ON auth_user.id = governance_apitoken.user_id"
    " WHERE governance_apitoken.key_digest = %s AND governance_apitoken.revoked_at IS NULL",
)
TOKEN_USE_PRECISION = timedelta(minutes=1)


def _authenticate(request: HttpRequest):
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "Authorization", "send 'Authorization: Bearer <token>'")
    found = TOKEN_AND_USER.rows(token_digest(token.strip()))
    row = found[0] if found else None
    user = None
    if row is not None:
        user = User.from_db(connection.alias, USER_ATTNAMES, row[-len(USER_FIELDS) :])
    if user is None or not user.is_active:
        raise ApiError(401, "Authorization", "unknown or revoked token")
    request.api_scopes = tuple(row.scopes or ())
    now = time_source.now()
    if row.last_used_at is None or now - row.last_used_at >= TOKEN_USE_PRECISION:
        # "Last used" to the minute: not one write per request of a busy client.
        ApiToken.objects.filter(pk=row.id).update(last_used_at=now)
    return user


def api_view(methods: tuple[str, ...], *, atomic: bool = False) -> Callable:
    """``atomic``: the token check, the reads and the view's writes are one
    transaction (one commit for a hot write path such as submitting a run)."""

    def decorate(view: Callable) -> Callable:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            if request.method not in methods:
                response = error_response(405, None, f"use {' or '.join(methods)} on this address")
                response["Allow"] = ", ".join(methods)
                return response
            try:
                with transaction.atomic() if atomic else nullcontext():
                    request.api_user = _authenticate(request)
                    return view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status, exc.field, exc.message)
            except services.ServiceError as exc:
                return error_response(400, exc.field, exc.message)
            except Overloaded as exc:
                response = error_response(429, None, exc.message)
                response["Retry-After"] = str(exc.retry_after_s)
                return response

        return wrapper

    return decorate


def require(request: HttpRequest, permission: str) -> None:
    """403 unless the token's user holds ``permission`` (and its scopes allow it)."""
    user = getattr(request, "api_user", None) or request.user
    if not permissions.allowed(user, permission, getattr(request, "api_scopes", ())):
        raise ApiError(403, None, permissions.refusal(permission))


def parse_body(request: HttpRequest, schema: type[BodyT]) -> BodyT:
    """The request's JSON body, validated by its endpoint's schema (``api_schemas``)."""
    if request.content_type != "application/json":
        raise ApiError(415, None, "send a JSON body with Content-Type: application/json")
    raw = request.body or b"{}"
    try:
        # NaN and Infinity are not JSON (RFC 8259); the schema's parser would take them.
        pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise ApiError(400, None, f"the body is not valid JSON: {exc}") from None
    try:
        return schema.model_validate_json(raw)
    except PydanticValidationError as exc:
        raise ApiError(400, *_first_problem(exc)) from None


def _first_problem(exc: PydanticValidationError) -> tuple[str | None, str]:
    """One field and one sentence, from pydantic's first error (never the input
    echoed). ``field`` is the top-level name; the message says where inside it."""
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = [part for part in error["loc"] if isinstance(part, int) or "[" not in str(part)]
    field = str(loc[0]) if loc else None
    inside = ".".join(f"item {p}" if isinstance(p, int) else str(p) for p in loc[1:])
    kind, message = error["type"], error["msg"].removeprefix("Value error, ")
    if kind == "model_type" and field is None:
        return None, "the body must be a JSON object"
    if kind == "extra_forbidden":
        message = "is not a field of this request"
    elif kind == "missing":
        message = "is required"
    return field, f"{inside}: {message}" if inside else message


def _get(model, **lookup):
    try:
        return model.objects.get(**lookup)
    except model.DoesNotExist:
        raise ApiError(404, None, f"no such {model.__name__.lower()}") from None


def _uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ApiError(404, None, f"no such {what}") from None


# --------------------------------------------------------------------------- serializers


def segment_json(segment: Segment, now) -> dict[str, Any]:
    return {
        "key": segment.key,
        "session_id": segment.session_id,
        "segment_no": segment.segment_no,
        "model": segment.model,
        "mode": segment.mode,
        "tool_surface": segment.tool_surface,
        "opened_at": segment.opened_at.isoformat(),
        "closed_at": segment.closed_at.isoformat() if segment.closed_at else None,
        "closed_kind": segment.closed_kind or None,
        "closed_by": segment.closed_by or None,
        "close_reason": segment.close_reason or None,
        "providers": services.refusal_rows_view(segment, now),
    }


def thread_json(thread: Thread) -> dict[str, Any]:
    return {
        "id": str(thread.id),
        "title": thread.title,
        "provider_chain": thread.provider_chain,
        "model": thread.model,
        "mode": thread.mode,
        "tool_surface": thread.tool_surface,
        "system_prompt": thread.system_prompt,
        "callback_url": thread.callback_url or None,
        "created_at": thread.created_at.isoformat(),
    }


def _iso(value):
    return value.isoformat() if value else None


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
# The provider is joined: an attempt's cost adds no query (issue 12, governance.rules.cost).
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
    key = _db_value(Run, run_id)
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
        "last_progress_at": _iso(run.last_progress_at),
        "cancel_requested_at": _iso(run.cancel_requested_at),
        "lifecycle": run.decisions,
        "stages": [
            {
                "seq": stage.seq,
                "kind": stage.kind,
                "enqueued_at": _iso(stage.enqueued_at),
                "started_at": _iso(stage.started_at),
                "finished_at": _iso(stage.finished_at),
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
                "verified_at": _iso(receipt.verified_at),
                "error": receipt.error or None,
                # A registry tool's (issue 11): its server, schema version and effect class.
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
                "committed_at": _iso(chunk.committed_at),
                "sent_at": _iso(chunk.sent_at),
                "observed_at": _iso(chunk.observed_at),
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


# --------------------------------------------------------------------------- views


@api_view(("POST",))
def create_thread(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, ThreadCreate)
    thread = services.create_thread(
        **body.model_dump(), user=request.api_user, now=time_source.now()
    )
    answer = thread_json(thread)
    answer["segment"] = segment_json(services.open_segment(thread), time_source.now())
    return JsonResponse(answer, status=201)


@api_view(("GET",))
def thread_detail(request: HttpRequest, thread_id: str) -> JsonResponse:
    thread = _get(Thread, id=_uuid(thread_id, "thread"))
    body = thread_json(thread)
    body["segment"] = segment_json(services.open_segment(thread), time_source.now())
    return JsonResponse(body)


@api_view(("GET",))
def thread_segment(request: HttpRequest, thread_id: str) -> JsonResponse:
    thread = _get(Thread, id=_uuid(thread_id, "thread"))
    return JsonResponse(segment_json(services.open_segment(thread), time_source.now()))


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
    found = THREAD_AND_OPEN_SEGMENT.rows(_db_value(Thread, _uuid(thread_id, "thread")))
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
    key = _uuid(run_id, "run")
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
    # Not settled: the answer waits for the settlement (dashboard/run_waits.py).
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
    response = run_waits.WaitedAnswer(body, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


@api_view(("POST",))
def cancel_run(request: HttpRequest, run_id: str) -> JsonResponse:
    try:
        run = Run.objects.get(id=_uuid(run_id, "run"))
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


@api_view(("POST",))
def apply_boundary(request: HttpRequest, thread_id: str) -> JsonResponse:
    thread = _get(Thread, id=_uuid(thread_id, "thread"))
    require(request, permissions.APPLY_BOUNDARY)  # R8.3: like the dashboard button
    body = parse_body(request, BoundaryApply)
    segment, created = services.apply_boundary(
        thread,
        body.kind.value,
        by=request.api_user.get_username(),
        reason=body.reason,
        idempotency_key=body.idempotency_key,
        model=body.model,
        mode=body.mode,
        tool_surface=body.tool_surface,
        system_prompt=body.system_prompt,
        now=time_source.now(),
    )
    if not created and segment.thread_id != thread.id:
        # The key was spent on another thread's boundary: never answer with its segment.
        raise ApiError(400, "idempotency_key", "already used for another thread")
    return JsonResponse(segment_json(segment, time_source.now()), status=201 if created else 200)


# --------------------------------------------------------------------------- client endpoints
# Issue 10, "What a client needs": the notifications inbox and its acknowledgement,
# providers, and thread/segment reads. Lists are paged by an opaque cursor (the
# last item's created_at and id), newest first.


def _by_method(**views: Callable) -> Callable:
    """One address, one view per method (each an ``api_view``); others answer 405."""
    allowed = ", ".join(views)

    @csrf_exempt
    def dispatch(request: HttpRequest, *args, **kwargs):
        view = views.get(request.method or "")
        if view is None:
            response = error_response(405, None, f"use {' or '.join(views)} on this address")
            response["Allow"] = allowed
            return response
        return view(request, *args, **kwargs)

    return dispatch


def parse_query(request: HttpRequest, schema: type[QueryT]) -> QueryT:
    """The query string, validated by its endpoint's model; a repeated name is refused."""
    values = {}
    for name, items in request.GET.lists():
        if len(items) != 1:
            raise ApiError(400, name, "give this parameter once")
        values[name] = items[0]
    try:
        return schema.model_validate(values)
    except PydanticValidationError as exc:
        raise ApiError(400, *_first_problem(exc)) from None


def _encode_cursor(created_at, pk) -> str:
    raw = json.dumps([created_at.isoformat(), str(pk)], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str, pk: Callable[[str], Any]):
    """(created_at, pk) of a cursor this API gave out; 400 naming ``cursor`` otherwise."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        when, key = json.loads(raw)
        created_at = datetime.fromisoformat(when)
        if created_at.tzinfo is None:
            raise ValueError(when)
        return created_at.astimezone(UTC), pk(key)
    except (ValueError, TypeError, OverflowError):
        raise ApiError(400, "cursor", "is not a cursor this API gave out") from None


def _page(rows, query, pk: Callable[[str], Any]) -> tuple[list, str | None]:
    """One page of ``rows`` (newest first by created_at, then id) and the next cursor."""
    rows = rows.order_by("-created_at", "-pk")
    if query.cursor is not None:
        created_at, last = _decode_cursor(query.cursor, pk)
        rows = rows.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, pk__lt=last))
    items = list(rows[: query.limit + 1])
    more = len(items) > query.limit
    items = items[: query.limit]
    return items, _encode_cursor(items[-1].created_at, items[-1].pk) if more else None


def _notification_pk(value: str) -> int:
    """A notification id as the database can hold it; ValueError otherwise."""
    if not (isinstance(value, str) and value.isascii() and value.isdigit()):
        raise ValueError(value)
    number = int(value)
    field = Notification._meta.pk
    _low, high = connection.ops.integer_field_range(field.get_internal_type())
    if high is not None and number > high:
        raise ValueError(value)
    return number


def notification_json(notification: Notification) -> dict[str, Any]:
    acked_by = notification.acked_by
    return {
        "id": notification.id,
        "dedupe_key": notification.dedupe_key,
        "severity": notification.severity,
        "text": notification.text,
        "segment": notification.segment.key if notification.segment_id else None,
        "provider_ids": list(notification.provider_ids or []),
        "reprobes": notification.reprobes,
        "escalation_level": notification.escalation_level,
        "created_at": notification.created_at.isoformat(),
        "acknowledged_by": acked_by.get_username() if acked_by else None,
        "acknowledged_at": _iso(notification.acked_at),
        "resolved_at": _iso(notification.resolved_at),
    }


@api_view(("GET",))
def notifications(request: HttpRequest) -> JsonResponse:
    query = parse_query(request, NotificationQuery)
    rows = Notification.objects.select_related("segment", "acked_by")
    if query.state == "unacknowledged":
        rows = rows.filter(acked_at__isnull=True)
    elif query.state == "acknowledged":
        rows = rows.filter(acked_at__isnull=False)
    if query.severity != "all":
        rows = rows.filter(severity=query.severity)
    if query.segment is not None:
        rows = rows.filter(segment__key=query.segment)
    if query.since is not None:
        rows = rows.filter(created_at__gte=query.since)
    items, next_cursor = _page(rows, query, _notification_pk)
    return JsonResponse(
        {"items": [notification_json(n) for n in items], "next_cursor": next_cursor}
    )


@api_view(("POST",), atomic=True)
def acknowledge_notification(request: HttpRequest, notification_id: str) -> JsonResponse:
    """R8.2 over the API, as the inbox's button: once; a second answers who was first."""
    require(request, permissions.ACKNOWLEDGE)
    try:
        notification, changed = services.acknowledge_notification(
            _notification_pk(notification_id), user=request.api_user, now=time_source.now()
        )
    except (ValueError, Notification.DoesNotExist):
        raise ApiError(404, None, "no such notification") from None
    return JsonResponse({**notification_json(notification), "acknowledged_now": changed})


def receipt_latency_ms(receipt) -> int | None:
    """From the receipt written before the call to its result (None: not finished)."""
    if receipt.finished_at is None:
        return None
    return max(0, round((receipt.finished_at - receipt.created_at).total_seconds() * 1000))


def _key_present(name: str) -> bool:
    if not name:
        return False
    try:
        return settings.GOVERNANCE_NAMED_SECRET(name) is not None
    except ImproperlyConfigured:
        return False  # a bad name, or both NAME and NAME_FILE set: no usable key


def provider_json(provider: Provider) -> dict[str, Any]:
    """A provider's configuration: its key's variable *name* and whether it is set, never a key."""
    try:
        breaker = provider.health.breaker
    except ProviderHealthState.DoesNotExist:
        breaker = "closed"
    return {
        "provider_id": provider.provider_id,
        "kind": provider.kind,
        "model": provider.model,
        "base_url": provider.base_url,
        "key_env": provider.api_key_env or None,
        "key_present": _key_present(provider.api_key_env),
        "has_script": provider.script is not None,
        "connect_timeout_s": provider.connect_timeout_s,
        "read_timeout_s": provider.read_timeout_s,
        "failure_threshold": provider.failure_threshold,
        "base_cooldown_s": provider.base_cooldown_s,
        "max_cooldown_s": provider.max_cooldown_s,
        "enabled": provider.enabled,
        "breaker": breaker,
        **{
            name: None if getattr(provider, name) is None else str(getattr(provider, name))
            for name in ("price_input_per_mtok", "price_output_per_mtok", "price_cached_per_mtok")
        },
        "currency": provider.currency or None,
        "refusal_schedule": provider.refusal_schedule or {},
        "created_at": provider.created_at.isoformat(),
        "updated_at": provider.updated_at.isoformat(),
    }


def script_problem(script: Any) -> str | None:
    """What the scripted adapter would refuse in ``script`` (None: it runs)."""
    from tasks.adapters import validate_script

    try:
        validate_script(script)
    except ValueError as exc:
        return str(exc)
    return None


def _provider_settings(body: BaseModel, *, exclude_none: bool) -> dict[str, Any]:
    values = body.model_dump(exclude_none=exclude_none, exclude={"provider_id", "reason"})
    if "key_env" in values:
        values["api_key_env"] = values.pop("key_env")
    if values.get("script") is not None and (problem := script_problem(values["script"])):
        raise ApiError(400, "script", problem)
    return values


def _provider_problem(exc: services.ServiceError) -> ApiError:
    """A service's refusal, named by the API's field (``key_env`` is ``api_key_env`` there)."""
    return ApiError(400, "key_env" if exc.field == "api_key_env" else exc.field, exc.message)


def _provider(provider_id: str) -> Provider:
    if not provider_services.PROVIDER_ID.fullmatch(provider_id):
        raise ApiError(404, None, "no such provider")
    try:
        return Provider.objects.select_related("health").get(provider_id=provider_id)
    except Provider.DoesNotExist:
        raise ApiError(404, None, "no such provider") from None


@api_view(("GET",))
def list_providers(request: HttpRequest) -> JsonResponse:
    rows = Provider.objects.select_related("health").order_by("provider_id")
    return JsonResponse({"items": [provider_json(p) for p in rows]})


@api_view(("POST",))
def create_provider(request: HttpRequest) -> JsonResponse:
    require(request, permissions.MANAGE_PROVIDERS)
    body = parse_body(request, ProviderCreate)
    values = _provider_settings(body, exclude_none=False)
    try:
        provider = provider_services.create_provider(
            provider_id=body.provider_id,
            by=request.api_user.get_username(),
            now=time_source.now(),
            **values,
        )
    except provider_services.ProviderExists as exc:
        raise ApiError(409, exc.field, exc.message) from None
    except services.ServiceError as exc:
        raise _provider_problem(exc) from None
    return JsonResponse(provider_json(provider), status=201)


@api_view(("GET",))
def provider_detail(request: HttpRequest, provider_id: str) -> JsonResponse:
    return JsonResponse(provider_json(_provider(provider_id)))


@api_view(("PATCH",))
def update_provider(request: HttpRequest, provider_id: str) -> JsonResponse:
    require(request, permissions.MANAGE_PROVIDERS)
    _provider(provider_id)  # 404 before judging the body
    body = parse_body(request, ProviderUpdate)
    try:
        provider, _changed = provider_services.update_provider(
            provider_id,
            by=request.api_user.get_username(),
            now=time_source.now(),
            reason=body.reason,
            **_provider_settings(body, exclude_none=True),
        )
    except Provider.DoesNotExist:
        raise ApiError(404, None, "no such provider") from None
    except services.ServiceError as exc:
        raise _provider_problem(exc) from None
    return JsonResponse(provider_json(_provider(provider.provider_id)))


def thread_list_json(thread: Thread, open_segments: dict) -> dict[str, Any]:
    answer = thread_json(thread)
    del answer["system_prompt"]  # can be long: GET /api/v1/threads/{id} has it
    answer["open_segment"] = open_segments.get(thread.id)
    return answer


@api_view(("GET",))
def list_threads(request: HttpRequest) -> JsonResponse:
    query = parse_query(request, ThreadQuery)
    items, next_cursor = _page(Thread.objects.all(), query, uuid.UUID)
    open_segments = dict(
        Segment.objects.filter(thread__in=items, closed_at__isnull=True).values_list(
            "thread_id", "key"
        )
    )
    return JsonResponse(
        {"items": [thread_list_json(t, open_segments) for t in items], "next_cursor": next_cursor}
    )


@api_view(("GET",))
def segment_detail(request: HttpRequest, segment_key: str) -> JsonResponse:
    """Any segment (open or closed) by its key, ``session#number`` (``%23`` in the path)."""
    try:
        parse_segment_key(segment_key)  # its shape, before the database sees it
        if "\x00" in segment_key or len(segment_key) > Segment._meta.get_field("key").max_length:
            raise RefusalError(segment_key)
        segment = Segment.objects.select_related("thread").get(key=segment_key)
    except (RefusalError, Segment.DoesNotExist):
        raise ApiError(404, None, "no such segment") from None
    answer = segment_json(segment, time_source.now())
    answer["thread_id"] = str(segment.thread_id)
    return JsonResponse(answer)


threads = _by_method(GET=list_threads, POST=create_thread)
providers = _by_method(GET=list_providers, POST=create_provider)
provider = _by_method(GET=provider_detail, PATCH=update_provider)
