"""R6.6: who may run a stage, and which stages the watchdog sends again (pure)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from governance.rules.claims import (
    ClaimFacts,
    ClaimVerdict,
    HolderId,
    LostProcess,
    OpenStageFacts,
    Resend,
    claim_verdict,
    held_by_lost_process,
    holds_live,
    may_probe_process,
    message_expected,
    needs_resend,
    parse_holder,
    resend_ahead,
    resend_delay,
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
    assert needs_resend(stage(holder=HOLDER, lease_until=PAST), NOW, resend_after=AFTER) is (
        Resend.HOLDER_STOPPED
    )
    assert needs_resend(stage(holder=HOLDER, lease_until=LIVE), NOW, resend_after=AFTER) is None
    assert holds_live(stage(holder=HOLDER, lease_until=LIVE), NOW)
    assert not holds_live(stage(holder=HOLDER, lease_until=PAST), NOW)
    # Never claimed: sent again only once it has waited longer than a queue should.
    assert needs_resend(stage(), NOW, resend_after=AFTER) is Resend.NEVER_CLAIMED
    fresh = stage(enqueued_at=NOW - timedelta(seconds=30))
    assert needs_resend(fresh, NOW, resend_after=AFTER) is None


def test_r6_6_a_holder_known_gone_is_sent_again_at_once_not_when_its_lease_ends():
    """The holder's process is gone (this host's OS says so): its lease still
    runs for up to a lease, but nobody renews it; sent again now, ahead."""
    gone = stage(holder=HOLDER, lease_until=LIVE, holder_gone=True)
    assert needs_resend(gone, NOW, resend_after=AFTER) is Resend.HOLDER_STOPPED
    assert resend_ahead(Resend.HOLDER_STOPPED)
    assert not holds_live(gone, NOW)  # the watchdog may decide its run's clocks


def test_r6_6_a_broker_that_lost_its_messages_has_its_stages_sent_again_at_once():
    """After a loss (the broker back empty or flushed, or a worker reconnected),
    a stage that should have a message and has none in the broker goes again
    now — not after the last-resort timer — ahead of new work."""
    just_queued = stage(enqueued_at=NOW - timedelta(seconds=3))
    lost = replace(just_queued, in_broker=False)
    assert needs_resend(lost, NOW, resend_after=AFTER, broker_lost=True) is Resend.MESSAGE_LOST
    assert resend_ahead(Resend.MESSAGE_LOST)
    # Still in the broker: it waits its turn; no second message.
    kept = replace(just_queued, in_broker=True)
    assert needs_resend(kept, NOW, resend_after=AFTER, broker_lost=True) is None
    # Nobody could look: the loss alone says nothing about this stage.
    assert needs_resend(just_queued, NOW, resend_after=AFTER, broker_lost=True) is None
    # A woken turn's message was on its way: lost with the rest.
    woken = replace(lost, lease_until=LIVE)
    assert needs_resend(woken, NOW, resend_after=AFTER, broker_lost=True) is Resend.MESSAGE_LOST
    # A held stage or a parked turn has no message in the broker by design.
    held = stage(holder=HOLDER, lease_until=LIVE)
    parked = stage(parked_at=NOW - timedelta(seconds=3), thread_turn_in_flight=True)
    assert not message_expected(held) and not message_expected(parked)
    assert message_expected(just_queued) and message_expected(woken)
    assert needs_resend(held, NOW, resend_after=AFTER, broker_lost=True) is None
    assert needs_resend(parked, NOW, resend_after=AFTER, broker_lost=True) is None


def test_r6_6_the_last_resort_timer_does_not_duplicate_a_backlog():
    """Unclaimed longer than ``resend_after``: when the broker is seen holding its
    message it is only waiting in a backlog (nothing sent); seen without it, it
    was lost (ahead); when nobody could look, it goes again behind new work."""
    old = stage()
    assert needs_resend(replace(old, in_broker=True), NOW, resend_after=AFTER) is None
    assert needs_resend(replace(old, in_broker=False), NOW, resend_after=AFTER) is (
        Resend.MESSAGE_LOST
    )
    assert needs_resend(old, NOW, resend_after=AFTER) is Resend.NEVER_CLAIMED
    assert not resend_ahead(Resend.NEVER_CLAIMED)


def test_r6_6_a_delayed_stage_is_timed_from_when_it_was_due_and_keeps_its_delay():
    """A recovery wait or a verification delay: the timer counts from when the
    stage was due, and a lost delayed message is sent again with what is left
    of its delay, never early."""
    waiting = stage(enqueued_at=NOW - timedelta(minutes=5), due_at=NOW + timedelta(seconds=40))
    assert needs_resend(waiting, NOW, resend_after=AFTER) is None
    assert resend_delay(waiting, NOW) == 40.0
    lost = replace(waiting, in_broker=False)
    assert needs_resend(lost, NOW, resend_after=AFTER, broker_lost=True) is Resend.MESSAGE_LOST
    later = NOW + timedelta(seconds=40) + AFTER
    assert needs_resend(waiting, later, resend_after=AFTER) is Resend.NEVER_CLAIMED
    assert resend_delay(waiting, later) == 0.0
    assert resend_delay(stage(), NOW) == 0.0


def test_r6_6_a_process_its_parent_saw_die_is_gone_on_any_host():
    """The worker's parent saw its pool process die and says so in the message it
    sends again: a claim that process made before it died is taken over at once,
    wherever the delivery lands; a later claim by a new process with the same
    pid, another process, or another host's is not."""
    holder = parse_holder(HOLDER)
    claimed = NOW - timedelta(seconds=2)
    lost = LostProcess(holder.process, NOW)
    assert holder.process == "box/pid:[4026531836]/4242"
    assert held_by_lost_process(HOLDER, claimed, lost)
    assert not held_by_lost_process(HOLDER, NOW + timedelta(seconds=1), lost)  # pid reused
    assert not held_by_lost_process(HOLDER, None, lost)
    assert not held_by_lost_process("box/pid:[4026531836]/4243/ab12", claimed, lost)
    assert not held_by_lost_process("other/pid:[4026531836]/4242/ab12", claimed, lost)
    assert not held_by_lost_process("", claimed, lost)
    reported = ClaimFacts(finished=False, holder=HOLDER, lease_until=LIVE, holder_gone=True)
    assert claim_verdict(reported, NOW) is ClaimVerdict.TAKE_OVER


def test_r6_6_a_waiting_turn_is_resent_only_when_its_wake_up_was_lost():
    parked = NOW - timedelta(minutes=5)
    behind_a_live_turn = stage(parked_at=parked, thread_turn_in_flight=True)
    assert needs_resend(behind_a_live_turn, NOW, resend_after=AFTER) is None
    wake_lost = stage(parked_at=parked, thread_turn_in_flight=False)
    assert needs_resend(wake_lost, NOW, resend_after=AFTER) is Resend.WAKE_LOST
    assert resend_ahead(Resend.WAKE_LOST)
    just_parked = stage(parked_at=NOW - timedelta(seconds=5))
    assert needs_resend(just_parked, NOW, resend_after=AFTER) is None
    # Woken and on its way (a reservation): not sent twice.
    assert needs_resend(stage(lease_until=LIVE), NOW, resend_after=AFTER) is None
    assert needs_resend(stage(lease_until=PAST), NOW, resend_after=AFTER) is (Resend.NEVER_CLAIMED)


def test_r6_6_a_turn_is_in_flight_while_its_lease_runs():
    from datetime import UTC, datetime, timedelta

    from governance.rules.claims import turn_in_flight

    now = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert turn_in_flight(now + timedelta(seconds=1), now)
    assert not turn_in_flight(now, now) and not turn_in_flight(now - timedelta(seconds=1), now)
    assert not turn_in_flight(None, now)  # parked behind another turn, or never claimed
