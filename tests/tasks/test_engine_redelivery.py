"""At-least-once delivery: nothing here may assume a stage runs exactly once."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from governance import services
from governance.models import BudgetEntry, ProviderAttempt, Stage, Thread
from governance.services.broker import lane_keys
from tasks.stages import run_stage
from tests.tasks.conftest import sent_stages

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42."}}}


@pytest.fixture
def queued(manual_clock, scripted_provider):
    scripted_provider("p", ANSWER)
    thread = services.create_thread(provider_chain=["p"], now=manual_clock())
    run, stage, _ = services.submit_run(
        Thread.objects.get(id=thread.id), input="Hello", now=manual_clock()
    )
    return run, stage


def test_r6_5_a_finished_stage_is_not_executed_again(queued):
    run, stage = queued
    assert run_stage(stage.id) == "accepted"
    attempts = ProviderAttempt.objects.filter(run=run).count()
    assert run_stage(stage.id) == "already handled"  # the broker redelivered it
    assert ProviderAttempt.objects.filter(run=run).count() == attempts == 1
    assert Stage.objects.get(id=stage.id).deliveries == 1


def test_r6_6_a_stage_held_by_a_live_worker_is_not_taken_twice(queued, manual_clock):
    _run, stage = queued
    lease = timedelta(seconds=30)
    held = services.claim_stage(stage.id, manual_clock(), lease=lease)
    assert held is not None and held.holder.split("/")[2] == str(os.getpid())
    # A duplicate message arrives while the first worker still holds the stage.
    assert services.claim_stage(stage.id, manual_clock(), lease=lease) is None
    assert run_stage(stage.id) == "already handled"
    # Its heartbeat keeps it: well past one lease from the claim, still held.
    for _ in range(3):
        manual_clock.advance(seconds=20)
        assert services.renew_leases([held.holder], manual_clock()) == {held.holder}
    assert run_stage(stage.id) == "already handled"
    row = Stage.objects.get(id=stage.id)
    assert row.deliveries == 1 and row.holder == held.holder and row.finished_at is None


def test_r5_3_a_stage_whose_holder_stopped_renewing_is_taken_over_and_draws_again(
    queued, manual_clock
):
    """R5.3: the retry draws from the same balance; the dead holder's use stays
    on the ledger, marked as having no known outcome."""
    run, stage = queued
    held = services.claim_stage(stage.id, manual_clock(), lease=timedelta(seconds=30))
    # The first worker admitted its request, then stopped before recording anything.
    services.admit(
        run, "model_requests", 1, f"stage{held.id}.1:p:original:1", now=manual_clock(), stage=held
    )
    manual_clock.advance(seconds=29)
    assert run_stage(stage.id) == "already handled"  # the lease still runs
    manual_clock.advance(seconds=2)
    assert run_stage(stage.id) == "accepted"
    refreshed = Stage.objects.get(id=stage.id)
    assert refreshed.deliveries == 2 and refreshed.holder != held.holder
    entries = list(BudgetEntry.objects.filter(account__run=run).order_by("id"))
    assert [(e.idempotency_key, e.outcome) for e in entries] == [
        (f"stage{stage.id}.1:p:original:1", "unknown"),
        (f"stage{stage.id}.2:p:original:1", ""),
    ]
    assert services.budget_view(run)["model_requests"].used == 2
    assert ProviderAttempt.objects.filter(run=run).count() == 1


def test_r6_6_a_holder_whose_process_is_gone_is_taken_over_at_once(queued, manual_clock):
    """The redelivery after a SIGKILL finds the lease still running; the holder's
    process is gone (same host, same pid namespace, no such pid): taken over now."""
    _run, stage = queued
    held = services.claim_stage(stage.id, manual_clock(), lease=timedelta(seconds=30))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host, namespace, _pid, token = held.holder.split("/")
    Stage.objects.filter(id=stage.id).update(holder=f"{host}/{namespace}/{gone.pid}/{token}")
    assert run_stage(stage.id) == "accepted"
    assert Stage.objects.get(id=stage.id).deliveries == 2
    # Another host's holder cannot be judged from here: its lease decides.
    assert not services.holder_gone(f"elsewhere/{namespace}/{gone.pid}/{token}")
    assert not services.holder_gone(f"{host}/pid:[1]/{gone.pid}/{token}")


def test_r3_2_r6_6_a_waiting_turn_is_woken_by_the_close_not_by_a_timer(
    queued, manual_clock, broker_queue
):
    """A second run's turn waits while the thread's first turn is in flight, so two
    runs can never both send a due re-probe (R3.2) or interleave history (R1.1).
    It waits without a message and the first turn's closing commit sends it."""
    run, stage = queued
    other, other_stage, _ = services.submit_run(
        Thread.objects.get(id=run.thread_id), input="Again", now=manual_clock()
    )
    third, third_stage, _ = services.submit_run(
        Thread.objects.get(id=run.thread_id), input="Third", now=manual_clock()
    )
    assert services.claim_stage(stage.id, manual_clock(), lease=timedelta(seconds=30))
    manual_clock.advance(seconds=1)
    assert run_stage(other_stage.id) == "waiting"
    assert run_stage(third_stage.id) == "waiting"
    parked = Stage.objects.get(id=other_stage.id)
    assert parked.holder == "" and parked.parked_at is not None and parked.finished_at is None
    assert ProviderAttempt.objects.filter(run__in=[other, third]).count() == 0
    assert sent_stages(broker_queue) == []  # nothing re-sent on a timer
    manual_clock.advance(seconds=30)  # the first holder stopped; a redelivery takes it over
    assert run_stage(stage.id) == "accepted"
    # Its close woke the oldest waiting turn, only that one, in the same commit.
    assert sent_stages(broker_queue) == [other_stage.id]
    woken = Stage.objects.get(id=other_stage.id)
    assert woken.parked_at is None and woken.lease_until > manual_clock()
    broker_queue.delete(*lane_keys("turns"))
    # A new run arriving now waits behind the woken turn that is on its way.
    _fourth, fourth_stage, _ = services.submit_run(
        Thread.objects.get(id=run.thread_id), input="Fourth", now=manual_clock()
    )
    assert run_stage(fourth_stage.id) == "waiting"
    assert run_stage(other_stage.id) == "accepted"
    assert sent_stages(broker_queue) == [third_stage.id]
    assert run_stage(third_stage.id) == "accepted"
    assert run_stage(fourth_stage.id) == "accepted"
    assert [
        Stage.objects.get(id=s.id).deliveries for s in (other_stage, third_stage, fourth_stage)
    ] == [2, 2, 2]


def test_r6_3_an_open_breaker_is_a_transient_failure_recovered_after_it_opens(queued, manual_clock):
    """Time repairs a breaker (R2.2): bounded recovery, not 'no provider eligible'."""
    from governance.models import Notification, Provider, ProviderHealthState, Run

    run, stage = queued
    ProviderHealthState.objects.create(
        provider=Provider.objects.get(provider_id="p"), breaker="open", consecutive_failures=3,
        trips=1, open_until=manual_clock() + timedelta(seconds=30),
        last_failure_class="server_error", last_failure_at=manual_clock(),
    )  # fmt: skip
    assert run_stage(stage.id) == "no_provider"
    row = Run.objects.get(id=run.id)
    assert row.status != "settled"
    assert [d["path"] for d in row.decisions] == ["bounded_recovery"]
    assert not Notification.objects.exists()  # nobody is paged for a breaker
    recovery = Stage.objects.get(run=run, seq=2)
    assert recovery.kind == "model_turn" and recovery.payload["recovery"] is True
    manual_clock.advance(seconds=31)  # the breaker half-opens: one probe goes out
    assert run_stage(recovery.id) == "accepted"
    row.refresh_from_db()
    assert row.settlement.outcome == "completed"


def test_r6_6_the_heartbeat_renews_what_this_process_holds_and_notices_a_takeover(
    queued, manual_clock
):
    from tasks.stages.heartbeat import Heartbeat

    _run, stage = queued
    lease = timedelta(seconds=30)
    held = services.claim_stage(stage.id, manual_clock(), lease=lease)
    beat = Heartbeat()
    with beat.holding(held.holder, held.id):
        manual_clock.advance(seconds=25)
        assert beat.beat() == {held.holder}
        assert Stage.objects.get(id=stage.id).lease_until == manual_clock() + lease
        # Another delivery took it over (this process's beats stalled past the lease).
        Stage.objects.filter(id=stage.id).update(holder="elsewhere/pid:[1]/7/abc")
        assert beat.beat() == set()
    assert beat.held() == [] and beat.beat() == set()
    assert Stage.objects.get(id=stage.id).holder == "elsewhere/pid:[1]/7/abc"
