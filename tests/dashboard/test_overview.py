"""The overview: state first (R8.1, R8.2), live without reloads, bounded queries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse

from governance import services, time_source
from governance.models import (
    Notification,
    Provider,
    ProviderHealthState,
    SegmentRefusal,
    Stage,
)
from governance.rules.refusal import ProviderRefusal, refusal_notice

pytestmark = pytest.mark.django_db


@pytest.fixture
def frozen_world():
    now = time_source.now()
    for pid in ("alpha", "beta"):
        Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-m")
    thread = services.create_thread(provider_chain=["alpha", "beta"], now=now)
    segment = services.open_segment(thread)
    SegmentRefusal.objects.create(
        segment=segment, provider_id="alpha", refusals=4, refused_at=now - timedelta(hours=1)
    )
    SegmentRefusal.objects.create(
        segment=segment, provider_id="beta", refusals=2, refused_at=now - timedelta(minutes=10)
    )
    notice = refusal_notice(
        segment.key, [ProviderRefusal("alpha", refusals=4, refused_at=now)], now
    )
    services.emit_notice(notice, segment)
    return segment, Notification.objects.get(dedupe_key=notice.dedupe_key)


def test_r8_2_the_incident_comes_first_with_one_click_ack_for_on_call(client, oncall, frozen_world):
    segment, alert = frozen_world
    client.force_login(oncall)
    body = client.get(reverse("overview")).content.decode()
    assert body.index("Incidents needing a person") < body.index("Segments with a frozen")
    assert '<span class="state critical">1</span>' in body
    assert reverse("incident-ack", args=[alert.incident_id]) in body
    assert f"Acknowledge incident #{alert.incident_id}</button>" in body
    assert reverse("segment", args=[segment.id]) in body
    # The count is in the tab title and the nav on every page.
    assert "<title>(1) Overview" in body
    assert 'id="nav-incidents" class="nav-count needing" data-needing="1"' in body


def test_r8_2_manager_sees_the_incident_but_no_acknowledge_button(client, manager, frozen_world):
    _segment, alert = frozen_world
    client.force_login(manager)
    body = client.get(reverse("overview")).content.decode()
    assert f"Incident #{alert.incident_id}" in body
    assert reverse("incident-ack", args=[alert.incident_id]) not in body


def test_r8_2_the_overview_says_plainly_when_nobody_is_paged(client, oncall, frozen_world):
    from governance.models import AlertChannel

    client.force_login(oncall)
    assert "nobody is paged" in client.get(reverse("overview")).content.decode()
    AlertChannel.objects.create(name="pager", kind="webhook", target="https://pager.example/h")
    assert "nobody is paged" not in client.get(reverse("overview")).content.decode()


def test_r8_1_frozen_and_cooling_providers_in_words_and_numbers(client, oncall, frozen_world):
    client.force_login(oncall)
    body = client.get(reverse("overview")).content.decode()
    assert '<span class="state frozen">frozen</span> since' in body
    assert '<span class="state cooling">cooling</span> until' in body
    assert "(refusals 2 of 4)" in body


def test_r8_2_acknowledged_or_resolved_incidents_leave_the_overview(
    client, oncall, operator, frozen_world
):
    segment, alert = frozen_world
    services.acknowledge_notification(alert.id, user=oncall, now=time_source.now())
    client.force_login(oncall)
    body = client.get(reverse("overview"), headers={"HX-Request": "true"}).content.decode()
    assert "Nothing needs a person" in body
    # A boundary resolves it: still nothing, and the incident says which boundary and who.
    services.apply_boundary(
        segment.thread, "fresh_start", by=operator.username, reason="drop it",
        now=time_source.now(),
    )  # fmt: skip
    body = client.get(reverse("overview")).content.decode()
    assert "Nothing needs a person" in body and "<title>Overview" in body
    alert.incident.refresh_from_db()
    assert alert.incident.state == "resolved"
    assert (alert.incident.resolved_how, alert.incident.resolved_by) == (
        "by a fresh start", operator.username,
    )  # fmt: skip


def test_r2_2_provider_board_shows_an_open_breaker(client, oncall, frozen_world):
    ProviderHealthState.objects.create(
        provider=Provider.objects.get(provider_id="alpha"),
        breaker="open",
        consecutive_failures=3,
        trips=1,
        open_until=time_source.now() + timedelta(minutes=5),
        last_failure_class="server_error",
        last_failure_at=time_source.now(),
        last_error="HTTP 503 overloaded",
    )
    client.force_login(oncall)
    body = client.get(reverse("overview")).content.decode()
    assert '<span class="state open">open</span>' in body
    assert "HTTP 503 overloaded" in body


def test_r6_1_clock_percentiles_per_stage_kind(client, oncall, frozen_world):
    segment, _ = frozen_world
    thread = segment.thread
    run, _stage, _ = services.submit_run(thread, input="hi", now=time_source.now())
    for i, queue in enumerate((100, 200, 300, 400, 50_000)):
        Stage.objects.create(
            run=run, seq=10 + i, kind="model_turn", enqueued_at=time_source.now(),
            finished_at=time_source.now(),
            clocks={"queue_ms": queue, "execution_ms": 20, "no_progress_ms": 5,
                    "deadline_remaining_ms": 1000},
        )  # fmt: skip
    client.force_login(oncall)
    body = client.get(reverse("overview")).content.decode()
    assert "model turn" in body
    assert "300 ms" in body  # p50 of the queue clock
    assert "50.0 s" in body  # p95 of the queue clock


def test_overview_query_count_is_bounded(
    client, oncall, frozen_world, django_assert_max_num_queries
):
    _segment, _ = frozen_world
    for _n in range(5):
        thread = services.create_thread(provider_chain=["alpha"], now=time_source.now())
        SegmentRefusal.objects.create(
            segment=services.open_segment(thread), provider_id="alpha", refusals=4,
            refused_at=time_source.now(),
        )  # fmt: skip
    client.force_login(oncall)
    with django_assert_max_num_queries(20):
        assert client.get(reverse("overview")).status_code == 200


def test_overview_with_an_empty_database_says_what_to_do(client, oncall):
    client.force_login(oncall)
    body = client.get(reverse("overview")).content.decode()
    assert "Nothing needs a person" in body
    assert "No providers configured yet" in body
    assert "No stage finished in the last hour" in body


def test_r3_2_the_overview_states_the_schedule_in_force(client, oncall, settings):
    """A rehearsal's schedule (GOVERNANCE_REFUSAL_REPROBE_DELAYS) is what the page
    states, with its own count of sends, not R3.2's default."""
    settings.GOVERNANCE_REFUSAL_REPROBE_DELAYS = (timedelta(minutes=1), timedelta(minutes=5))
    client.force_login(oncall)
    body = client.get(reverse("overview")).content.decode()
    assert "Re-probe delays: 1 min, 5 min — at most 3 sends per segment" in body
    assert "15 min" not in body


def test_r3_2_the_database_picks_the_segments_in_trouble_frozen_then_newest():
    """R3.2: the overview shows ten segments in trouble, frozen ones first and
    newest first, and counts the rest; a due re-probe (eligible) or a closed
    segment is no trouble. The choice is the database's, each card the rule's."""
    from dashboard.queries.overview import troubled_segments

    now = time_source.now().replace(microsecond=0)
    time_source.install(time_source.ManualClock(now))
    try:
        for pid in ("alpha", "beta"):
            Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-m")
        made = {}
        # (refusals of alpha, refused ago, closed?) per segment, opened a minute apart.
        shapes = [(4, 1, False)] * 4 + [(1, 1, False)] * 8 + [(1, 20, False), (4, 1, True)]
        for n, (count, minutes_ago, closed) in enumerate(shapes):
            thread = services.create_thread(provider_chain=["alpha", "beta"], now=now)
            segment = services.open_segment(thread)
            type(segment).objects.filter(id=segment.id).update(
                opened_at=now - timedelta(minutes=100 - n),
                closed_at=now if closed else None,
            )
            SegmentRefusal.objects.create(
                segment=segment, provider_id="alpha", refusals=count,
                refused_at=now - timedelta(minutes=minutes_ago),
            )  # fmt: skip
            made[segment.id] = (count, minutes_ago, closed, n)
        shown, total = troubled_segments(now, limit=10)
    finally:
        time_source.install(None)
    # 4 frozen and 8 cooling are in trouble; the due one (20 min) and the closed one are not.
    assert total == 12
    assert [t.worst for t in shown] == ["frozen"] * 4 + ["cooling"] * 6
    frozen_order = [made[t.segment.id][3] for t in shown[:4]]
    cooling_order = [made[t.segment.id][3] for t in shown[4:]]
    assert frozen_order == [3, 2, 1, 0]  # newest first
    assert cooling_order == [11, 10, 9, 8, 7, 6]
    assert all(p["provider_id"] == "alpha" for t in shown for p in t.providers)
