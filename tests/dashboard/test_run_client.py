"""Which API token made a run — its client, by the name the token had — in the
run API's JSON and on the dashboard; and the OpenAI door's own scope
(``use_openai_door``): a token scoped to the door alone calls the door and
none of the run API's writes, one scoped without it gets OpenAI's 403."""

from __future__ import annotations

import importlib
import json

import openai
import pytest
from django.core.management import call_command

from governance import services, time_source
from governance.models import ApiToken, Run, Segment, Thread
from governance.services.tokens import revoke_token, token_digest

pytestmark = pytest.mark.django_db

CHAT = {"model": "p", "messages": [{"role": "user", "content": "hello door"}]}
STREAMED = {**CHAT, "stream": True}


def token(user, name: str, secret: str, scopes=()) -> dict:
    ApiToken.objects.create(
        user=user, name=name, key_digest=token_digest(secret), scopes=list(scopes)
    )
    return {"Authorization": f"Bearer {secret}"}


def call(client, auth: dict, method: str, path: str, body: dict | None = None, **headers):
    return client.generic(
        method, path, json.dumps(body) if body is not None else b"",
        content_type="application/json", headers={**auth, **headers},
    )  # fmt: skip


@pytest.fixture
def provider():
    from governance.models import Provider

    return Provider.objects.create(provider_id="p", kind="scripted", model="p-model", script={})


def test_a_run_submitted_with_a_named_token_names_its_client_in_json_and_on_its_page(
    client, make_user, operator, provider
):
    agent = make_user("billing", "agent-client")
    auth = token(agent, "billing agent", "billing-token-" + "x" * 20)
    thread = call(client, auth, "POST", "/api/v1/threads", {"provider_chain": ["p"]}).json()
    submitted = call(client, auth, "POST", f"/api/v1/threads/{thread['id']}/runs", {"input": "hi"})
    assert submitted.status_code == 202, submitted.content
    run_id = submitted.json()["run_id"]
    run = Run.objects.get(id=run_id)
    assert (run.client_name, run.api_token.name) == ("billing agent", "billing agent")
    assert call(client, auth, "GET", f"/api/v1/runs/{run_id}").json()["client"] == "billing agent"

    client.force_login(operator)
    page = client.get(f"/runs/{run_id}/").content.decode()
    assert 'client: <strong class="client-name">billing agent</strong>' in page
    assert "(API token)" in page
    listed = client.get("/runs/").content.decode()
    assert 'client: <strong class="client-name">billing agent</strong>' in listed

    # Revoked, then deleted: the run keeps the name it was submitted with.
    revoke_token(run.api_token, by="tests", now=time_source.now())
    assert "(API token, revoked since)" in client.get(f"/runs/{run_id}/").content.decode()
    ApiToken.objects.all().delete()
    run.refresh_from_db()
    assert (run.api_token_id, run.client_name) == (None, "billing agent")
    page = client.get(f"/runs/{run_id}/").content.decode()
    assert 'client: <strong class="client-name">billing agent</strong>' in page
    assert "(API token, deleted since)" in page
    client.logout()
    admin = make_user("root", is_superuser=True)
    again = call(
        client, token(admin, "admin", "admin-token-" + "y" * 20), "GET", f"/api/v1/runs/{run_id}"
    )
    assert again.json()["client"] == "billing agent"


def test_a_run_made_without_a_token_has_no_client(client, operator, provider):
    thread = services.create_thread(provider_chain=["p"], user=operator, now=time_source.now())
    run, _stage, _ = services.submit_run(thread, input="hi", user=operator, now=time_source.now())
    assert run.client_name == "" and run.api_token_id is None
    client.force_login(operator)
    assert "no API token" in client.get(f"/runs/{run.id}/").content.decode()
    admin_auth = token(operator, "ops", "ops-token-" + "z" * 20)
    assert call(client, admin_auth, "GET", f"/api/v1/runs/{run.id}").json()["client"] is None


def test_the_door_records_its_token_and_the_dashboard_shows_the_door_thread(
    client, make_user, operator, provider
):
    agent = make_user("support", "agent-client")
    auth = token(agent, "support bot", "support-token-" + "s" * 20, scopes=["use_openai_door"])
    # Streamed: the answer's body waits for the run (no worker here), its status does not.
    answer = call(client, auth, "POST", "/v1/chat/completions", STREAMED, x_session_id="conv-7")
    assert answer.status_code == 200, answer.content
    run = Run.objects.get()
    assert run.client_name == "support bot" and run.api_token.name == "support bot"
    thread = Thread.objects.get()
    assert thread.client_session_key == "conv-7"

    client.force_login(operator)
    listed = client.get("/runs/").content.decode()
    assert ">OpenAI door</span>" in listed
    assert 'client: <strong class="client-name">support bot</strong>' in listed
    one_thread = client.get(f"/runs/?thread={thread.id}").content.decode()
    assert 'session <span class="mono">conv-7</span>' in one_thread
    assert 'client: <strong class="client-name">support bot</strong>' in one_thread
    segment = Segment.objects.get(thread=thread)
    segment_page = client.get(f"/segments/{segment.id}/").content.decode()
    assert 'session <span class="mono">conv-7</span>' in segment_page
    assert 'client: <strong class="client-name">support bot</strong>' in segment_page
    run_page = client.get(f"/runs/{run.id}/").content.decode()
    assert 'session <span class="mono">conv-7</span>' in run_page
    assert 'client: <strong class="client-name">support bot</strong>' in run_page

    # The API says the thread is the door's conversation, the list too.
    own = call(client, auth, "GET", f"/api/v1/threads/{thread.id}").json()
    assert own["door"] == {"session_id": "conv-7", "model": "p"}
    (listed_thread,) = call(client, auth, "GET", "/api/v1/threads").json()["items"]
    assert listed_thread["door"] == {"session_id": "conv-7", "model": "p"}
    made_otherwise = services.create_thread(provider_chain=["p"], user=agent, now=time_source.now())
    other = call(client, auth, "GET", f"/api/v1/threads/{made_otherwise.id}").json()
    assert other["door"] is None


def test_a_token_scoped_to_the_door_alone_cannot_write_through_the_run_api(
    client, make_user, provider
):
    agent = make_user("door-only", "agent-client")
    auth = token(agent, "door only", "door-only-token-" + "d" * 20, scopes=["use_openai_door"])
    own = services.create_thread(provider_chain=["p"], user=agent, now=time_source.now())
    before = (Thread.objects.count(), Run.objects.count())
    created = call(client, auth, "POST", "/api/v1/threads", {"provider_chain": ["p"]})
    submitted = call(client, auth, "POST", f"/api/v1/threads/{own.id}/runs", {"input": "hi"})
    for refused in (created, submitted):
        assert refused.status_code == 403, refused.content
        assert "'submit_run'" in refused.json()["error"]["message"]
    assert (Thread.objects.count(), Run.objects.count()) == before
    # Its reads still work, and the door answers it.
    assert call(client, auth, "GET", "/api/v1/threads").status_code == 200
    assert call(client, auth, "POST", "/v1/chat/completions", STREAMED).status_code == 200
    assert Run.objects.get().client_name == "door only"


@pytest.mark.django_db(transaction=True)
def test_the_door_refuses_tokens_without_its_scope_with_openais_403(live_server, make_user):
    """OpenAI's SDK raises PermissionDeniedError on the 403, and nothing is written."""
    from governance.models import Provider

    Provider.objects.create(provider_id="p", kind="scripted", model="p-model", script={})
    agent = make_user("api-only", "agent-client")
    manager = make_user("mia", "manager")
    refused = {
        "a token scoped to submit_run alone": (
            token(agent, "api only", "api-only-token-" + "a" * 20, scopes=["submit_run"]),
            "'use_openai_door'",
        ),
        "a role without the door": (
            token(manager, "reports", "manager-token-" + "m" * 20),
            "'use_openai_door'",
        ),
    }
    for what, (auth, named) in refused.items():
        sdk = openai.OpenAI(
            base_url=f"{live_server.url}/v1",
            api_key=auth["Authorization"].split(" ", 1)[1],
            max_retries=0,
            timeout=30,
        )
        with pytest.raises(openai.PermissionDeniedError) as caught:
            sdk.chat.completions.create(**CHAT)
        error = caught.value.body
        assert caught.value.status_code == 403, what
        assert error["type"] == "permission_error" and named in error["message"], (what, error)
        assert sdk.models.list().data[0].id == "p"  # its read stays open
    assert (Thread.objects.count(), Run.objects.count()) == (0, 0)


def test_the_door_scope_is_offered_with_its_words_where_tokens_are_made(
    client, make_user, operator, capsys
):
    agent = make_user("maker", "agent-client")
    client.force_login(agent)
    page = client.get("/tokens/").content.decode()
    assert 'value="use_openai_door"' in page
    assert "call the OpenAI-compatible door (/v1/chat/completions)" in page
    made = client.post("/tokens/", {"name": "sdk agent", "scopes": ["use_openai_door"]})
    assert made.status_code == 302
    assert ApiToken.objects.get(name="sdk agent").scopes == ["use_openai_door"]
    # Not offered to a role without it.
    client.force_login(make_user("mona", "manager"))
    assert 'value="use_openai_door"' not in client.get("/tokens/").content.decode()
    # The command takes it too.
    call_command("create_api_token", operator.username, "--name", "cli door", "--scope",
                 "use_openai_door")  # fmt: skip
    assert ApiToken.objects.get(name="cli door").scopes == ["use_openai_door"]


def test_the_migration_keeps_the_door_for_whoever_could_call_it(django_user_model):
    """0022: the door needed submit_run before; users, groups and tokens that
    had it keep the door, and a token scoped to submit_run gains its scope."""
    from django.contrib.auth.models import Group, Permission
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    name = "0023_openai_door_scope_run_client"
    update_roles = importlib.import_module(f"governance.migrations.{name}").update_roles
    # The models as of the migration: its permissions step unsets each app's
    # models module on the registry it is given, never to be done to the live one.
    state = MigrationExecutor(connection).loader.project_state(("governance", name))
    door = Permission.objects.get(codename="use_openai_door")
    submit = Permission.objects.get(codename="submit_run")
    by_hand = django_user_model.objects.create_user("by-hand")
    by_hand.user_permissions.add(submit)
    custom = Group.objects.create(name="night shift")
    custom.permissions.add(submit)
    narrow = ApiToken.objects.create(
        user=by_hand, name="n", key_digest=token_digest("narrow-1"), scopes=["submit_run"]
    )
    other = ApiToken.objects.create(
        user=by_hand, name="o", key_digest=token_digest("other-1"), scopes=["cancel_run"]
    )
    for group in Group.objects.filter(name__in=["operator", "agent-client"]):
        group.permissions.remove(door)
    update_roles(state.apps, None)
    assert door in by_hand.user_permissions.all() and door in custom.permissions.all()
    assert set(Group.objects.filter(permissions=door).values_list("name", flat=True)) == {
        "operator", "agent-client", "night shift",
    }  # fmt: skip
    narrow.refresh_from_db(), other.refresh_from_db()
    assert narrow.scopes == ["submit_run", "use_openai_door"]
    assert other.scopes == ["cancel_run"]
