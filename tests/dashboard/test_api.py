"""The JSON API under /api/v1/: its contract, through the Django test client.

No worker runs here: a submitted run stays queued (its stage is published on
commit, and the test transaction never commits). Each test names the rule or
the behaviour it holds the API to. Bad input answers 4xx with
``{"error": {"field": …, "message": …}}`` and writes nothing.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from governance import services, time_source
from governance.models import (
    ApiToken,
    AuditEntry,
    BodyChunk,
    BudgetAccount,
    BudgetEntry,
    HistoryItem,
    Provider,
    ProviderAttempt,
    Run,
    RunEvent,
    Segment,
    SegmentRefusal,
    Settlement,
    Stage,
    Thread,
    ThreadSession,
)
from governance.rules import settlement as rules_settlement
from governance.rules.authority import FactKind
from governance.rules.decision_table import Decision, Path
from governance.rules.settlement import Outcome, ReasonCode
from governance.services.errors import RunSettled
from governance.services.tokens import token_digest
from tests import facts as written

pytestmark = pytest.mark.django_db

TOKEN = "api-contract-token-" + "k" * 24
USERNAME = "operator-ann"
# An id no row has (fixed, so every test worker collects the same test names).
UNKNOWN_ID = "3f2c1b7e-0d4a-4e59-9b8e-6a1c2d3e4f50"
RESOURCES = (
    "model_requests",
    "tool_calls",
    "web_searches",
    "provider_concurrency",
    "body_revisions",
    "output_reserve",
)
WRITTEN = (
    Thread,
    ThreadSession,
    Segment,
    HistoryItem,
    Run,
    BudgetAccount,
    BudgetEntry,
    Stage,
    RunEvent,
    AuditEntry,
    Settlement,
    SegmentRefusal,
)


def counts() -> dict[str, int]:
    """Rows of every table a request could write: compared before/after a refusal."""
    return {model.__name__: model.objects.count() for model in WRITTEN}


class JsonApi:
    """The test client with a Bearer token; ``status`` asserts the answer's code."""

    def __init__(self, client, token: str) -> None:
        self.client = client
        self.headers = {"Authorization": f"Bearer {token}"}

    def _check(self, response, status):
        if status is not None:
            assert response.status_code == status, response.content.decode()[:2000]
        return response

    def post(self, path: str, body=None, *, status: int | None = None):
        response = self.client.post(
            path,
            data=json.dumps({} if body is None else body),
            content_type="application/json",
            headers=self.headers,
        )
        return self._check(response, status)

    def post_raw(self, path: str, data, content_type: str, *, status: int | None = None):
        response = self.client.generic(
            "POST", path, data=data, content_type=content_type, headers=self.headers
        )
        return self._check(response, status)

    def get(self, path: str, *, status: int | None = 200):
        return self._check(self.client.get(path, headers=self.headers), status)

    def error(self, response, status: int, field: str | None) -> str:
        """Assert the JSON error shape and return its message."""
        assert response.status_code == status, response.content.decode()[:2000]
        assert response["Content-Type"].startswith("application/json")
        error = response.json()["error"]
        assert set(error) == {"field", "message"}
        assert error["field"] == field, error
        assert isinstance(error["message"], str) and error["message"].strip()
        return error["message"]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def manual_clock():
    start = datetime(2030, 5, 17, 9, 30, tzinfo=UTC)
    the_clock = time_source.ManualClock(start)
    time_source.install(the_clock)
    yield the_clock
    time_source.install(None)


@pytest.fixture
def user(django_user_model):
    from django.contrib.auth.models import Permission

    operator = django_user_model.objects.create_user(USERNAME)  # no password: unusable
    operator.user_permissions.add(
        *Permission.objects.filter(codename__in=["apply_boundary", "submit_run", "cancel_run"])
    )
    return operator


@pytest.fixture
def token_row(user):
    return ApiToken.objects.create(user=user, name="tests", key_digest=token_digest(TOKEN))


@pytest.fixture
def api(client, token_row, manual_clock):
    return JsonApi(client, TOKEN)


@pytest.fixture
def scripted_provider():
    def make(provider_id: str, model: str | None = None) -> Provider:
        return Provider.objects.create(
            provider_id=provider_id,
            kind="scripted",
            model=model or f"{provider_id}-model",
            script={"default": {"answer": {"text": "ok", "chunks": 1}}},
        )

    return make


@pytest.fixture
def providers(scripted_provider):
    return [scripted_provider("alpha"), scripted_provider("beta"), scripted_provider("gamma")]


@pytest.fixture
def thread(api, providers):
    return api.post(
        "/api/v1/threads",
        {"title": "Contract thread", "provider_chain": ["alpha", "beta", "gamma"]},
        status=201,
    ).json()


@pytest.fixture
def run_id(api, thread):
    return api.post(f"/api/v1/threads/{thread['id']}/runs", {"input": "hi"}, status=202).json()[
        "run_id"
    ]


def runs_url(thread) -> str:
    return f"/api/v1/threads/{thread['id']}/runs"


def boundaries_url(thread) -> str:
    return f"/api/v1/threads/{thread['id']}/boundaries"


def open_segment(thread) -> Segment:
    return Segment.objects.get(thread_id=thread["id"], closed_at__isnull=True)


def boundary(kind: str, key: str, **extra) -> dict:
    return {"kind": kind, "reason": "operator asked for it", "idempotency_key": key, **extra}


# --------------------------------------------------------------------------- authentication


ENDPOINTS = (
    ("post", "/api/v1/threads"),
    ("get", "/api/v1/threads/{thread}"),
    ("get", "/api/v1/threads/{thread}/segment"),
    ("post", "/api/v1/threads/{thread}/runs"),
    ("post", "/api/v1/threads/{thread}/boundaries"),
    ("get", "/api/v1/runs/{run}"),
    ("post", "/api/v1/runs/{run}/cancel"),
)


def _call(client, method: str, path: str, headers: dict):
    if method == "get":
        return client.get(path, headers=headers)
    body = {"provider_chain": ["alpha"], "input": "x", **boundary("compact", "auth-k")}
    return client.post(
        path, data=json.dumps(body), content_type="application/json", headers=headers
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": ""},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Token {TOKEN}"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer    "},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer not-a-known-token"},
        {"Authorization": f"Bearer {TOKEN}x"},
    ],
    ids=[
        "no-header",
        "empty-header",
        "basic-scheme",
        "token-scheme",
        "bearer-without-token",
        "bearer-blank-token",
        "token-without-scheme",
        "unknown-token",
        "token-with-extra-char",
    ],
)
def test_auth_missing_wrong_scheme_or_unknown_token_is_401_on_every_endpoint(
    client, api, run_id, thread, headers
):
    """Every endpoint answers 401 with field "Authorization" and writes nothing."""
    before = counts()
    for method, template in ENDPOINTS:
        path = template.format(thread=thread["id"], run=run_id)
        response = _call(client, method, path, headers)
        api.error(response, 401, "Authorization")
        assert response["WWW-Authenticate"].startswith("Bearer")
    assert counts() == before
    assert Run.objects.get(id=run_id).cancel_requested_at is None


def test_auth_comes_before_the_lookup_so_unknown_ids_do_not_leak(client, api):
    """No token: 401, not 404, even for a thread that does not exist."""
    response = client.get(f"/api/v1/threads/{uuid.uuid4()}/segment")
    api.error(response, 401, "Authorization")


def test_auth_revoked_token_is_401_and_not_marked_used(client, api, token_row, providers):
    ApiToken.objects.filter(pk=token_row.pk).update(revoked_at=time_source.now())
    before = counts()
    response = api.post("/api/v1/threads", {"provider_chain": ["alpha"]})
    api.error(response, 401, "Authorization")
    assert counts() == before
    token_row.refresh_from_db()
    assert token_row.last_used_at is None


def test_auth_token_of_an_inactive_user_is_401(api, user, token_row, providers):
    user.is_active = False
    user.save()
    before = counts()
    api.error(api.post("/api/v1/threads", {"provider_chain": ["alpha"]}), 401, "Authorization")
    assert counts() == before


def test_auth_a_dashboard_login_session_does_not_authenticate_the_api(client, api, user, providers):
    """The API is CSRF-exempt, so a browser session must not be enough: token only."""
    client.force_login(user)
    response = client.post(
        "/api/v1/threads",
        data=json.dumps({"provider_chain": ["alpha"]}),
        content_type="application/json",
    )
    api.error(response, 401, "Authorization")
    assert Thread.objects.count() == 0


def test_auth_valid_token_updates_last_used_at(api, token_row, thread):
    token_row.refresh_from_db()
    first = token_row.last_used_at
    assert first is not None
    api.get(f"/api/v1/threads/{thread['id']}")
    token_row.refresh_from_db()
    assert token_row.last_used_at >= first


def test_auth_the_scheme_is_case_insensitive(client, api, thread):
    response = client.get(
        f"/api/v1/threads/{thread['id']}", headers={"Authorization": f"bearer {TOKEN}"}
    )
    assert response.status_code == 200


def test_auth_other_users_tokens_do_not_interfere(client, api, django_user_model, thread):
    """Only the row whose digest matches is used; its user is the actor."""
    from django.contrib.auth.models import Permission

    other = django_user_model.objects.create_user("someone-else")
    other.user_permissions.add(
        *Permission.objects.filter(codename__in=["apply_boundary", "see_all_runs"])
    )
    ApiToken.objects.create(user=other, name="other", key_digest=token_digest("other-token-1234"))
    other_api = JsonApi(client, "other-token-1234")
    other_api.post(boundaries_url(thread), boundary("compact", "k-other"), status=201)
    assert AuditEntry.objects.get(idempotency_key="boundary:k-other").actor == "someone-else"


def test_auth_reads_the_token_and_its_whole_user_in_one_query(rf, user, token_row):
    """Every request authenticates: the token and its user are one read, and
    the user is complete, as a queryset of users reads it."""
    from dashboard.api.base import authenticate

    ApiToken.objects.filter(pk=token_row.pk).update(scopes=["submit_run"])
    ApiToken.objects.filter(pk=token_row.pk).update(last_used_at=time_source.now())
    request = rf.get("/api/v1/threads", headers={"Authorization": f"Bearer {TOKEN}"})
    with CaptureQueriesContext(connection) as queries:
        got = authenticate(request)
    assert len(queries) == 1
    ApiToken.objects.filter(pk=token_row.pk).update(last_used_at=None)
    got = authenticate(request)
    assert got.get_deferred_fields() == set()
    stored = type(user).objects.get(pk=user.pk)
    assert {f.attname: getattr(got, f.attname) for f in stored._meta.concrete_fields} == {
        f.attname: getattr(stored, f.attname) for f in stored._meta.concrete_fields
    }
    assert request.api_scopes == ("submit_run",)
    token_row.refresh_from_db()
    assert token_row.last_used_at is not None  # the first use is written


# --------------------------------------------------------------------------- methods and bodies


@pytest.mark.parametrize(
    ("method", "template", "allow"),
    [
        ("put", "/api/v1/threads", "GET, POST"),  # GET lists, POST creates
        ("delete", "/api/v1/threads", "GET, POST"),
        ("post", "/api/v1/threads/{thread}", "GET"),
        ("put", "/api/v1/threads/{thread}/segment", "GET"),
        ("get", "/api/v1/threads/{thread}/runs", "POST"),
        ("get", "/api/v1/threads/{thread}/boundaries", "POST"),
        ("patch", "/api/v1/runs/{run}", "GET"),
        ("get", "/api/v1/runs/{run}/cancel", "POST"),
    ],
)
def test_method_not_allowed_is_405_json_with_allow_header(
    client, api, thread, run_id, method, template, allow
):
    path = template.format(thread=thread["id"], run=run_id)
    before = counts()
    response = getattr(client, method)(path, headers=api.headers)
    api.error(response, 405, None)
    assert response["Allow"] == allow
    assert counts() == before
    assert Run.objects.get(id=run_id).cancel_requested_at is None


@pytest.mark.parametrize(
    ("data", "content_type"),
    [
        ('{"provider_chain": ["alpha"]}', "text/plain"),
        ("provider_chain=alpha", "application/x-www-form-urlencoded"),
        ('{"provider_chain": ["alpha"]}', ""),
        ('{"provider_chain": ["alpha"]}', "application/xml"),
    ],
    ids=["text-plain", "form", "no-content-type", "xml"],
)
def test_non_json_content_type_is_415_and_writes_nothing(api, providers, data, content_type):
    before = counts()
    response = api.post_raw("/api/v1/threads", data, content_type)
    api.error(response, 415, None)
    assert counts() == before


def test_multipart_form_post_is_415(client, api, thread):
    before = counts()
    response = client.post(runs_url(thread), {"input": "hello"}, headers=api.headers)
    api.error(response, 415, None)
    assert counts() == before


def test_json_content_type_with_charset_is_accepted(api, providers):
    response = api.post_raw(
        "/api/v1/threads",
        json.dumps({"provider_chain": ["alpha"]}),
        "application/json; charset=utf-8",
    )
    assert response.status_code == 201


@pytest.mark.parametrize(
    "data",
    [
        b'{"provider_chain": ["alpha"]',
        b"{'provider_chain': ['alpha']}",
        b"\xff\xfe\x00garbage",
        b'{"provider_chain": ["alpha"], "deadline_s": NaN}',
        b'{"provider_chain": ["alpha"], "deadline_s": Infinity}',
        b"[" * 100_000,
    ],
    ids=["truncated", "single-quotes", "not-utf8", "nan", "infinity", "deeply-nested"],
)
def test_malformed_json_is_400_and_writes_nothing(api, thread, data):
    before = counts()
    for path in ("/api/v1/threads", runs_url(thread), boundaries_url(thread)):
        api.error(api.post_raw(path, data, "application/json"), 400, None)
    assert counts() == before


@pytest.mark.parametrize("body", ["[]", '["alpha"]', '"text"', "42", "null", "true"])
def test_body_that_is_not_an_object_is_400(api, thread, body):
    before = counts()
    for path in ("/api/v1/threads", runs_url(thread), boundaries_url(thread)):
        message = api.error(api.post_raw(path, body, "application/json"), 400, None)
        assert "object" in message
    assert counts() == before


def test_empty_json_body_reads_as_an_empty_object(client, api, providers):
    """No body at all: the required field is named, nothing else is guessed."""
    before = counts()
    # The test client drops Content-Type for an empty body; a real client sends it.
    response = client.generic(
        "POST", "/api/v1/threads", data=b"", headers=api.headers, CONTENT_TYPE="application/json"
    )
    api.error(response, 400, "provider_chain")
    assert counts() == before


# --------------------------------------------------------------------------- POST /threads


def test_r1_2_create_thread_opens_session_1_segment_1_with_every_provider_eligible(
    api, user, providers
):
    response = api.post(
        "/api/v1/threads",
        {
            "title": "Quarterly report",
            "provider_chain": ["beta", "alpha"],
            "tool_surface": ["webhook", "calculator", "webhook"],
            "system_prompt": "Be brief.",
            "callback_url": "https://example.test/hook",
        },
        status=201,
    )
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    thread = Thread.objects.get(id=body["id"])
    assert body["title"] == "Quarterly report"
    assert body["provider_chain"] == ["beta", "alpha"]
    assert body["model"] == "beta-model"  # the first provider's model by default
    assert body["mode"] == "default"
    assert body["tool_surface"] == ["calculator", "webhook"]  # a set: sorted, no repeats
    assert body["system_prompt"] == "Be brief."
    assert body["callback_url"] == "https://example.test/hook"
    assert thread.created_by == user

    session = ThreadSession.objects.get(thread=thread)
    assert session.generation == 1
    segment = body["segment"]
    assert segment["session_id"] == session.id
    assert segment["segment_no"] == 1
    assert segment["key"] == f"{session.id}#1"
    assert segment["model"] == "beta-model"
    assert segment["tool_surface"] == ["calculator", "webhook"]
    assert segment["opened_at"] == time_source.now().isoformat()
    assert segment["closed_at"] is None and segment["closed_kind"] is None
    assert segment["closed_by"] is None and segment["close_reason"] is None
    assert [p["provider_id"] for p in segment["providers"]] == ["beta", "alpha"]
    for row in segment["providers"]:
        assert row["state"] == "eligible"
        assert row["refusals"] == 0 and row["reprobes"] == 0
        assert row["refused_at"] is None and row["next_probe_at"] is None
        assert row["max_sends"] == 4  # R3.2: 1 + 3 re-probes
    assert Segment.objects.filter(thread=thread).count() == 1
    assert open_segment(body).key == segment["key"]


def test_create_thread_with_an_explicit_model_and_mode(api, providers):
    body = api.post(
        "/api/v1/threads",
        {"provider_chain": ["alpha"], "model": "custom-model", "mode": "research"},
        status=201,
    ).json()
    assert body["model"] == "custom-model" and body["mode"] == "research"
    assert body["segment"]["model"] == "custom-model" and body["segment"]["mode"] == "research"


def test_get_thread_returns_the_thread_and_its_open_segment(api, thread):
    body = api.get(f"/api/v1/threads/{thread['id']}").json()
    assert body == thread


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "provider_chain"),
        ({"provider_chain": None}, "provider_chain"),
        ({"provider_chain": []}, "provider_chain"),
        ({"provider_chain": "alpha"}, "provider_chain"),
        ({"provider_chain": {"alpha": 1}}, "provider_chain"),
        ({"provider_chain": ["alpha", 2]}, "provider_chain"),
        ({"provider_chain": ["alpha", ""]}, "provider_chain"),
        ({"provider_chain": ["alpha", "alpha"]}, "provider_chain"),
        ({"provider_chain": ["alpha", "nobody"]}, "provider_chain"),
        ({"provider_chain": ["alpha"], "tool_surface": ["calculator", "rm_rf"]}, "tool_surface"),
        ({"provider_chain": ["alpha"], "tool_surface": ["calculator", 7]}, "tool_surface"),
        ({"provider_chain": ["alpha"], "tool_surface": "calculator"}, "tool_surface"),
        ({"provider_chain": ["alpha"], "title": 12}, "title"),
        ({"provider_chain": ["alpha"], "title": ["x"]}, "title"),
        ({"provider_chain": ["alpha"], "model": 3}, "model"),
        ({"provider_chain": ["alpha"], "model": "m" * 201}, "model"),
        ({"provider_chain": ["alpha"], "mode": False}, "mode"),
        ({"provider_chain": ["alpha"], "mode": "m" * 51}, "mode"),
        ({"provider_chain": ["alpha"], "system_prompt": {"a": 1}}, "system_prompt"),
        ({"provider_chain": ["alpha"], "callback_url": 1}, "callback_url"),
        ({"provider_chain": ["alpha"], "callback_url": "not a url"}, "callback_url"),
        ({"provider_chain": ["alpha"], "callback_url": "ftp://example.test/x"}, "callback_url"),
        (
            {"provider_chain": ["alpha"], "callback_url": "https://example.test/" + "a" * 200},
            "callback_url",
        ),
        # The worker would POST there: metadata, private and (not allow-listed) loopback.
        (
            {"provider_chain": ["alpha"], "callback_url": "http://169.254.169.254/latest"},
            "callback_url",
        ),
        ({"provider_chain": ["alpha"], "callback_url": "https://10.1.2.3/hook"}, "callback_url"),
        ({"provider_chain": ["alpha"], "callback_url": "https://[fd00:ec2::254]/"}, "callback_url"),
    ],
    ids=lambda value: json.dumps(value)[:40] if isinstance(value, dict) else value,
)
def test_create_thread_bad_input_is_400_naming_the_field_and_writes_nothing(
    api, providers, body, field
):
    before = counts()
    api.error(api.post("/api/v1/threads", body), 400, field)
    assert counts() == before


def test_create_thread_names_the_unknown_provider(api, providers):
    message = api.error(
        api.post("/api/v1/threads", {"provider_chain": ["alpha", "ghost"]}), 400, "provider_chain"
    )
    assert "ghost" in message


# --------------------------------------------------------------------------- POST runs


def test_submit_run_is_202_with_run_budget_account_and_a_queued_first_stage(
    api, user, thread, manual_clock
):
    response = api.post(
        runs_url(thread), {"input": "What is 6 x 7?", "budget": {"tool_calls": 3}}, status=202
    )
    body = response.json()
    run = Run.objects.get(id=body["run_id"])
    assert body == {
        "run_id": str(run.id),
        "status": "queued",
        "created": True,
        "url": f"/api/v1/runs/{run.id}",
    }
    assert str(run.thread_id) == thread["id"]
    assert run.segment.key == thread["segment"]["key"]
    assert run.input == "What is 6 x 7?"
    assert run.status == Run.Status.QUEUED
    assert run.created_at == manual_clock()
    assert run.authorization["user"] == USERNAME
    assert run.trace_context  # the run's trace carrier is stored at admission

    account = BudgetAccount.objects.get(run=run)
    assert set(account.limits) == set(RESOURCES)
    assert account.limits["tool_calls"] == 3
    assert account.limits["model_requests"] == 40  # the default, untouched
    assert not account.entries.exists()  # nothing consumed yet

    stage = Stage.objects.get(run=run)
    assert stage.seq == 1 and stage.kind == "model_turn"
    assert stage.enqueued_at == manual_clock()
    assert stage.started_at is None and stage.finished_at is None
    assert stage.payload == {  # stored with its version (rules.payloads)
        "version": 1,
        "increment": [{"role": "user", "content": "What is 6 x 7?"}],
    }
    # The stage row is the queued fact (its queue clock starts at enqueued_at).
    assert not RunEvent.objects.filter(run=run).exists()


def test_submit_run_publishes_its_first_stage_once(api, thread, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        api.post(runs_url(thread), {"input": "go", "idempotency_key": "pub-1"}, status=202)
    assert len(callbacks) == 1
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        api.post(runs_url(thread), {"input": "go", "idempotency_key": "pub-1"}, status=200)
    assert callbacks == []  # R5.4: a repeated admission dispatches nothing new


def test_r6_1_submit_run_deadline_and_stage_budgets_are_recorded(api, thread, manual_clock):
    run_id = api.post(
        runs_url(thread),
        {"input": "x", "deadline_s": 90, "stage_budget_s": 12.5, "no_progress_s": 30},
        status=202,
    ).json()["run_id"]
    run = Run.objects.get(id=run_id)
    assert run.deadline_at == manual_clock() + timedelta(seconds=90)
    assert run.stage_budget_s == 12.5
    assert run.no_progress_limit_s == 30


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "input"),
        ({"input": None}, "input"),
        ({"input": ""}, "input"),
        ({"input": "   \n"}, "input"),
        ({"input": 42}, "input"),
        ({"input": ["hi"]}, "input"),
        ({"input": "x", "budget": {"gpu_hours": 1}}, "budget"),
        ({"input": "x", "budget": {"model_requests": -1}}, "budget"),
        ({"input": "x", "budget": {"model_requests": True}}, "budget"),
        ({"input": "x", "budget": {"model_requests": 1.5}}, "budget"),
        ({"input": "x", "budget": {"model_requests": "3"}}, "budget"),
        ({"input": "x", "budget": {"model_requests": None}}, "budget"),
        ({"input": "x", "budget": [1, 2]}, "budget"),
        ({"input": "x", "budget": 5}, "budget"),
        ({"input": "x", "deadline_s": "60"}, "deadline_s"),
        ({"input": "x", "deadline_s": True}, "deadline_s"),
        ({"input": "x", "deadline_s": 0}, "deadline_s"),
        ({"input": "x", "deadline_s": 0.0}, "deadline_s"),
        ({"input": "x", "deadline_s": -5}, "deadline_s"),
        ({"input": "x", "deadline_s": 1e300}, "deadline_s"),
        ({"input": "x", "stage_budget_s": "10"}, "stage_budget_s"),
        ({"input": "x", "stage_budget_s": 0}, "stage_budget_s"),
        ({"input": "x", "stage_budget_s": -1}, "stage_budget_s"),
        ({"input": "x", "no_progress_s": False}, "no_progress_s"),
        ({"input": "x", "no_progress_s": 0}, "no_progress_s"),
        ({"input": "x", "idempotency_key": 17}, "idempotency_key"),
        ({"input": "x", "idempotency_key": "k" * 201}, "idempotency_key"),
    ],
    ids=lambda value: json.dumps(value)[:48] if isinstance(value, dict) else value,
)
def test_submit_run_bad_input_is_400_naming_the_field_and_writes_nothing(api, thread, body, field):
    before = counts()
    api.error(api.post(runs_url(thread), body), 400, field)
    assert counts() == before


@pytest.mark.parametrize("name", ["deadline_s", "stage_budget_s", "no_progress_s"])
def test_submit_run_a_number_too_large_for_a_float_is_400_naming_it(api, thread, name):
    """1e400 is valid JSON that Python reads as infinity: no 500, no default."""
    before = counts()
    data = '{"input": "x", "' + name + '": 1e400}'
    api.error(api.post_raw(runs_url(thread), data, "application/json"), 400, name)
    assert counts() == before


def test_r5_4_same_idempotency_key_twice_makes_one_run(api, thread):
    first = api.post(
        runs_url(thread), {"input": "once", "idempotency_key": "dbl-1"}, status=202
    ).json()
    before = counts()
    second = api.post(
        runs_url(thread), {"input": "once", "idempotency_key": "dbl-1"}, status=200
    ).json()
    assert first["created"] is True and second["created"] is False
    assert second["run_id"] == first["run_id"]
    assert second["url"] == first["url"]
    assert counts() == before
    assert Run.objects.filter(idempotency_key="dbl-1").count() == 1
    assert Stage.objects.filter(run_id=first["run_id"]).count() == 1


def test_r5_4_the_key_names_the_admission_even_if_the_repeat_differs(api, thread):
    """A repeat with another input is still the first admission, not a second run."""
    first = api.post(runs_url(thread), {"input": "A", "idempotency_key": "k-a"}, status=202)
    second = api.post(
        runs_url(thread), {"input": "B", "budget": {"tool_calls": 1}, "idempotency_key": "k-a"}
    )
    assert second.status_code == 200
    assert second.json()["run_id"] == first.json()["run_id"]
    run = Run.objects.get(id=first.json()["run_id"])
    assert run.input == "A"
    assert run.budget.limits["tool_calls"] == 20


def test_r5_4_same_idempotency_key_on_another_thread_is_400(api, thread, providers):
    other = api.post("/api/v1/threads", {"provider_chain": ["beta"]}, status=201).json()
    api.post(runs_url(thread), {"input": "x", "idempotency_key": "shared"}, status=202)
    before = counts()
    api.error(
        api.post(runs_url(other), {"input": "x", "idempotency_key": "shared"}),
        400,
        "idempotency_key",
    )
    assert counts() == before


def test_submit_run_without_a_key_twice_makes_two_runs(api, thread):
    a = api.post(runs_url(thread), {"input": "x"}, status=202).json()["run_id"]
    b = api.post(runs_url(thread), {"input": "x"}, status=202).json()["run_id"]
    assert a != b
    assert Run.objects.filter(idempotency_key__isnull=True).count() == 2


@pytest.mark.parametrize("thread_id", [UNKNOWN_ID, "not-a-uuid", "123", "%20"])
def test_submit_run_unknown_or_malformed_thread_is_404_json(api, thread, thread_id):
    before = counts()
    api.error(api.post(f"/api/v1/threads/{thread_id}/runs", {"input": "x"}), 404, None)
    assert counts() == before


@pytest.mark.parametrize("suffix", ["", "/segment"])
@pytest.mark.parametrize("thread_id", [UNKNOWN_ID, "nope"])
def test_get_unknown_or_malformed_thread_is_404_json(api, thread_id, suffix):
    api.error(api.get(f"/api/v1/threads/{thread_id}{suffix}", status=None), 404, None)


def test_r8_3_a_run_after_a_boundary_lands_on_the_new_segment(api, thread):
    old = api.post(runs_url(thread), {"input": "before"}, status=202).json()["run_id"]
    opened = api.post(boundaries_url(thread), boundary("fresh_start", "fs-run"), status=201).json()
    new = api.post(runs_url(thread), {"input": "after"}, status=202).json()["run_id"]
    assert Run.objects.get(id=old).segment.key == thread["segment"]["key"]  # R1.4: unchanged
    assert Run.objects.get(id=new).segment.key == opened["key"]


# --------------------------------------------------------------------------- GET runs/{id}


def test_get_run_of_a_queued_run(api, thread, run_id, manual_clock):
    body = api.get(f"/api/v1/runs/{run_id}").json()
    assert body["id"] == run_id
    assert body["thread_id"] == thread["id"]
    assert body["segment"] == thread["segment"]["key"]
    assert body["status"] == "queued" and body["phase"] == "research"
    assert body["input"] == "hi"
    assert body["created_at"] == manual_clock().isoformat()
    assert body["deadline_at"] == (manual_clock() + timedelta(seconds=1800)).isoformat()
    assert body["cancel_requested_at"] is None
    assert body["lifecycle"] == []
    assert body["stages"] == [
        {
            "seq": 1,
            "kind": "model_turn",
            "enqueued_at": manual_clock().isoformat(),
            "started_at": None,
            "finished_at": None,
            "outcome": None,
            "timeout": None,
            "failure_class": None,
            "detail": None,
            "clocks": {},
            "deliveries": 0,
        }
    ]
    assert body["attempts"] == [] and body["receipts"] == [] and body["chunks"] == []
    assert body["body"] == ""
    assert set(body["budget"]) == set(RESOURCES)
    for name, view in body["budget"].items():
        assert view["used"] == 0
        assert view["remaining"] == view["limit"], name
    assert body["settlement"] is None


def test_r7_1_reading_a_run_observes_it_and_changes_nothing(
    api, run_id, django_capture_on_commit_callbacks
):
    before = counts()
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        for _ in range(3):
            api.get(f"/api/v1/runs/{run_id}")
    assert callbacks == []  # no new work dispatched by observing
    assert counts() == before
    assert Run.objects.get(id=run_id).status == Run.Status.QUEUED


def test_get_run_shows_stage_clocks_attempts_budget_receipts_chunks_and_settlement(
    api, run_id, manual_clock
):
    """R5.1 one ledger view, R6.1 clocks per stage, R7.2 chunk facts, R6.5 settlement."""
    run = Run.objects.get(id=run_id)
    stage = Stage.objects.get(run=run, seq=1)
    started = manual_clock()
    claimed = services.claim_stage(stage.id, started, lease=timedelta(minutes=5))
    assert claimed is not None
    clocks = {"queue_ms": 0, "execution_ms": 1500, "no_progress_ms": 1500, "deadline_ms": 1500}
    ProviderAttempt.objects.create(
        run=run,
        stage=stage,
        segment=run.segment,
        provider=Provider.objects.get(provider_id="alpha"),
        model="alpha-model",
        kind="original",
        request_digest="d" * 64,
        started_at=started,
        latency_ms=1500,
        result="refused",
        refusal_category="content_filter",
        status_code=200,
    )
    # R5.4: the same admission key twice consumes once.
    for _ in range(2):
        admission = services.admit(run, "model_requests", 1, f"{run.id}:turn1", now=started)
        assert admission.admitted
    services.admit(run, "tool_calls", 1, f"{run.id}:tool1", now=started)
    receipt, _ = services.open_receipt(
        run, stage, tool="calculator", key=f"{run.id}:calc", arguments={"x": 1}, call_id="c1",
        now=started,
    )  # fmt: skip
    services.close_receipt(receipt, effect="succeeded", output=42, error="", now=started)
    manual_clock.advance(seconds=2)
    services.commit_chunks(run, ["The answer ", "is 42."], manual_clock())
    services.finish_stage(stage, outcome="answered", now=manual_clock(), clocks=clocks)
    settlement = rules_settlement.Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "answered")
    written.record_decision(
        run,
        Decision(Path.SETTLE, "the answer is committed", settlement=settlement),
        manual_clock(),
    )
    written.settle(run, settlement, manual_clock())

    body = api.get(f"/api/v1/runs/{run_id}").json()
    assert body["status"] == "settled" and body["phase"] == "settled"
    [stage_json] = body["stages"]
    assert stage_json["started_at"] == started.isoformat()
    assert stage_json["finished_at"] == manual_clock().isoformat()
    assert stage_json["outcome"] == "answered"
    assert stage_json["clocks"] == clocks
    assert stage_json["deliveries"] == 1
    assert body["attempts"] == [
        {
            "stage": 1,
            "provider_id": "alpha",
            "model": "alpha-model",
            "kind": "original",
            "result": "refused",
            "failure_class": None,
            "refusal_category": "content_filter",
            "status_code": 200,
            "latency_ms": 1500,
            "segment": run.segment.key,
            # No usage reported — no amount, and the reason (never 0).
            "cost": {"amount": None, "currency": None, "unknown_because": "no usage reported"},
        }
    ]
    assert body["cost"]["requests"] == 1 and body["cost"]["without_usage"] == 1
    assert body["cost"]["total"] == {}
    assert body["budget"]["model_requests"] == {"limit": 40, "used": 1, "remaining": 39}
    assert body["budget"]["tool_calls"] == {"limit": 20, "used": 1, "remaining": 19}
    assert body["budget"]["web_searches"]["used"] == 0
    assert body["receipts"] == [
        {
            "tool": "calculator",
            "idempotency_key": f"{run.id}:calc",
            "effect": "succeeded",
            "verified_at": None,
            "error": None,
            # A built-in: no registry server, schema version or effect class.
            "server": None,
            "schema_version": None,
            "effect_class": None,
            "latency_ms": body["receipts"][0]["latency_ms"],
        }
    ]
    assert body["receipts"][0]["latency_ms"] >= 0
    assert [c["chunk_no"] for c in body["chunks"]] == [1, 2]
    assert [c["final"] for c in body["chunks"]] == [False, True]
    assert all(c["committed_at"] and c["sent_at"] is None for c in body["chunks"])
    assert all(c["observed_at"] is None for c in body["chunks"])  # R7.3: no client evidence
    assert body["body"] == "The answer is 42."
    assert [entry["path"] for entry in body["lifecycle"]] == ["settle"]
    assert body["lifecycle"][0]["reason"] == "the answer is committed"
    assert body["settlement"] == {
        "outcome": "completed",
        "reason_code": "answered",
        "reason": "answered",
        "unknown_effects": [],
        "settled_at": manual_clock().isoformat(),
    }


def test_r7_2_an_uncommitted_chunk_is_not_part_of_the_body(api, run_id, manual_clock):
    run = Run.objects.get(id=run_id)
    services.commit_chunks(run, ["committed"], manual_clock())
    BodyChunk.objects.create(run=run, chunk_no=2, text=" candidate", generated_at=manual_clock())
    body = api.get(f"/api/v1/runs/{run_id}").json()
    assert body["body"] == "committed"
    assert [c["committed_at"] is not None for c in body["chunks"]] == [True, False]


@pytest.mark.parametrize("suffix", ["", "/cancel"])
@pytest.mark.parametrize("run", [UNKNOWN_ID, "garbage", "0"])
def test_unknown_or_malformed_run_is_404_json(api, run_id, run, suffix):
    before = counts()
    if suffix:
        response = api.post(f"/api/v1/runs/{run}{suffix}")
    else:
        response = api.get(f"/api/v1/runs/{run}", status=None)
    api.error(response, 404, None)
    assert counts() == before


# --------------------------------------------------------------------------- cancel


def test_r7_1_cancel_is_202_and_records_one_fact_and_one_audit_entry(
    api, run_id, manual_clock, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api.post(f"/api/v1/runs/{run_id}/cancel", status=202)
    assert response.json() == {"run_id": run_id, "cancel_requested": True}
    assert len(callbacks) == 1  # the pending stage is nudged so the run settles
    run = Run.objects.get(id=run_id)
    assert run.cancel_requested_at == manual_clock()
    assert run.cancel_requested_by == USERNAME
    assert run.status == Run.Status.QUEUED  # requested, not settled: the lifecycle settles
    assert not Settlement.objects.filter(run=run).exists()
    facts = [f.kind for f in services.run_facts(run).facts]
    assert facts == [FactKind.CANCEL_REQUESTED]
    fact = RunEvent.objects.get(run=run, kind="facts")
    assert [f["owner"] for f in fact.metadata["facts"]] == ["user"]
    audit = AuditEntry.objects.get(action="run.cancel")
    assert audit.actor == USERNAME
    assert audit.target_type == "run" and audit.target_id == run_id
    assert audit.at == manual_clock()
    body = api.get(f"/api/v1/runs/{run_id}").json()
    assert body["cancel_requested_at"] == manual_clock().isoformat()


def test_r7_1_a_second_cancel_is_202_and_records_nothing_new(
    api, run_id, manual_clock, django_capture_on_commit_callbacks
):
    api.post(f"/api/v1/runs/{run_id}/cancel", status=202)
    first_at = Run.objects.get(id=run_id).cancel_requested_at
    before = counts()
    manual_clock.advance(minutes=1)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api.post(f"/api/v1/runs/{run_id}/cancel", status=202)
    assert response.json()["cancel_requested"] is True
    assert callbacks == []
    assert counts() == before
    assert Run.objects.get(id=run_id).cancel_requested_at == first_at
    assert AuditEntry.objects.filter(action="run.cancel").count() == 1


def test_r6_5_cancel_of_a_settled_run_is_409_and_the_settlement_stands(api, run_id, manual_clock):
    run = Run.objects.get(id=run_id)
    written.settle(
        run,
        rules_settlement.Settlement(Outcome.FAILED, ReasonCode.NO_ELIGIBLE_PROVIDER, "all frozen"),
        manual_clock(),
    )
    before = counts()
    api.error(api.post(f"/api/v1/runs/{run_id}/cancel"), 409, None)
    assert counts() == before
    run.refresh_from_db()
    assert run.cancel_requested_at is None
    assert run.settlement.outcome == "failed"
    assert not AuditEntry.objects.filter(action="run.cancel").exists()


def test_r6_5_the_stop_service_itself_refuses_a_settled_run(api, run_id, manual_clock):
    """The 409 is the service's answer (rules.connection), not a view's own check:
    a stop that reaches the service after the run settled changes nothing."""
    run = Run.objects.get(id=run_id)
    written.settle(
        run,
        rules_settlement.Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "answered"),
        manual_clock(),
    )
    before = counts()
    with pytest.raises(RunSettled, match="already settled completed"):
        services.request_cancel(run, by=USERNAME, now=manual_clock())
    assert counts() == before
    assert Run.objects.get(id=run_id).cancel_requested_at is None


def test_cancel_ignores_the_request_body(api, run_id):
    """Cancel takes no input: a text body is neither parsed nor refused."""
    response = api.post_raw(f"/api/v1/runs/{run_id}/cancel", "stop please", "text/plain")
    assert response.status_code == 202


# --------------------------------------------------------------------------- GET segment (R8.1)


def _refusal(thread, provider_id: str, refusals: int | None, refused_at) -> SegmentRefusal:
    return SegmentRefusal.objects.create(
        segment=open_segment(thread),
        provider_id=provider_id,
        model=f"{provider_id}-model",
        category="content_filter",
        refusals=refusals,
        refused_at=refused_at,
    )


def test_r8_1_segment_shows_eligible_cooling_and_frozen_with_refusals_n_of_4(
    api, thread, manual_clock
):
    now = manual_clock()
    refused_at = now - timedelta(minutes=5)
    _refusal(thread, "alpha", 1, refused_at)
    _refusal(thread, "beta", 4, now - timedelta(days=3))
    body = api.get(f"/api/v1/threads/{thread['id']}/segment").json()
    assert body["key"] == thread["segment"]["key"]
    rows = {row["provider_id"]: row for row in body["providers"]}
    assert list(rows) == ["alpha", "beta", "gamma"]  # the chain's order

    alpha = rows["alpha"]
    assert alpha["state"] == "cooling"
    assert alpha["refusals"] == 1 and alpha["max_sends"] == 4
    assert alpha["reprobes"] == 0
    assert alpha["category"] == "content_filter" and alpha["model"] == "alpha-model"
    assert alpha["next_probe_at"] == (refused_at + timedelta(minutes=15)).isoformat()
    assert alpha["refused_at"] == refused_at.isoformat()

    beta = rows["beta"]
    assert beta["state"] == "frozen"
    assert beta["refusals"] == 4 and beta["reprobes"] == 3
    assert beta["next_probe_at"] is None
    assert beta["refused_at"] == (now - timedelta(days=3)).isoformat()  # frozen since T

    gamma = rows["gamma"]
    assert gamma["state"] == "eligible"
    assert gamma["refusals"] == 0 and gamma["refused_at"] is None
    assert gamma["next_probe_at"] is None


def test_r3_2_segment_cooling_ends_exactly_at_next_probe_at(api, thread, manual_clock):
    refused_at = manual_clock()
    _refusal(thread, "alpha", 2, refused_at)  # one re-probe done: next delay 1 h
    path = f"/api/v1/threads/{thread['id']}/segment"
    row = api.get(path).json()["providers"][0]
    assert row["state"] == "cooling" and row["reprobes"] == 1
    assert row["next_probe_at"] == (refused_at + timedelta(hours=1)).isoformat()
    manual_clock.set(refused_at + timedelta(hours=1) - timedelta(seconds=1))
    assert api.get(path).json()["providers"][0]["state"] == "cooling"
    manual_clock.set(refused_at + timedelta(hours=1))
    row = api.get(path).json()["providers"][0]
    assert row["state"] == "eligible"  # the re-probe is due
    assert row["refusals"] == 2  # R3.3: reading never moves the state


def test_r3_4_a_legacy_refusal_row_reads_as_frozen(api, thread):
    _refusal(thread, "gamma", None, None)
    rows = api.get(f"/api/v1/threads/{thread['id']}/segment").json()["providers"]
    assert [row["state"] for row in rows] == ["eligible", "eligible", "frozen"]


def test_r3_3_reading_the_segment_writes_nothing(api, thread, manual_clock):
    row = _refusal(thread, "alpha", 1, manual_clock())
    before = counts()
    for _ in range(3):
        manual_clock.advance(hours=10)
        api.get(f"/api/v1/threads/{thread['id']}/segment")
    assert counts() == before
    fresh = SegmentRefusal.objects.get(pk=row.pk)
    assert (fresh.refusals, fresh.refused_at) == (1, row.refused_at)


# --------------------------------------------------------------------------- boundaries (R1, R8.3)


@pytest.mark.parametrize("kind", ["compact", "fresh_start"])
def test_r1_2_compact_and_fresh_start_open_segment_1_of_a_new_session(
    api, thread, manual_clock, kind
):
    old_key = thread["segment"]["key"]
    old_session = thread["segment"]["session_id"]
    manual_clock.advance(minutes=3)
    response = api.post(boundaries_url(thread), boundary(kind, f"{kind}-1"), status=201)
    body = response.json()
    assert body["session_id"] != old_session
    assert body["segment_no"] == 1
    assert body["key"] == f"{body['session_id']}#1"
    assert body["opened_at"] == manual_clock().isoformat()
    assert body["closed_at"] is None
    assert body["model"] == thread["model"]
    session = ThreadSession.objects.get(id=body["session_id"])
    assert session.generation == 2 and session.opened_by == kind
    assert open_segment(thread).key == body["key"]
    assert Segment.objects.get(key=old_key).closed_kind == kind
    assert api.get(f"/api/v1/threads/{thread['id']}/segment").json()["key"] == body["key"]


def test_r1_2_compact_carries_a_summary_and_fresh_start_drops_history(api, thread, manual_clock):
    first = ThreadSession.objects.get(id=thread["segment"]["session_id"])
    services.append_history(
        first,
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}],
        run=None,
        now=manual_clock(),
    )
    compacted = api.post(boundaries_url(thread), boundary("compact", "c-h"), status=201).json()
    [summary] = HistoryItem.objects.filter(session_id=compacted["session_id"])
    assert "hello" in summary.content and "hi there" in summary.content
    assert first.history.count() == 2  # R1.4: the old session's history is untouched
    fresh = api.post(boundaries_url(thread), boundary("fresh_start", "f-h"), status=201).json()
    assert not HistoryItem.objects.filter(session_id=fresh["session_id"]).exists()


def test_r1_2_model_switch_stays_in_the_session_as_segment_2(api, thread):
    body = api.post(
        boundaries_url(thread), boundary("model_switch", "ms-1", model="beta-model"), status=201
    ).json()
    assert body["session_id"] == thread["segment"]["session_id"]
    assert body["segment_no"] == 2
    assert body["key"] == f"{thread['segment']['session_id']}#2"
    assert body["model"] == "beta-model"
    assert api.get(f"/api/v1/threads/{thread['id']}").json()["model"] == "beta-model"
    assert ThreadSession.objects.filter(thread_id=thread["id"]).count() == 1


def test_r1_2_tool_surface_change_opens_the_next_segment(api, thread):
    body = api.post(
        boundaries_url(thread),
        boundary("tool_surface_change", "ts-1", tool_surface=["kb_search", "calculator"]),
        status=201,
    ).json()
    assert body["segment_no"] == 2
    assert body["session_id"] == thread["segment"]["session_id"]
    assert body["tool_surface"] == ["calculator", "kb_search"]
    assert body["model"] == thread["model"]
    assert api.get(f"/api/v1/threads/{thread['id']}").json()["tool_surface"] == [
        "calculator",
        "kb_search",
    ]


@pytest.mark.parametrize(
    ("kind", "extra"),
    [("mode_change", {"mode": "strict"}), ("prompt_change", {"system_prompt": "New prompt."})],
)
def test_r1_3_mode_and_prompt_changes_are_boundaries_too(api, thread, kind, extra):
    body = api.post(boundaries_url(thread), boundary(kind, f"{kind}-1", **extra), status=201)
    assert body.json()["segment_no"] == 2
    assert Segment.objects.get(key=thread["segment"]["key"]).closed_kind == kind


def test_r1_4_the_old_segment_is_closed_with_who_why_when_and_otherwise_unchanged(
    api, thread, manual_clock
):
    old = Segment.objects.get(key=thread["segment"]["key"])
    frozen_fields = {
        name: getattr(old, name)
        for name in (
            "key",
            "thread_id",
            "session_id",
            "segment_no",
            "model",
            "mode",
            "tool_surface",
            "system_prompt",
            "opened_at",
        )
    }
    manual_clock.advance(minutes=7)
    body = api.post(
        boundaries_url(thread),
        {
            "kind": "model_switch",
            "model": "gamma-model",
            "reason": "  alpha keeps refusing  ",
            "idempotency_key": "r14",
        },
        status=201,
    ).json()
    old.refresh_from_db()
    assert {name: getattr(old, name) for name in frozen_fields} == frozen_fields
    assert old.closed_at == manual_clock()
    assert old.closed_kind == "model_switch"
    assert old.closed_by == USERNAME
    assert old.close_reason == "alpha keeps refusing"
    assert old.next_segment.key == body["key"]

    audit = AuditEntry.objects.get(idempotency_key="boundary:r14")
    assert audit.action == "boundary.model_switch"
    assert audit.actor == USERNAME
    assert audit.reason == "alpha keeps refusing"
    assert audit.target_id == old.key
    assert audit.detail["closed"] == old.key and audit.detail["opened"] == body["key"]
    assert audit.at == manual_clock()


def test_r3_8_after_a_boundary_every_provider_is_eligible_again(api, thread, manual_clock):
    for provider_id in ("alpha", "beta", "gamma"):
        _refusal(thread, provider_id, 4, manual_clock() - timedelta(hours=8))
    path = f"/api/v1/threads/{thread['id']}/segment"
    assert {row["state"] for row in api.get(path).json()["providers"]} == {"frozen"}
    body = api.post(boundaries_url(thread), boundary("compact", "thaw"), status=201).json()
    assert [row["state"] for row in body["providers"]] == ["eligible"] * 3
    assert all(row["refusals"] == 0 for row in body["providers"])
    assert [row["state"] for row in api.get(path).json()["providers"]] == ["eligible"] * 3
    # R1.4: the old segment keeps its refusal records.
    assert SegmentRefusal.objects.filter(segment__key=thread["segment"]["key"]).count() == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "compact", "idempotency_key": "e1"}, "reason"),
        ({"kind": "compact", "reason": "", "idempotency_key": "e2"}, "reason"),
        ({"kind": "compact", "reason": "   ", "idempotency_key": "e3"}, "reason"),
        ({"kind": "compact", "reason": 5, "idempotency_key": "e4"}, "reason"),
        ({"kind": "compact", "reason": "why"}, "idempotency_key"),
        ({"kind": "compact", "reason": "why", "idempotency_key": ""}, "idempotency_key"),
        ({"kind": "compact", "reason": "why", "idempotency_key": 9}, "idempotency_key"),
        (
            {"kind": "compact", "reason": "why", "idempotency_key": "k" * 291},
            "idempotency_key",
        ),
        ({"reason": "why", "idempotency_key": "e5"}, "kind"),
        ({"kind": "explode", "reason": "why", "idempotency_key": "e6"}, "kind"),
        ({"kind": 1, "reason": "why", "idempotency_key": "e7"}, "kind"),
        ({"kind": "model_switch", "reason": "why", "idempotency_key": "e8"}, "model"),
        ({"kind": "model_switch", "reason": "why", "idempotency_key": "e9", "model": ""}, "model"),
        (
            {"kind": "model_switch", "reason": "why", "idempotency_key": "e10", "model": 4},
            "model",
        ),
        (
            {"kind": "model_switch", "reason": "w", "idempotency_key": "e10b", "model": "m" * 201},
            "model",
        ),
        (
            {
                "kind": "tool_surface_change",
                "reason": "why",
                "idempotency_key": "e11",
                "tool_surface": ["calculator", "shell"],
            },
            "tool_surface",
        ),
        (
            {
                "kind": "tool_surface_change",
                "reason": "why",
                "idempotency_key": "e12",
                "tool_surface": "calculator",
            },
            "tool_surface",
        ),
    ],
    ids=lambda value: json.dumps(value)[:60] if isinstance(value, dict) else value,
)
def test_r8_3_boundary_bad_input_is_400_naming_the_field_and_writes_nothing(
    api, thread, body, field
):
    before = counts()
    api.error(api.post(boundaries_url(thread), body), 400, field)
    assert counts() == before
    assert open_segment(thread).key == thread["segment"]["key"]


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "model_switch", "model": "alpha-model"},
        {"kind": "tool_surface_change", "tool_surface": []},
        {"kind": "tool_surface_change"},
        {"kind": "mode_change", "mode": "default"},
        {"kind": "prompt_change", "system_prompt": ""},
    ],
    ids=["same-model", "empty-surface-is-current", "surface-not-given", "same-mode", "same-prompt"],
)
def test_r1_2_a_configuration_boundary_that_changes_nothing_is_400(api, thread, body):
    before = counts()
    message = api.error(
        api.post(boundaries_url(thread), {**body, "reason": "why", "idempotency_key": "same"}),
        400,
        "kind",
    )
    assert body["kind"] in message
    assert counts() == before
    assert open_segment(thread).key == thread["segment"]["key"]


def test_r8_3_double_click_makes_one_boundary_and_one_audit_entry(api, thread, manual_clock):
    first = api.post(boundaries_url(thread), boundary("compact", "click"), status=201).json()
    before = counts()
    manual_clock.advance(seconds=1)
    second = api.post(boundaries_url(thread), boundary("compact", "click"), status=200).json()
    assert second["key"] == first["key"]
    assert second["session_id"] == first["session_id"]
    assert counts() == before
    assert AuditEntry.objects.filter(idempotency_key="boundary:click").count() == 1
    assert AuditEntry.objects.filter(action__startswith="boundary.").count() == 1
    assert ThreadSession.objects.filter(thread_id=thread["id"]).count() == 2


def test_r8_3_a_repeated_key_returns_the_first_boundary_whatever_the_repeat_says(api, thread):
    first = api.post(boundaries_url(thread), boundary("compact", "once"), status=201).json()
    again = api.post(
        boundaries_url(thread), boundary("model_switch", "once", model="beta-model"), status=200
    ).json()
    assert again["key"] == first["key"]
    assert open_segment(thread).model == thread["model"]


def test_r8_3_a_boundary_key_used_on_another_thread_is_400(api, thread, providers):
    other = api.post("/api/v1/threads", {"provider_chain": ["beta"]}, status=201).json()
    api.post(boundaries_url(thread), boundary("compact", "shared-b"), status=201)
    before = counts()
    api.error(
        api.post(boundaries_url(other), boundary("compact", "shared-b")), 400, "idempotency_key"
    )
    assert counts() == before
    assert open_segment(other).key == other["segment"]["key"]


def test_r8_3_two_boundaries_with_different_keys_make_two(api, thread):
    a = api.post(boundaries_url(thread), boundary("model_switch", "a", model="x-1"), status=201)
    b = api.post(boundaries_url(thread), boundary("model_switch", "b", model="x-2"), status=201)
    assert a.json()["segment_no"] == 2 and b.json()["segment_no"] == 3
    closed = Segment.objects.get(key=a.json()["key"])
    assert closed.closed_kind == "model_switch" and closed.next_segment.key == b.json()["key"]
    assert AuditEntry.objects.filter(action="boundary.model_switch").count() == 2


@pytest.mark.parametrize("thread_id", [UNKNOWN_ID, "not-a-uuid"])
def test_boundary_on_unknown_or_malformed_thread_is_404_json(api, thread_id):
    before = counts()
    api.error(
        api.post(f"/api/v1/threads/{thread_id}/boundaries", boundary("compact", "k")), 404, None
    )
    assert counts() == before


def test_r8_3_forcing_a_boundary_needs_the_permission(client, django_user_model, manual_clock):
    from governance.models import AuditEntry, Segment

    Provider.objects.create(provider_id="solo", kind="scripted", model="solo-model")
    plain = django_user_model.objects.create_user("no-perms")
    ApiToken.objects.create(user=plain, name="plain", key_digest=token_digest("plain-token-1"))
    api = JsonApi(client, "plain-token-1")
    made = services.create_thread(provider_chain=["solo"], user=plain, now=manual_clock())
    thread = {"id": made.id}
    before = (Segment.objects.count(), AuditEntry.objects.count())
    response = api.post(
        f"/api/v1/threads/{thread['id']}/boundaries",
        {"kind": "fresh_start", "reason": "try", "idempotency_key": "k-1"},
    )
    assert response.status_code == 403
    assert "apply_boundary" in response.json()["error"]["message"]
    assert (Segment.objects.count(), AuditEntry.objects.count()) == before


def test_r8_3_the_longest_accepted_boundary_key_is_stored_whole(api, thread):
    """290 characters plus the audit namespace still fits its column."""
    key = "k" * 290
    first = api.post(boundaries_url(thread), boundary("compact", key), status=201).json()
    again = api.post(boundaries_url(thread), boundary("compact", key), status=200).json()
    assert first["key"] == again["key"]


# --------------------------------------------------------------------------- hostile text


HOSTILE = [
    ("nul", '{"input": "a\\u0000b"}', "input"),
    ("lone-surrogate", '{"input": "a\\ud800b"}', None),
    ("unknown-field", '{"input": "x", "priority": 9}', "priority"),
    ("budget-1e40", '{"input": "x", "budget": {"model_requests": 1e40}}', "budget"),
    # A JSON integer of 41 digits was a Python int and was accepted silently.
    (
        "budget-10**40",
        '{"input": "x", "budget": {"model_requests": ' + str(10**40) + "}}",
        "budget",
    ),
    ("budget-unknown", '{"input": "x", "budget": {"gpu_hours": 1}}', "budget"),
    ("nested", '{"input": ' + "[" * 5000 + "]" * 5000 + "}", None),
    ("key-nul", '{"input": "x", "idempotency_key": "k\\u0000"}', "idempotency_key"),
]


@pytest.mark.parametrize(
    ("data", "field"), [(d, f) for _, d, f in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_submit_bodies_are_400_naming_the_field_and_write_nothing(api, thread, data, field):
    """Each of these was a 500 (DataError, UnicodeEncodeError after 9-15 s,
    RecursionError) or silently accepted before the schemas."""
    before = counts()
    response = api.post_raw(
        f"/api/v1/threads/{thread['id']}/runs", data.encode(), "application/json"
    )
    api.error(response, 400, field)
    assert counts() == before


def test_nul_in_a_thread_title_and_a_boundary_reason_is_400(api, thread):
    api.error(
        api.post("/api/v1/threads", {"provider_chain": ["alpha"], "title": "a\x00b"}), 400, "title"
    )
    response = api.post(
        f"/api/v1/threads/{thread['id']}/boundaries",
        {"kind": "compact", "reason": "why\x00", "idempotency_key": "k-1"},
    )
    api.error(response, 400, "reason")
