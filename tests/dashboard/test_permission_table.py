"""Who may write what (R8): every mutating endpoint, API and dashboard, declares
the permission it checks, and every role and token scope is tried against
every write. Where the table says no: 403, and nothing is written."""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Group
from django.urls import URLPattern, URLResolver, get_resolver, resolve

from dashboard.site import permissions
from governance import services, time_source
from governance.models import (
    ApiToken,
    AuditEntry,
    BodyChunk,
    Incident,
    Notification,
    Provider,
    Route,
    Run,
    Segment,
    Stage,
    Thread,
    ToolApproval,
    ToolServer,
    ViewerPreference,
)
from governance.roles import ACTIONS, ROLES
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from governance.services.tokens import token_digest
from tests import facts as written_facts

pytestmark = pytest.mark.django_db

WRITES = ("POST", "PUT", "PATCH", "DELETE")
# A real stdio MCP server from this virtual environment (registering lists its tools).
TIME_SERVER = str(Path(sys.executable).parent / "mcp-server-time")


# --------------------------------------------------------------------------- the URL map


def routes(patterns=None, prefix=""):
    """(route, view) of every address but Django's admin (its ModelAdmins check
    model permissions themselves)."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            if entry.namespace == "admin":
                continue
            yield from routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern), entry.callback


def test_every_view_declares_what_each_of_its_methods_needs():
    undeclared = [route for route, view in routes() if not hasattr(view, "required_permissions")]
    assert undeclared == []


def test_every_write_names_a_permission_or_says_it_needs_none():
    """A write's declaration is a permission, or explicitly the signed-in user
    acting on its own (tokens), or anyone (the login form): never left empty."""
    for route, view in routes():
        for method, needed in view.required_permissions.items():
            if method in WRITES:
                assert needed, f"{route} {method} declares no permission"
                named = needed if isinstance(needed, tuple) else (needed,)
                assert all(
                    part in (permissions.SIGNED_IN, permissions.ANYONE, permissions.OWN_RUN)
                    or (part.startswith("governance.") and part.split(".", 1)[1] in ACTIONS)
                    for part in named
                ), (route, method, needed)


SAMPLE = {"uuid": str(uuid.uuid4()), "int": "987654", "str": "x", "path": "x", "slug": "x"}


def sample_url(route: str) -> str:
    """The route with a value of each converter's kind (nothing is found by it)."""
    url = route
    while "<" in url:
        start, end = url.index("<"), url.index(">")
        kind = url[start + 1 : end].split(":")[0] if ":" in url[start:end] else "str"
        url = url[:start] + SAMPLE[kind] + url[end + 1 :]
    return "/" + url.lstrip("^").rstrip("$")


def test_a_method_a_view_does_not_declare_is_refused_before_anything_runs(client, make_user):
    """The declaration is honest: a write method it leaves out answers 405 (for
    an administrator too), so no write can hide behind a read's declaration."""
    admin = make_user("table-admin", is_superuser=True, is_staff=True)
    client.force_login(admin)
    checked = 0
    for route, view in routes():
        for method in WRITES:
            if method in view.required_permissions:
                continue
            response = client.generic(method, sample_url(route))
            assert response.status_code == 405, (route, method, response.status_code)
            checked += 1
    assert checked > 40


# --------------------------------------------------------------------------- the table

# The specification, written out here by hand rather than read back from the
# views: for each write, what an actor gets — "ok", 403 (it may see the thing
# but lacks the permission) or 404 (someone else's, and it sees only its own).
# "own" is the actor's own thread or run; "someone's" another user's.


def holds(actor: str, codename: str) -> bool:
    """What the actor's role (or its token's single scope) grants."""
    if actor == "admin":
        return True
    if actor.startswith("scope:"):
        return actor.split(":", 1)[1] == codename
    if actor.startswith("role:"):
        return codename in ROLES[actor.split(":", 1)[1]]
    return False


def as_owner(actor: str, codename: str) -> bool:
    """A run's owner acts on it whatever its role, unless its token's scope
    leaves the act out (R7.1: who asked stops their run; R7.2: their acks)."""
    return not actor.startswith("scope:") or actor.split(":", 1)[1] == codename


def needs(codename: str):
    return lambda actor: "ok" if holds(actor, codename) else 403


def needs_all(*codenames: str):
    return lambda actor: "ok" if all(holds(actor, c) for c in codenames) else 403


def on_someones(codename: str):
    """The permission, checked first; then someone else's is a 404 unless the
    actor sees everything."""

    def expect(actor):
        if not holds(actor, codename):
            return 403
        return "ok" if holds(actor, "see_all_runs") else 404

    return expect


def someones_run(codename: str | None):
    """Someone else's run: a 404 unless the actor sees everything; then the
    permission (None: nobody but the owner)."""

    def expect(actor):
        if not holds(actor, "see_all_runs"):
            return 404
        return "ok" if codename and holds(actor, codename) else 403

    return expect


def decide_someones_call(actor: str):
    """decide_approval, checked first; someone else's run is a 404 unless the
    actor sees everything; then the tool's policy names the operator role (an
    administrator is in every role), so on-call's answer is a 403."""
    if not holds(actor, "decide_approval"):
        return 403
    if not holds(actor, "see_all_runs"):
        return 404
    return "ok" if actor in ("admin", "role:operator") else 403


def door(actor: str):
    """use_openai_door (by role and scope) and submit_run (by role: a scoped
    token's user here is a superuser, whose role grants everything)."""
    if actor.startswith("scope:"):
        return "ok" if holds(actor, "use_openai_door") else 403
    return "ok" if holds(actor, "use_openai_door") and holds(actor, "submit_run") else 403


API_WRITES = {
    "create thread": needs("submit_run"),
    "submit run on own thread": needs("submit_run"),
    "submit run on someone's thread": on_someones("submit_run"),
    # A new thread of the actor's (no session id), its run admitted; the answer
    # waits for the settlement, which this test does not read. The door submits
    # runs: the role must grant submit_run too, but a token's scope names the
    # door alone (scope:submit_run alone is refused, scope:use_openai_door is not).
    "chat completion (OpenAI door)": door,
    "force boundary": needs("apply_boundary"),
    "cancel own run": lambda actor: "ok" if as_owner(actor, "cancel_run") else 403,
    "cancel someone's run": someones_run("cancel_run"),
    "ack own run's chunks": lambda actor: "ok" if as_owner(actor, "submit_run") else 403,
    "ack someone's run's chunks": someones_run(None),
    "ack notification": needs("acknowledge_notification"),
    "ack incident": needs("acknowledge_notification"),
    "resolve incident": needs("acknowledge_notification"),
    "approve a call in someone's run": decide_someones_call,
    "add provider": needs("change_provider"),
    "change provider": needs("change_provider"),
    "add route": needs("change_provider"),
    "change route": needs("change_provider"),
    "add tool": needs("change_toolserver"),
    "change tool": needs("change_toolserver"),
}
PAGE_WRITES = {
    "ack alert": needs("acknowledge_notification"),
    "ack incident": needs("acknowledge_notification"),
    "resolve incident": needs("acknowledge_notification"),
    # The page lists every request (no ownership on the inbox); the policy's role decides.
    "approve a call": lambda actor: "ok" if actor in ("admin", "role:operator") else 403,
    "tool approval policy": needs("change_toolserver"),
    "force boundary": needs("apply_boundary"),
    "stop own run": lambda actor: "ok",
    "stop someone's run": someones_run("cancel_run"),
    "provider prices": needs("change_provider"),
    "provider schedule": needs("change_provider"),
    "new token": lambda actor: "ok",  # its own token, never wider than its role
    "choose time zone": lambda actor: "ok",  # how times are shown to this person only
    # A stdio server runs a command on the workers: run_tool_command as well.
    "register stdio tool": needs_all("change_toolserver", "run_tool_command"),
    "import tools file (a stdio server)": needs_all("change_toolserver", "run_tool_command"),
}
API_ACTORS = [
    *(f"role:{role}" for role in ROLES),
    "admin",
    *(f"scope:{scope}" for scope in ACTIONS),
]
PAGE_ACTORS = [*(f"role:{role}" for role in ROLES), "admin", "no role"]


@dataclass
class World:
    thread: Thread  # the actor's
    run: Run  # the actor's
    their_thread: Thread  # someone else's
    their_run: Run
    notification: Notification
    incident: Incident
    approval: ToolApproval  # a call in someone else's run, waiting for a person


def make_actor(django_user_model, actor: str):
    """The user an actor names; for a scope, a superuser's token narrowed to it."""
    from governance.roles import ensure_roles

    ensure_roles()
    if actor == "admin" or actor.startswith("scope:"):
        user = django_user_model.objects.create_superuser("actor", password="pw-for-tests-1")
    else:
        user = django_user_model.objects.create_user("actor", password="pw-for-tests-1")
        if actor.startswith("role:"):
            user.groups.add(Group.objects.get(name=actor.split(":", 1)[1]))
    scopes = [actor.split(":", 1)[1]] if actor.startswith("scope:") else []
    ApiToken.objects.create(
        user=user, name="actor", key_digest=token_digest("actor-token-1"), scopes=scopes
    )
    return user


def make_world(user, someone) -> World:
    """A thread and a run of the actor's and of someone else's (each with a
    committed chunk), a notification on the actor's segment, a provider, a route and a
    registry tool."""
    now = time_source.now()
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model", script={})
    Route.objects.create(name="r", provider_chain=["p"], created_at=now, updated_at=now)
    ToolServer.objects.create(
        name="weather", kind="http", url="http://127.0.0.1:9/weather", method="GET",
        description="Weather", parameters={"type": "object"}, effect="read_only",
    )  # fmt: skip
    made = []
    for owner in (user, someone):
        thread = services.create_thread(provider_chain=["p"], title="t", user=owner, now=now)
        run, _stage, _ = services.submit_run(thread, input="hi", user=owner, now=now)
        services.commit_chunks(run, ["a"], now)
        made += [thread, run]
    segment = services.open_segment(made[0])
    incident = Incident.objects.create(key="incident:table:1", segment=segment, opened_at=now)
    notification = Notification.objects.create(
        dedupe_key="n-1", severity="critical", text="frozen", segment=segment, created_at=now,
        incident=incident, leads_incident=True,
    )  # fmt: skip
    asking = Stage.objects.create(
        run=made[3], seq=99, kind="tool_call", payload={}, enqueued_at=now, parked_at=now
    )
    approval = ToolApproval.objects.create(
        run=made[3], stage=asking, tool="weather", arguments={"city": "Oslo"},
        idempotency_key="k-approval", policy="always", approver_role="operator",
        requested_at=now, expires_at=now + timedelta(hours=1),
    )  # fmt: skip
    return World(*made, notification, incident, approval)


def written() -> tuple:
    """What a write would change."""
    return (
        Thread.objects.count(),
        Run.objects.count(),
        Segment.objects.count(),
        AuditEntry.objects.count(),
        ApiToken.objects.count(),
        sorted(ViewerPreference.objects.values_list("user_id", "time_zone")),
        sorted(Provider.objects.values_list("provider_id", "enabled", "updated_at", "currency")),
        sorted(Route.objects.values_list("name", "enabled", "updated_at")),
        sorted(ToolServer.objects.values_list("name", "enabled", "approval")),
        list(Notification.objects.values_list("acked_at", flat=True)),
        list(Incident.objects.values_list("state", flat=True)),
        list(ToolApproval.objects.values_list("state", flat=True)),
        sorted(Run.objects.values_list("id", "cancel_requested_at")),
        sorted(BodyChunk.objects.values_list("id", "observed_at")),
    )


def api_calls(world: World) -> dict[str, tuple[str, str, dict | None]]:
    """Each row's request: (method, path, body)."""
    t, r, their_t, their_r = (
        world.thread.id,
        world.run.id,
        world.their_thread.id,
        world.their_run.id,
    )
    return {
        "create thread": ("POST", "/api/v1/threads", {"provider_chain": ["p"]}),
        "submit run on own thread": ("POST", f"/api/v1/threads/{t}/runs", {"input": "again"}),
        "submit run on someone's thread": (
            "POST", f"/api/v1/threads/{their_t}/runs", {"input": "again"},
        ),
        "chat completion (OpenAI door)": (
            "POST", "/v1/chat/completions",
            # Streamed: its status comes at once (no worker runs here).
            {"model": "r", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ),
        "force boundary": (
            "POST", f"/api/v1/threads/{t}/boundaries",
            {"kind": "fresh_start", "reason": "table", "idempotency_key": "k-table"},
        ),
        "cancel own run": ("POST", f"/api/v1/runs/{r}/cancel", None),
        "cancel someone's run": ("POST", f"/api/v1/runs/{their_r}/cancel", None),
        "ack own run's chunks": ("POST", f"/api/v1/runs/{r}/acks", {"through": 1}),
        "ack someone's run's chunks": ("POST", f"/api/v1/runs/{their_r}/acks", {"through": 1}),
        "ack notification": ("POST", f"/api/v1/notifications/{world.notification.id}/ack", None),
        "ack incident": ("POST", f"/api/v1/incidents/{world.incident.id}/ack", {"note": "n"}),
        "resolve incident": ("POST", f"/api/v1/incidents/{world.incident.id}/resolve", {}),
        "approve a call in someone's run": (
            "POST", f"/api/v1/approvals/{world.approval.id}", {"decision": "approve"},
        ),
        "add provider": (
            "POST", "/api/v1/providers",
            {"provider_id": "p2", "kind": "scripted", "model": "m", "script": {}},
        ),
        "change provider": ("PATCH", "/api/v1/providers/p", {"enabled": False}),
        "add route": ("POST", "/api/v1/routes", {"name": "r2", "provider_chain": ["p"]}),
        "change route": ("PATCH", "/api/v1/routes/r", {"enabled": False}),
        "add tool": (
            "POST", "/api/v1/tools",
            {"name": "news", "kind": "http", "url": "http://127.0.0.1:9/news", "method": "GET",
             "description": "News", "parameters": {"type": "object"}, "effect": "read_only"},
        ),
        "change tool": ("PATCH", "/api/v1/tools/weather", {"enabled": False, "reason": "x"}),
    }  # fmt: skip


def api_request(client, world: World, action: str):
    method, path, body = api_calls(world)[action]
    return client.generic(
        method, path, json.dumps(body) if body is not None else b"",
        content_type="application/json", headers={"Authorization": "Bearer actor-token-1"},
    )  # fmt: skip


def page_request(client, world: World, action: str):
    segment = services.open_segment(world.thread)
    calls = {
        "ack alert": (f"/alerts/{world.notification.id}/ack", {}),
        "ack incident": (f"/incidents/{world.incident.id}/ack", {"note": "n"}),
        "resolve incident": (f"/incidents/{world.incident.id}/resolve", {}),
        "approve a call": (f"/approvals/{world.approval.id}/decide", {"decision": "approve"}),
        "tool approval policy": (
            "/tools/weather/approval",
            {"approval-weather-approval": "always", "approval-weather-approver_role": "operator",
             "approval-weather-wait_minutes": "60"},
        ),
        "force boundary": (
            f"/segments/{segment.id}/boundary",
            {"kind": "fresh_start", "reason": "table", "idempotency_key": "k-page"},
        ),
        "stop own run": (f"/runs/{world.run.id}/stop", {}),
        "stop someone's run": (f"/runs/{world.their_run.id}/stop", {}),
        "provider prices": (
            "/providers/p/prices",
            {"prices-p-price_input_per_mtok": "1", "prices-p-price_output_per_mtok": "2",
             "prices-p-currency": "EUR", "prices-p-reason": "table"},
        ),
        "provider schedule": (
            "/providers/p/schedule",
            {"schedule-p-delays": "10m, 30m", "schedule-p-categories": "",
             "schedule-p-reason": "table"},
        ),
        "new token": ("/tokens/", {"name": "mine"}),
        "choose time zone": ("/me/time-zone", {"time_zone": "Europe/Berlin"}),
        "register stdio tool": (
            "/tools/stdio",
            {"stdio-name": "clock", "stdio-command": TIME_SERVER, "stdio-reason": "table"},
        ),
        "import tools file (a stdio server)": (
            "/tools/import/register",
            {"content": json.dumps({"mcpServers": {"clock": {"command": TIME_SERVER}}}),
             "reason": "table"},
        ),
    }  # fmt: skip
    path, data = calls[action]
    return client.post(path, data)


def check(response, expected, before) -> None:
    if expected == "ok":
        assert response.status_code in (200, 201, 202, 302), response.content[:300]
        assert written() != before
    else:
        assert response.status_code == expected, response.content[:300]
        assert written() == before


def test_every_write_of_the_api_and_the_door_is_a_row_of_the_table():
    """The OpenAI door's included: a new write endpoint cannot miss the table."""
    ids = {name: SimpleNamespace(id=uuid.uuid4()) for name in ("thread", "run", "their_thread")}
    fake = SimpleNamespace(**ids, their_run=SimpleNamespace(id=uuid.uuid4()),
                           notification=SimpleNamespace(id=1),
                           incident=SimpleNamespace(id=1),
                           approval=SimpleNamespace(id=1))  # fmt: skip
    rows = {(method, resolve(path).func) for method, path, _body in api_calls(fake).values()}
    assert set(api_calls(fake)) == set(API_WRITES)
    missing = [
        (route, method)
        for route, view in routes()
        if route.startswith(("api/v1/", "v1/"))
        for method in view.required_permissions
        if method in WRITES and (method, view) not in rows
    ]
    assert missing == []
    assert ("POST", resolve("/v1/chat/completions").func) in rows


@pytest.mark.parametrize("actor", API_ACTORS)
@pytest.mark.parametrize("action", list(API_WRITES))
def test_api_writes_by_role_and_scope(client, django_user_model, make_user, actor, action):
    world = make_world(make_actor(django_user_model, actor), make_user("someone", "agent-client"))
    before = written()
    response = api_request(client, world, action)
    check(response, API_WRITES[action](actor), before)
    if response.status_code == 403:
        error = response.json()["error"]
        assert "permission" in error["message"] or "owner" in error["message"]
        if action == "chat completion (OpenAI door)":
            # OpenAI's shape: its SDK raises PermissionDeniedError on it.
            assert error["type"] == "permission_error"
            assert "'use_openai_door'" in error["message"] or "'submit_run'" in error["message"]


@pytest.mark.parametrize("actor", API_ACTORS)
def test_any_token_lists_the_doors_models(client, django_user_model, actor):
    """The door's read (GET /v1/models): any valid token, whatever its role or scope."""
    make_actor(django_user_model, actor)
    answer = client.get("/v1/models", headers={"Authorization": "Bearer actor-token-1"})
    assert answer.status_code == 200 and answer.json()["object"] == "list"
    assert client.get("/v1/models").status_code == 401


@pytest.mark.parametrize("actor", PAGE_ACTORS)
@pytest.mark.parametrize("action", list(PAGE_WRITES))
def test_dashboard_writes_by_role(client, django_user_model, make_user, actor, action):
    user = make_actor(django_user_model, actor)
    world = make_world(user, make_user("someone", "agent-client"))
    client.force_login(user)
    before = written()
    check(page_request(client, world, action), PAGE_WRITES[action](actor), before)


# --------------------------------------------------------------------------- ownership


def client_token(django_user_model, name: str) -> tuple[object, dict]:
    from governance.roles import ensure_roles

    ensure_roles()
    user = django_user_model.objects.create_user(name)
    user.groups.add(Group.objects.get(name="agent-client"))
    token = f"{name}-token-" + "z" * 16
    ApiToken.objects.create(user=user, name=name, key_digest=token_digest(token))
    return user, {"Authorization": f"Bearer {token}"}


def call(client, auth, method, path, body=None):
    return client.generic(
        method, path, json.dumps(body) if body is not None else b"",
        content_type="application/json", headers=auth,
    )  # fmt: skip


def test_two_service_accounts_never_see_or_touch_each_others_threads_and_runs(
    client, django_user_model
):
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    _alice, alice = client_token(django_user_model, "alice")
    _bob, bob = client_token(django_user_model, "bob")
    thread = call(client, alice, "POST", "/api/v1/threads", {"provider_chain": ["p"]}).json()
    run = call(client, alice, "POST", f"/api/v1/threads/{thread['id']}/runs", {"input": "hi"})
    run_id = run.json()["run_id"]
    services.commit_chunks(Run.objects.get(id=run_id), ["a"], time_source.now())
    segment = services.open_segment(Thread.objects.get(id=thread["id"])).key
    Notification.objects.create(
        dedupe_key="alice-n", severity="critical", text="frozen", created_at=time_source.now(),
        segment=Segment.objects.get(key=segment),
    )  # fmt: skip
    before = written()
    for method, path, body in (
        ("GET", f"/api/v1/threads/{thread['id']}", None),
        ("GET", f"/api/v1/threads/{thread['id']}/segment", None),
        ("POST", f"/api/v1/threads/{thread['id']}/runs", {"input": "mine now"}),
        ("GET", f"/api/v1/runs/{run_id}", None),
        ("GET", f"/api/v1/runs/{run_id}?wait=1", None),
        ("GET", f"/api/v1/runs/{run_id}/events", None),
        ("POST", f"/api/v1/runs/{run_id}/acks", {"through": 1}),
        ("POST", f"/api/v1/runs/{run_id}/cancel", None),
        ("GET", f"/api/v1/segments/{segment.replace('#', '%23')}", None),
    ):
        response = call(client, bob, method, path, body)
        assert response.status_code == 404, (method, path, response.status_code)
        assert "no such" in response.json()["error"]["message"]
    assert written() == before
    assert call(client, bob, "GET", "/api/v1/threads").json()["items"] == []
    assert call(client, bob, "GET", "/api/v1/notifications").json()["items"] == []
    # Alice sees and acts on her own.
    assert [t["id"] for t in call(client, alice, "GET", "/api/v1/threads").json()["items"]] == [
        thread["id"]
    ]
    assert call(client, alice, "GET", "/api/v1/notifications").json()["items"][0]["dedupe_key"]
    assert call(client, alice, "GET", f"/api/v1/runs/{run_id}").status_code == 200
    assert (
        call(client, alice, "POST", f"/api/v1/runs/{run_id}/acks", {"through": 1}).json()[
            "observed"
        ]
        == 1
    )
    assert call(client, alice, "POST", f"/api/v1/runs/{run_id}/cancel").status_code == 202


def test_a_service_account_cannot_cancel_an_operators_run(client, django_user_model, make_user):
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    operator = make_user("oscar", "operator")
    thread = services.create_thread(provider_chain=["p"], user=operator, now=time_source.now())
    run, _stage, _ = services.submit_run(
        thread, input="ops work", user=operator, now=time_source.now()
    )
    _client, auth = client_token(django_user_model, "carol")
    assert call(client, auth, "POST", f"/api/v1/runs/{run.id}/cancel").status_code == 404
    assert Run.objects.get(id=run.id).cancel_requested_at is None


def test_staff_watching_a_clients_run_record_no_delivery_evidence(
    client, django_user_model, make_user
):
    """R7.2: sent and observed are the client's evidence; an administrator who
    opens the watch page or the stream is an onlooker."""
    from governance.models import RunViewer

    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    owner, _auth = client_token(django_user_model, "dora")
    thread = services.create_thread(provider_chain=["p"], user=owner, now=time_source.now())
    run, _stage, _ = services.submit_run(thread, input="hi", user=owner, now=time_source.now())
    services.commit_chunks(run, ["a", "b"], time_source.now())
    admin = make_user("root-admin", is_superuser=True, is_staff=True)
    client.force_login(admin)
    assert client.get(f"/runs/{run.id}/watch").status_code == 200
    written_facts.settle(
        run, Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "done"), time_source.now()
    )
    stream = client.get(f"/api/v1/runs/{run.id}/events", {"last_event_id": "0"})
    assert stream.status_code == 200
    streamed = b"".join(stream.streaming_content)  # ends at the settlement
    assert b'"kind":"chunk"' in streamed and b"settlement" in streamed
    acked = client.post(
        f"/api/v1/runs/{run.id}/acks", json.dumps({"through": 2}),
        content_type="application/json",
    )  # fmt: skip
    assert acked.status_code == 403
    assert "owner" in acked.json()["error"]["message"]
    assert not RunViewer.objects.filter(run=run).exists()
    assert list(BodyChunk.objects.filter(run=run).values_list("sent_at", "observed_at")) == [
        (None, None),
        (None, None),
    ]


def test_the_migration_gives_existing_runs_an_owner(django_user_model):
    """0019: the user the admission recorded, else the thread's creator."""
    import importlib

    from django.apps import apps

    give_owners = importlib.import_module("governance.migrations.0019_run_owner").give_owners
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    asker = django_user_model.objects.create_user("asker")
    creator = django_user_model.objects.create_user("creator")
    thread = services.create_thread(provider_chain=["p"], user=creator, now=time_source.now())
    by_asker, _s, _ = services.submit_run(thread, input="a", user=asker, now=time_source.now())
    later = time_source.now() + timedelta(seconds=1)
    by_nobody, _s, _ = services.submit_run(thread, input="b", now=later)
    Run.objects.update(owner=None)
    give_owners(apps, None)
    assert Run.objects.get(id=by_asker.id).owner == asker
    assert Run.objects.get(id=by_nobody.id).owner == creator
