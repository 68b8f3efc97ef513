"""R6.6: who may run a stage, and which stages the watchdog sends again (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from governance.rules.claims import (
    ClaimFacts,
    ClaimVerdict,
    HolderId,
    OpenStageFacts,
    claim_verdict,
    holds_live,
    may_probe_process,
    needs_resend,
    parse_holder,
    turn_may_start,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LIVE = NOW + timedelta(seconds=10)
PAST = NOW - timedelta(seconds=1)
HOLDER = "box/pid:[4026531836]/4242/ab12"


@pytest.mark.parametrize(
    ("facts", "verdict"),
    [
        (ClaimFacts(finished=True, holder=HOLDER, lease_until=LIVE), ClaimVerdict.DONE),
        (ClaimFacts(finished=False, holder="", lease_until=None), ClaimVerdict.TAKE),
        # A woken turn carries a reservation but no holder: its delivery takes it.
        (ClaimFacts(finished=False, holder="", lease_until=LIVE), ClaimVerdict.TAKE),
        (ClaimFacts(finished=False, holder=HOLDER, lease_until=LIVE), ClaimVerdict.HELD),
        (ClaimFacts(finished=False, holder=HOLDER, lease_until=NOW), ClaimVerdict.TAKE_OVER),
        (ClaimFacts(finished=False, holder=HOLDER, lease_until=PAST), ClaimVerdict.TAKE_OVER),
        (
            ClaimFacts(finished=False, holder=HOLDER, lease_until=LIVE, holder_gone=True),
            ClaimVerdict.TAKE_OVER,
        ),
    ],
)
def test_r6_6_claim_verdict(facts, verdict):
    assert claim_verdict(facts, NOW) is verdict


def test_r6_6_a_holder_is_named_by_host_namespace_pid_and_token():
    holder = parse_holder(HOLDER)
    assert holder == HolderId("box", "pid:[4026531836]", 4242, "ab12")
    assert str(holder) == HOLDER
    assert parse_holder("") is None and parse_holder("box/ns/notapid/t") is None
    # A pid means something only on the same host, in the same pid namespace.
    assert may_probe_process(holder, host="box", pid_namespace="pid:[4026531836]")
    assert not may_probe_process(holder, host="other", pid_namespace="pid:[4026531836]")
    assert not may_probe_process(holder, host="box", pid_namespace="pid:[4026532001]")


def test_r6_6_r1_1_one_turn_per_thread():
    assert turn_may_start(other_turn_in_flight=False)
    assert not turn_may_start(other_turn_in_flight=True)


def stage(**overrides) -> OpenStageFacts:
    base = dict(
        holder="", lease_until=None, enqueued_at=NOW - timedelta(minutes=10), parked_at=None,
        thread_turn_in_flight=False,
    )  # fmt: skip
    return OpenStageFacts(**{**base, **overrides})


AFTER = timedelta(minutes=2)


def test_r6_6_the_watchdog_resends_a_dead_holders_stage_and_a_lost_message():
    assert needs_resend(stage(holder=HOLDER, lease_until=PAST), NOW, resend_after=AFTER)
    assert not needs_resend(stage(holder=HOLDER, lease_until=LIVE), NOW, resend_after=AFTER)
    assert holds_live(stage(holder=HOLDER, lease_until=LIVE), NOW)
    assert not holds_live(stage(holder=HOLDER, lease_until=PAST), NOW)
    # Never claimed: sent again only once it has waited longer than a queue should.
    assert needs_resend(stage(), NOW, resend_after=AFTER)
    fresh = stage(enqueued_at=NOW - timedelta(seconds=30))
    assert not needs_resend(fresh, NOW, resend_after=AFTER)


def test_r6_6_a_waiting_turn_is_resent_only_when_its_wake_up_was_lost():
    parked = NOW - timedelta(minutes=5)
    behind_a_live_turn = stage(parked_at=parked, thread_turn_in_flight=True)
    assert not needs_resend(behind_a_live_turn, NOW, resend_after=AFTER)
    wake_lost = stage(parked_at=parked, thread_turn_in_flight=False)
    assert needs_resend(wake_lost, NOW, resend_after=AFTER)
    just_parked = stage(parked_at=NOW - timedelta(seconds=5))
    assert not needs_resend(just_parked, NOW, resend_after=AFTER)
    # Woken and on its way (a reservation): not sent twice.
    assert not needs_resend(stage(lease_until=LIVE), NOW, resend_after=AFTER)
    assert needs_resend(stage(lease_until=PAST), NOW, resend_after=AFTER)


def test_r6_6_a_turn_is_in_flight_while_its_lease_runs():
    from datetime import UTC, datetime, timedelta

    from governance.rules.claims import turn_in_flight

    now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert turn_in_flight(now + timedelta(seconds=1), now)
    assert not turn_in_flight(now, now) and not turn_in_flight(now - timedelta(seconds=1), now)
    assert not turn_in_flight(None, now)  # parked behind another turn, or never claimed
