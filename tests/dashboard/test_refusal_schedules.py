"""A re-probe schedule per provider and refusal category (R3.2): validated
by the service (API, providers page), stored with each refusal when it starts, and
named on the segment page — a change never re-judges a refusal under way."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from governance import services, time_source
from governance.models import ApiToken, AuditEntry, Provider, SegmentRefusal
from governance.rules.routing import AttemptOutcome, ChainEntry, drive_turn, route_turn
from governance.services.errors import ServiceError
from governance.services.providers import create_provider, update_provider
from governance.services.refusals import record_turn, reprobe_schedules, segment_refusals
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


@pytest.fixture(autouse=True)
def clock():
    manual = time_source.ManualClock(NOW)
    time_source.install(manual)
    yield manual
    time_source.install(None)


@pytest.fixture
def setter(make_user):
    user = make_user("sam-schedules", "operator")
    user.user_permissions.add(Permission.objects.get(codename="change_provider"))
    return user


def _provider(pid="alpha", **extra):
    return create_provider(
        provider_id=pid, kind="scripted", model=f"{pid}-model", script={}, by="t", now=NOW,
        **extra,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("schedule", "words"),
    [
        ({"delays_s": []}, "a list of delays|1 to 5"),
        ({"delays_s": [600, 600]}, "re-probe 2's delay must be longer"),
        ({"delays_s": [600, 22000]}, "at most 6 h"),
        ({"delays_s": [1, 2, 3, 4, 5, 6]}, "1 to 5 re-probes, not 6"),
        ({"delays_s": ["10m"]}, "a list of delays in seconds"),
        ({"delays_s": [0]}, "positive"),
        ({"categories": {"policy": [60, 30]}}, "categories.policy: re-probe 2"),
        ({"categories": {"bad name!": [60]}}, "not a refusal category name"),
        ({"every": [60]}, "unknown key 'every'"),
        ("15m", "an object"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_field(schedule, words):
    _provider()
    with pytest.raises(ServiceError, match=words) as error:
        update_provider("alpha", by="t", now=NOW, refusal_schedule=schedule)
    assert error.value.field == "refusal_schedule"
    assert Provider.objects.get(provider_id="alpha").refusal_schedule == {}


def test_a_schedule_is_stored_in_seconds_and_audited():
    _provider()
    _, changed = update_provider(
        "alpha", by="t", now=NOW,
        refusal_schedule={"delays_s": [600.0, 1800], "categories": {"policy": [300]}},
    )  # fmt: skip
    assert changed == ["refusal_schedule"]
    stored = Provider.objects.get(provider_id="alpha").refusal_schedule
    assert stored == {"delays_s": [600, 1800], "categories": {"policy": [300]}}
    entry = AuditEntry.objects.get(action="provider.update")
    assert entry.detail["after"]["refusal_schedule"] == stored
    update_provider("alpha", by="t", now=NOW, refusal_schedule={})  # back to R3.2's default
    assert Provider.objects.get(provider_id="alpha").refusal_schedule == {}


def test_the_api_takes_and_shows_a_schedule(client, setter):
    token = "schedule-token-" + "s" * 20
    ApiToken.objects.create(user=setter, name="t", key_digest=token_digest(token))
    headers = {"Authorization": f"Bearer {token}"}
    body = {
        "provider_id": "sched", "kind": "scripted", "model": "m", "script": {},
        "refusal_schedule": {"delays_s": [600, 1800]},
    }  # fmt: skip
    created = client.post(
        "/api/v1/providers", json.dumps(body), content_type="application/json", headers=headers
    )
    assert created.status_code == 201, created.content
    assert created.json()["refusal_schedule"] == {"delays_s": [600, 1800]}
    bad = client.patch(
        "/api/v1/providers/sched",
        json.dumps({"refusal_schedule": {"delays_s": [1800, 600]}}),
        content_type="application/json", headers=headers,
    )  # fmt: skip
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == "refusal_schedule"
    assert "longer" in bad.json()["error"]["message"]


def test_the_providers_page_sets_a_schedule_and_says_which_applies(client, setter):
    _provider()
    client.force_login(setter)
    page = client.get(reverse("providers")).content.decode()
    assert "15 min, 1 h, 6 h (R3.2&#x27;s default)" in page
    response = client.post(
        reverse("provider-schedule", args=["alpha"]),
        {
            "schedule-alpha-delays": "10m, 30m",
            "schedule-alpha-categories": "policy: 5m, 1h",
            "schedule-alpha-reason": "tuned on the Insights page",
        },
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert Provider.objects.get(provider_id="alpha").refusal_schedule == {
        "delays_s": [600, 1800], "categories": {"policy": [300, 3600]},
    }  # fmt: skip
    page = client.get(reverse("providers")).content.decode()
    assert "10 min, 30 min (alpha&#x27;s own); by refusal category — policy: 5 min, 1 h" in page
    # The form, as it opens on the page (htmx), is filled with the schedule as it stands.
    form = client.get(reverse("provider-schedule", args=["alpha"]), headers={"HX-Request": "true"})
    assert 'value="10m, 30m"' in form.content.decode()


def test_a_bad_schedule_on_the_page_is_a_form_error(client, setter, oncall):
    _provider()
    client.force_login(setter)
    response = client.post(
        reverse("provider-schedule", args=["alpha"]), {"schedule-alpha-delays": "1h, 7h"}
    )
    assert response.status_code == 400 and "at most 6 h" in response.content.decode()
    response = client.post(
        reverse("provider-schedule", args=["alpha"]), {"schedule-alpha-categories": "policy"}
    )
    assert response.status_code == 400 and "write it as category: 10m, 1h" in (
        response.content.decode()
    )
    client.force_login(oncall)
    response = client.post(
        reverse("provider-schedule", args=["alpha"]), {"schedule-alpha-delays": "10m"}
    )
    assert response.status_code == 403
    assert Provider.objects.get(provider_id="alpha").refusal_schedule == {}


def _refused_turn(thread, at):
    """One turn through the real protocol and recording service: alpha refuses."""
    segment = services.open_segment(thread)
    refusals = segment_refusals(segment)
    providers = {p.provider_id: p for p in Provider.objects.all()}
    schedules = reprobe_schedules(providers.values())
    route = route_turn(
        [ChainEntry("alpha", "alpha-model"), ChainEntry("beta", "beta-model")],
        now=at, health={}, refusals=refusals, delays=schedules,
    )  # fmt: skip
    sent = []

    def send(candidate, kind):
        sent.append((candidate.provider_id, kind))
        if candidate.provider_id == "alpha":
            return AttemptOutcome("refused", refusal_category="policy", at=at)
        return AttemptOutcome("accepted", at=at)

    outcome = drive_turn(
        route, send, segment_key=segment.key, refusals=refusals,
        has_unaccepted_increment=False, now=at, delays=schedules,
    )  # fmt: skip
    run, stage, _ = services.submit_run(thread, input="next", now=at)
    rows = [
        {
            "provider": providers[pid], "model": f"{pid}-model", "kind": kind,
            "request_digest": f"{kind}-{n}", "started_at": at, "latency_ms": 0,
            "result": "refused" if pid == "alpha" else "accepted",
            "refusal_category": "policy" if pid == "alpha" else "",
        }
        for n, (pid, kind) in enumerate(sent)
    ]  # fmt: skip
    record_turn(run=run, stage=stage, segment=segment, outcome=outcome, attempts=rows, now=at)
    services.finish_stage(stage, outcome="answered", now=at)  # as close_stage does
    return [kind for pid, kind in sent if pid == "alpha"]


def test_r3_2_changing_a_schedule_never_changes_a_segment_verdict(client, operator):
    _provider(refusal_schedule={"delays_s": [600, 1800]})
    _provider("beta")
    thread = services.create_thread(provider_chain=["alpha", "beta"], now=NOW)
    assert _refused_turn(thread, NOW) == ["original"]
    segment = services.open_segment(thread)
    assert SegmentRefusal.objects.get(segment=segment).delays_s == [600, 1800]
    client.force_login(operator)
    page = client.get(reverse("segment", args=[segment.id])).content.decode()
    assert "10 min, 30 min (alpha&#x27;s own when this refusal started; kept until it clears)" in (
        page
    )
    update_provider("alpha", by="t", now=NOW, refusal_schedule={"delays_s": [3600]})
    page = client.get(reverse("segment", args=[segment.id])).content.decode()
    assert "kept until it clears); a new refusal would get 1 h" in page
    assert "(refusals 1 of 3)" in page  # its own schedule: 1 + 2 sends
    # The overview and the providers page count the sends of that same schedule.
    for name in ("overview", "providers"):
        shown = client.get(reverse(name)).content.decode()
        assert "refusals 1 of 3)" in shown, name
        assert "refusals 1 of 4)" not in shown, name  # R3.2's default, not this refusal's
    # Its verdict is the one of the schedule it started under: due at +10 min.
    assert _refused_turn(thread, NOW + 10 * MIN) == ["re_probe"]
    assert _refused_turn(thread, NOW + 39 * MIN) == []  # cooling until +40 min
    assert _refused_turn(thread, NOW + 40 * MIN) == ["re_probe"]  # the last: frozen
    assert _refused_turn(thread, NOW + 100 * 60 * MIN) == []
    page = client.get(reverse("segment", args=[segment.id])).content.decode()
    assert "frozen" in page and "(refusals 3 of 3)" in page


def test_r3_2_the_what_if_replays_each_refusal_under_the_schedule_it_ran_under(
    client, operator, clock
):
    """A refusal that started under alpha's own 10 min, 30 min: the Insights page's
    replay 'as run' uses that schedule (read from the cards), not the default."""
    _provider(refusal_schedule={"delays_s": [600, 1800]})
    _provider("beta")
    thread = services.create_thread(provider_chain=["alpha", "beta"], now=NOW)
    for minutes in (0, 10, 40, 60):
        _refused_turn(thread, NOW + minutes * MIN)
    clock.advance(timedelta(days=1))
    client.force_login(operator)
    page = client.get(
        reverse("insights"),
        {"from": "2025-06-02", "to": "2025-06-02", "tiers": "1", "delays": "5m"},
    ).content.decode()
    assert "<td>10 min, 30 min</td><td>5 min</td>" in page
    assert "1 refusal timeline " in page
