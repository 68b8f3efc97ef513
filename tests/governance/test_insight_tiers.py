"""Each provider attempt's Insights tier is decided once, by
``governance.rules.insights.tier_sends``, and kept on the attempt
(``governance.services.insight_tiers``); the Insights page sums what is kept
(R3.1, R3.2, R3.8). The hand-made timeline is tests/dashboard/test_insights.py's,
recorded through the real refusal protocol and recording service."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.queries import insights as q
from governance import services
from governance.models import ProviderAttempt, SegmentRefusal, Settlement, Stage, Thread
from governance.rules.insights import CarriedRefusal, SendFact, reprobe_outcomes, tier_sends
from governance.services import deliveries, insight_tiers
from tasks.jobs import tier_attempts
from tests.dashboard.test_insights import (
    A0,
    C0,
    DAY0,
    EXPECTED,
    MIN,
    NOW,
    api_client,
    check_rows,
    fixed_clock,  # noqa: F401 (autouse fixture)
    timeline,  # noqa: F401 (fixture)
    turn,
)
from tests.dashboard.test_report_views import RunSpec, make_run

pytestmark = pytest.mark.django_db

PERIOD = "/api/v1/insights/reprobes?since=2025-03-01T00:00:00Z&until=2025-03-09T00:00:00Z"
WHOLE = q.InsightsQuery(start=DAY0 - timedelta(days=1), end=NOW + timedelta(days=1))


def kept() -> dict[int, tuple]:
    """Every attempt's kept tier, by id: (tiered, tier, step, boundary kind, category,
    seconds since the latest refusal)."""
    return {
        row[0]: row[1:]
        for row in ProviderAttempt.objects.values_list(
            "id", "tiered", "insight_tier", "insight_step", "insight_boundary_kind",
            "insight_category", "insight_since_refusal_s",
        )
    }  # fmt: skip


def by_the_rule() -> dict[int, tuple]:
    """What the rule says of every recorded send — all of them, accepted originals
    too — with each closed segment's refusal state carried into the next (R3.8)."""
    sends = [
        SendFact(
            a.id,
            a.segment_id,
            a.stage_id,
            a.provider.provider_id,
            a.model,
            a.kind,
            a.started_at,
            a.result,
            a.refusal_category,
            a.latency_ms,
        )
        for a in ProviderAttempt.objects.select_related("provider")
    ]
    carried = [
        CarriedRefusal(
            r.segment.next_segment_id,
            r.provider_id,
            r.segment.closed_kind,
            r.refusals,
            r.refused_at,
            r.category,
        )
        for r in SegmentRefusal.objects.select_related("segment")
        if r.segment.next_segment_id is not None and (r.refusals is None or r.refusals > 0)
    ]
    expected = {a_id: (True, "", 0, "", "", None) for a_id in (s.attempt_id for s in sends)}
    for t in tier_sends(sends, carried):
        since = t.since_refusal.total_seconds() if t.since_refusal is not None else None
        expected[t.attempt_id] = (True, t.tier, t.step, t.boundary_kind, t.category, since)
    return expected


def test_the_kept_tiers_are_what_tier_sends_gives_on_the_hand_made_timeline(timeline):  # noqa: F811
    """R3.1–R3.3, R3.8: every attempt tiered once, as the rule tiers the whole timeline."""
    assert all(not row[0] for row in kept().values())  # recorded untiered
    assert insight_tiers.tier_pending() == ProviderAttempt.objects.count()
    assert kept() == by_the_rule()
    tiers = [row[1] for row in kept().values() if row[1]]
    assert sorted(tiers) == sorted(
        ["original"] * 4 + ["re_render"] * 3 + ["history_only"] + ["re_probe"] * 8
        + ["after_boundary"]
    )  # fmt: skip
    assert insight_tiers.tier_pending() == 0  # nothing pending: nothing tiered again
    # The kept tiers, counted, are the hand-computed numbers.
    _rows, totals = q.tier_outcomes(WHOLE)
    assert [r.sends for r in totals] == [e[0] for e in EXPECTED.values()]


def test_the_beat_task_tiers_what_is_pending(timeline):  # noqa: F811
    """R3.2: the beat's pass tiers every finished turn's sends, once."""
    assert tier_attempts() == ProviderAttempt.objects.count()
    assert ProviderAttempt.objects.filter(tiered=False).count() == 0
    assert tier_attempts() == 0


def test_r3_1_a_turn_still_running_is_not_tiered_until_its_stage_finishes(
    timeline,  # noqa: F811
    client,
    manager,
):
    """A refused send's tier, and what it means for the sends after it, is known once
    its turn is over: a running turn's sends wait, then count."""
    insight_tiers.tier_pending()
    d = Thread.objects.get(title="D")
    at = A0 + timedelta(days=4)
    assert turn(d, at, ["refused"], finish=False) == ["original"]
    running = ProviderAttempt.objects.filter(started_at__gte=at)
    assert running.count() == 2  # alpha refused, beta accepted
    assert insight_tiers.tier_pending() == 0
    assert not running.filter(tiered=True).exists()
    get = api_client(client, manager)
    totals = {r["label"]: r["sends"] for r in get(PERIOD).json()["totals"]}
    assert totals["original refused send"] == 4  # not counted yet
    stage = Stage.objects.get(run__thread=d, finished_at__isnull=True)
    services.finish_stage(stage, outcome="answered", now=at + timedelta(seconds=2))
    totals = {r["label"]: r["sends"] for r in get(PERIOD).json()["totals"]}  # tiers first
    assert totals["original refused send"] == 5
    assert not running.filter(tiered=False).exists()
    assert kept() == by_the_rule()


def test_r3_8_a_boundarys_first_send_gets_after_boundary(timeline):  # noqa: F811
    """C's alpha was frozen when the fresh start closed its segment: its first send in
    the new segment is the after-boundary tier, timed from the last refusal; the next
    one is in no tier. Beta was never refused: its first send is in no tier either."""
    c = Thread.objects.get(title="C")
    assert turn(c, C0 + 500 * MIN, ["accepted"]) == ["original"]
    insight_tiers.tier_pending()
    segment = services.open_segment(c)
    sends = ProviderAttempt.objects.filter(segment=segment).order_by("started_at", "id")
    rows = [
        (a.provider.provider_id, a.insight_tier, a.insight_boundary_kind, a.insight_since_refusal_s)
        for a in sends
    ]
    assert rows == [
        ("alpha", "after_boundary", "fresh_start", 45 * 60.0),  # +480 min, refused at +435
        ("alpha", "", "", None),
    ]
    assert sends.first().insight_category == "policy"


def test_the_pages_statements_do_not_grow_with_the_attempts(timeline, client, operator):  # noqa: F811
    """R3.2: the page sums kept tiers: three times the refusal timelines, the same statements
    (with the period's pending attempts — boundaries among them — tiered first, in one
    batch, and without)."""
    client.force_login(operator)
    url = "/insights/?from=2025-03-01&to=2025-03-12"

    def statements() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        return len(ctx.captured_queries)

    def more_timelines(day: int) -> None:
        for n in range(2):
            thread = services.create_thread(
                provider_chain=["alpha", "beta"], now=DAY0, title=f"more {day} {n}"
            )
            at = DAY0 + timedelta(days=day, hours=n)
            turn(thread, at, ["refused"])
            turn(thread, at + 15 * MIN, ["refused"])
            if n:  # a boundary while refused, as in the fixture's C (R3.8)
                services.apply_boundary(thread, "compact", by="t", reason="r", now=at + 20 * MIN)
            turn(thread, at + 75 * MIN, ["accepted"])

    pending_before = statements()  # the fixture's attempts tiered by the page
    tiered_before = statements()
    for day in (6, 7, 8):
        more_timelines(day)
    assert ProviderAttempt.objects.filter(tiered=False).count() >= 18
    assert statements() == pending_before
    assert statements() == tiered_before
    assert tiered_before < pending_before


def test_the_database_counts_what_the_rule_counts(timeline):  # noqa: F811
    """R3.2: on PostgreSQL the kept tiers are counted by one GROUP BY (the median by
    ordered-set aggregates); elsewhere the kept tiers are read and counted by the
    rule: the same rows either way."""
    insight_tiers.tier_pending()
    rows, totals = q.tier_outcomes(WHOLE)
    sends = q._kept_sends(WHOLE)
    assert rows == reprobe_outcomes(sends, by_provider=True)
    assert totals == reprobe_outcomes(sends, by_provider=False)
    check = [
        {
            "label": label,
            "sends": r.sends,
            "accepted": r.accepted,
            "refused": r.refused,
            "failed": r.failed,
            "acceptance_rate": r.rate,
            "interval": {"low": r.interval.low, "high": r.interval.high},
            "median_seconds_since_refusal": (
                r.median_since_refusal.total_seconds() if r.median_since_refusal else None
            ),
        }
        for label, r in zip(EXPECTED, totals, strict=True)
    ]
    check_rows(check)


def test_writing_a_tier_leaves_the_delivery_judgement_standing():
    """R7.4, migration 0016: a tier write changes nothing the delivery report reads, so it
    does not make the run's judgement stale (0015's trigger); any other write to the
    attempt still does."""
    run = make_run(RunSpec(attempts=(("alpha", "refused"), ("beta", "accepted"))))
    services.finish_stage(Stage.objects.get(run=run), outcome="answered", now=NOW)
    deliveries.judge_unjudged()

    def stale() -> bool:
        row = Settlement.objects.get(run=run)
        return row.judged_rev != row.delivery_rev

    assert not stale()
    assert insight_tiers.tier_pending() == 2
    assert ProviderAttempt.objects.filter(run=run, insight_tier="original").count() == 1
    assert not stale()
    attempt = ProviderAttempt.objects.filter(run=run).first()
    attempt.save()  # every column set, the tier's among them
    assert stale()
