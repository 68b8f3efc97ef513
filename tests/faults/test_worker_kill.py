"""A prefork worker child SIGKILLed by pid mid-stage costs no answer (R6.4, R6.5).

Real processes: the web, a prefork worker (2 children) and beat on an own
PostgreSQL cluster and an own Redis server, with the production clocks (a 30 s
lease, the watchdog every 15 s, the last-resort resend after 120 s). The test
reads the stage's holder ("host/pid-namespace/pid/token") from its row and
kills exactly that child while it is inside the provider call (a scripted
model with ``delay_s``) or inside a webhook request (a loopback receiver that
sleeps before answering), with fresh work queued behind. Then: the worker's
parent, seeing its child die, sends the stage again (R6.6), and it runs again
within 60 s of the kill, ahead of the work queued before it; every run
settles as a healthy provider makes it (completed), and no effect happened
twice — attempts, receipts, ledger keys, webhook POSTs, callbacks, alert
deliveries.
"""

from __future__ import annotations

import time

import pytest

from tests.faults import checks
from tests.faults.conftest import running_system
from tests.faults.harness import (
    held_stage,
    kill_holder,
    wait_for,
    wait_outbox_drained,
    wait_rerun,
)

RECOVERY_BOUND_S = 60.0
BACKLOG_RUNS = 6  # fresh runs queued behind the killed stage (3 s each, 2 children)


@pytest.fixture(scope="module")
def system():
    with running_system("kill") as running:
        yield running


def _refusal_threads(system, count: int) -> list[str]:
    callback = system.receiver.url("/callback")
    return [
        system.create_thread(provider_chain=["refuser", "backup"], callback_url=callback)
        for _ in range(count)
    ]


def _slow_threads(system, count: int) -> list[str]:
    callback = system.receiver.url("/callback")
    return [
        system.create_thread(provider_chain=["slow"], callback_url=callback) for _ in range(count)
    ]


def _assert_no_fault_cost(system, run_ids, figures, *, webhook_runs=()):
    settle = system.wait_settled(run_ids, timeout=90)
    figures["slowest_settle_s"] = round(max(settle.values()), 1)
    wait_outbox_drained(system)
    problems = checks.settle_problems(system, run_ids, {})
    dupes, counts = checks.duplicate_problems(
        system, run_ids, system.receiver, webhook_runs=list(webhook_runs), callback_runs=run_ids
    )
    figures.update(counts)
    figures["runs"] = len(run_ids)
    figures["runs_not_completed"] = sum(
        1 for outcome, *_ in system.settlements(run_ids).values() if outcome != "completed"
    )
    assert not problems + dupes, "\n".join(problems + dupes)


def _queued_behind(system, run_ids: list[str]) -> list[int]:
    """Stages of ``run_ids`` queued and not yet started (nobody took them)."""
    return [
        stage_id
        for (stage_id,) in system.sql(
            "SELECT id FROM governance_stage WHERE run_id::text = ANY(%s) "
            "AND started_at IS NULL AND finished_at IS NULL AND parked_at IS NULL",
            run_ids,
        )
    ]


def _kill_and_rerun(system, stage, backlog_runs: list[str]) -> dict:
    """Kill the stage's holder; wait for the stage to run again (bounded); tell
    how many stages queued before the kill were still waiting then (it ran
    ahead of them), and whether the worker's parent sent it again."""
    queued_before = _queued_behind(system, backlog_runs)
    pid = kill_holder(system, stage)
    rerun = wait_rerun(system, stage, timeout=RECOVERY_BOUND_S)
    still_waiting = set(queued_before) & set(_queued_behind(system, backlog_runs))
    sent_again = wait_for(
        f"the worker's parent to say it sent stage {stage['stage_id']} again",
        lambda: f"its worker process {pid} died; sent again" in system.worker_log(),
        timeout=10,
    )  # fmt: skip
    return {"stage": stage["stage_id"], "killed_pid": pid, **rerun,
            "queued_before_kill": len(queued_before), "still_waiting_at_rerun": len(still_waiting),
            "parent_sent_it_again": sent_again}  # fmt: skip


def _assert_recovered(recoveries: list[dict]) -> None:
    for recovery in recoveries:
        assert recovery["rerun_after_s"] <= RECOVERY_BOUND_S, recovery
        # Ahead of new work: it did not wait for the stages queued before it.
        assert recovery["queued_before_kill"] >= 2, recovery  # the test's own precondition
        assert recovery["still_waiting_at_rerun"] >= 1, recovery


def test_r6_5_a_worker_killed_mid_model_call_costs_no_answer(system, figures):
    callback = system.receiver.url("/callback")
    runs, recoveries = [], []
    for wave in range(2):  # two waves of 5 runs, one kill in each, inside a 3 s model call
        slow = [system.create_thread(provider_chain=["slow"], callback_url=callback)
                for _ in range(4 + BACKLOG_RUNS)]  # fmt: skip
        batch = [system.submit_ok(thread, f"question {wave}.{n}") for n, thread in enumerate(slow)]
        batch += [system.submit_ok(t, "please answer") for t in _refusal_threads(system, 1)]
        runs += batch
        stage = held_stage(system, batch, "model_turn", min_age_s=0.8)
        others = [run for run in batch if run != stage["run_id"]]
        recovery = _kill_and_rerun(system, stage, others)
        recoveries.append({**recovery, "killed_after_s": round(stage["age_s"], 2)})
    figures["kills"] = recoveries
    figures["kill_to_rerun_s"] = [r["rerun_after_s"] for r in recoveries]
    _assert_recovered(recoveries)
    _assert_no_fault_cost(system, runs, figures)


def test_r6_4_a_worker_killed_mid_webhook_call_verifies_instead_of_replaying(system, figures):
    receiver = system.receiver
    receiver.hook_delay_s = 2.5  # the webhook request stays in flight this long
    callback = receiver.url("/callback")
    runs, webhook_runs, recoveries = [], [], []
    for wave in range(2):  # two waves of 5 runs, one kill in each, mid webhook request
        hook_threads = [
            system.create_thread(provider_chain=["hooker"], tool_surface=["webhook"],
                                 callback_url=callback)
            for _ in range(4)
        ]  # fmt: skip
        slow = _slow_threads(system, BACKLOG_RUNS)
        batch = [system.submit_ok(t, f"notify {wave}.{n}") for n, t in enumerate(hook_threads)]
        webhook_runs += batch
        runs += batch + [system.submit_ok(t, "please answer") for t in _refusal_threads(system, 1)]
        # Fresh runs queued behind: the webhook call must not wait for them.
        backlog = [system.submit_ok(t, f"meanwhile {wave}.{n}") for n, t in enumerate(slow)]
        runs += backlog
        killed_keys = {r["key"] for r in recoveries}

        def in_flight(batch=batch, killed_keys=killed_keys):
            with receiver.lock:
                return [
                    key
                    for key, since in receiver.hooks_in_flight.items()
                    if time.monotonic() - since > 0.3
                    and key not in killed_keys
                    and key.split(":")[1] in batch
                ]

        # Wait until a webhook POST is in flight, then kill the child that sent it.
        key = wait_for("a webhook request in flight", in_flight, timeout=30, interval=0.05)[0]
        run_id = key.split(":")[1]
        stage = held_stage(system, [run_id], "tool_call", min_age_s=0.0, timeout=5)
        recovery = _kill_and_rerun(system, stage, backlog)
        recoveries.append({**recovery, "key": key})
    figures["kills"] = recoveries
    figures["kill_to_rerun_s"] = [r["rerun_after_s"] for r in recoveries]
    _assert_recovered(recoveries)
    _assert_no_fault_cost(system, runs, figures, webhook_runs=webhook_runs)
    # The killed calls were verified by key (R6.4), not sent again.
    figures["webhook_verifications"] = receiver.verifications
    killed_keys = {r["key"] for r in recoveries}
    effects = dict(
        system.sql(
            "SELECT idempotency_key, effect FROM governance_toolreceipt "
            "WHERE idempotency_key = ANY(%s)",
            list(killed_keys),
        )
    )
    assert all(effects.get(k) == "succeeded" for k in killed_keys), effects
    assert receiver.verifications >= len(killed_keys), "no verification reached the receiver"
