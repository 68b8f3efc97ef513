"""Every error of the OpenAI-compatible door as OpenAI's Python SDK raises it:
the status picks the SDK's exception, the body has OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``), and a refused request
writes nothing (no thread, no run). No worker runs in this module: nothing
here may reach one."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from governance.models import ApiToken, Route, Run, Thread
from governance.services.tokens import token_digest
from tests.tasks.openai_door import TOKEN, LoopbackProvider, sdk

pytestmark = pytest.mark.django_db(transaction=True)

HI = [{"role": "user", "content": "hi"}]


def nothing_written() -> bool:
    return not Thread.objects.exists() and not Run.objects.exists()


def error_body(refused: openai.APIStatusError) -> dict:
    """The whole body as sent (the SDK's ``.body`` is the inner object)."""
    whole = refused.response.json()
    assert set(whole) == {"error"}
    assert set(whole["error"]) == {"message", "type", "param", "code"}
    assert whole["error"] == refused.body
    return whole["error"]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([{"role": "robot", "content": "hi"}], "messages.0.role"),
        ([{"role": "user", "content": 42}], "messages.0.content"),
        (["hi"], "messages.0"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages.0"),
        ([{"role": "user", "content": "  "}], "the last message must be a user message"),
    ],
    ids=["unknown-role", "content-not-text", "not-an-object", "not-a-text-part", "blank-last"],
)
def test_malformed_messages_are_a_bad_request_naming_messages(live_server, door, messages, says):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(live_server).chat.completions.create(model="chat", messages=messages)
    body = error_body(refused.value)
    assert body["param"] == "messages" and body["type"] == "invalid_request_error"
    assert says in body["message"]
    assert nothing_written() and not LoopbackProvider.requests


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"n": 2}, "n"), ({"temperature": 3}, "temperature"), ({"max_tokens": 0}, "max_tokens")],
)
def test_an_out_of_range_parameter_is_a_bad_request_naming_it(live_server, door, extra, param):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(live_server).chat.completions.create(model="chat", messages=HI, **extra)
    assert error_body(refused.value)["param"] == param
    assert nothing_written()


def test_a_body_that_is_not_json_is_a_bad_request(live_server, door):
    answer = httpx.post(
        f"{live_server.url}/v1/chat/completions",
        content=b'{"model": "chat", "messages": [',
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("the body is not valid JSON")
    assert nothing_written()


def test_an_unknown_or_revoked_token_is_an_authentication_error(live_server, door):
    from django.utils import timezone

    ApiToken.objects.create(
        user=door, name="old", key_digest=token_digest("revoked-" + "r" * 30),
        revoked_at=timezone.now(),
    )  # fmt: skip
    for key in ("not-a-token", "revoked-" + "r" * 30):
        with pytest.raises(openai.AuthenticationError) as refused:
            sdk(live_server, key).chat.completions.create(model="chat", messages=HI)
        body = error_body(refused.value)
        assert (body["type"], body["code"]) == ("authentication_error", "invalid_api_key")
        assert refused.value.response.headers["WWW-Authenticate"].startswith("Bearer")
    assert nothing_written()


def test_a_user_who_may_not_use_the_door_is_permission_denied(live_server, door, make_user):
    """R8: on-call may stop a run but not submit one, nor call the door."""
    oncall = make_user("door-oncall", "on-call")
    ApiToken.objects.create(user=oncall, name="oc", key_digest=token_digest("oncall-" + "o" * 30))
    with pytest.raises(openai.PermissionDeniedError) as refused:
        sdk(live_server, "oncall-" + "o" * 30).chat.completions.create(model="chat", messages=HI)
    body = error_body(refused.value)
    assert body["type"] == "permission_error" and "'use_openai_door'" in body["message"]
    assert nothing_written()


def test_a_token_scoped_without_the_door_is_permission_denied(live_server, door):
    """The token's user may call the door; the token's scope does not say so."""
    ApiToken.objects.create(
        user=door, name="narrow", key_digest=token_digest("narrow-" + "n" * 30),
        scopes=["cancel_run"],
    )  # fmt: skip
    with pytest.raises(openai.PermissionDeniedError) as refused:
        sdk(live_server, "narrow-" + "n" * 30).chat.completions.create(model="chat", messages=HI)
    assert "'use_openai_door'" in error_body(refused.value)["message"]
    assert nothing_written()


def test_an_unknown_or_disabled_model_is_not_found(live_server, door):
    Route.objects.filter(name="chat").update(enabled=False)
    for model in ("chat", "nope"):
        with pytest.raises(openai.NotFoundError) as refused:
            sdk(live_server).chat.completions.create(model=model, messages=HI)
        body = error_body(refused.value)
        assert (body["param"], body["code"]) == ("model", "model_not_found")
        assert f"'{model}'" in body["message"]
    assert nothing_written()


def test_a_backed_up_turns_queue_is_a_rate_limit(live_server, door, api, broker_queue, settings):
    """R6.7: the real turns queue in Redis holds more than the bound (runs
    submitted over the run API with no worker to take them): the door admits
    nothing more and says when to come back."""
    settings.GOVERNANCE_ADMISSION_MAX_QUEUED = 1
    thread = api.post("/api/v1/threads", {"provider_chain": ["echo"]}, expect=201).json()
    for text in ("first", "second"):
        api.post(f"/api/v1/threads/{thread['id']}/runs", {"input": text}, expect=202)
    before = (Thread.objects.count(), Run.objects.count())
    with pytest.raises(openai.RateLimitError) as refused:
        sdk(live_server).chat.completions.create(model="chat", messages=HI)
    body = error_body(refused.value)
    assert (body["type"], body["code"]) == ("rate_limit_error", "overloaded")
    assert "holds 2 waiting stages" in body["message"]
    assert int(refused.value.response.headers["Retry-After"]) >= 1
    assert (Thread.objects.count(), Run.objects.count()) == before


def test_another_method_is_the_sdks_status_error_with_allow(live_server, door):
    client = sdk(live_server)
    for path, allowed in (("/chat/completions", "POST"), ("/models", "GET")):
        call = client.get if allowed == "POST" else client.post
        with pytest.raises(openai.APIStatusError) as refused:
            call(path, cast_to=object)
        assert type(refused.value) is openai.APIStatusError  # no subclass for 405
        assert refused.value.status_code == 405
        assert refused.value.response.headers["Allow"] == allowed
        assert error_body(refused.value)["code"] == "method_not_allowed"
    assert nothing_written()


def oversize_messages(settings) -> list[dict]:
    return [{"role": "user", "content": "x" * (settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1)}]


def test_an_oversize_body_is_a_413_in_openais_shape(live_server, door, settings):
    """The SDK declares the body's length: it is refused before it is read."""
    with pytest.raises(openai.APIStatusError) as refused:
        sdk(live_server).chat.completions.create(model="chat", messages=oversize_messages(settings))
    assert refused.value.status_code == 413
    body = error_body(refused.value)
    assert body["type"] == "invalid_request_error"
    assert f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes" in body["message"]
    assert nothing_written() and not LoopbackProvider.requests


def test_an_oversize_chunked_body_under_asgi_is_a_413_in_openais_shape(asgi_server, door, settings):
    """No Content-Length (chunked): the size is known only when the view reads
    the body, after the token was checked; still 413, and nothing written."""
    raw = json.dumps({"model": "chat", "messages": oversize_messages(settings)}).encode()

    def chunked():
        for start in range(0, len(raw), 65536):
            yield raw[start : start + 65536]

    answer = httpx.post(
        f"{asgi_server}/v1/chat/completions", content=chunked(), timeout=60,
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )  # fmt: skip
    assert "content-length" not in answer.request.headers
    assert answer.status_code == 413, answer.text[:500]
    assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    assert nothing_written()
