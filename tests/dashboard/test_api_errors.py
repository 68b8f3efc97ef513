"""Every error under /api/ is JSON, and no error page shows a secret.

Through the Django test client (WSGI and ASGI), a live WSGI server (pytest-django's
``live_server``) and a real uvicorn server (what ``make run`` serves): unknown
addresses, uncaught exceptions (in a view and in a middleware), bodies over
``DATA_UPLOAD_MAX_MEMORY_SIZE``, requests Django refuses early, wrong methods,
missing tokens, wrong content types and bad ``Last-Event-ID`` values all answer
``{"error": {"field": …, "message": …}}``; with ``DJANGO_DEBUG=1`` too. Django's
technical 500 page (``DJANGO_DEBUG=1``) hides connection strings.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from urllib.parse import quote

import httpx
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings as django_settings
from django.test import AsyncClient, Client, RequestFactory
from django.urls import URLPattern

from dashboard.api.urls import api_patterns
from dashboard.site import errors
from dashboard.site.urls import urlpatterns
from governance import services, time_source
from governance.models import ApiToken, Provider, Route, Run, Thread, ToolServer
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from governance.services.tokens import token_digest
from tests import facts as written
from tests.asgi_server import serving

pytestmark = pytest.mark.django_db

TOKEN = "api-errors-token-" + "e" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIMIT = 2_621_440  # Django's default DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MiB
BIG = 12 * 1024 * 1024
REF = re.compile(r"^internal error; it has been logged \(ref ([0-9a-f]{8})\)$")

# Every API address, the methods it answers (its Allow header), whether it reads a
# JSON body (with its method other than GET) and whether it needs a token.
# ``api-openapi`` (the public description) is optional here.
ENDPOINTS = {
    "api-threads": ("GET, POST", True, True),
    "api-thread": ("GET", False, True),
    "api-segment": ("GET", False, True),
    "api-runs": ("POST", True, True),
    "api-boundaries": ("POST", True, True),
    "api-run": ("GET", False, True),
    "api-run-cancel": ("POST", False, True),
    "api-run-events": ("GET", False, True),
    "api-run-acks": ("POST", True, True),
    "api-notifications": ("GET", False, True),
    "api-notification-ack": ("POST", False, True),
    "api-approvals": ("GET", False, True),
    "api-approval": ("GET, POST", True, True),
    "api-incidents": ("GET", False, True),
    "api-incident": ("GET", False, True),
    "api-incident-ack": ("POST", True, True),
    "api-incident-resolve": ("POST", True, True),
    "api-providers": ("GET, POST", True, True),
    "api-provider": ("GET, PATCH", True, True),
    "api-routes": ("GET, POST", True, True),
    "api-route": ("GET, PATCH", True, True),
    "api-segment-detail": ("GET", False, True),
    "api-tools": ("GET, POST", True, True),
    "api-tool": ("GET, PATCH", True, True),
    "api-insights-reprobes": ("GET", False, True),
    "api-openapi": ("GET", False, False),
}
OPTIONAL = {"api-openapi"}
OTHER_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def methods_of(allowed: str) -> list[str]:
    return allowed.split(", ")


def body_method(allowed: str) -> str:
    """The method of an address that reads the body (not GET)."""
    return next(method for method in methods_of(allowed) if method != "GET")


# --------------------------------------------------------------------------- helpers


def assert_json_error(response, status: int, field: str | None = None) -> str:
    body = response.content if hasattr(response, "content") else response.read()
    assert response.status_code == status, body[:500]
    assert response.headers["Content-Type"].startswith("application/json"), body[:500]
    error = json.loads(body)["error"]
    assert set(error) == {"field", "message"}
    assert error["field"] == field, error
    assert isinstance(error["message"], str) and error["message"].strip()
    return error["message"]


def secrets_in(text: str) -> list[str]:
    """The connection strings (and the DB password) that must never be shown."""
    values = [
        django_settings.DATABASE_URL,
        django_settings.CELERY_BROKER_URL,
        django_settings.REDIS_URL or "",
        django_settings.CELERY_RESULT_BACKEND or "",
        django_settings.DATABASES["default"].get("PASSWORD") or "",
        django_settings.SECRET_KEY,
    ]
    return [value for value in values if value and value in text]


@pytest.fixture
def user(django_user_model):
    from django.contrib.auth.models import Permission

    the_user = django_user_model.objects.create_user("errors-operator")
    the_user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=[
                "apply_boundary",
                "submit_run",
                "cancel_run",
                "change_provider",
                "change_toolserver",
                "acknowledge_notification",
                "decide_approval",
            ]
        )
    )
    ApiToken.objects.create(user=the_user, name="t", key_digest=token_digest(TOKEN))
    return the_user


@pytest.fixture
def thread(user):
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    ToolServer.objects.create(name="files", kind="mcp", url="http://127.0.0.1:9/mcp")
    # A route of the tool's name: one ``name`` fills both addresses (api_urls).
    Route.objects.create(
        name="files", provider_chain=["p"], created_at=time_source.now(),
        updated_at=time_source.now(),
    )  # fmt: skip
    return services.create_thread(provider_chain=["p"], title="t", user=user, now=time_source.now())


@pytest.fixture
def run(thread, user):
    the_run, _stage, _ = services.submit_run(thread, input="hi", user=user, now=time_source.now())
    return the_run


def api_urls(thread, run) -> dict[str, str]:
    """name → concrete path, for every pattern of dashboard/site/urls.py under api/."""
    values = {
        "thread_id": str(thread.id),
        "run_id": str(run.id),
        "notification_id": "1",
        "incident_id": "1",
        "approval_id": "1",
        "provider_id": "p",
        "name": "files",
        "segment_key": quote(services.open_segment(thread).key, safe=""),
    }
    paths = {}
    for pattern in api_patterns:
        route = str(pattern.pattern)
        for name, value in values.items():
            route = route.replace(f"<str:{name}>", value)
        assert "<" not in route, route
        paths[pattern.name] = "/" + route
    return paths


def big_json(size: int = BIG) -> bytes:
    return b'{"input": "' + b"a" * size + b'", "through": 1, "provider_chain": ["p"]}'


@pytest.fixture
def debug(settings):
    """``make run``'s default: DJANGO_DEBUG=1."""
    settings.DEBUG = True
    return settings


@pytest.fixture(params=[False, True], ids=["debug-0", "debug-1"])
def any_debug(request, settings):
    settings.DEBUG = request.param
    return request.param


def test_every_api_address_of_the_urls_is_pinned_here():
    """A new address under api/v1/ joins ENDPOINTS (and so every test below)."""
    routes = {
        p.name
        for p in urlpatterns
        if isinstance(p, URLPattern) and str(p.pattern).startswith("api/v1/")
    }
    assert routes == {p.name for p in api_patterns}
    assert routes <= set(ENDPOINTS)
    assert set(ENDPOINTS) - OPTIONAL <= routes


def test_the_body_limit_is_djangos_default_and_named_in_settings():
    assert django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE == LIMIT
    assert "2,621,440 bytes" in errors.body_limit_message(LIMIT)


# --------------------------------------------------------------------------- 404


@pytest.mark.parametrize(
    "path",
    [
        "/api/nope",
        "/api/v1/",
        "/api/v1/nope",
        "/api/v2/threads",
        "/api/v1/threads/x/y/z",
        "/api/v1/runs/",
    ],
)
@pytest.mark.parametrize("headers", [{}, AUTH], ids=["anonymous", "token"])
def test_unknown_api_addresses_are_404_json(client, user, any_debug, path, headers):
    response = client.get(path, headers=headers)
    message = assert_json_error(response, 404)
    assert "tried" not in message and "urlpatterns" not in message.lower()
    assert response["X-Content-Type-Options"] == "nosniff"  # the replaced page's headers
    response = client.post(path, data="{}", content_type="application/json", headers=headers)
    assert_json_error(response, 404)


def test_unknown_pages_outside_the_api_stay_html(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


# --------------------------------------------------------------------------- 500


def _boom(*args, **kwargs):
    dsn = django_settings.DATABASE_URL  # a frame variable holding a connection string
    raise RuntimeError(f"the database went away ({len(dsn)})")


def test_an_exception_in_a_view_is_500_json_with_a_logged_ref(
    client, user, thread, any_debug, monkeypatch, caplog
):
    monkeypatch.setattr(services, "open_segment", _boom)
    with caplog.at_level(logging.ERROR, logger="dashboard.site.errors"):
        response = client.get(f"/api/v1/threads/{thread.id}", headers=AUTH)
    message = assert_json_error(response, 500)
    ref = REF.match(message).group(1)
    logged = [
        r for r in caplog.records if r.name == "dashboard.site.errors" and ref in r.getMessage()
    ]
    assert len(logged) == 1 and logged[0].exc_info[0] is RuntimeError
    assert secrets_in(response.content.decode()) == []
    assert "Traceback" not in response.content.decode()


def test_each_500_has_its_own_ref(client, user, thread, monkeypatch):
    monkeypatch.setattr(services, "open_segment", _boom)
    refs = {
        REF.match(
            assert_json_error(client.get(f"/api/v1/threads/{thread.id}", headers=AUTH), 500)
        ).group(1)
        for _ in range(3)
    }
    assert len(refs) == 3


def test_an_exception_in_a_middleware_is_500_json_with_the_logged_ref(
    user, any_debug, monkeypatch, caplog
):
    from django.contrib.auth.middleware import AuthenticationMiddleware

    def broken(self, request):
        raise RuntimeError("session store down")

    monkeypatch.setattr(AuthenticationMiddleware, "process_request", broken)
    browser = Client(raise_request_exception=False)
    with caplog.at_level(logging.ERROR, logger="dashboard.site.errors"):
        response = browser.get("/api/v1/threads/whatever", headers=AUTH)
    message = assert_json_error(response, 500)
    ref = REF.match(message).group(1)
    logged = [
        r for r in caplog.records if r.name == "dashboard.site.errors" and ref in r.getMessage()
    ]
    assert len(logged) == 1 and logged[0].exc_info[0] is RuntimeError
    assert secrets_in(response.content.decode()) == []
    # Outside the API the page stays Django's (and, with DEBUG=1, the filtered technical one).
    page = browser.get("/login/")
    assert page.status_code == 500 and page["Content-Type"].startswith("text/html")
    assert secrets_in(page.content.decode()) == []


def test_an_exception_in_an_async_view_is_500_json(user, run, monkeypatch, debug):
    from dashboard.api import events as stream_views

    monkeypatch.setattr(stream_views.stream, "connect_viewer", _boom)

    async def fetch():
        return await AsyncClient().get(f"/api/v1/runs/{run.id}/events", headers=AUTH)

    response = async_to_sync(fetch)()
    REF.match(assert_json_error(response, 500)).group(1)


# --------------------------------------------------------------------------- 400, 403 from Django


@pytest.mark.parametrize(
    ("raised", "status"),
    [
        ("permission", 403),
        ("suspicious", 400),
        ("bad_request", 400),
        ("http404", 404),
    ],
)
def test_django_exceptions_out_of_a_view_are_json(
    client, user, thread, any_debug, monkeypatch, raised, status
):
    from django.core.exceptions import BadRequest, PermissionDenied, SuspiciousOperation
    from django.http import Http404

    exceptions = {
        "permission": PermissionDenied("not yours"),
        "suspicious": SuspiciousOperation("ALLOWED_HOSTS says no"),
        "bad_request": BadRequest("that makes no sense"),
        "http404": Http404("no such thing"),
    }

    def raising(*args, **kwargs):
        raise exceptions[raised]

    monkeypatch.setattr(services, "open_segment", raising)
    message = assert_json_error(client.get(f"/api/v1/threads/{thread.id}", headers=AUTH), status)
    assert "ALLOWED_HOSTS" not in message


def test_a_host_django_refuses_is_400_json(client, user, any_debug):
    response = client.get("/api/v1/threads/x", headers=AUTH, HTTP_HOST="evil.example")
    message = assert_json_error(response, 400)
    assert "ALLOWED_HOSTS" not in message and "evil" not in message


@pytest.mark.parametrize("length", ["abc", "-1", "1e9", "9" * 40])
def test_a_content_length_that_is_not_a_number_is_400_json(client, user, thread, length):
    response = client.generic(
        "POST",
        "/api/v1/threads",
        data=b"{}",
        content_type="application/json",
        headers=AUTH,
        CONTENT_LENGTH=length,
    )
    assert_json_error(response, 400, "Content-Length")


# --------------------------------------------------------------------------- 413


def body_paths(thread, run) -> list[tuple[str, str]]:
    """(method, path) of every address that reads a body."""
    urls = api_urls(thread, run)
    return [
        (body_method(allowed), urls[name])
        for name, (allowed, reads_body, _token) in ENDPOINTS.items()
        if reads_body
    ]


def test_a_body_over_the_limit_is_413_json_naming_it(client, user, thread, run, any_debug):
    before = (Thread.objects.count(), Run.objects.count())
    data = big_json()
    for method, path in body_paths(thread, run):
        started = time.monotonic()
        response = client.generic(
            method, path, data=data, content_type="application/json", headers=AUTH
        )
        message = assert_json_error(response, 413)
        assert "2,621,440 bytes" in message, path
        # Refused before the view, yet through every middleware (security headers).
        assert response["X-Content-Type-Options"] == "nosniff"
        assert time.monotonic() - started < 2, path
        # Without a token too: the size is refused before anything else.
        anonymous = client.generic(method, path, data=data, content_type="application/json")
        assert_json_error(anonymous, 413)
    assert (Thread.objects.count(), Run.objects.count()) == before


def test_a_body_just_at_the_limit_is_read(client, user, thread):
    filler = LIMIT - len(big_json(0))
    response = client.generic(
        "POST",
        "/api/v1/threads",
        data=big_json(filler),
        content_type="application/json",
        headers=AUTH,
    )
    # Read and judged (a 2.5 MiB title is not refused for its size).
    assert response.status_code != 413, response.content[:300]


def test_a_body_found_too_big_when_the_view_reads_it_is_413_json(
    client, user, thread, run, monkeypatch, any_debug
):
    """The view's own read (a chunked body, whose size is not declared up front)."""
    monkeypatch.setattr(errors.ApiErrorMiddleware, "_refuse_early", lambda self, request: None)
    for method, path in body_paths(thread, run):
        response = client.generic(
            method, path, data=big_json(), content_type="application/json", headers=AUTH
        )
        assert "2,621,440 bytes" in assert_json_error(response, 413), path


def test_a_body_over_the_limit_is_413_json_under_asgi(user, thread, run):
    paths = body_paths(thread, run)

    async def post_all():
        client = AsyncClient()
        return [
            await client.generic(
                method, path, data=big_json(), content_type="application/json", headers=AUTH
            )
            for method, path in paths
        ]

    for response in async_to_sync(post_all)():
        assert "2,621,440 bytes" in assert_json_error(response, 413)


# --------------------------------------------------------------------------- 405, 401, 415


def test_every_api_address_answers_other_methods_405_json_with_allow(client, user, thread, run):
    for name, path in api_urls(thread, run).items():
        allowed, _reads_body, _token = ENDPOINTS[name]
        for method in OTHER_METHODS:
            if method in methods_of(allowed):
                continue
            for headers in ({}, AUTH):
                response = client.generic(method, path, headers=headers)
                assert_json_error(response, 405)
                assert response["Allow"] == allowed, (name, method)


def test_every_api_address_answers_401_json_without_a_token(client, user, thread, run):
    for name, path in api_urls(thread, run).items():
        allowed, _reads_body, needs_token = ENDPOINTS[name]
        if not needs_token:
            continue
        for method in methods_of(allowed):
            response = client.generic(method, path, data=b"{}", content_type="application/json")
            assert_json_error(response, 401, "Authorization")
            assert response["WWW-Authenticate"].startswith("Bearer"), (name, method)


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml"],
)
def test_every_body_address_answers_415_json_for_other_content(
    client, user, thread, run, content_type
):
    for name, path in api_urls(thread, run).items():
        allowed, reads_body, _token = ENDPOINTS[name]
        if not reads_body:
            continue
        response = client.generic(
            body_method(allowed),
            path,
            data=b'{"through": 1}',
            content_type=content_type,
            headers=AUTH,
        )
        assert_json_error(response, 415)


# --------------------------------------------------------------------------- Last-Event-ID


BAD_IDS = [
    str(10**30),
    str(2**63),
    "9" * 5000,
    "-1",
    "+5",
    " 5",
    "1_0",
    "5.0",
    "abc",
    "\u0663",  # ARABIC-INDIC DIGIT THREE: int() takes it, it is no event id
]


@pytest.mark.parametrize("value", BAD_IDS)
def test_last_event_id_out_of_range_or_not_digits_is_400_json(client, user, run, value):
    url = f"/api/v1/runs/{run.id}/events"
    started = time.monotonic()
    by_query = client.get(url, {"last_event_id": value}, headers=AUTH)
    assert_json_error(by_query, 400, "Last-Event-ID")
    if value.isascii():  # an HTTP header value is latin-1
        by_header = client.get(url, headers={**AUTH, "Last-Event-ID": value})
        assert_json_error(by_header, 400, "Last-Event-ID")
    assert time.monotonic() - started < 1
    assert not run.viewers.exists()


@pytest.mark.django_db(transaction=True)  # the stream reads from its own connection
def test_last_event_id_at_the_largest_stored_id_is_accepted(client, user, run):
    """The largest id RunViewer.last_event_id holds (int4 today; RunEvent.id is a bigint)."""
    from django.db import connection

    from governance.models import RunViewer

    field = RunViewer._meta.get_field("last_event_id")
    largest = min(2**63 - 1, connection.ops.integer_field_range(field.get_internal_type())[1])
    too_big = client.get(
        f"/api/v1/runs/{run.id}/events", headers={**AUTH, "Last-Event-ID": str(largest + 1)}
    )
    assert str(largest) in assert_json_error(too_big, 400, "Last-Event-ID")
    settlement = Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "done for the test")
    written.settle(run, settlement, time_source.now())
    response = client.get(
        f"/api/v1/runs/{run.id}/events", headers={**AUTH, "Last-Event-ID": "00" + str(largest)}
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    b"".join(response.streaming_content)  # nothing after it; the settled stream closes


# --------------------------------------------------------------------------- the debug page


def _joined(*parts: str) -> str:
    # Built at run time: the technical page shows the source lines around each
    # frame, and a secret written whole in this file would show up there.
    return "-".join(parts)


DB_PASSWORD = _joined("db", "pw", "s3cr3t", "7781")
REDIS_PASSWORD = _joined("redis", "pw", "s3cr3t", "9921")
BROKER_PASSWORD = _joined("broker", "pw", "s3cr3t", "1187")
SENTRY_KEY = _joined("public", "key", "3311")
SECRET_DB = f"postgres://gov:{DB_PASSWORD}@db.internal:5432/governance"
SECRET_REDIS = f"redis://:{REDIS_PASSWORD}@cache.internal:6379/0"
SECRET_BROKER = f"redis://:{BROKER_PASSWORD}@broker.internal:6379/1"


@pytest.fixture
def leaky_settings(debug):
    """Connection strings with passwords, as production-like settings would hold."""
    debug.DATABASE_URL = SECRET_DB
    debug.REDIS_URL = SECRET_REDIS
    debug.CELERY_BROKER_URL = SECRET_BROKER
    debug.CELERY_RESULT_BACKEND = SECRET_REDIS
    debug.CACHES = {
        **django_settings.CACHES,
        "default": {**django_settings.CACHES["default"], "LOCATION": SECRET_REDIS},
    }
    debug.SENTRY_DSN = f"https://{SENTRY_KEY}@o1.ingest.example/42"
    return debug


SECRET_PARTS = (
    SECRET_DB,
    SECRET_REDIS,
    SECRET_BROKER,
    DB_PASSWORD,
    REDIS_PASSWORD,
    BROKER_PASSWORD,
    SENTRY_KEY,
)


def _leaky_boom(*args, **kwargs):
    dsn = django_settings.DATABASE_URL
    conninfo = f"host=db.internal password={DB_PASSWORD} dbname=governance"
    raise RuntimeError(f"cannot connect ({len(dsn)}, {len(conninfo)})")


def test_the_technical_500_page_hides_connection_strings(leaky_settings):
    request = RequestFactory().get(
        "/runs/",
        # Under runserver the request's META carries the process environment.
        DATABASE_URL=SECRET_DB,
        REDIS_URL=SECRET_REDIS,
        CELERY_BROKER_URL=SECRET_BROKER,
        SOME_HARMLESS_NAME=SECRET_DB,
    )
    from django.views.debug import technical_500_response

    try:
        _leaky_boom()
    except RuntimeError:
        import sys

        response = technical_500_response(request, *sys.exc_info())
    html = response.content.decode()
    assert response.status_code == 500 and "cannot connect" in html
    assert "DATABASE_URL" in html and "CELERY_BROKER_URL" in html  # listed, hidden
    leaked = [part for part in SECRET_PARTS if part in html]
    assert leaked == []
    assert secrets_in(html) == []


def test_a_page_500_with_debug_1_shows_no_connection_string(
    client, leaky_settings, make_user, monkeypatch
):
    from dashboard.queries import overview

    make_user("page-viewer")
    browser = Client(raise_request_exception=False)
    browser.login(username="page-viewer", password="pw-for-tests-1")
    monkeypatch.setattr(overview, "incidents_needing_a_person", _leaky_boom)
    response = browser.get("/", DATABASE_URL=SECRET_DB, REDIS_URL=SECRET_REDIS)
    html = response.content.decode()
    assert response.status_code == 500 and "Traceback" in html  # Django's technical page
    assert [part for part in SECRET_PARTS if part in html] == []
    assert secrets_in(html) == []


def test_an_api_500_with_debug_1_is_json_without_secrets(
    client, user, thread, leaky_settings, monkeypatch
):
    monkeypatch.setattr(services, "open_segment", _leaky_boom)
    response = client.get(f"/api/v1/threads/{thread.id}", headers=AUTH)
    REF.match(assert_json_error(response, 500))
    body = response.content.decode()
    assert len(body) < 200 and [part for part in SECRET_PARTS if part in body] == []


def test_the_filter_keeps_djangos_names_and_adds_connection_names():
    from django.views.debug import get_default_exception_reporter_filter

    reporter_filter = get_default_exception_reporter_filter()
    assert isinstance(reporter_filter, errors.SafeReporterFilter)
    for name in (
        "API_KEY",
        "AUTH_TOKEN",
        "SECRET_KEY",
        "EMAIL_HOST_PASSWORD",
        "SIGNATURE",
        "DATABASE_URL",
        "SENTRY_DSN",
        "DATABASES",
        "CELERY_BROKER_URL",
        "REDIS_URL",
        "CELERY_RESULT_BACKEND",
        "LOCATION",
    ):
        assert reporter_filter.cleanse_setting(name, "x") == reporter_filter.cleansed_substitute
    assert reporter_filter.cleanse_setting("TIME_ZONE", "UTC") == "UTC"


# --------------------------------------------------------------------------- real servers


pytest_live = pytest.mark.django_db(transaction=True)


def _live_checks(base: str, thread_id: str, run_id: str, *, chunked: bool) -> None:
    paths = [
        "/api/v1/threads",
        f"/api/v1/threads/{thread_id}/runs",
        f"/api/v1/runs/{run_id}/acks",
    ]
    headers = {**AUTH, "Content-Type": "application/json"}
    with httpx.Client(base_url=base, timeout=30) as http:
        for path in paths:
            started = time.monotonic()
            response = http.post(path, content=big_json(), headers=headers)
            assert "2,621,440 bytes" in assert_json_error(response, 413), path
            assert time.monotonic() - started < 5, path
            if chunked:  # no Content-Length: the size shows when the view reads the body

                def parts():
                    data = big_json()
                    for start in range(0, len(data), 1 << 20):
                        yield data[start : start + (1 << 20)]

                response = http.post(path, content=parts(), headers=headers)
                assert "content-length" not in response.request.headers
                assert "2,621,440 bytes" in assert_json_error(response, 413), path
        assert_json_error(http.get("/api/v1/nope", headers=AUTH), 404)
        assert_json_error(http.patch(f"/api/v1/runs/{run_id}"), 405)
        assert_json_error(
            http.get(f"/api/v1/runs/{run_id}/events", params={"last_event_id": str(10**30)},
                     headers=AUTH),
            400,
            "Last-Event-ID",
        )  # fmt: skip
        response = http.get(f"/api/v1/threads/{thread_id}", headers=AUTH)
        REF.match(assert_json_error(response, 500))
        assert [part for part in SECRET_PARTS if part in response.text] == []


@pytest_live
def test_live_wsgi_server_answers_json_errors(live_server, user, thread, run, monkeypatch):
    monkeypatch.setattr(services, "open_segment", _leaky_boom)
    _live_checks(live_server.url, str(thread.id), str(run.id), chunked=False)


@pytest.fixture
def uvicorn_server():
    """dashboard.site.asgi's application under a real uvicorn, in this process."""
    from django.core.asgi import get_asgi_application

    with serving(get_asgi_application()) as (base, _loop):
        yield base


@pytest_live
def test_uvicorn_answers_json_errors_with_debug_1(
    uvicorn_server, user, thread, run, leaky_settings, monkeypatch
):
    monkeypatch.setattr(services, "open_segment", _leaky_boom)
    _live_checks(uvicorn_server, str(thread.id), str(run.id), chunked=True)


@pytest.fixture
def asgi_entry_server():
    """dashboard.site.asgi.application (what `manage.py up` serves) under a real uvicorn."""
    import asyncio

    import uvicorn

    from dashboard.site.asgi import application

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = uvicorn.Config(
        application, host="127.0.0.1", port=port, lifespan="off", log_level="error"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield port
    server.should_exit = True
    thread.join(10)


def test_a_declared_oversize_body_is_refused_before_it_is_sent(asgi_entry_server):
    """Only the headers go out: the 413 JSON comes back without the 50 MB being read."""
    with socket.create_connection(("127.0.0.1", asgi_entry_server), timeout=5) as conn:
        conn.sendall(
            b"POST /api/v1/threads HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 52428800\r\n\r\n"
        )
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body)["error"]["message"].startswith("the request body is larger than")


def test_a_database_that_goes_away_under_a_request_is_503_retry_not_500(
    client, user, thread, monkeypatch
):
    """Seen by bench/faults_probe.py during `pg_ctl restart`: the request's first
    query met AdminShutdown. Nothing was written; the client may send it again."""
    from django.db import OperationalError

    def cut(*_args, **_kwargs):
        raise OperationalError("terminating connection due to administrator command")

    monkeypatch.setattr(services, "open_segment", cut)
    response = client.get(
        f"/api/v1/threads/{thread.id}", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.json()["error"]["message"].startswith("the database is unavailable")
