"""The pure statistics of issue 12 (governance/rules/insights.py): Wilson
intervals, medians and the tier of each send (R3.1, R3.2, R3.8)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from governance.rules.insights import (
    CarriedRefusal,
    InsightError,
    SendFact,
    median_duration,
    reprobe_outcomes,
    tier_label,
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
