"""The system's own PostgreSQL cluster restarted mid-run costs no answer (R6.5).

``pg_ctl restart -m fast`` cuts every connection of the web, the worker's
children and beat while stages are inside provider calls and webhook
requests. Afterwards every run settles completed, nothing happened twice, and
the web and worker serve new runs on fresh connections.
"""

from __future__ import annotations

import time

import pytest

from tests.faults import checks
from tests.faults.conftest import running_system
from tests.faults.harness import held_stage, wait_for, wait_outbox_drained


@pytest.fixture(scope="module")
def system():
    with running_system("pg", hook_delay_s=1.5) as running:
        yield running


def test_r6_5_a_database_restart_mid_run_costs_no_answer(system, figures):
    callback = system.receiver.url("/callback")
    threads = [
        system.create_thread(provider_chain=["slow"], callback_url=callback) for _ in range(6)
    ]
    threads += [
        system.create_thread(
            provider_chain=["hooker"], tool_surface=["webhook"], callback_url=callback
        )
        for _ in range(4)
    ]
    threads += [
        system.create_thread(provider_chain=["refuser", "backup"], callback_url=callback)
        for _ in range(2)
    ]
    runs = [system.submit_ok(thread, f"before the restart {n}") for n, thread in enumerate(threads)]
    webhook_runs = runs[6:10]

    # Restart while workers are inside calls (a model stage held for a while).
    held_stage(system, runs, "model_turn", min_age_s=1.0, need_holder=False)
    before = system.sql("SELECT count(*) FROM governance_stage WHERE finished_at IS NULL")[0][0]
    restarted_at = system.sql("SELECT now()")[0][0]
    started = time.monotonic()
    system.pg.restart()
    figures["restart_took_s"] = round(time.monotonic() - started, 2)
    figures["open_stages_at_restart"] = before

    # The web answers again (its pool drops the cut connections) and takes new runs.
    def web_ok():
        return system.http.get("/healthz").status_code == 200

    wait_for("the web's /healthz to be 200 after the restart", web_ok, timeout=30)
    figures["web_healthy_after_s"] = round(time.monotonic() - started, 2)
    later = [system.submit_ok(thread, "after the restart") for thread in threads[:4]]
    runs += later

    settle = system.wait_settled(runs, timeout=90)
    figures["settled_after_restart_s"] = round(time.monotonic() - started, 1)
    figures["slowest_settle_s"] = round(max(settle.values()), 1)
    wait_outbox_drained(system)

    errors = system.sql(
        "SELECT s.id, s.kind, s.outcome, left(s.detail, 200) FROM governance_stage s "
        "WHERE s.run_id::text = ANY(%s) AND s.outcome IN ('error', 'abandoned')",
        runs,
    )
    figures["stages_closed_as_error"] = len(errors)
    figures["cut_stages_reclaimed_after_s"] = [
        round(float(age), 1)
        for (age,) in system.sql(
            "SELECT extract(epoch FROM claimed_at - %s) FROM governance_stage "
            "WHERE run_id::text = ANY(%s) AND deliveries > 1 ORDER BY 1",
            restarted_at, runs,
        )
    ]  # fmt: skip
    figures["redelivered_stages"] = system.sql(
        "SELECT count(*) FROM governance_stage WHERE run_id::text = ANY(%s) AND deliveries > 1",
        runs,
    )[0][0]
    problems = checks.settle_problems(system, runs, {})
    dupes, counts = checks.duplicate_problems(
        system, runs, system.receiver, webhook_runs=webhook_runs, callback_runs=runs
    )
    figures.update(counts)
    figures["runs"] = len(runs)
    figures["runs_not_completed"] = sum(
        1 for outcome, *_ in system.settlements(runs).values() if outcome != "completed"
    )
    assert not problems + dupes, "\n".join(problems + dupes + [f"error stages: {errors}"])
