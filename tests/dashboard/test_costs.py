"""Cost of provider requests: provider prices through the service,
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

from governance import services, time_source
from governance.models import ApiToken, Provider, ProviderAttempt, Settlement
from governance.services.errors import ServiceError
from governance.services.providers import create_provider, update_provider
from governance.services.tokens import token_digest
from tests import facts as written
from tests.conftest import streamed_body

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


# --------------------------------------------------------------------------- API, report, form


def _settle(run, at):
    from governance.rules import settlement as rules_settlement
    from governance.rules.settlement import Outcome, ReasonCode

    settlement = rules_settlement.Settlement(Outcome.COMPLETED, ReasonCode.ANSWERED, "answered")
    written.settle(run, settlement, at)


@pytest.fixture
def api_headers(make_user):
    user = make_user("cost-reader", "operator")
    token = "cost-reader-token-" + "y" * 20
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(token))
    return {"Authorization": f"Bearer {token}"}


def test_the_run_api_gives_each_request_its_cost_and_the_run_its_total(
    client, api_headers, priced_run
):
    run, _segment = priced_run
    body = client.get(f"/api/v1/runs/{run.id}", headers=api_headers).json()
    costs = [attempt["cost"] for attempt in body["attempts"]]
    assert costs[0] == {"amount": "0.003500", "currency": "USD", "unknown_because": None}
    # The re-render reported no usage: no amount, the reason, never 0.
    assert costs[1] == {"amount": None, "currency": "USD", "unknown_because": "no usage reported"}
    assert body["cost"] == {
        "total": {"USD": "0.010500"},
        "refused_sends": {"USD": "0.007000"},
        "requests": 4,
        "refused_requests": 3,
        "without_usage": 1,
        "not_priced": 0,
        "refused_without_known_cost": 1,
    }


def test_the_run_api_cost_costs_no_query_per_request(client, api_headers, priced_run):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    run, segment = priced_run
    url = f"/api/v1/runs/{run.id}"
    client.get(url, headers=api_headers)  # warm the token's caches alike for both counts
    with CaptureQueriesContext(connection) as few:
        client.get(url, headers=api_headers)
    stage = run.stages.get()
    for n in range(6):
        ProviderAttempt.objects.create(
            run=run, stage=stage, segment=segment,
            provider=Provider.objects.get(provider_id="alpha"),
            model="alpha-model", kind="re_probe", request_digest=f"more{n}",
            started_at=NOW + timedelta(minutes=n), result="refused", usage={"output_tokens": 1},
        )  # fmt: skip
    with CaptureQueriesContext(connection) as many:
        body = client.get(url, headers=api_headers).json()
    assert len(many) == len(few)
    assert body["cost"]["requests"] == 10


def test_the_delivery_report_shows_cost_refused_cost_and_unknown_per_group(
    client, manager, priced_run
):
    import csv
    import io

    run, _segment = priced_run
    _settle(run, NOW - timedelta(minutes=1))
    client.force_login(manager)
    params = {"from": "2025-03-10", "to": "2025-03-10", "group": "day"}
    page = client.get(reverse("report"), params).content.decode()
    assert "Cost of provider requests" in page
    assert "0.0105 USD" in page and "0.0070 USD" in page
    assert "1 no usage reported" in page and "not counted as 0" in page
    rows = list(
        csv.reader(io.StringIO(streamed_body(client.get(reverse("report-csv"), params)).decode()))
    )
    header = rows[0]
    assert header[-3:] == ["cost", "cost of refused sends", "requests without a known cost"]
    day = rows[1]
    assert day[0] == "2025-03-10" and day[-3:] == ["0.0105 USD", "0.0070 USD", "1"]


def test_a_group_whose_requests_report_no_usage_says_unknown_not_zero(client, manager):
    create_provider(
        provider_id="alpha", kind="scripted", model="alpha-model", script={}, by="t", now=NOW,
        price_input_per_mtok=1, currency="USD",
    )  # fmt: skip
    thread = services.create_thread(provider_chain=["alpha"], now=NOW)
    run, stage, _ = services.submit_run(thread, input="hi", now=NOW)
    ProviderAttempt.objects.create(
        run=run, stage=stage, segment=run.segment,
        provider=Provider.objects.get(provider_id="alpha"),
        model="alpha-model", kind="original", request_digest="x", started_at=NOW,
        result="accepted", usage={},
    )  # fmt: skip
    _settle(run, NOW)
    client.force_login(manager)
    params = {"from": "2025-03-10", "to": "2025-03-10", "group": "provider", "format": "csv"}
    import csv
    import io

    rows = list(
        csv.reader(io.StringIO(streamed_body(client.get(reverse("report-csv"), params)).decode()))
    )
    assert rows[1][0] == "alpha" and rows[1][-3:] == ["unknown", "—", "1"]


@pytest.fixture
def price_setter(make_user):
    from django.contrib.auth.models import Permission

    user = make_user("pat-prices", "operator")
    user.user_permissions.add(Permission.objects.get(codename="change_provider"))
    return user


def test_the_providers_page_sets_prices_through_the_service_and_audits(client, price_setter):
    from governance.models import AuditEntry

    create_provider(provider_id="alpha", kind="scripted", model="m", script={}, by="t", now=NOW)
    client.force_login(price_setter)
    page = client.get(reverse("providers")).content.decode()
    assert "No prices" in page and "Change the prices of alpha" in page
    response = client.post(
        reverse("provider-prices", args=["alpha"]),
        {
            "prices-alpha-price_input_per_mtok": "2.5",
            "prices-alpha-price_output_per_mtok": "10",
            "prices-alpha-price_cached_per_mtok": "",
            "prices-alpha-currency": "usd",
            "prices-alpha-reason": "list price of March",
        },
    )
    assert response.status_code == 302
    alpha = Provider.objects.get(provider_id="alpha")
    assert (alpha.price_input_per_mtok, alpha.price_output_per_mtok) == (
        Decimal("2.5"),
        Decimal(10),
    )
    assert alpha.price_cached_per_mtok is None and alpha.currency == "USD"
    entry = AuditEntry.objects.get(action="provider.update", target_id="alpha")
    assert entry.actor == "pat-prices" and entry.reason == "list price of March"
    page = client.get(reverse("providers")).content.decode()
    assert "Input 2.500000, output 10.000000" in page and "USD per million tokens" in page


def test_a_bad_price_is_a_form_error_and_changes_nothing(client, price_setter):
    create_provider(provider_id="alpha", kind="scripted", model="m", script={}, by="t", now=NOW)
    client.force_login(price_setter)
    response = client.post(
        reverse("provider-prices", args=["alpha"]),
        {"prices-alpha-price_output_per_mtok": "free", "prices-alpha-currency": "USD"},
    )
    assert response.status_code == 400
    assert "must be a price per million tokens" in response.content.decode()
    response = client.post(
        reverse("provider-prices", args=["alpha"]), {"prices-alpha-price_input_per_mtok": "1"}
    )
    assert response.status_code == 400 and "name the currency" in response.content.decode()
    assert Provider.objects.get(provider_id="alpha").price_output_per_mtok is None


def test_only_who_may_change_providers_sets_prices(client, operator, oncall):
    create_provider(provider_id="alpha", kind="scripted", model="m", script={}, by="t", now=NOW)
    client.force_login(oncall)
    assert "Change the prices" not in client.get(reverse("providers")).content.decode()
    response = client.post(
        reverse("provider-prices", args=["alpha"]),
        {"prices-alpha-price_input_per_mtok": "1", "prices-alpha-currency": "USD"},
    )
    assert response.status_code == 403
    assert Provider.objects.get(provider_id="alpha").price_input_per_mtok is None


def test_the_price_form_is_drawn_when_opened_and_a_refused_one_comes_back_open(
    client, price_setter, oncall
):
    """The providers page draws each provider's forms when they are opened (htmx; a
    page of their own without JavaScript), filled as the provider stands; a refused
    one comes back open on the page, as typed, with the reason."""
    create_provider(
        provider_id="alpha", kind="scripted", model="m", script={}, by="t", now=NOW,
        price_input_per_mtok="2.5", currency="USD",
    )  # fmt: skip
    url = reverse("provider-prices", args=["alpha"])
    client.force_login(price_setter)
    page = client.get(reverse("providers")).content.decode()
    assert f'hx-get="{url}" hx-trigger="toggle once"' in page and f'href="{url}"' in page
    assert 'name="prices-alpha-price_input_per_mtok"' not in page
    assert 'name="schedule-alpha-delays"' not in page

    fragment = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in fragment and f'action="{url}"' in fragment
    assert 'name="prices-alpha-price_input_per_mtok" value="2.500000"' in fragment
    assert 'name="prices-alpha-currency" value="USD"' in fragment and "Save prices" in fragment
    alone = client.get(url).content.decode()
    assert "<html" in alone and "Change the prices of" in alone and "Save prices" in alone
    schedule = client.get(
        reverse("provider-schedule", args=["alpha"]), headers={"HX-Request": "true"}
    )
    assert 'name="schedule-alpha-delays"' in schedule.content.decode()

    refused = client.post(url, {"prices-alpha-price_output_per_mtok": "free"})
    assert refused.status_code == 400
    body = refused.content.decode()
    assert '<details class="price-form" open>' in body and 'value="free"' in body
    assert "must be a price per million tokens" in body

    client.force_login(oncall)
    assert client.get(url, headers={"HX-Request": "true"}).status_code == 403
    assert client.get(reverse("provider-schedule", args=["alpha"])).status_code == 403
    assert client.get(reverse("provider-prices", args=["nobody"])).status_code in (403, 404)


# --------------------------------------------------------------------------- sums at scale


USAGES = [
    {}, {"input_tokens": 1000, "output_tokens": 100}, {"prompt_tokens": 7, "completion_tokens": 3},
    {"input_tokens": 500, "cached_tokens": 800}, {"input_tokens": 900, "cached_tokens": 300},
    {"output_tokens": 12}, {"cache_read_input_tokens": 40, "input_tokens": 60},
    {"input_tokens": "12"}, {"input_tokens": True}, {"input_tokens": 1.5}, {"input_tokens": -3},
    {"input_tokens": 0, "output_tokens": 0}, {"input_tokens": "x", "prompt_tokens": 5},
    {"other": 1},
]  # fmt: skip


@pytest.mark.parametrize("vendor", ["postgresql", "other"])
def test_the_summed_cost_equals_the_sum_of_each_requests_cost(monkeypatch, vendor):
    """The report and segment page sum by shape (in the database on PostgreSQL); the
    result is the rule's own per-request cost summed — for odd usage too."""
    import random

    from dashboard.queries import costs as cost_queries
    from governance.rules.cost import attempt_cost, summarize_costs

    full = create_provider(
        provider_id="full", kind="scripted", model="m", script={}, by="t", now=NOW,
        price_input_per_mtok="2.5", price_output_per_mtok="10", price_cached_per_mtok="0.25",
        currency="USD",
    )  # fmt: skip
    input_only = create_provider(
        provider_id="input-only", kind="scripted", model="m", script={}, by="t", now=NOW,
        price_input_per_mtok="1", currency="EUR",
    )  # fmt: skip
    none = create_provider(
        provider_id="none", kind="scripted", model="m", script={}, by="t", now=NOW
    )
    thread = services.create_thread(provider_chain=["full"], now=NOW)
    run, stage, _ = services.submit_run(thread, input="hi", now=NOW)
    rng = random.Random(7)
    expected = []
    for n in range(300):
        provider = rng.choice([full, input_only, none])
        usage = rng.choice(USAGES)
        result = rng.choice(["accepted", "refused", "failed"])
        ProviderAttempt.objects.create(
            run=run, stage=stage, segment=run.segment, provider=provider, model="m",
            kind="original", request_digest=f"r{n}", started_at=NOW, result=result, usage=usage,
        )  # fmt: skip
        expected.append((result, attempt_cost(usage, cost_queries.prices_of(provider))))
    from governance.services import usage

    monkeypatch.setattr(usage.connection, "vendor", vendor)
    assert cost_queries.cost_summary(ProviderAttempt.objects.all()) == summarize_costs(expected)
    by_run, prices = cost_queries.costs_by_run([run.id])
    assert cost_queries.summarize(by_run[run.id], prices) == summarize_costs(expected)

    # The report: the billed tokens kept with the judged run, summed again, alike.
    from dashboard.queries.report import ReportQuery, delivery_report
    from governance.services.deliveries import judge_unjudged

    monkeypatch.undo()
    Settlement.objects.create(
        run=run, outcome="completed", reason_code="answered", reason="", settled_at=NOW
    )
    assert judge_unjudged() == 1
    hour, day = timedelta(hours=1), timedelta(days=1)
    midnight = NOW.replace(hour=0, minute=0, second=0, microsecond=0)
    for start, end in ((NOW - hour, NOW + hour), (midnight, midnight + day)):  # part, whole day
        report = delivery_report(ReportQuery(start=start, end=end))
        assert report.total.cost == summarize_costs(expected) == report.groups[0].cost


def test_the_generated_usage_columns_read_the_rules_own_keys():
    """Migration 0013 writes the keys out (a migration must not change with the code):
    they are the cost rule's."""
    import importlib

    from governance.rules import cost

    migration = importlib.import_module("governance.migrations.0013_refusal_schedules")
    assert (migration.INPUT_KEYS, migration.OUTPUT_KEYS, migration.CACHED_KEYS) == (
        cost.INPUT_KEYS, cost.OUTPUT_KEYS, cost.CACHED_KEYS,
    )  # fmt: skip
