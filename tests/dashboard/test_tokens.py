"""API tokens: shown once, stored hashed, listed, revoked, scoped;
roles decide over the API exactly as in the dashboard (R8)."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from governance.models import ApiToken, AuditEntry, Provider, Run
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db


@pytest.fixture
def thread_id(api_client_for):
    Provider.objects.create(provider_id="alpha", kind="scripted", model="alpha-model")
    from governance import services, time_source

    return str(services.create_thread(provider_chain=["alpha"], now=time_source.now()).id)


@pytest.fixture
def api_client_for(client):
    def post(token: str, path: str, body: dict):
        return client.post(
            path, data=json.dumps(body), content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )  # fmt: skip

    return post


def made_token(capsys, *args) -> str:
    call_command("create_api_token", *args)
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_a_service_account_token_from_the_command_submits_and_is_stored_hashed(
    capsys, thread_id, api_client_for
):
    token = made_token(capsys, "billing-bot", "--create-user", "--role", "agent-client")
    row = ApiToken.objects.get(user__username="billing-bot")
    assert row.key_digest == token_digest(token) and token not in json.dumps(row.scopes)
    # Someone else's thread is not the service account's to use: it opens its own.
    answer = api_client_for(token, f"/api/v1/threads/{thread_id}/runs", {"input": "hi"})
    assert answer.status_code == 404, answer.content
    own = api_client_for(token, "/api/v1/threads", {"provider_chain": ["alpha"]}).json()["id"]
    answer = api_client_for(token, f"/api/v1/threads/{own}/runs", {"input": "hi"})
    assert answer.status_code == 202, answer.content
    assert AuditEntry.objects.filter(action="token.create", target_id=str(row.id)).exists()


def test_a_manager_token_is_read_only_over_the_api(capsys, manager, thread_id, api_client_for):
    token = made_token(capsys, manager.username)
    answer = api_client_for(token, f"/api/v1/threads/{thread_id}/runs", {"input": "hi"})
    assert answer.status_code == 403
    assert "submit_run" in answer.json()["error"]["message"]
    assert not Run.objects.exists()


def test_scopes_narrow_a_role_and_never_widen_it(capsys, operator, thread_id, api_client_for):
    narrow = made_token(capsys, operator.username, "--scope", "acknowledge_notification")
    answer = api_client_for(narrow, f"/api/v1/threads/{thread_id}/runs", {"input": "hi"})
    assert answer.status_code == 403 and not Run.objects.exists()
    with pytest.raises(CommandError, match="role does not allow view_delivery_report"):
        call_command("create_api_token", operator.username, "--scope", "view_delivery_report")


def test_listing_never_shows_a_secret_and_a_revoked_token_stops_at_once(
    capsys, operator, thread_id, api_client_for
):
    token = made_token(capsys, operator.username, "--name", "ci")
    row = ApiToken.objects.get(name="ci")
    call_command("api_tokens", "list")
    listing = capsys.readouterr().out
    assert "ci" in listing and token not in listing and row.key_digest not in listing
    call_command("api_tokens", "revoke", str(row.id))
    assert "revoked token" in capsys.readouterr().out
    answer = api_client_for(token, f"/api/v1/threads/{thread_id}/runs", {"input": "hi"})
    assert answer.status_code == 401
    call_command("api_tokens", "revoke", str(row.id))
    assert "already revoked" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no token with id 999999"):
        call_command("api_tokens", "revoke", "999999")


def test_the_tokens_page_shows_a_new_token_once_and_revokes_in_one_click(client, operator):
    client.force_login(operator)
    page = client.post("/tokens/", {"name": "billing agent", "scopes": ["submit_run"]})
    assert page.status_code == 302  # a reload does not post it again
    html = client.get("/tokens/").content.decode()
    row = ApiToken.objects.get(name="billing agent")
    secret = html.split('id="new-token">')[1].split("<")[0]
    assert row.key_digest == token_digest(secret) and row.scopes == ["submit_run"]
    again = client.get("/tokens/").content.decode()
    assert secret not in again and "billing agent" in again
    # A scope the role does not hold is not even offered.
    assert 'value="view_delivery_report"' not in again
    assert client.post(f"/tokens/{row.id}/revoke").status_code == 302
    row.refresh_from_db()
    assert row.revoked_at is not None


def test_someone_elses_token_cannot_be_seen_or_revoked(client, operator, oncall, capsys):
    made_token(capsys, oncall.username, "--name", "oncall-laptop")
    theirs = ApiToken.objects.get(name="oncall-laptop")
    client.force_login(operator)
    assert "oncall-laptop" not in client.get("/tokens/").content.decode()
    assert client.post(f"/tokens/{theirs.id}/revoke").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


def test_a_bad_token_name_is_a_form_error_and_makes_nothing(client, operator):
    client.force_login(operator)
    page = client.post("/tokens/", {"name": ""})
    assert page.status_code == 400 and "This field is required" in page.content.decode()
    assert not ApiToken.objects.exists()


def test_the_permission_names_are_the_actions_roles_grant():
    from dashboard.site import permissions
    from governance.roles import ACTIONS, ROLES

    named = {
        value.split(".", 1)[1]
        for name, value in vars(permissions).items()
        if name.isupper() and isinstance(value, str) and value.startswith("governance.")
    }
    assert named == set(ACTIONS)
    assert {c for codes in ROLES.values() for c in codes} <= set(ACTIONS)
