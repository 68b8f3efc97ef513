"""R6.7 backpressure at admission: the pure verdict."""

from __future__ import annotations

import pytest

from governance.rules.admission import MAX_RETRY_AFTER_S, admission_verdict


def verdict(depth=0, age=0.0, max_age=120, max_queued=5000):
    return admission_verdict(
        depth=depth, oldest_age_s=age, max_age_s=max_age, max_queued=max_queued
    )


def test_r6_7_a_quiet_queue_admits():
    assert verdict().admit and verdict(depth=5000, age=120).admit  # the bounds themselves hold


def test_r6_7_an_old_oldest_message_refuses_with_the_excess_as_retry_after():
    refused = verdict(depth=3, age=127.2)
    assert not refused.admit
    assert refused.retry_after_s == 8  # 7.2 s over the bound, rounded up
    assert "waited 127 s" in refused.reason and "120 s" in refused.reason
    assert verdict(depth=3, age=10_000).retry_after_s == MAX_RETRY_AFTER_S


def test_r6_7_a_long_queue_refuses():
    refused = verdict(depth=5001, age=3)
    assert not refused.admit and refused.retry_after_s >= 1
    assert "5,001 waiting stages" in refused.reason


@pytest.mark.parametrize(
    ("depth", "age", "max_age", "max_queued"),
    [(None, None, 120, 10), (10**6, None, 120, 0), (None, 10**6, 0, 10), (10**6, 10**6, 0, 0)],
)
def test_r6_7_a_bound_that_is_off_or_cannot_be_read_never_refuses(depth, age, max_age, max_queued):
    assert verdict(depth=depth, age=age, max_age=max_age, max_queued=max_queued).admit
