"""GET /metrics: the facts in Prometheus's text format, for a scraper with
the token or from an allowed address only; gauges read by aggregate queries
(their count does not grow with the rows) and labelled by bounded values."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from governance import services, time_source
from governance.models import (
    Incident,
    Notification,
    Provider,
    ProviderHealthState,
    SegmentRefusal,
)
from governance.rules.outbound import parse_allow_list

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-" + "m" * 24


@pytest.fixture
def scrape_settings(settings):
    settings.GOVERNANCE_METRICS_TOKEN = TOKEN
    settings.GOVERNANCE_METRICS_ALLOW = parse_allow_list([])
    return settings


def scrape(client, token: str = TOKEN) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def segment_with(
    chain, refusals: dict[str, int], *, closed: bool = False, ago=timedelta(minutes=1)
):
    now = time_source.now()
    thread = services.create_thread(provider_chain=chain, now=now)
    segment = services.open_segment(thread)
    for provider_id, count in refusals.items():
        SegmentRefusal.objects.create(
            segment=segment, provider_id=provider_id, refusals=count,
            refused_at=now - ago, category="content_filter",
        )  # fmt: skip
    if closed:
        type(segment).objects.filter(id=segment.id).update(closed_at=now)
    return segment


@pytest.fixture
def providers():
    for pid in ("alpha", "beta"):
        Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-m", script={})


def test_without_the_token_or_an_allowed_address_nothing_is_read(client, scrape_settings):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
        assert b"GOVERNANCE_METRICS_TOKEN" in response.content


def test_an_allowed_address_scrapes_without_a_token(client, settings):
    settings.GOVERNANCE_METRICS_TOKEN = None
    settings.GOVERNANCE_METRICS_ALLOW = parse_allow_list(["127.0.0.0/8"])
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 401


def test_r3_2_the_segments_each_provider_is_cooling_eligible_or_frozen_in(
    client, scrape_settings, providers
):
    segment_with(["alpha", "beta"], {"alpha": 4, "beta": 1})  # alpha frozen, beta cooling
    segment_with(["alpha"], {"alpha": 4})
    segment_with(["alpha"], {"alpha": 4}, closed=True)  # a boundary cleared it
    # Refused once 20 minutes ago: its first re-probe (15 min) is due.
    segment_with(["beta"], {"beta": 1}, ago=timedelta(minutes=20))
    samples = scrape(client)

    def segments(provider: str, state: str) -> float:
        return samples[
            ("governance_segments_by_refusal_state", (("provider", provider), ("state", state)))
        ]

    assert (segments("alpha", "frozen"), segments("alpha", "cooling")) == (2, 0)
    assert (segments("beta", "cooling"), segments("beta", "eligible")) == (1, 1)
    assert (segments("alpha", "eligible"), segments("beta", "frozen")) == (0, 0)


def test_r8_2_incidents_breakers_and_what_waits(client, scrape_settings, providers):
    segment = segment_with(["alpha"], {"alpha": 4})
    opened = time_source.now() - timedelta(minutes=20)
    incident = Incident.objects.create(key="incident:m:1", segment=segment, opened_at=opened)
    Notification.objects.create(
        dedupe_key="m-1", severity="critical", text="frozen", segment=segment,
        created_at=opened, incident=incident, leads_incident=True,
    )  # fmt: skip
    ProviderHealthState.objects.create(
        provider=Provider.objects.get(provider_id="beta"), breaker="open"
    )
    thread = services.create_thread(provider_chain=["alpha"], now=time_source.now())
    services.submit_run(thread, input="hi", now=time_source.now() - timedelta(seconds=30))
    samples = scrape(client)
    assert samples[("governance_incidents_open", (("state", "triggered"),))] == 1
    assert samples[("governance_critical_notifications_unacknowledged", ())] == 1
    assert 1190 <= samples[("governance_incident_unacknowledged_oldest_seconds", ())] <= 1300
    assert samples[("governance_provider_breaker", (("provider", "beta"), ("state", "open")))] == 1
    assert (
        samples[("governance_provider_breaker", (("provider", "beta"), ("state", "closed")))] == 0
    )
    assert samples[("governance_runs_unsettled", (("status", "queued"),))] == 1
    assert samples[("governance_stages_waiting", (("kind", "model_turn"),))] == 1
    assert samples[("governance_stage_oldest_wait_seconds", (("kind", "model_turn"),))] >= 29
    assert samples[("governance_approvals_waiting", ())] == 0


def test_a_scrape_costs_the_same_queries_with_more_rows_and_labels_stay_bounded(
    client, scrape_settings, providers
):
    segment_with(["alpha"], {"alpha": 4})
    with CaptureQueriesContext(connection) as few:
        scrape(client)
    for _ in range(6):
        segment_with(["alpha", "beta"], {"alpha": 4, "beta": 1})
        thread = services.create_thread(provider_chain=["alpha"], now=time_source.now())
        services.submit_run(thread, input="hi", now=time_source.now())
    with CaptureQueriesContext(connection) as many:
        samples = scrape(client)
    assert len(many) == len(few)
    # Bounded labels: these names only, and never an id (a UUID, a segment key).
    keys = {key for _name, pairs in samples for key, _value in pairs}
    assert keys <= {"provider", "state", "status", "kind", "stage_kind", "clock", "timeout",
                    "outcome", "effect", "event", "severity", "what", "channel", "le", "tier",
                    "currency", "resource", "gen_ai_operation_name", "gen_ai_provider_name",
                    "gen_ai_request_model", "gen_ai_response_model", "gen_ai_token_type",
                    "error_type"}  # fmt: skip
    values = {value for _name, pairs in samples for _key, value in pairs}
    assert not [v for v in values if "#" in v or len(v) >= 32], values


def test_r3_2_the_database_counts_each_row_as_the_rule_judges_it(
    client, scrape_settings, providers, request
):
    """R3.2, R3.4: the gauge is counted by the database; each open row must land
    in the state ``refusal_verdict`` gives it — default and stored schedules,
    the instant the re-probe is due, an unknown time and a legacy row."""
    from governance.rules.refusal import refusal_verdict
    from governance.services.refusals import refusal_of, reprobe_delays

    now = time_source.now().replace(microsecond=0)
    clock = time_source.ManualClock(now)  # the scrape reads this same instant
    time_source.install(clock)
    request.addfinalizer(lambda: time_source.install(None))
    shapes = [
        # (refusals, refused ago, stored schedule in seconds)
        (1, timedelta(minutes=1), None),  # cooling
        (1, timedelta(minutes=15), None),  # due at this very instant: eligible
        (1, timedelta(minutes=15) - timedelta(microseconds=1), None),  # cooling still
        (2, timedelta(minutes=30), None),  # second re-probe in 1 h: cooling
        (3, timedelta(hours=7), None),  # third re-probe due: eligible
        (4, timedelta(minutes=1), None),  # frozen
        (1, timedelta(minutes=3), [120, 600]),  # its own schedule: due after 2 min
        (2, timedelta(minutes=3), [120, 600]),  # cooling for 10 min
        (3, timedelta(days=9), [120, 600]),  # past its schedule: frozen
        (None, timedelta(minutes=1), None),  # legacy row: frozen
        (1, None, None),  # unknown time: frozen
        (0, timedelta(minutes=1), None),  # no refusal counted: eligible
    ]
    expected = Counter()
    for index, (count, ago, delays_s) in enumerate(shapes):
        thread = services.create_thread(provider_chain=["alpha", "beta"], now=now)
        segment = services.open_segment(thread)
        provider = "alpha" if index % 2 else "beta"
        row = SegmentRefusal.objects.create(
            segment=segment, provider_id=provider, refusals=count, delays_s=delays_s,
            refused_at=None if ago is None else now - ago, category="content_filter",
        )  # fmt: skip
        expected[(provider, refusal_verdict(refusal_of(row), now, reprobe_delays()).state)] += 1
    assert {state for _p, state in expected} == {"eligible", "cooling", "frozen"}
    samples = scrape(client)
    counted = Counter(
        {
            (dict(labels)["provider"], dict(labels)["state"]): value
            for (name, labels), value in samples.items()
            if name == "governance_segments_by_refusal_state" and value
        }
    )
    assert counted == expected
