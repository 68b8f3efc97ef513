"""``GET /v1/models`` of the OpenAI-compatible door, called by OpenAI's own
Python SDK against the live server: the enabled routes and providers, our API
tokens as its API key, and errors in OpenAI's shape."""

from __future__ import annotations

import logging
import re

import openai
import pytest

from governance import time_source
from governance.models import ApiToken, Provider
from governance.services import routes as route_services
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "door-token-" + "d" * 24


@pytest.fixture
def offered(make_user):
    """Two routes (one disabled) over two providers (one disabled); a token of
    a user with no role at all (reading the list needs none)."""
    ApiToken.objects.create(user=make_user("door"), name="door", key_digest=token_digest(TOKEN))
    Provider.objects.create(provider_id="alpha", kind="scripted", model="m", script={})
    Provider.objects.create(
        provider_id="beta", kind="scripted", model="m", script={}, enabled=False
    )
    now = time_source.now()
    route_services.create_route(name="fast", provider_chain=["alpha", "beta"], by="t", now=now)
    route_services.create_route(
        name="off", provider_chain=["alpha"], enabled=False, by="t", now=now
    )
    return now


def sdk(live_server, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=api_key, max_retries=0)


def test_the_sdk_lists_the_enabled_routes_then_the_enabled_providers(live_server, offered):
    models = list(sdk(live_server, TOKEN).models.list())
    assert [(m.id, m.object, m.owned_by) for m in models] == [
        ("fast", "model", "route"),
        ("alpha", "model", "scripted"),
    ]
    route_created = int(offered.timestamp())
    assert models[0].created == route_created
    assert all(isinstance(m.created, int) and m.created > 0 for m in models)


def test_a_bad_token_is_an_authentication_error_in_openais_shape(live_server, offered):
    with pytest.raises(openai.AuthenticationError) as refused:
        sdk(live_server, "not-a-token").models.list()
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "message": "unknown or revoked token",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }


def test_no_token_and_other_methods_answer_in_openais_shape(client, offered):
    missing = client.get("/v1/models")
    assert missing.status_code == 401 and missing["WWW-Authenticate"].startswith("Bearer")
    assert missing.json()["error"]["code"] == "invalid_api_key"
    posted = client.post("/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert posted.status_code == 405 and posted["Allow"] == "GET"
    assert set(posted.json()["error"]) == {"message", "type", "param", "code"}
    assert posted.json()["error"]["type"] == "invalid_request_error"


def test_the_list_shape_on_the_wire(client, offered):
    answer = client.get("/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert answer["object"] == "list"
    assert [set(m) for m in answer["data"]] == [{"id", "object", "created", "owned_by"}] * 2


def test_an_unknown_door_address_is_404_in_openais_shape(client, offered):
    for path in ("/v1/chat/nope", "/v1/", "/v1"):
        response = client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 404, path
        assert response.json()["error"] == {
            "message": "no such address",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }


def test_a_failure_in_the_door_is_500_in_openais_shape_with_a_logged_ref(
    client, offered, monkeypatch, caplog
):
    from dashboard.openai import models as door_models

    def broken():
        raise RuntimeError("the read failed")

    monkeypatch.setattr(door_models, "offered_models", broken)
    with caplog.at_level(logging.ERROR, logger="dashboard.site.errors"):
        response = client.get("/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error" and set(error) == {"message", "type", "param", "code"}
    ref = re.fullmatch(
        r"internal error; it has been logged \(ref ([0-9a-f]{8})\)", error["message"]
    )
    assert ref and any(ref.group(1) in r.getMessage() for r in caplog.records)
