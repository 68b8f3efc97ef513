"""Each segment's billed tokens, kept as its requests are written (issue 12, migration
0017): the segment page prices a few kept rows instead of summing every request of a
long-lived segment on each view. The kept sums must always equal the requests' own."""

from __future__ import annotations

import importlib
import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.queries import costs
from dashboard.queries import segments as segment_queries
from governance import services, time_source
from governance.models import ProviderAttempt, Segment
from governance.rules.cost import attempt_cost, summarize_costs
from governance.services import usage
from governance.services.providers import create_provider

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
USAGES = [
    {}, {"input_tokens": 1000, "output_tokens": 100}, {"prompt_tokens": 7, "completion_tokens": 3},
    {"input_tokens": 500, "cached_tokens": 800}, {"input_tokens": 900, "cached_tokens": 300},
    {"output_tokens": 12}, {"input_tokens": "12"}, {"input_tokens": -3}, {"other": 1},
]  # fmt: skip


@pytest.fixture(autouse=True)
def fixed_clock():
    time_source.install(time_source.ManualClock(NOW))
    yield
    time_source.install(None)


@pytest.fixture
def world():
    full = create_provider(
        provider_id="full", kind="scripted", model="m", script={}, by="t", now=NOW,
        price_input_per_mtok="2.5", price_output_per_mtok="10", price_cached_per_mtok="0.25",
        currency="USD",
    )  # fmt: skip
    cheap = create_provider(
        provider_id="cheap", kind="scripted", model="m", script={}, by="t", now=NOW,
        price_input_per_mtok="1", currency="EUR",
    )  # fmt: skip
    thread = services.create_thread(provider_chain=["full", "cheap"], now=NOW)
    run, stage, _ = services.submit_run(thread, input="hi", now=NOW)
    other = services.create_thread(provider_chain=["full"], now=NOW)
    return {
        "providers": [full, cheap],
        "run": run,
        "stage": stage,
        "segment": run.segment,
        "other": services.open_segment(other),
    }


def attempt(world, n, *, provider=None, usage=None, result="accepted", segment=None):
    return ProviderAttempt(
        run=world["run"], stage=world["stage"], segment=segment or world["segment"],
        provider=provider or world["providers"][0], model="m", kind="original",
        request_digest=f"r{n}", started_at=NOW + timedelta(seconds=n), result=result,
        usage=usage if usage is not None else {"input_tokens": 10},
    )  # fmt: skip


def each_request(segment: Segment):
    """The rule's own cost of each request of the segment, summed (the reference)."""
    return summarize_costs(
        (a.result, attempt_cost(a.usage, costs.prices_of(a.provider)))
        for a in ProviderAttempt.objects.filter(segment=segment).select_related("provider")
    )


def kept_rows(segment: Segment) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT provider_id, refused, reported, requests FROM governance_segmentusage "
            "WHERE segment_id = %s ORDER BY 1, 2, 3, 4",
            [segment.id],
        )
        return cursor.fetchall()


def test_the_kept_sums_follow_every_write_of_a_request(world):
    """Inserted one by one or in bulk, changed, moved to another segment or provider,
    tiered, deleted: the kept sums stay the sum of the requests, never stale."""
    segment, other = world["segment"], world["other"]
    full, cheap = world["providers"]
    rng = random.Random(3)
    ProviderAttempt.objects.bulk_create(
        attempt(world, n, provider=rng.choice([full, cheap]), usage=rng.choice(USAGES),
                result=rng.choice(["accepted", "refused", "failed"]))
        for n in range(60)
    )  # fmt: skip
    one = attempt(world, 100, usage={"input_tokens": 1000, "output_tokens": 100}, result="refused")
    one.save()
    assert segment_queries.segment_cost(segment) == each_request(segment)
    assert each_request(segment).requests == 61

    one.usage = {"output_tokens": 5}
    one.save()  # Django's save sets every column
    assert segment_queries.segment_cost(segment) == each_request(segment)
    one.result = "accepted"
    one.save()
    assert segment_queries.segment_cost(segment) == each_request(segment)
    ProviderAttempt.objects.filter(segment=segment, provider=full).update(provider=cheap)
    assert segment_queries.segment_cost(segment) == each_request(segment)
    moved = list(ProviderAttempt.objects.filter(segment=segment).values_list("id", flat=True))[:7]
    ProviderAttempt.objects.filter(id__in=moved).update(segment=other)
    assert segment_queries.segment_cost(segment) == each_request(segment)
    assert segment_queries.segment_cost(other) == each_request(other)
    assert segment_queries.segment_cost(other).requests == 7
    ProviderAttempt.objects.filter(segment=segment).update(tiered=True, insight_tier="re_probe")
    assert segment_queries.segment_cost(segment) == each_request(segment)

    ProviderAttempt.objects.filter(segment=other).delete()
    assert segment_queries.segment_cost(other) == each_request(other)
    assert kept_rows(other) == []  # a line whose requests are all gone is removed
    ProviderAttempt.objects.all().delete()
    assert kept_rows(segment) == []
    assert segment_queries.segment_cost(segment).requests == 0


def test_emptying_the_attempts_table_empties_the_sums(world):
    attempt(world, 1).save()
    assert kept_rows(world["segment"])
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no foreign-key check left pending
        cursor.execute("TRUNCATE governance_providerattempt")
    assert kept_rows(world["segment"]) == []


def test_the_migration_starts_the_sums_from_the_requests_already_written(world):
    """0017 on a database that already holds requests: its sums are theirs."""
    migration = importlib.import_module("governance.migrations.0017_segment_usage")
    rng = random.Random(5)
    ProviderAttempt.objects.bulk_create(
        attempt(world, n, provider=rng.choice(world["providers"]), usage=rng.choice(USAGES),
                result=rng.choice(["accepted", "refused"]))
        for n in range(40)
    )  # fmt: skip
    with connection.schema_editor() as editor:
        migration._run(migration._down)(None, editor)
        migration._run(migration._up)(None, editor)
    assert segment_queries.segment_cost(world["segment"]) == each_request(world["segment"])
    attempt(world, 99, result="refused").save()  # and the trigger is back
    assert segment_queries.segment_cost(world["segment"]) == each_request(world["segment"])


def test_without_postgresql_the_requests_are_summed(world, monkeypatch):
    rng = random.Random(8)
    ProviderAttempt.objects.bulk_create(
        attempt(world, n, usage=rng.choice(USAGES), result=rng.choice(["accepted", "refused"]))
        for n in range(20)
    )  # fmt: skip
    monkeypatch.setattr(usage.connection, "vendor", "other")
    assert segment_queries.segment_cost(world["segment"]) == each_request(world["segment"])


def test_the_segment_page_prices_the_kept_sums_not_each_request(client, operator, world):
    segment = world["segment"]
    ProviderAttempt.objects.bulk_create(
        attempt(world, n, usage={"input_tokens": 1000, "output_tokens": 100},
                result="refused" if n % 2 else "accepted")
        for n in range(10)
    )  # fmt: skip
    client.force_login(operator)
    with CaptureQueriesContext(connection) as queries:
        page = client.get(reverse("segment", args=[segment.id])).content.decode()
    # 10 requests × (1,000 × 2.5 + 100 × 10) per million = 0.035 USD; 5 refused.
    assert "0.0350 USD" in page and "0.0175 USD for 5 refused requests" in page
    summed = [
        q["sql"] for q in queries if "governance_providerattempt" in q["sql"] and "sum(" in q["sql"]
    ]
    assert summed == []  # the page does not add up the segment's requests
