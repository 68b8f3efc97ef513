"""At-least-once delivery: nothing here may assume a stage runs exactly once."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance import services
from governance.models import BudgetEntry, ProviderAttempt, Stage, Thread
from tasks.stages import run_stage

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


def test_r6_5_a_stage_held_by_a_live_worker_is_not_taken_twice(queued, manual_clock):
    _run, stage = queued
    lease = timedelta(minutes=10)
    assert services.claim_stage(stage.id, manual_clock(), lease=lease) is not None
    # A duplicate message arrives while the first worker still holds the stage.
    assert services.claim_stage(stage.id, manual_clock(), lease=lease) is None


def test_r5_4_a_stage_whose_worker_died_runs_again_without_new_quota(queued, manual_clock):
    run, stage = queued
    lease = timedelta(minutes=10)
    held = services.claim_stage(stage.id, manual_clock(), lease=lease)
    # The first worker admitted its request, then died before recording anything.
    services.admit(run, "model_requests", 1, f"stage{held.id}:p:original:1", now=manual_clock())
    manual_clock.advance(minutes=11)
    assert run_stage(stage.id) == "accepted"
    refreshed = Stage.objects.get(id=stage.id)
    assert refreshed.deliveries == 2
    # Same stage, same idempotency key: the retry drew nothing new (R5.3, R5.4).
    assert BudgetEntry.objects.filter(account__run=run).count() == 1
    assert services.budget_view(run)["model_requests"].used == 1


def test_r3_2_one_model_turn_at_a_time_per_thread(queued, manual_clock):
    """A second run's turn waits while the thread's first turn is in flight, so two
    runs can never both send a due re-probe (R3.2) or interleave history (R1.1)."""
    run, stage = queued
    other, other_stage, _ = services.submit_run(
        Thread.objects.get(id=run.thread_id), input="Again", now=manual_clock()
    )
    lease = timedelta(minutes=10)
    assert services.claim_stage(stage.id, manual_clock(), lease=lease) is not None  # in flight
    manual_clock.advance(seconds=1)
    assert run_stage(other_stage.id) == "deferred"
    deferred = Stage.objects.get(id=other_stage.id)
    assert deferred.claimed_at is None and deferred.finished_at is None
    assert ProviderAttempt.objects.filter(run=other).count() == 0


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
