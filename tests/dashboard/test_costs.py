"""Cost of provider requests (issue 12): provider prices through the service,
API and CLI; the run and segment pages show the cost and, apart, the cost of
refused sends; a request without usage says so instead of counting 0."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from dashboard.api import token_digest
from governance import services, time_source
from governance.models import ApiToken, Provider, ProviderAttempt
from governance.services.errors import ServiceError
from governance.services.providers import create_provider, update_provider

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fixed_clock():
    time_source.install(time_source.ManualClock(NOW))
    yield
    time_source.install(None)


@pytest.fixture
def priced_run():
    alpha = create_provider(
        provider_id="alpha", kind="scripted", model="alpha-model", script={}, by="t", now=NOW,
        price_input_per_mtok=2.5, price_output_per_mtok="10", currency="USD",
    )  # fmt: skip
    thread = services.create_thread(provider_chain=["alpha"], now=NOW)
    run, stage, _ = services.submit_run(thread, input="hi", now=NOW)
    segment = services.open_segment(thread)
    # 1,000 in + 100 out = 2500 + 1000 per million = 0.0035 USD per request
    usage = {"input_tokens": 1000, "output_tokens": 100}
    for n, (kind, result, used) in enumerate(
        [("original", "refused", usage), ("re_render", "refused", {}),
         ("history_only", "refused", usage), ("fallback", "accepted", usage)]
    ):  # fmt: skip
        ProviderAttempt.objects.create(
            run=run, stage=stage, segment=segment, provider=alpha, model="alpha-model",
            kind=kind, request_digest=f"d{n}", started_at=NOW + timedelta(seconds=n),
            result=result, usage=used,
        )  # fmt: skip
    return run, segment


def test_the_run_page_shows_cost_refused_cost_and_no_usage(client, operator, priced_run):
    run, _segment = priced_run
    client.force_login(operator)
    page = client.get(reverse("run", args=[run.id])).content.decode()
    assert "0.0105 USD" in page  # three requests with usage
    assert "1 no usage reported" in page and "not counted as 0" in page
    assert "0.0070 USD for 3 refused requests" in page  # original + history-only
    assert "0.003500 USD" in page  # one request's own cost
    assert page.count("no usage reported") == 2  # the summary and the re-render's row


def test_the_segment_page_shows_the_same_cost(client, operator, priced_run):
    _run, segment = priced_run
    client.force_login(operator)
    page = client.get(reverse("segment", args=[segment.id])).content.decode()
    assert "0.0105 USD" in page and "0.0070 USD for 3 refused requests" in page


def test_prices_are_validated_and_audited():
    with pytest.raises(ServiceError) as error:
        create_provider(
            provider_id="b", kind="scripted", model="m", script={}, by="t", now=NOW,
            price_input_per_mtok=1,
        )  # fmt: skip
    assert error.value.field == "currency"
    for bad in (-1, "lots", True, 2_000_000):
        with pytest.raises(ServiceError) as error:
            create_provider(
                provider_id="b", kind="scripted", model="m", script={}, by="t", now=NOW,
                price_output_per_mtok=bad, currency="USD",
            )  # fmt: skip
        assert error.value.field == "price_output_per_mtok"
    create_provider(provider_id="b", kind="scripted", model="m", script={}, by="t", now=NOW)
    provider, changed = update_provider(
        "b", by="t", now=NOW, price_cached_per_mtok="0.3", currency="EUR"
    )
    assert changed == ["price_cached_per_mtok", "currency"]
    assert Provider.objects.get(pk=provider.pk).price_cached_per_mtok == Decimal("0.3")


def test_the_api_takes_and_shows_prices(client, make_user):
    user = make_user("admin-ish")
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="change_provider"))
    token = "cost-token-" + "z" * 20
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(token))
    headers = {"Authorization": f"Bearer {token}"}
    body = {
        "provider_id": "priced", "kind": "scripted", "model": "m", "script": {},
        "price_input_per_mtok": 3, "price_output_per_mtok": 15, "currency": "USD",
    }  # fmt: skip
    response = client.post(
        "/api/v1/providers", json.dumps(body), content_type="application/json", headers=headers
    )
    assert response.status_code == 201, response.content
    answer = response.json()
    assert (answer["price_input_per_mtok"], answer["currency"]) == ("3.000000", "USD")
    bad = client.patch(
        "/api/v1/providers/priced", json.dumps({"currency": "dollars"}),
        content_type="application/json", headers=headers,
    )  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "currency"


def test_the_cli_adds_a_priced_provider_and_refuses_a_bad_price(capsys):
    call_command(
        "provider", "add", "cli-priced", "--kind", "openai", "--model", "gpt",
        "--base-url", "https://example.test/v1", "--price-input", "1.5", "--currency", "USD",
    )  # fmt: skip
    assert Provider.objects.get(provider_id="cli-priced").price_input_per_mtok == Decimal("1.5")
    with pytest.raises(CommandError, match="price_output_per_mtok"):
        call_command(
            "provider", "add", "cli-bad", "--kind", "openai", "--model", "gpt",
            "--base-url", "https://example.test/v1", "--price-output", "free", "--currency", "USD",
        )  # fmt: skip
