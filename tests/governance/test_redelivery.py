"""R7.3/R8.2: one answer for callbacks and alert channels (governance.rules.redelivery)."""

from __future__ import annotations

import pytest

from governance.rules.redelivery import (
    RetryPolicy,
    Verdict,
    after_attempt,
    attempt_verdict,
    may_attempt,
    retry_delay_s,
    smtp_recipients_verdict,
    smtp_reply_verdict,
)

POLICY = RetryPolicy(base_s=10, cap_s=3600, max_attempts=4, retry_after_cap_s=86400)


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_r7_3_r8_2_2xx_is_delivered(status):
    assert attempt_verdict(status) is Verdict.DELIVERED


@pytest.mark.parametrize("status", [408, 425, 429, 500, 502, 503, 504, 599, None])
def test_r7_3_r8_2_not_now_statuses_and_no_answer_retry(status):
    assert attempt_verdict(status) is Verdict.RETRY


@pytest.mark.parametrize("status", [100, 301, 302, 400, 401, 403, 404, 410, 413, 422])
def test_r7_3_r8_2_other_statuses_are_permanent(status):
    assert attempt_verdict(status) is Verdict.FAILED


def test_r7_3_r8_2_a_refused_target_or_bad_configuration_fails_whatever_the_status():
    for status in (None, 200, 503):
        assert attempt_verdict(status, permanent=True) is Verdict.FAILED


def test_r7_3_r8_2_smtp_4yz_is_transient_and_5yz_permanent():
    assert smtp_reply_verdict(421) is Verdict.RETRY
    assert smtp_reply_verdict(451) is Verdict.RETRY
    assert smtp_reply_verdict(550) is Verdict.FAILED
    assert smtp_reply_verdict(554) is Verdict.FAILED


def test_r7_3_r8_2_backoff_doubles_from_the_base_and_stops_at_the_cap():
    assert [retry_delay_s(n, None, POLICY) for n in (1, 2, 3, 4)] == [10, 20, 40, 80]
    assert retry_delay_s(20, None, POLICY) == 3600
    assert retry_delay_s(10_000, None, POLICY) == 3600  # no overflow for a huge count


def test_r7_3_r8_2_retry_after_is_a_floor_honoured_up_to_its_own_cap():
    assert retry_delay_s(1, 120, POLICY) == 120  # later than the backoff: honoured
    assert retry_delay_s(4, 1, POLICY) == 80  # sooner than the backoff: the backoff stands
    assert retry_delay_s(1, 7200, POLICY) == 7200  # beyond the backoff's cap, within its own
    assert retry_delay_s(1, 10**9, POLICY) == 86400
    assert retry_delay_s(1, -5, POLICY) == 10  # a negative wait is no wait
    alerts = RetryPolicy(base_s=30, cap_s=3600, max_attempts=12, retry_after_cap_s=3600)
    assert retry_delay_s(1, 7200, alerts) == 3600


def test_r7_3_r8_2_after_attempt_retries_until_the_attempts_are_used_then_gives_up():
    step = after_attempt(Verdict.RETRY, 1, None, POLICY)
    assert step == after_attempt("retry", 1, None, POLICY)
    assert step.state is Verdict.RETRY and step.retry_in_s == 10 and not step.gave_up
    assert after_attempt(Verdict.RETRY, 3, 500, POLICY).retry_in_s == 500
    last = after_attempt(Verdict.RETRY, 4, None, POLICY)
    assert last.state is Verdict.FAILED and last.gave_up and last.retry_in_s is None


def test_r7_3_r8_2_after_attempt_delivered_and_failed_are_final_and_not_a_give_up():
    assert after_attempt(Verdict.DELIVERED, 4, None, POLICY).state is Verdict.DELIVERED
    failed = after_attempt(Verdict.FAILED, 1, None, POLICY)
    assert failed.state is Verdict.FAILED and not failed.gave_up


@pytest.mark.parametrize(
    "fields",
    [
        {"base_s": 0, "cap_s": 10, "max_attempts": 1, "retry_after_cap_s": 0},
        {"base_s": 1, "cap_s": 0, "max_attempts": 1, "retry_after_cap_s": 0},
        {"base_s": 1, "cap_s": 10, "max_attempts": 0, "retry_after_cap_s": 0},
        {"base_s": 1, "cap_s": 10, "max_attempts": 1, "retry_after_cap_s": -1},
    ],
)
def test_r7_3_r8_2_a_policy_that_cannot_work_is_refused(fields):
    with pytest.raises(ValueError):
        RetryPolicy(**fields)


def test_r8_2_smtp_all_recipients_refused_is_permanent_once_one_code_is_5yz():
    assert smtp_recipients_verdict([450, 451]) is Verdict.RETRY
    assert smtp_recipients_verdict([450, 550]) is Verdict.FAILED
    assert smtp_recipients_verdict([]) is Verdict.FAILED  # refused with nothing to read


def test_r7_3_r8_2_an_attempt_may_go_while_attempts_are_left():
    assert may_attempt(0, POLICY) and may_attempt(3, POLICY)
    assert not may_attempt(4, POLICY) and not may_attempt(5, POLICY)
