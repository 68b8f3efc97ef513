"""Error answers: every error under ``/api/`` and ``/v1/`` is JSON; no error page shows a secret.

Under ``/v1/`` (the OpenAI-compatible door) every error has OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}`` (``dashboard.openai.errors``):
its clients read that one. What follows for ``/api/`` holds there too, in that shape.

Under ``/api/`` every error answer has the API's one shape, ``{"error": {"field": …,
"message": …}}`` (``dashboard.api.base.error_response``), never Django's HTML page, also
with ``DJANGO_DEBUG=1``:

- ``ApiErrorMiddleware`` (first in ``MIDDLEWARE``) refuses a declared body over
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` with 413 before the view runs (and a
  Content-Length that is not a number with 400); turns an exception out of an API
  view into JSON (``RequestDataTooBig`` — a chunked body, whose size is known only
  when the view reads it — 413, ``SuspiciousOperation`` 400, ``PermissionDenied``
  403, ``Http404`` 404, anything else 500 with a logged reference); and, last line,
  replaces any other non-JSON error answer under ``/api/`` (an unknown address,
  a request refused by a middleware such as a bad Host header, Django's technical
  pages) by the JSON one with the same status and headers.
- ``handler400``/``handler403``/``handler404``/``handler500`` (``dashboard/site/urls.py``)
  answer JSON under ``/api/`` and Django's plain pages elsewhere.
- ``SafeReporterFilter`` (``DEFAULT_EXCEPTION_REPORTER_FILTER``): Django's technical
  500 page (``make run`` has ``DJANGO_DEBUG=1``) and the error e-mails hide connection
  strings (``DATABASE_URL``, ``REDIS_URL``, the broker and result backend, cache
  locations) as well as Django's keys, tokens and passwords, in the settings, the
  request's META (which under runserver carries the process environment) and the
  traceback's local variables.

A 500 names a short reference; the log line with the traceback carries the same one.
"""

from __future__ import annotations

import logging
import re
import secrets
import sys
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import (
    BadRequest,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.core.signals import got_request_exception
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.http.multipartparser import MultiPartParserError
from django.views import defaults
from django.views.debug import SafeExceptionReporterFilter

from dashboard.api.base import error_response
from dashboard.openai.errors import openai_error
from dashboard.site.answer_middleware import AnswerMiddleware

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
DOOR_PREFIX = "/v1/"

# Said when nothing more specific is known (a rewritten page, a handler).
STATUS_MESSAGES = {
    400: "bad request",
    401: "authentication required",
    403: "forbidden",
    404: "no such address",
    405: "this method is not allowed on this address",
    409: "conflict with the current state",
    413: "the request body is too large",
    415: "unsupported content type",
    429: "too many requests; try again later",
    503: "temporarily unavailable; try again later",
}
# Headers of a replaced answer that describe its old body, not the new one.
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding"})
_REF_ATTR = "_api_error_ref"


def is_api(request: HttpRequest) -> bool:
    path = request.path_info or ""
    return path.startswith(API_PREFIX) or path == API_PREFIX.rstrip("/")


def is_door(request: HttpRequest) -> bool:
    """The OpenAI-compatible door: its errors have OpenAI's shape."""
    path = request.path_info or ""
    return path.startswith(DOOR_PREFIX) or path == DOOR_PREFIX.rstrip("/")


def answers_json(request: HttpRequest) -> bool:
    return is_api(request) or is_door(request)


def _error(request: HttpRequest | None, status: int, field: str | None, message: str):
    """The error answer in the shape the address's clients read."""
    if request is not None and is_door(request):
        return openai_error(status, message, param=field)
    return error_response(status, field, message)


def body_limit_message(limit: int) -> str:
    """413's words: the limit is ``settings.DATA_UPLOAD_MAX_MEMORY_SIZE``."""
    return f"the request body is larger than the limit of {limit:,} bytes ({limit / 2**20:g} MiB)"


def too_large(request: HttpRequest | None = None) -> JsonResponse:
    return _error(request, 413, None, body_limit_message(settings.DATA_UPLOAD_MAX_MEMORY_SIZE))


def internal_error(request: HttpRequest, exc_info=None) -> JsonResponse:
    """500 with a short reference; the exception is logged under it (once per request)."""
    ref = getattr(request, _REF_ATTR, None)
    if ref is None:
        ref = _log_internal_error(request, exc_info)
    return _error(request, 500, None, f"internal error; it has been logged (ref {ref})")


def _log_internal_error(request: HttpRequest, exc_info) -> str:
    ref = secrets.token_hex(4)
    setattr(request, _REF_ATTR, ref)
    logger.error(
        "internal error (ref %s) on %s %s",
        ref,
        request.method,
        request.path,
        # No exception at hand (a 500 answer replaced): the line still names the ref.
        exc_info=exc_info if exc_info and exc_info[0] is not None else None,
    )
    return ref


def _record_on_span(exc: BaseException) -> None:
    # The OpenTelemetry Django middleware (outside this one) is not told about an
    # exception this middleware answers; the request's span still records it.
    from opentelemetry import trace

    span = trace.get_current_span()
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))


def _on_uncaught_exception(sender, request=None, **kwargs) -> None:
    """An exception Django handles itself (one raised in a middleware, not in a
    view): log it with a reference now, while it is being handled, so the JSON
    500 that replaces Django's answer names the same reference."""
    if request is not None and answers_json(request) and getattr(request, _REF_ATTR, None) is None:
        _log_internal_error(request, sys.exc_info())


got_request_exception.connect(_on_uncaught_exception, dispatch_uid="dashboard.site.errors.api_500")


def exception_response(request: HttpRequest, exc: Exception) -> JsonResponse:
    """The JSON answer for an exception out of an API (or door) view."""
    if isinstance(exc, RequestDataTooBig):
        return too_large(request)
    if isinstance(exc, Http404):
        return _error(request, 404, None, _readable(exc) or STATUS_MESSAGES[404])
    if isinstance(exc, PermissionDenied):
        return _error(request, 403, None, _readable(exc) or STATUS_MESSAGES[403])
    if isinstance(exc, BadRequest):
        return _error(request, 400, None, _readable(exc) or STATUS_MESSAGES[400])
    if isinstance(exc, MultiPartParserError):
        return _error(request, 400, None, "the multipart body could not be parsed")
    if isinstance(exc, UnreadablePostError):
        return _error(request, 400, None, "the request body could not be read")
    if isinstance(exc, SuspiciousOperation):
        # Its text is for the security log (it may name settings), not for the client.
        logging.getLogger(f"django.security.{type(exc).__name__}").error(
            "%s on %s %s", exc, request.method, request.path
        )
        return _error(request, 400, None, STATUS_MESSAGES[400])
    if isinstance(exc, OperationalError | InterfaceError):
        # The database went away under the request (a restart, a failover): its
        # transaction rolled back, so the same request may simply be sent again.
        logging.getLogger(__name__).warning(
            "database unavailable on %s %s: %s", request.method, request.path, exc
        )
        response = _error(
            request,
            503,
            None,
            "the database is unavailable for a moment; nothing was written, retry",
        )
        response["Retry-After"] = "1"
        return response
    _record_on_span(exc)
    return internal_error(request, (type(exc), exc, exc.__traceback__))


def _readable(exc: Exception) -> str:
    text = str(exc) if exc.args and isinstance(exc.args[0], str) else ""
    return text.strip()[:500]


def declared_length(raw: str) -> int | None:
    """A Content-Length header's value, or None when it is not a plain number."""
    raw = raw or "0"
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        return None
    return int(raw)


def _declared_length(request: HttpRequest) -> int | None:
    return declared_length(request.META.get("CONTENT_LENGTH", ""))


class ApiErrorMiddleware(AnswerMiddleware):
    """JSON errors under /api/ and /v1/ (see the module's docstring). Sync and async."""

    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        if self.async_mode:
            # Django would run a plain process_view in a thread for every request.
            self.process_view = self._process_view_async

    def process_view(self, request: HttpRequest, view_func, view_args, view_kwargs):
        # Here rather than in __call__: the refusal passes every middleware's
        # process_response (security headers) like any view's answer.
        return self._refuse_early(request)

    async def _process_view_async(self, request: HttpRequest, view_func, view_args, view_kwargs):
        return self._refuse_early(request)

    def _refuse_early(self, request: HttpRequest) -> JsonResponse | None:
        """A declared body over the limit is refused before anything reads it."""
        if not answers_json(request):
            return None
        length = _declared_length(request)
        if length is None:
            return _error(request, 400, "Content-Length", "must be a number of bytes")
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            return too_large(request)
        return None

    def process_exception(self, request: HttpRequest, exception: Exception):
        if not answers_json(request):
            return None
        return exception_response(request, exception)

    def _finish(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        if (
            response.status_code < 400
            or not answers_json(request)
            or response.get("Content-Type", "").startswith("application/json")
        ):
            return response
        replacement = api_error_for_status(request, response.status_code)
        for name, value in response.items():
            if name.lower() not in _BODY_HEADERS:
                replacement[name] = value
        replacement.cookies = response.cookies
        response.close()
        return replacement


def api_error_for_status(request: HttpRequest, status: int) -> JsonResponse:
    if status == 500:
        return internal_error(request, sys.exc_info())
    if status == 413:
        return too_large(request)
    message = STATUS_MESSAGES.get(status)
    if message is None:
        message = HttpResponse(status=status).reason_phrase.lower()
    return _error(request, status, None, message)


# --------------------------------------------------------------------------- handlers


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if answers_json(request):
        if isinstance(exception, RequestDataTooBig):
            return too_large(request)
        return _error(request, 400, None, STATUS_MESSAGES[400])
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if answers_json(request):
        return _error(request, 403, None, _readable(exception) or STATUS_MESSAGES[403])
    return defaults.permission_denied(request, exception)


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if answers_json(request):
        # A Resolver404's text is the URL patterns tried: not for the client.
        readable = _readable(exception) if type(exception) is Http404 else ""
        return _error(request, 404, None, readable or STATUS_MESSAGES[404])
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if answers_json(request):
        return internal_error(request, sys.exc_info())
    return defaults.server_error(request)


# --------------------------------------------------------------------------- debug pages


class SafeReporterFilter(SafeExceptionReporterFilter):
    """Django's filter, plus connection strings.

    Hidden by name: Django's API|TOKEN|KEY|SECRET|PASS|SIGNATURE (and AUTH,
    HTTP_COOKIE), plus URL|DSN|DATABASE|BROKER|REDIS|BACKEND|LOCATION, in settings
    and request.META. Hidden by value, wherever it appears (any setting, META
    value or traceback variable): every connection string found in the settings
    (a URL with a password or of a non-web scheme: postgres://, redis://, …), its
    password, and the values of password, secret and token settings.
    """

    hidden_settings = re.compile(
        "API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE"
        "|URL|DSN|DATABASE|BROKER|REDIS|BACKEND|LOCATION",
        flags=re.IGNORECASE,
    )
    _credential_name = re.compile(r"(PASSWORD|SECRET|SECRET_KEY|SECRET_KEY_FALLBACKS|TOKEN)$")

    # Django keeps one instance of the default filter; the values are found again
    # when the settings object changes (a test's override), not per variable.
    _found: tuple[object, tuple[str, ...]] | None = None

    @property
    def secret_values(self) -> tuple[str, ...]:
        current = settings._wrapped
        if self._found is None or self._found[0] is not current:
            self._found = (current, self._find_secret_values())
        return self._found[1]

    def _find_secret_values(self) -> tuple[str, ...]:
        found: set[str] = set()

        def walk(key: str, value) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(str(k), v)
            elif isinstance(value, list | tuple):
                for v in value:
                    walk(key, v)
            elif isinstance(value, str) and value:
                if self._credential_name.search(key.upper()) and len(value) >= 8:
                    found.add(value)
                if "://" in value:
                    try:
                        parts = urlsplit(value)
                        password = parts.password
                    except ValueError:
                        found.add(value)
                        return
                    if password:
                        found.add(value)
                        if len(password) >= 4:
                            found.add(password)
                    elif parts.scheme not in ("http", "https", ""):
                        found.add(value)

        for name in dir(settings):
            if name.isupper():
                walk(name, getattr(settings, name))
        # Longest first: a URL is hidden whole, not around its password.
        return tuple(sorted(found, key=len, reverse=True))

    def _carries_secret(self, value) -> bool:
        if not self.secret_values or isinstance(value, int | float | bool | type(None)):
            return False
        try:
            text = value if isinstance(value, str) else repr(value)
        except Exception:  # a broken __repr__: the page shows it as it can
            return False
        return any(secret in text for secret in self.secret_values)

    def cleanse_setting(self, key, value):
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str | bytes) and self._carries_secret(
            cleansed if isinstance(cleansed, str) else cleansed.decode("latin1")
        ):
            return self.cleansed_substitute
        return cleansed

    def get_traceback_frame_variables(self, request, tb_frame):
        return [
            (name, self.cleansed_substitute if self._carries_secret(value) else value)
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]
