"""The provider kinds have one source (``governance.provider_kinds``) and the
adapter registry (``tasks.adapters.REGISTRY``) maps each of them to its
adapter (R2.4: each adapter reads its own vendor's answer).

A kind registered here for a while is accepted end to end: by the service's
checks, the API's schema and its OpenAPI description, ``manage.py provider``,
the model's choices and ``call_provider``, whose adapter's evidence the rules
classify. Nothing else names the kinds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command
from pydantic import ValidationError

from dashboard.api.schemas import ProviderCreate
from governance import provider_kinds
from governance.models import ApiToken, Provider
from governance.rules.classification import AttemptEvidence, classify_attempt
from governance.services import ServiceError
from governance.services import providers as provider_services
from governance.services.tokens import token_digest
from tasks.adapters import REGISTRY, adapter_for, call_provider, check_registry
from tasks.adapters._evidence import evidence_from
from tasks.adapters.base import (
    Adapter,
    CallLimits,
    ChatMessage,
    ProviderConfig,
    ProviderRequest,
    ProviderResponse,
    WireAnswer,
)

T0 = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
TOKEN = "provider-kinds-token-" + "k" * 24
ECHO = provider_kinds.ProviderKind("echo", "Echo (a kind only this test knows)", "server")
TAPE = provider_kinds.ProviderKind("tape", "Tape (a script kind only this test knows)", "script")


def read_echo(answer: WireAnswer) -> AttemptEvidence:
    """The echo vendor says ``finish_reason "blocked"`` when it refuses (R2.4)."""
    category = "policy" if answer.finish_reason == "blocked" else None
    return evidence_from(answer, refusal_category=category)


def call_echo(config, request, *, limits, clock, on_event, transport, script_state):
    answer = WireAnswer(status_code=200, headers_received=True, finish_reason="blocked")
    return ProviderResponse(
        status_code=200, finish_reason="blocked", evidence=read_echo(answer), answer=answer
    )


def check_tape(script) -> None:
    if not isinstance(script, dict) or "tape" not in script:
        raise ValueError("script: a tape script names its tape")


@pytest.fixture
def echo_kind(monkeypatch):
    """The echo kind, registered the way a new kind is: its line in the list of
    kinds and its adapter in the registry."""
    monkeypatch.setitem(provider_kinds.KINDS, ECHO.name, ECHO)
    monkeypatch.setitem(REGISTRY, ECHO.name, Adapter(call=call_echo, read_evidence=read_echo))
    return ECHO.name


def test_the_registry_and_the_list_of_kinds_agree():
    assert list(REGISTRY) == list(provider_kinds.names())
    assert [value for value, _label in provider_kinds.choices()] == list(REGISTRY)
    check_registry(REGISTRY, provider_kinds.KINDS)


def test_a_kind_without_an_adapter_or_an_adapter_without_a_kind_is_refused_at_import():
    kinds = {**provider_kinds.KINDS, "echo": ECHO}
    with pytest.raises(ImportError, match=r"kinds without an adapter \['echo'\]"):
        check_registry(REGISTRY, kinds)
    extra = {**REGISTRY, "echo": Adapter(call=call_echo, read_evidence=read_echo)}
    with pytest.raises(ImportError, match=r"adapters without a kind \['echo'\]"):
        check_registry(extra, provider_kinds.KINDS)
    scripted_without_check = {**REGISTRY, "scripted": Adapter(call_echo, read_echo)}
    with pytest.raises(ImportError, match="'scripted': a kind whose configuration is a script"):
        check_registry(scripted_without_check, provider_kinds.KINDS)
    server_with_check = {**REGISTRY, "openai": Adapter(call_echo, read_echo, check_tape)}
    with pytest.raises(ImportError, match="'openai': a kind whose configuration is a script"):
        check_registry(server_with_check, provider_kinds.KINDS)
    with pytest.raises(ImportError, match="not an Adapter"):
        check_registry({**REGISTRY, "openai": object()}, provider_kinds.KINDS)  # type: ignore[dict-item]


def test_the_model_and_the_api_take_their_kinds_from_the_list():
    field = Provider._meta.get_field("kind")
    assert [value for value, _label in field.choices] == list(provider_kinds.names())
    assert ProviderCreate.model_json_schema()["properties"]["kind"]["enum"] == list(
        provider_kinds.names()
    )


def test_an_unknown_kind_is_refused_everywhere():
    with pytest.raises(ValueError, match="unknown adapter 'echo'"):
        adapter_for("echo")
    with pytest.raises(ValidationError, match="must be one of openai, anthropic, scripted"):
        ProviderCreate(provider_id="e", kind="echo", model="m")


@pytest.mark.django_db
def test_a_registered_kind_is_accepted_end_to_end(echo_kind, client, django_user_model, tmp_path):
    check_registry(REGISTRY, provider_kinds.KINDS)
    # The API's schema and its description.
    body = {"provider_id": "echo-1", "kind": "echo", "model": "m", "base_url": "https://e.example"}
    assert ProviderCreate(**body).kind == "echo"
    assert "echo" in ProviderCreate.model_json_schema()["properties"]["kind"]["enum"]
    # The API, through the service's checks (a server kind needs its base URL).
    user = django_user_model.objects.create_user("kinds-admin")
    user.user_permissions.add(Permission.objects.get(codename="change_provider"))
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(TOKEN))
    response = client.post(
        "/api/v1/providers",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 201, response.content
    assert response.json()["kind"] == "echo"
    with pytest.raises(ServiceError, match="needs the server's base URL"):
        provider_services.create_provider(
            provider_id="echo-2", kind="echo", model="m", by="test", now=T0
        )
    # manage.py provider.
    out = StringIO()
    call_command(
        "provider", "add", "echo-3", "--kind", "echo", "--model", "m",
        "--base-url", "https://e.example", stdout=out,
    )  # fmt: skip
    assert Provider.objects.get(provider_id="echo-3").get_kind_display() == ECHO.label
    # The model's choices.
    Provider.objects.get(provider_id="echo-1").full_clean()
    # call_provider dispatches to its adapter; the rules classify what it read.
    config = ProviderConfig("echo-1", "echo", "m", base_url="https://e.example")
    request = ProviderRequest(model="m", messages=(ChatMessage("user", "hi"),))
    limits = CallLimits(budget_s=10, no_progress_s=10)
    response = call_provider(config, request, limits=limits, clock=lambda: T0)
    verdict = classify_attempt(response.evidence, T0)
    assert (verdict.failure_class, verdict.refusal_category) == ("refusal", "policy")


@pytest.mark.django_db
def test_without_its_registration_the_kind_is_refused_by_the_service_and_the_command():
    with pytest.raises(ServiceError, match="must be one of openai, anthropic, scripted"):
        provider_services.create_provider(
            provider_id="echo-1", kind="echo", model="m", base_url="https://e.example",
            by="test", now=T0,
        )  # fmt: skip
    with pytest.raises(CommandError, match="invalid choice"):
        call_command("provider", "add", "x", "--kind", "echo", "--model", "m", stdout=StringIO())


@pytest.mark.django_db
def test_a_registered_script_kind_has_its_script_checked_by_its_own_adapter(
    monkeypatch, client, django_user_model
):
    monkeypatch.setitem(provider_kinds.KINDS, TAPE.name, TAPE)
    monkeypatch.setitem(REGISTRY, TAPE.name, Adapter(call_echo, read_echo, check_tape))
    check_registry(REGISTRY, provider_kinds.KINDS)
    user = django_user_model.objects.create_user("kinds-admin")
    user.user_permissions.add(Permission.objects.get(codename="change_provider"))
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(TOKEN))

    def post(script):
        body = {"provider_id": "tape-1", "kind": "tape", "model": "m", "script": script}
        return client.post(
            "/api/v1/providers",
            json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )

    refused = post({"default": {"answer": {"text": "a scripted provider's script"}}})
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "field": "script",
        "message": "script: a tape script names its tape",
    }
    assert post({"tape": "t-1"}).status_code == 201
