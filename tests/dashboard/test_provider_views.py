"""Providers page (R2.1–R2.3, R3.2, R8.1): breaker state in words, failures by
class over 24 h, and the open segments where a provider is frozen or cooling."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from governance import services, time_source
from governance.models import (
    Provider,
    ProviderAttempt,
    ProviderHealthState,
    Run,
    SegmentRefusal,
    Stage,
)

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 3, 2, 14, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fixed_clock():
    time_source.install(time_source.ManualClock(NOW))
    yield
    time_source.install(None)


def provider(provider_id: str, **extra) -> Provider:
    extra.setdefault("kind", "openai")
    extra.setdefault("model", f"{provider_id}-model")
    extra.setdefault("base_url", f"https://{provider_id}.example/v1")
    return Provider.objects.create(provider_id=provider_id, **extra)


def health(p: Provider, **fields) -> ProviderHealthState:
    return ProviderHealthState.objects.create(provider=p, **fields)


def card(body: str, provider_id: str) -> str:
    start = body.index(f'<article id="provider-{provider_id}"')
    return body[start : body.index("</article>", start)]


def thread(title: str, chain=("alpha", "beta")):
    return services.create_thread(
        provider_chain=list(chain), now=NOW - timedelta(days=1), title=title
    )


def attempts(p: Provider, segment, rows: list[tuple[str, str, int]], *, at: datetime) -> None:
    """rows: (result, failure_class, how many)."""
    run = Run.objects.create(
        thread=segment.thread,
        segment=segment,
        input="hello",
        created_at=at,
        deadline_at=at + timedelta(hours=1),
        last_progress_at=at,
    )
    stage = Stage.objects.create(run=run, seq=1, kind="model_turn", enqueued_at=at)
    ProviderAttempt.objects.bulk_create(
        ProviderAttempt(
            run=run,
            stage=stage,
            segment=segment,
            provider=p,
            model=p.model,
            kind="original",
            request_digest="d",
            started_at=at,
            result=result,
            failure_class=failure_class,
        )
        for result, failure_class, count in rows
        for _ in range(count)
    )


def test_r2_2_anonymous_is_sent_to_login(client):
    response = client.get(reverse("providers"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_r2_2_providers_page_is_get_only(client, manager):
    client.force_login(manager)
    assert client.post(reverse("providers")).status_code == 405


def test_r2_1_empty_state_points_to_the_admin(client, manager, make_user):
    client.force_login(manager)
    body = client.get(reverse("providers")).content.decode()
    assert "No providers are configured yet." in body
    assert "An administrator adds providers in the Django admin" in body
    client.force_login(make_user("ada-admin", is_staff=True))
    body = client.get(reverse("providers")).content.decode()
    assert f'href="{reverse("admin:governance_provider_add")}"' in body


@pytest.mark.parametrize("role", ["oncall", "operator", "manager", "outsider"])
def test_r2_2_every_logged_in_role_reads_the_page(client, request, role):
    provider("alpha")
    client.force_login(request.getfixturevalue(role))
    response = client.get(reverse("providers"))
    assert response.status_code == 200
    assert 'id="provider-alpha"' in response.content.decode()


def test_r2_2_closed_breaker_without_a_health_row_and_the_page_writes_nothing(client, oncall):
    alpha = provider("alpha", kind="anthropic", model="claude-x", api_key_env="ALPHA_KEY")
    client.force_login(oncall)
    body = card(client.get(reverse("providers")).content.decode(), "alpha")
    assert '<span class="state closed">Closed</span>' in body
    assert re.search(r"<strong>Breaker:</strong>\s*closed\s*</p>", body)
    assert "Anthropic messages" in body and "claude-x" in body
    assert "https://alpha.example/v1" in body
    assert "<dt>Enabled</dt><dd>yes</dd>" in body
    assert "No failed attempts in the last 24 h." in body
    assert "Not frozen or cooling in any open segment." in body
    assert not ProviderHealthState.objects.filter(provider=alpha).exists()
    assert (
        '<span class="state ok">All 1 available</span>'
        in client.get(reverse("providers")).content.decode()
    )


def test_r2_2_closed_with_some_failures_says_how_many_before_it_opens(client, oncall):
    alpha = provider("alpha", failure_threshold=3)
    health(alpha, consecutive_failures=2, last_failure_class="timeout", last_failure_at=NOW)
    client.force_login(oncall)
    body = card(client.get(reverse("providers")).content.decode(), "alpha")
    assert "closed — 2 consecutive failures (last: timeout); opens at 3" in body


def test_r2_2_open_breaker_says_until_when_and_after_what(client, oncall):
    alpha = provider("alpha")
    open_until = NOW + timedelta(minutes=32)
    health(
        alpha,
        breaker="open",
        open_until=open_until,
        consecutive_failures=3,
        trips=1,
        last_failure_class="server_error",
        last_failure_at=NOW - timedelta(minutes=1),
        last_error="HTTP 503: upstream overloaded",
    )
    client.force_login(oncall)
    page = client.get(reverse("providers")).content.decode()
    body = card(page, "alpha")
    assert '<span class="state open">Open</span>' in body
    assert f'open until <time datetime="{open_until.isoformat()}" data-format="clock"' in body
    assert "14:32 UTC</time>" in body
    assert "after 3 failures (last: server_error)" in body
    assert "HTTP 503: upstream overloaded" in body
    assert f'datetime="{(NOW - timedelta(minutes=1)).isoformat()}"' in body  # last error, when
    assert '<span class="state bad">1 of 1 unavailable</span>' in page
    assert '<a class="mono" href="#provider-alpha">alpha</a> (open)' in page


def test_r2_2_open_past_its_window_is_half_open_one_probe_allowed(client, oncall):
    alpha = provider("alpha")
    health(
        alpha,
        breaker="open",
        open_until=NOW - timedelta(seconds=1),
        consecutive_failures=3,
        last_failure_class="network",
        last_failure_at=NOW - timedelta(minutes=5),
    )
    client.force_login(oncall)
    body = card(client.get(reverse("providers")).content.decode(), "alpha")
    assert '<span class="state half_open">Half-open</span>' in body
    assert "half-open: one probe allowed" in body


def test_r2_2_half_open_with_a_probe_in_flight(client, oncall):
    alpha = provider("alpha")
    lease = NOW + timedelta(seconds=30)
    health(alpha, breaker="half_open", consecutive_failures=3, probe_lease_until=lease)
    client.force_login(oncall)
    body = card(client.get(reverse("providers")).content.decode(), "alpha")
    assert "half-open: one probe in flight; another may go at" in body
    assert f'datetime="{lease.isoformat()}"' in body


def test_r2_1_auth_failure_disables_until_the_key_is_fixed(client, oncall):
    alpha = provider("alpha", api_key_env="ALPHA_API_KEY")
    health(
        alpha,
        disabled_config=alpha.config_fingerprint(),
        last_failure_class="auth",
        last_failure_at=NOW - timedelta(minutes=10),
        last_error="HTTP 401: invalid api key",
    )
    client.force_login(oncall)
    body = card(client.get(reverse("providers")).content.decode(), "alpha")
    assert '<span class="state disabled">Disabled</span>' in body
    assert "disabled: auth failed" in body
    assert 'fix the key (env var <span class="mono">ALPHA_API_KEY</span>)' in body
    assert "HTTP 401: invalid api key" in body


def test_r2_1_a_changed_configuration_re_enables_an_auth_disabled_provider(client, oncall):
    alpha = provider("alpha", api_key_env="ALPHA_API_KEY")
    health(alpha, disabled_config="fingerprint-of-old-config", last_failure_class="auth")
    client.force_login(oncall)
    body = card(client.get(reverse("providers")).content.decode(), "alpha")
    assert '<span class="state closed">Closed</span>' in body


def test_r2_1_disabled_by_an_administrator(client, oncall):
    provider("alpha", enabled=False)
    client.force_login(oncall)
    body = card(client.get(reverse("providers")).content.decode(), "alpha")
    assert '<span class="state disabled">Disabled</span>' in body
    assert "disabled by an administrator" in body
    assert "<dt>Enabled</dt><dd>no — turned off in the admin</dd>" in body


def test_r2_3_failures_by_class_over_the_last_24_hours(client, oncall):
    """R2.1/R2.3: counts per class; a refusal is listed as content, not provider health."""
    alpha, beta = provider("alpha"), provider("beta")
    segment = thread("Counts").segments.get()
    attempts(
        alpha,
        segment,
        [("failed", "server_error", 3), ("failed", "timeout", 2), ("refused", "refusal", 1),
         ("accepted", "", 4)],
        at=NOW - timedelta(hours=2),
    )  # fmt: skip
    attempts(alpha, segment, [("failed", "server_error", 5)], at=NOW - timedelta(hours=25))
    attempts(beta, segment, [("failed", "rate_limited", 7)], at=NOW - timedelta(hours=1))
    client.force_login(oncall)
    page = client.get(reverse("providers")).content.decode()
    body = card(page, "alpha")
    assert "Last 24 h: 10 attempts, 4 accepted" in body
    rows = re.findall(r'<th scope="row" class="mono">(\w+)</th><td class="num">(\d+)</td>', body)
    assert rows == [("server_error", "3"), ("timeout", "2"), ("refusal", "1")]
    assert "the segment&#x27;s content, not provider health" in body
    assert "rate_limited" not in body
    beta_rows = re.findall(
        r'<th scope="row" class="mono">(\w+)</th><td class="num">(\d+)</td>', card(page, "beta")
    )
    assert beta_rows == [("rate_limited", "7")]


def test_r8_1_frozen_and_cooling_segments_are_listed_with_links(client, oncall):
    """R3.2/R8.1: frozen (4 of 4) and cooling (until T) in open segments, linked."""
    provider("alpha")
    provider("beta")
    frozen_seg = thread("Frozen thread").segments.get()
    cooling_seg = thread("Cooling thread").segments.get()
    due_seg = thread("Due thread").segments.get()
    closed_thread = thread("Closed thread")
    closed_seg = closed_thread.segments.get()
    SegmentRefusal.objects.create(
        segment=frozen_seg, provider_id="alpha", refusals=4, refused_at=NOW - timedelta(hours=2)
    )
    # refusals 2 → one re-probe used; the next waits 1 h after the latest refusal.
    SegmentRefusal.objects.create(
        segment=cooling_seg, provider_id="alpha", refusals=2, refused_at=NOW - timedelta(minutes=10)
    )
    SegmentRefusal.objects.create(
        segment=due_seg, provider_id="alpha", refusals=2, refused_at=NOW - timedelta(hours=2)
    )
    SegmentRefusal.objects.create(
        segment=closed_seg, provider_id="alpha", refusals=4, refused_at=NOW - timedelta(hours=3)
    )
    services.apply_boundary(closed_thread, "compact", by="oscar", reason="frozen", now=NOW)
    SegmentRefusal.objects.create(
        segment=cooling_seg, provider_id="beta", refusals=None, refused_at=None
    )  # legacy row: frozen (R3.4)
    client.force_login(oncall)
    page = client.get(reverse("providers")).content.decode()
    body = card(page, "alpha")
    items = re.findall(r"<li>(.*?)</li>", body, re.S)
    assert len(items) == 2
    assert '<span class="state frozen">Frozen</span>' in items[0]
    assert f'href="{reverse("segment", args=[frozen_seg.pk])}">{frozen_seg.key}</a>' in items[0]
    assert "Frozen thread; refusals 4 of 4" in items[0]
    assert f'datetime="{(NOW - timedelta(hours=2)).isoformat()}"' in items[0]
    assert '<span class="state cooling">Cooling</span>' in items[1]
    assert f'datetime="{(NOW + timedelta(minutes=50)).isoformat()}"' in items[1]
    assert "refusals 2 of 4" in items[1]
    assert closed_seg.key not in body and due_seg.key not in body
    beta = card(page, "beta")
    assert "since an unknown time (legacy state)" in beta
    assert "refusals ? of 4" in beta
    # R2.3: a refusal never opens the breaker.
    assert '<span class="state closed">Closed</span>' in body


def test_r2_2_query_count_does_not_grow_with_providers(
    client, oncall, django_assert_max_num_queries
):
    """No N+1: the same number of queries for 2 providers as for 12 with data."""

    def build(names):
        for name in names:
            p = provider(name)
            health(p, consecutive_failures=1, last_failure_class="timeout", last_failure_at=NOW)
            segment = thread(f"T {name}", chain=[name]).segments.get()
            attempts(p, segment, [("failed", "timeout", 2), ("accepted", "", 1)], at=NOW)
            SegmentRefusal.objects.create(
                segment=segment, provider_id=name, refusals=4, refused_at=NOW
            )

    client.force_login(oncall)
    build(["p00", "p01"])
    # One is the nav's incident count; two count the segments in trouble in SQL
    # (refusal_states): none grows with the rows.
    with django_assert_max_num_queries(11) as few:
        assert client.get(reverse("providers")).status_code == 200
    build([f"p{i:02d}" for i in range(2, 12)])
    with django_assert_max_num_queries(len(few.captured_queries)):
        body = client.get(reverse("providers")).content.decode()
    assert body.count('<span class="state frozen">Frozen</span>') == 12


def test_r2_2_providers_are_paginated(client, oncall):
    for i in range(27):
        provider(f"p{i:02d}")
    client.force_login(oncall)
    body = client.get(reverse("providers")).content.decode()
    assert body.count('<article id="provider-') == 25
    assert "Page 1 of 2 (27 in all)" in body
    second = client.get(reverse("providers"), {"page": 2}).content.decode()
    assert second.count('<article id="provider-') == 2


def test_r8_2_a_disabled_alert_channel_is_visible_on_the_providers_page(client, oncall):
    from governance.models import AlertChannel

    AlertChannel.objects.create(name="ops-hook", kind="webhook", target="http://127.0.0.1:9/x")
    AlertChannel.objects.create(
        name="pager", kind="pagerduty", enabled=False,
        disabled_reason="HTTP 400: invalid routing key", disabled_at=time_source.now(),
    )  # fmt: skip
    client.force_login(oncall)
    body = client.get(reverse("providers")).content.decode()
    assert "ops-hook" in body and "pager" in body
    assert "invalid routing key" in body


def test_r2_3_the_counts_of_the_second_page_are_its_providers_own(client, oncall):
    """The last day's attempts are counted for every provider at once, then shown on
    each provider's page: none is lost or given to another."""
    for i in range(27):
        provider(f"p{i:02d}")
    first, last = Provider.objects.get(provider_id="p00"), Provider.objects.get(provider_id="p26")
    segment = thread("Paged", chain=["p00", "p26"]).segments.get()
    attempts(first, segment, [("failed", "timeout", 2)], at=NOW - timedelta(hours=1))
    attempts(last, segment, [("failed", "server_error", 3), ("accepted", "", 1)], at=NOW)
    client.force_login(oncall)
    page_one = client.get(reverse("providers")).content.decode()
    page_two = client.get(reverse("providers"), {"page": 2}).content.decode()
    assert "Last 24 h: 2 attempts, 0 accepted" in card(page_one, "p00")
    assert "Last 24 h: 4 attempts, 1 accepted" in card(page_two, "p26")
    assert "Last 24 h: 0 attempts" in card(page_two, "p25")


def test_r3_2_a_provider_card_shows_ten_segments_in_trouble_frozen_first_and_counts_the_rest(
    client, oncall
):
    """R3.2: frozen first (an unknown time first among them), then the latest
    refusal; a due re-probe (eligible) is no trouble; the rest are counted."""
    provider("alpha")
    refused = [
        (4, None),  # legacy time: frozen
        *[(4, timedelta(hours=h)) for h in (5, 1, 3)],  # frozen
        *[(1, timedelta(minutes=m)) for m in range(1, 10)],  # cooling, 1–9 min ago
        (1, timedelta(minutes=20)),  # its re-probe is due: eligible
    ]
    for n, (count, ago) in enumerate(refused):
        segment = thread(f"T{n:02d}", chain=["alpha"]).segments.get()
        SegmentRefusal.objects.create(
            segment=segment, provider_id="alpha", refusals=count,
            refused_at=None if ago is None else NOW - ago,
        )  # fmt: skip
    client.force_login(oncall)
    alpha = card(client.get(reverse("providers")).content.decode(), "alpha")
    freezes = alpha[alpha.index('<ul class="freezes">') :]
    freezes = freezes[: freezes.index("</ul>")]
    shown = re.findall(r'<span class="state (\w+)">.*?\((T\d\d);', freezes, re.S)
    assert [state for state, _title in shown] == ["frozen"] * 4 + ["cooling"] * 6
    # The unknown time first, then 1 h, 3 h, 5 h ago; then the cooling ones newest first.
    assert [title for _state, title in shown] == [
        "T00", "T02", "T03", "T01", "T04", "T05", "T06", "T07", "T08", "T09",
    ]  # fmt: skip
    assert "and 3 more open segments" in alpha  # 13 in trouble, 10 shown
