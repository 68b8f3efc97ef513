"""What every fault test asserts after its runs: settled, honest, no duplicate effect.

Each check returns human-readable problems (empty: fine) so one failure
message lists everything that went wrong, not only the first thing.
"""

from __future__ import annotations

import re
from typing import Any

from tests.faults.harness import Receiver, System

HEALTHY = "completed"


def settle_problems(system: System, run_ids: list[str], expected: dict[str, str]) -> list[str]:
    """Every run settled once, with the outcome a healthy provider gives
    (``expected``: run id → outcome; default ``completed``)."""
    settled = system.settlements(run_ids)
    problems = []
    for run_id in run_ids:
        if run_id not in settled:
            problems.append(f"run {run_id} has no settlement")
            continue
        outcome, code, reason = settled[run_id]
        want = expected.get(run_id, HEALTHY)
        if outcome != want:
            problems.append(
                f"run {run_id} settled {outcome} ({code}: {reason[:300]}), expected {want}"
            )
    return problems


def duplicate_problems(
    system: System, run_ids: list[str], receiver: Receiver | None = None, *,
    webhook_runs: list[str] = (), callback_runs: list[str] = (),
) -> tuple[list[str], dict[str, int]]:  # fmt: skip
    """0 duplicate effects: attempts, receipts, ledger keys, callbacks, alert
    deliveries, settlements. Returns (problems, counts)."""
    problems: list[str] = []
    counts: dict[str, int] = {}
    ids = list(run_ids)

    # Attempts: one row per (stage, provider, kind, request bytes).
    rows = system.sql(
        "SELECT a.stage_id, p.provider_id, a.kind, a.request_digest, count(*) "
        "FROM governance_providerattempt a JOIN governance_provider p ON p.id = a.provider_id "
        "WHERE a.run_id::text = ANY(%s) GROUP BY 1, 2, 3, 4 HAVING count(*) > 1",
        ids,
    )
    counts["duplicate_attempts"] = sum(n - 1 for *_, n in rows)
    problems += [
        f"attempt recorded {n} times: stage {s} {p} {k} {d[:12]}" for s, p, k, d, n in rows
    ]

    # Receipts: one per tool call of a turn (the key is unique by constraint; a
    # second key for the same call would be a replay under a new identity).
    rows = system.sql(
        "SELECT run_id::text, tool, tool_call_id, count(*), array_agg(idempotency_key) "
        "FROM governance_toolreceipt WHERE run_id::text = ANY(%s) "
        "GROUP BY 1, 2, 3 HAVING count(*) > 1",
        ids,
    )
    counts["duplicate_receipts"] = sum(n - 1 for _, _, _, n, _ in rows)
    problems += [f"run {r}: {n} receipts for {t} call {c}: {keys}" for r, t, c, n, keys in rows]

    # Ledger keys: (account, key, kind) is unique; and no model request is
    # charged without an attempt, except uses marked unknown (a dead holder's).
    rows = system.sql(
        "SELECT e.account_id, e.idempotency_key, e.kind, count(*) FROM governance_budgetentry e "
        "JOIN governance_budgetaccount a ON a.id = e.account_id WHERE a.run_id::text = ANY(%s) "
        "GROUP BY 1, 2, 3 HAVING count(*) > 1",
        ids,
    )
    counts["duplicate_ledger_keys"] = sum(n - 1 for *_, n in rows)
    problems += [f"ledger key {k} ({kind}) written {n} times" for _, k, kind, n in rows]
    counts.update(_charged_without_attempt(system, ids, problems))

    # Settlements: one per run.
    rows = system.sql(
        "SELECT run_id::text, count(*) FROM governance_settlement WHERE run_id::text = ANY(%s) "
        "GROUP BY 1 HAVING count(*) > 1",
        ids,
    )
    problems += [f"run {r} settled {n} times" for r, n in rows]

    if receiver is not None:
        with receiver.lock:
            hooks = dict(receiver.hooks)
            callbacks = {k: len(v) for k, v in receiver.callbacks.items()}
            alerts = dict(receiver.alerts)
        # Webhook effects: at most one POST per idempotency key; every webhook
        # run's receipt key reached the receiver exactly once.
        counts["webhook_duplicate_posts"] = sum(n - 1 for n in hooks.values() if n > 1)
        problems += [f"webhook key {k} received {n} POSTs" for k, n in hooks.items() if n > 1]
        if webhook_runs:
            keys = {
                run_id: key
                for run_id, key in system.sql(
                    "SELECT run_id::text, idempotency_key FROM governance_toolreceipt "
                    "WHERE tool = 'webhook' AND run_id::text = ANY(%s)",
                    list(webhook_runs),
                )
            }
            for run_id in webhook_runs:
                key = keys.get(run_id)
                if key is None:
                    problems.append(f"webhook run {run_id} has no webhook receipt")
                elif hooks.get(key, 0) != 1:
                    problems.append(f"webhook run {run_id}: key {key} POSTed {hooks.get(key, 0)}x")
        # Callbacks: exactly one per run that has a callback URL.
        counts["callback_duplicates"] = sum(n - 1 for n in callbacks.values() if n > 1)
        problems += [f"callback {k} delivered {n} times" for k, n in callbacks.items() if n > 1]
        if callback_runs:
            delivered = {
                run_id: key
                for run_id, key in system.sql(
                    "SELECT run_id::text, idempotency_key FROM governance_runcallback "
                    "WHERE run_id::text = ANY(%s)",
                    list(callback_runs),
                )
            }
            for run_id in callback_runs:
                key = delivered.get(run_id)
                if key is None:
                    problems.append(f"run {run_id} has no callback row")
                elif callbacks.get(key, 0) != 1:
                    problems.append(
                        f"run {run_id}: callback {key} delivered {callbacks.get(key, 0)}x"
                    )
        # Alert deliveries: each (notification, event) reaches the channel once.
        counts["alert_duplicates"] = sum(n - 1 for n in alerts.values() if n > 1)
        counts["alert_deliveries"] = sum(alerts.values())
        problems += [f"alert {k} delivered {n} times" for k, n in alerts.items() if n > 1]
    return problems, counts


_STAGE_IN_KEY = re.compile(r"^stage(\d+)[.:]")


def _charged_without_attempt(system: System, ids: list[str], problems: list[str]) -> dict:
    columns = {
        name
        for (name,) in system.sql(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'governance_budgetentry'"
        )
    }
    outcome = "e.outcome" if "outcome" in columns else "''"
    stage = "e.stage_id" if "stage_id" in columns else "NULL"
    rows = system.sql(
        f"SELECT e.idempotency_key, {stage}, {outcome} FROM governance_budgetentry e "
        "JOIN governance_budgetaccount a ON a.id = e.account_id "
        "WHERE a.run_id::text = ANY(%s) AND e.resource = 'model_requests' AND e.kind = 'admit'",
        ids,
    )
    known: dict[int, int] = {}
    unknown = 0
    for key, stage_id, entry_outcome in rows:
        if stage_id is None and (match := _STAGE_IN_KEY.match(key)):
            stage_id = int(match.group(1))
        if entry_outcome == "unknown":
            unknown += 1
            continue
        if stage_id is not None:
            known[stage_id] = known.get(stage_id, 0) + 1
    attempts: dict[int, int] = dict(
        system.sql(
            "SELECT stage_id, count(*) FROM governance_providerattempt "
            "WHERE run_id::text = ANY(%s) GROUP BY 1",
            ids,
        )
    )
    missing = 0
    for stage_id, charged in known.items():
        if charged > attempts.get(stage_id, 0):
            missing += charged - attempts.get(stage_id, 0)
            problems.append(
                f"stage {stage_id}: {charged} model requests charged, "
                f"{attempts.get(stage_id, 0)} attempts recorded (none marked unknown)"
            )
    return {"charged_without_attempt": missing, "ledger_unknown_uses": unknown}


def summary(figures: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in figures.items())
