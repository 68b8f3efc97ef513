"""The API as a contract: its OpenAPI 3.1 description, and schemathesis
checking the live API against it (no 500s; every answer as described)."""

from __future__ import annotations

import json

import pytest
import schemathesis
from django.urls import get_resolver
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance

from dashboard.api.openapi import openapi_document
from governance.models import Provider

pytestmark = pytest.mark.django_db(transaction=True)

DOCUMENT = openapi_document()
# The event stream stays open while the run is unsettled: exercised in test_stream.py.
schema = schemathesis.openapi.from_dict(DOCUMENT).exclude(path="/api/v1/runs/{run_id}/events")


def test_the_description_is_openapi_3_1_and_covers_every_api_address(client):
    response = client.get("/api/v1/openapi.json")  # public: no token needed
    assert response.status_code == 200
    assert response.json() == json.loads(json.dumps(DOCUMENT))
    assert DOCUMENT["openapi"] == "3.1.0"
    routes = {
        "/" + str(p.pattern).replace("<str:", "{").replace(">", "}")
        for p in get_resolver().url_patterns
        if str(p.pattern).startswith("api/v1/")
    }
    described = set(DOCUMENT["paths"]) | {"/api/v1/openapi.json"}
    assert routes == described
    bodies = {
        (path, method): op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for path, methods in DOCUMENT["paths"].items()
        for method, op in methods.items()
        if "requestBody" in op
    }
    assert bodies[("/api/v1/threads/{thread_id}/runs", "post")].endswith("/RunSubmit")
    run_submit = DOCUMENT["components"]["schemas"]["RunSubmit"]
    assert run_submit["additionalProperties"] is False
    assert run_submit["properties"]["input"]["minLength"] == 1


@pytest.fixture
def bearer(django_user_model):
    from django.contrib.auth.models import Permission

    from governance.models import ApiToken
    from governance.services.tokens import token_digest

    user = django_user_model.objects.create_user("contract", password="unused-password-1")
    user.user_permissions.add(
        *Permission.objects.filter(
            codename__in=[
                "apply_boundary",
                "submit_run",
                "cancel_run",
                "acknowledge_notification",
                "change_provider",
                "see_all_runs",
            ]
        )
    )
    token = "contract-token-" + "x" * 20
    ApiToken.objects.create(user=user, name="contract", key_digest=token_digest(token))
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def known_thread():
    """One real thread so some generated ids can find something (the rest 404)."""
    from governance import services, time_source

    Provider.objects.create(provider_id="alpha", kind="scripted", model="alpha-model")
    return services.create_thread(provider_chain=["alpha"], now=time_source.now())


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_the_live_api_answers_as_described_and_never_500(case, live_server, bearer, known_thread):
    # A schema-valid body may still name an unknown provider or thread: a 4xx
    # there is the business rule, not a contract breach.
    case.call_and_validate(
        base_url=live_server.url, headers=bearer, excluded_checks=[positive_data_acceptance]
    )


def test_acks_refuse_deep_nesting_and_unknown_fields_with_400(
    client, bearer, known_thread, django_user_model
):
    """Deeply nested JSON in /acks was a RecursionError (500)."""
    from governance import services, time_source

    owner = django_user_model.objects.get(username="contract")  # acks are the owner's
    run, _stage, _ = services.submit_run(
        known_thread, input="hi", user=owner, now=time_source.now()
    )
    url = f"/api/v1/runs/{run.id}/acks"
    for data, field in (
        (b'{"through": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
        (b'{"through": 0, "extra": 1}', "extra"),
        (b'{"through": -1}', "through"),
        (b'{"through": 4294967296}', "through"),
    ):
        response = client.generic(
            "POST", url, data, content_type="application/json", headers=bearer
        )
        assert response.status_code == 400, response.content
        assert response.json()["error"]["field"] == field
    ok = client.generic(
        "POST", url, b'{"through": 0}', content_type="application/json", headers=bearer
    )
    assert ok.status_code == 200 and ok.json()["through"] == 0


@pytest.fixture
def api_workflow(live_server, bearer, known_thread):
    """schemathesis's stateful phase: sequences of calls that follow the
    description's links (a thread made, then its runs, boundaries and segment;
    a run, then its answer, cancel and acks; a provider or tool, then its change)."""

    class Workflow(schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"base_url": live_server.url, "headers": bearer}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            # A schema-valid body may still name an unknown provider: a 4xx is the rule.
            case.validate_response(response, excluded_checks=[positive_data_acceptance])

    return Workflow


def test_the_live_api_answers_every_sequence_of_linked_calls_as_described(api_workflow):
    assert len(list(api_workflow.bundles)) >= 5  # the links became transitions
    api_workflow.run(
        settings=settings(
            max_examples=60,
            stateful_step_count=8,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
        )
    )
