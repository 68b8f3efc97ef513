"""The pure statistics of the Insights page (governance/rules/insights.py): Wilson
intervals, medians and the tier of each send (R3.1, R3.2, R3.8)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from governance.rules.insights import (
    CarriedRefusal,
    InsightError,
    SendFact,
    TierCount,
    median_duration,
    reprobe_outcomes,
    tier_label,
    tier_rows,
    tier_sends,
    wilson_interval,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
END = T0 + timedelta(days=1)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [(0, 10, 0.0, 0.2775), (5, 10, 0.2366, 0.7634), (10, 10, 0.7225, 1.0), (1, 4, 0.0456, 0.6994)],
)
def test_wilson_interval_matches_hand_computed_values(k, n, low, high):
    """R3.2: wilson interval matches hand computed values."""
    interval = wilson_interval(k, n)
    assert interval.low == pytest.approx(low, abs=1e-4)
    assert interval.high == pytest.approx(high, abs=1e-4)


def test_wilson_interval_of_nothing_is_none_and_bad_counts_raise():
    """R3.2: wilson interval of nothing is none and bad counts raise."""
    assert wilson_interval(0, 0) is None
    for k, n in ((3, 2), (-1, 2), (True, 2)):
        with pytest.raises(InsightError):
            wilson_interval(k, n)


def test_median_duration():
    """R3.2: median duration."""
    assert median_duration([]) is None
    minutes = [timedelta(minutes=m) for m in (1, 3, 10, 20)]
    assert median_duration(minutes) == timedelta(minutes=6.5)
    assert median_duration(minutes[:3]) == timedelta(minutes=3)


def send(n, kind, result, at, stage=None, segment=1):
    return SendFact(
        n, segment, stage or n, "p", "m", kind, at, result, "policy" if result == "refused" else ""
    )


def test_r3_2_a_failed_re_probe_does_not_number_the_next_one():
    """A time-based failure records no refusal: the next re-probe is the same step."""
    sends = [
        send(1, "original", "refused", T0),
        send(2, "re_probe", "failed", T0 + timedelta(minutes=15)),
        send(3, "re_probe", "refused", T0 + timedelta(minutes=16)),
        send(4, "re_probe", "refused", T0 + timedelta(minutes=80)),
    ]
    steps = [(t.tier, t.step) for t in tier_sends(sends, start=T0, end=END)]
    assert steps == [("original", 0), ("re_probe", 1), ("re_probe", 1), ("re_probe", 2)]


def test_r3_1_a_refused_original_followed_by_a_re_render_is_not_a_segment_refusal():
    sends = [
        send(1, "original", "refused", T0, stage=1),
        send(2, "re_render", "accepted", T0 + timedelta(seconds=1), stage=1),
        send(3, "original", "refused", T0 + timedelta(minutes=5), stage=2),
        send(4, "re_probe", "accepted", T0 + timedelta(minutes=20), stage=3),
    ]
    tiered = tier_sends(sends, start=T0, end=END)
    assert [(t.tier, t.step) for t in tiered] == [
        ("original", 0), ("re_render", 0), ("original", 0), ("re_probe", 1),
    ]  # fmt: skip
    assert tiered[2].since_refusal == timedelta(minutes=5)  # since the first refused send


def test_r3_8_the_first_send_after_a_boundary_carries_the_old_state():
    carried = [CarriedRefusal(2, "p", "compact", None, None, "policy")]  # a legacy row
    sends = [
        send(1, "original", "accepted", T0 + timedelta(hours=1), segment=2),
        send(2, "original", "refused", T0 + timedelta(hours=2), segment=2),
    ]
    tiered = tier_sends(sends, carried, start=T0, end=END)
    assert [(t.tier, t.boundary_kind, t.since_refusal) for t in tiered] == [
        ("after_boundary", "compact", None),
        ("original", "", None),
    ]
    rows = reprobe_outcomes(tiered, by_provider=False)
    assert [(r.tier, r.sends, r.rate) for r in rows] == [
        ("original", 1, 0.0),
        ("after_boundary", 1, 1.0),
    ]
    assert tier_label("after_boundary", 0, "fresh_start") == "first send after fresh start"


def test_sends_outside_the_period_are_not_counted_but_still_number_the_tiers():
    """R3.2: sends outside the period are not counted but still number the tiers."""
    sends = [
        send(1, "original", "refused", T0 - timedelta(hours=1)),
        send(2, "re_probe", "refused", T0),
    ]
    assert [(t.tier, t.step) for t in tier_sends(sends, start=T0, end=END)] == [("re_probe", 1)]
    with pytest.raises(InsightError):
        tier_sends(sends, start=END, end=T0)


def test_r3_2_without_a_period_every_send_is_tiered_and_named_by_its_attempt():
    """What is kept on each attempt (services.insight_tiers): the tiers of every send
    given, whatever the period, each naming its attempt."""
    sends = [
        send(1, "original", "refused", T0 - timedelta(days=400)),
        send(2, "re_probe", "refused", T0 - timedelta(days=399)),
        send(3, "re_probe", "accepted", T0 + timedelta(days=400)),
    ]
    tiered = tier_sends(sends)
    assert [(t.attempt_id, t.tier, t.step) for t in tiered] == [
        (1, "original", 0), (2, "re_probe", 1), (3, "re_probe", 2),
    ]  # fmt: skip
    assert tier_sends(sends, start=T0, end=END) == []
    assert tier_sends(sends, start=T0) == tiered[2:]


def test_r3_2_rows_from_counts_are_the_rows_of_the_sends_counted():
    """The page counts kept tiers in the database; ``tier_rows`` gives those counts
    the same rates, Wilson intervals and order as ``reprobe_outcomes`` gives sends."""
    sends = [
        send(1, "original", "refused", T0),
        send(2, "re_probe", "failed", T0 + timedelta(minutes=15)),
        send(3, "re_probe", "refused", T0 + timedelta(minutes=16)),
        send(4, "re_probe", "accepted", T0 + timedelta(minutes=80)),
    ]
    tiered = tier_sends(sends)
    counted = tier_rows(
        [
            TierCount("re_probe", 2, "", "p", "m", "policy", 1, 1, 0, timedelta(minutes=64), 1),
            TierCount("re_probe", 1, "", "p", "m", "policy", 2, 0, 1, timedelta(minutes=15.5), 2),
            TierCount("original", 0, "", "p", "m", "policy", 1, 0, 1, None, 0),
        ]
    )
    assert counted == reprobe_outcomes(tiered)
    assert [(r.tier, r.step, r.failed, r.rate) for r in counted] == [
        ("original", 0, 0, 0.0), ("re_probe", 1, 1, 0.0), ("re_probe", 2, 0, 1.0),
    ]  # fmt: skip
    assert counted[2].interval == wilson_interval(1, 1)


# --------------------------------------------------------------------------- what if (R3.2)

from governance.rules.insights import (  # noqa: E402
    RefusalTimeline,
    flip_rates,
    refusal_timelines,
    replay_schedule,
    what_if,
)

MIN = timedelta(minutes=1)
R32 = (15 * MIN, 60 * MIN, 360 * MIN)
SEG_A, SEG_B, SEG_C = 1, 2, 3
A0, B0, C0 = T0, T0 + timedelta(hours=10), T0 + timedelta(hours=12)


def _hand_made():
    """Three timelines by hand (relative minutes; every answer at its send):
    A: quarantine refused (segment refusal at +3 s), re-probes at 15 and 75 min
       refused, the one at 435 min accepted;
    B: original refused at once (no increment); re-probe at 15 min times out,
       the one at 20 min is accepted;
    C: refused; re-probes at 15, 75 and 435 min refused: frozen; one more turn at
       460 min sends only to the backup (its fallback card is a turn too).
    """
    s = timedelta(seconds=1)
    a = A0 + 3 * s
    sends = [
        SendFact(1, SEG_A, 10, "p", "m", "original", A0, "refused", "policy"),
        SendFact(2, SEG_A, 10, "p", "m", "re_render", A0 + s, "refused", "policy"),
        SendFact(3, SEG_A, 10, "p", "m", "re_render", A0 + 2 * s, "refused", "policy"),
        SendFact(4, SEG_A, 10, "p", "m", "history_only", a, "refused", "policy"),
        SendFact(5, SEG_A, 11, "p", "m", "re_probe", a + 15 * MIN, "refused", "policy"),
        SendFact(6, SEG_A, 12, "p", "m", "re_probe", a + 75 * MIN, "refused", "policy"),
        SendFact(7, SEG_A, 13, "p", "m", "re_probe", a + 435 * MIN, "accepted"),
        SendFact(8, SEG_B, 20, "p", "m", "original", B0, "refused", "policy"),
        SendFact(9, SEG_B, 21, "p", "m", "re_probe", B0 + 15 * MIN, "failed"),
        SendFact(10, SEG_B, 22, "p", "m", "re_probe", B0 + 20 * MIN, "accepted"),
        SendFact(11, SEG_C, 30, "p", "m", "original", C0, "refused", "policy"),
        SendFact(12, SEG_C, 31, "p", "m", "re_probe", C0 + 15 * MIN, "refused", "policy"),
        SendFact(13, SEG_C, 32, "p", "m", "re_probe", C0 + 75 * MIN, "refused", "policy"),
        SendFact(14, SEG_C, 33, "p", "m", "re_probe", C0 + 435 * MIN, "refused", "policy"),
    ]
    turns = {
        SEG_A: [A0, *(a + m * MIN for m in (15, 75, 435))],
        SEG_B: [B0, B0 + 15 * MIN, B0 + 20 * MIN],
        SEG_C: [C0, *(C0 + m * MIN for m in (15, 75, 435, 460))],
    }
    return sends, turns


def _timelines():
    sends, turns = _hand_made()
    return sends, refusal_timelines(
        sends, turns, start=T0, end=END, delays=lambda segment, provider: R32
    )


def test_r3_2_timelines_open_at_the_segment_refusal_and_count_what_was_recorded():
    _sends, (a, b, c) = _timelines()
    assert a.refused_at == A0 + timedelta(seconds=3) and a.opening_sends == 4
    assert a.turns == tuple(a.refused_at + m * MIN for m in (15, 75, 435))  # not the opening
    assert (a.reprobes, a.refused_reprobes, a.accepted, a.frozen) == (3, 2, True, False)
    assert (b.refused_at, b.opening_sends) == (B0, 1)
    assert (b.reprobes, b.refused_reprobes, b.accepted, b.frozen) == (2, 0, True, False)
    assert (c.reprobes, c.refused_reprobes, c.accepted, c.frozen) == (3, 3, False, True)
    assert len(c.turns) == 4 and c.delays == R32


def test_r3_2_flip_rates_per_re_probe_with_their_samples_and_borrowing():
    sends, _turns = _hand_made()
    tiered = tier_sends(sends, start=T0, end=END)
    # re-probe 1: A refused, B failed (no answer), B accepted, C refused → 1 of 3
    # re-probe 2: A refused, C refused → 0 of 2; re-probe 3: A accepted, C refused → 1 of 2
    rates = flip_rates(tiered, 5)
    assert [(r.step, r.accepted, r.answered, r.source_step) for r in rates] == [
        (1, 1, 3, 1), (2, 0, 2, 2), (3, 1, 2, 3), (4, 1, 2, 3), (5, 1, 2, 3),
    ]  # fmt: skip
    assert rates[0].rate == pytest.approx(1 / 3)
    nothing = flip_rates([], 2)
    assert [(r.rate, r.answered, r.source_step) for r in nothing] == [(0.0, 0, None)] * 2
    with pytest.raises(InsightError):
        flip_rates([], 0)


def test_r3_2_what_if_replays_the_hand_made_timelines_under_both_schedules():
    """Numbers by hand, with p1 = 1/3, p2 = 0, p3 = 1/2:

    As run (15 min, 1 h, 6 h): A and C re-probe at 15, 75, 435 min — sends
    1 + 2/3 + 2/3, answers 1/3 + 0 + 2/3·1/2 = 2/3, frozen with chance 1/3 at
    435 min; B re-probes at 15 min only (its next turn, 20 min, is before 75):
    sends 1, answers 1/3. Total sends 17/3, answers 5/3, frozen 2/3.

    Proposed (10 min, 30 min): A and C re-probe at 15 (first turn ≥ 10) and 75
    min (first turn ≥ 45): sends 5/3, answers 1/3, frozen with chance 2/3 at 75
    min; B at 15 min only: sends 1, answers 1/3. Total sends 13/3, answers 1,
    frozen 4/3.
    """
    sends, timelines = _timelines()
    tiered = tier_sends(sends, start=T0, end=END)
    result = what_if(timelines, (10 * MIN, 30 * MIN), tiered, now=END)
    current, proposed = result.current, result.proposed
    assert current.delays is None and proposed.delays == (10 * MIN, 30 * MIN)
    assert current.reprobe_sends == pytest.approx(17 / 3)
    assert current.answers == pytest.approx(5 / 3)
    assert current.frozen == pytest.approx(2 / 3) and current.could_freeze == 2
    assert current.median_to_freeze == 435 * MIN
    assert proposed.reprobe_sends == pytest.approx(13 / 3)
    assert proposed.answers == pytest.approx(1.0)
    assert proposed.frozen == pytest.approx(4 / 3) and proposed.could_freeze == 2
    assert proposed.median_to_freeze == 75 * MIN
    assert result.answers_gained == pytest.approx(-2 / 3)
    assert result.extra_sends == pytest.approx(-4 / 3)
    assert (result.timelines, result.opening_sends) == (3, 6)
    assert (result.recorded_reprobes, result.recorded_accepted, result.recorded_frozen) == (8, 2, 1)
    a, b, c = proposed.replays
    assert a.reprobe_times == (a.refused_at + 15 * MIN, a.refused_at + 75 * MIN)
    assert a.frozen_at == a.refused_at + 75 * MIN and a.frozen_chance == pytest.approx(2 / 3)
    assert b.reprobe_times == (B0 + 15 * MIN,) and b.frozen_at is None and b.frozen_chance == 0
    assert c.frozen_at == C0 + 75 * MIN


def test_r3_2_the_replay_sees_no_turn_after_now():
    """Time is an argument: at C0 + 100 min, C's 435 min turn has not happened."""
    sends, timelines = _timelines()
    rates = flip_rates(tier_sends(sends, start=T0, end=END), 3)
    replay = replay_schedule([timelines[2]], None, rates, now=C0 + 100 * MIN)
    [c] = replay.replays
    assert c.reprobe_times == (C0 + 15 * MIN, C0 + 75 * MIN) and c.frozen_at is None
    assert replay.reprobe_sends == pytest.approx(1 + 2 / 3) and replay.could_freeze == 0


def test_r3_2_a_timeline_opened_outside_the_period_is_not_replayed():
    sends, turns = _hand_made()
    later = refusal_timelines(sends, turns, start=B0, end=END, delays=lambda segment, provider: R32)
    assert [t.segment_id for t in later] == [SEG_B, SEG_C]
    with pytest.raises(InsightError):
        refusal_timelines(sends, turns, start=END, end=T0, delays=lambda s, p: R32)


def test_r3_2_each_timeline_is_replayed_under_its_own_schedule_as_run():
    one = RefusalTimeline(
        segment_id=9, provider_id="p", refused_at=T0,
        turns=tuple(T0 + m * MIN for m in (5, 30, 200)), delays=(5 * MIN,),
        opening_sends=1, reprobes=1, refused_reprobes=1, accepted=False,
    )  # fmt: skip
    rates = flip_rates([], 2)
    replay = replay_schedule([one], None, rates, now=END)
    assert replay.replays[0].reprobe_times == (T0 + 5 * MIN,)
    assert replay.replays[0].frozen_at == T0 + 5 * MIN and replay.frozen == 1.0
    with pytest.raises(InsightError):
        replay_schedule([one], (MIN, 2 * MIN, 3 * MIN), rates, now=END)  # rates for 2 only
