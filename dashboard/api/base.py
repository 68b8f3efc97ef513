"""The API's request handling: bearer-token authentication, one decorator per
view (methods, transaction, errors), permission checks, bodies and query strings
validated by their pydantic schemas, and cursor pages.

Bad input answers 4xx with ``{"error": {"field": …, "message": …}}`` and
writes nothing. Every change goes through ``governance.services``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from functools import wraps
from typing import Any, TypeVar

import pydantic_core
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Q
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from dashboard.site import permissions
from governance import services, time_source
from governance.models import ApiToken
from governance.services import statements as sql
from governance.services.admission import Overloaded
from governance.services.tokens import token_digest

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


TOKEN_USE_PRECISION = timedelta(minutes=1)


User = get_user_model()
USER_FIELDS = tuple(User._meta.concrete_fields)
USER_ATTNAMES = [field.attname for field in USER_FIELDS]
# Every API request reads this: fixed SQL (services.statements), a fenced hot path.
TOKEN_AND_USER = sql.Read(
    {
        **sql.fields_of(ApiToken, "id", "name", "last_used_at", "scopes"),
        **{f"user_{field.attname}": field for field in USER_FIELDS},
    },
    f"FROM {sql.table(ApiToken)} JOIN {sql.table(User)}"
    f" ON {sql.table(User)}.id = {sql.table(ApiToken)}.user_id"
    f" WHERE {sql.table(ApiToken)}.key_digest = %s AND {sql.table(ApiToken)}.revoked_at IS NULL",
)


def authenticate(request: HttpRequest):
    """The token's user, read with the token in one fixed statement, or 401.
    The token itself (id and name: the run's client) is ``request.api_token``,
    its scopes ``request.api_scopes``."""
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
    request.api_token = ApiToken.from_db(  # values in the model's field order, as from_db wants
        connection.alias,
        ["id", "user_id", "name", "last_used_at", "scopes"],
        [row.id, user.pk, row.name, row.last_used_at, row.scopes],
    )
    sql.cache_related(request.api_token, "user", user)
    now = time_source.now()
    if row.last_used_at is None or now - row.last_used_at >= TOKEN_USE_PRECISION:
        # "Last used" to the minute: not one write per request of a busy client.
        ApiToken.objects.filter(pk=row.id).update(last_used_at=now)
    return user


def api_view(methods: tuple[str, ...], *, permission: Any = None, atomic: bool = False) -> Callable:
    """``permission``: what the token's user must hold (and its scopes allow),
    checked before anything is read or written; a write must name one (None: a
    read any token may make). ``atomic``: the token check, the reads and the
    view's writes are one transaction (one commit for a hot write path such as
    submitting a run)."""
    if permission is None and permissions.WRITES.intersection(methods):
        raise ImproperlyConfigured(f"a write ({', '.join(methods)}) must declare its permission")

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
                    request.api_user = authenticate(request)
                    if checked := permissions.checked_before_the_view(permission):
                        require(request, checked)
                    return view(request, *args, **kwargs)
            except ApiError as exc:
                return error_response(exc.status, exc.field, exc.message)
            except services.ServiceError as exc:
                return error_response(400, exc.field, exc.message)
            except Overloaded as exc:
                response = error_response(429, None, exc.message)
                response["Retry-After"] = str(exc.retry_after_s)
                return response

        return permissions.declare(wrapper, dict.fromkeys(methods, permission))

    return decorate


def require(request: HttpRequest, permission: str) -> None:
    """403 unless the token's user holds ``permission`` (and its scopes allow it)."""
    user = getattr(request, "api_user", None) or request.user
    if not permissions.allowed(user, permission, getattr(request, "api_scopes", ())):
        raise ApiError(403, None, permissions.refusal(permission))


def require_visible(request: HttpRequest, owner_id: Any, what: str) -> None:
    """404 unless the token's user owns it or sees everything: someone else's
    thread or run is answered as if it did not exist."""
    if not permissions.may_see(request.api_user, owner_id, request.api_scopes):
        raise ApiError(404, None, f"no such {what}")


def parse_body(request: HttpRequest, schema: type[BodyT]) -> BodyT:
    """The request's JSON body, validated by its endpoint's schema (``dashboard.api.schemas``)."""
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


def get_or_404(model, **lookup):
    try:
        return model.objects.get(**lookup)
    except model.DoesNotExist:
        raise ApiError(404, None, f"no such {model.__name__.lower()}") from None


def parse_uuid(value: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ApiError(404, None, f"no such {what}") from None


def iso(value):
    return value.isoformat() if value else None


def by_method(**views: Callable) -> Callable:
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

    return permissions.declare(
        dispatch,
        {method: view.required_permissions[method] for method, view in views.items()},
    )


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


def page(rows, query, pk: Callable[[str], Any], at: str = "created_at") -> tuple[list, str | None]:
    """One page of ``rows`` (newest first by the time field ``at``, then id) and the next cursor."""
    rows = rows.order_by(f"-{at}", "-pk")
    if query.cursor is not None:
        time, last = _decode_cursor(query.cursor, pk)
        rows = rows.filter(Q(**{f"{at}__lt": time}) | Q(**{at: time, "pk__lt": last}))
    items = list(rows[: query.limit + 1])
    more = len(items) > query.limit
    items = items[: query.limit]
    return items, _encode_cursor(getattr(items[-1], at), items[-1].pk) if more else None
