"""Fault probe (R6.6): the old fault probe, re-run on the current code.

The original probe ran 300 runs on 30 threads while the worker was SIGKILLed
15 times, then restarted PostgreSQL under load, then flushed Redis
(FLUSHALL) and stopped it for 10 s, all with healthy scripted providers. On
the old code 57 of 300 runs (19 %) ended partial or failed, a run took up to
721 s to settle, the ledger charged 10 model requests with no attempt, 95 %
of stage executions were deferrals, a submit answered 500 during the broker
outage and /healthz answered 500. This script repeats it and prints today's
figures beside those.

It reuses the fault tests' harness (``tests/faults/harness.py``): its own
PostgreSQL cluster (initdb, own port), its own redis-server, the web
(uvicorn), a prefork worker (2 children, like ``manage.py up``), beat, and a
loopback receiver for webhooks, callbacks and alerts. Nothing touches the
shared servers.

Phases:

1. ``--runs`` runs on ``--threads`` threads, submitted over HTTP across
   ``--submit-window`` seconds by one client per thread. Providers are
   scripted and healthy, answering after 0.5-1 s (so kills land inside calls);
   a third of the threads use a tool (the calculator, or the webhook against
   the loopback receiver, which keeps the request open ``--hook-delay`` s),
   and 2 of 15 threads start with a provider that refuses and fall back (R3;
   not a fault, it makes alert deliveries to check). Meanwhile the prefork
   child holding a stage (the pid in the stage row's ``holder``,
   "host/pid-namespace/pid/token") is SIGKILLed ``--kills`` times, spread over
   the phase (every third kill aims at a webhook request in flight).
2. ``pg_ctl restart -m fast`` while 2 runs per thread are in flight, with a
   client submitting one run every 0.5 s through the restart.
3. Redis FLUSHALL while one run per thread is queued or running; 3 s later
   Redis stops for 10 s, with one submit and one ``/healthz`` per second
   during the outage; then it comes back on the same port.

Every submit carries an idempotency key; a submit that did not answer 2xx is
retried with the same key (as a client would) until it does, so every
intended run ends with a run id. A run that never settles within the bound is
lost. Settings are the production defaults except where the harness needs
otherwise (printed with the report).

Run from the repo root:
  .venv/bin/python bench/faults_probe.py [--runs 300 --threads 30 --kills 15]
Exit 0 when nothing was duplicated and no run was lost; 1 otherwise; 2 when
the system could not be started or driven; 130 when interrupted. Every
process and temporary directory is removed on exit (``--keep`` keeps the
logs and data directory and prints where).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script: tests.faults must be importable

import httpx  # noqa: E402
import psycopg  # noqa: E402

from tests.faults import checks  # noqa: E402
from tests.faults.harness import (  # noqa: E402
    HarnessError,
    Receiver,
    System,
    holder_pid,
    kill_holder,
    parent_pid,
    pid_alive,
    wait_for,
    wait_outbox_drained,
)

OUTAGE_S = 10.0
FLUSH_TO_STOP_S = 3.0
KILL_MIN_AGE_S = 0.2  # a stage held this long is inside its provider or tool call
RERUN_GIVE_UP_S = 300.0

# The production defaults of the clocks (dashboard/site/settings.py), set
# explicitly so the report names them (the harness uses the defaults too).
PRODUCTION_CLOCKS = {
    "GOVERNANCE_STAGE_LEASE_SECONDS": "30",
    "GOVERNANCE_WATCHDOG_SECONDS": "15",
    "GOVERNANCE_STAGE_RESEND_AFTER_SECONDS": "120",
    "GOVERNANCE_HEARTBEAT_SECONDS": "30",
    "GOVERNANCE_CALLBACK_RETRY_SECONDS": "15",
    "GOVERNANCE_CALLBACK_BACKOFF_SECONDS": "10",
    "GOVERNANCE_CALLBACK_BACKOFF_MAX_SECONDS": "3600",
    "GOVERNANCE_ALERT_SWEEP_SECONDS": "15",
    "GOVERNANCE_ALERT_RETRY_BASE_SECONDS": "30",
    "GOVERNANCE_ALERT_RETRY_MAX_SECONDS": "3600",
}
# What the harness sets that production would not, and why (printed).
HARNESS_NEEDS = [
    "GOVERNANCE_OUTBOUND_ALLOW=127.0.0.1 (the receiver is plain http on loopback)",
    "DJANGO_SECURE_SSL_REDIRECT=0, *_COOKIE_SECURE=0, HSTS 0 (plain http, no TLS proxy)",
    "GOVERNANCE_DASHBOARD_URL=the probe's web, LOG_LEVEL=WARNING, own secrets",
    "throw-away PostgreSQL: fsync=off, synchronous_commit=off, max_connections=200",
    "worker: celery prefork -c 2 -l INFO (manage.py up's default concurrency)",
]

# Old figures (the first probe, on the old code); None: not reported then.
OLD = {
    "submitted": "300",
    "lost": None,
    "partial_failed": "57 of 300 (19 %)",
    "duplicates": None,
    "charged_without_attempt": "10",
    "unknown_uses": None,
    "max_deliveries": "704",
    "waiting_share": "95 % (deferrals)",
    "outage_non2xx": "≥ 1 (a 500)",
    "healthz_outage": "500",
    "kill_rerun": None,
    "return_settled": "126 s (a probe of 60 runs with 4 kills)",
    "settle": "p90 ≈ 590 s, max 721 s",
}

# The thread mix, repeated: model answering after 0.5 / 0.75 / 1.0 s, a
# calculator call, a webhook call, a refusal that falls back.
MIX = [
    "fast",
    "mid",
    "slow",
    "calc",
    "hook",
    "fast",
    "mid",
    "slow",
    "calc",
    "hook",
    "fast",
    "mid",
    "slow",
    "hook",
    "refusal",
]
CHAINS = {
    "fast": (["probe-fast"], []),
    "mid": (["probe-mid"], []),
    "slow": (["probe-slow"], []),
    "calc": (["probe-calc"], ["calculator"]),
    "hook": (["probe-hook"], ["webhook"]),
    "refusal": (["refuser", "backup"], []),
}


def log(message: str) -> None:
    print(f"[probe {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def scripts(hook_url: str) -> dict[str, dict]:
    """Healthy scripted providers (tasks/adapters/scripted.py format)."""

    def answer(delay: float, text: str) -> dict:
        return {"name": "answer", "delay_s": delay, "answer": {"text": text, "chunks": 2}}

    return {
        "probe-fast": {"rules": [answer(0.5, "Fast answer to: {last_user}")]},
        "probe-mid": {"rules": [answer(0.75, "Answer to: {last_user}")]},
        "probe-slow": {"rules": [answer(1.0, "Slow answer to: {last_user}")]},
        "probe-calc": {
            "rules": [
                {
                    "name": "calculate",
                    "delay_s": 0.5,
                    "when": {"last_role_not": "tool", "has_tool": "calculator"},
                    "tool_call": {"name": "calculator", "arguments": {"expression": "6 * 7 + 1"}},
                },
                answer(0.5, "The calculator said: {last_message}"),
            ]
        },
        "probe-hook": {
            "rules": [
                {
                    "name": "call the webhook",
                    "delay_s": 0.5,
                    "when": {"last_role_not": "tool", "has_tool": "webhook"},
                    "tool_call": {
                        "name": "webhook",
                        "arguments": {"url": hook_url, "payload": {"about": "{last_user}"}},
                    },
                },
                answer(0.5, "The hook said: {last_message}"),
            ]
        },
        "refuser": {"default": {"refuse": {"category": "policy", "text": "I can't help."}}},
        "backup": {"rules": [answer(0.5, "Backup answer to: {last_user}")]},
    }


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def fmt_s(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} s"


# --------------------------------------------------------------------------- the probe


class Probe:
    def __init__(self, system: System, receiver: Receiver, args: argparse.Namespace) -> None:
        self.system = system
        self.receiver = receiver
        self.args = args
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.local = threading.local()
        self.clients: list[httpx.Client] = []
        self.threads: list[tuple[str, str]] = []  # (thread id, mix kind)
        # Every intended run: key → facts (phase, kind, run id, statuses of its submits).
        self.runs: dict[str, dict[str, Any]] = {}
        self.kills: list[dict[str, Any]] = []
        # Submit answers other than 2xx: (phase, status) → [how many, first body].
        self.refusals: dict[tuple[str, str], list] = {}
        self.phase_notes: dict[str, dict[str, Any]] = {}
        self.broker_back_at: float | None = None  # when Redis came back (wall clock)
        self.pool = ThreadPoolExecutor(max_workers=max(8, args.threads + 12))
        self.monitor = threading.Thread(
            target=self._watch_reruns, name="rerun-monitor", daemon=True
        )
        self.monitor.start()

    # ---- HTTP (one client per OS thread)

    def http(self) -> httpx.Client:
        client = getattr(self.local, "client", None)
        if client is None:
            client = httpx.Client(
                base_url=f"http://127.0.0.1:{self.system.web_port}",
                timeout=30,
                headers={"Authorization": f"Bearer {self.system.token}"},
            )
            self.local.client = client
            with self.lock:
                self.clients.append(client)
        return client

    def close(self) -> None:
        self.stop.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            clients = list(self.clients)
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()

    def create_threads(self) -> None:
        callback = self.receiver.url("/callback")
        for index in range(self.args.threads):
            kind = MIX[index % len(MIX)]
            chain, tools = CHAINS[kind]
            response = self.http().post(
                "/api/v1/threads",
                json={
                    "provider_chain": chain,
                    "tool_surface": tools,
                    "callback_url": callback,
                    "title": f"probe {index} ({kind})",
                },
            )
            if response.status_code != 201:
                raise HarnessError(f"create thread: {response.status_code} {response.text}")
            self.threads.append((response.json()["id"], kind))

    def submit(self, phase: str, thread_index: int, *, retry_for: float = 120.0) -> dict:
        """Submit one run; retried with the same idempotency key until it answers 2xx."""
        thread_id, kind = self.threads[thread_index]
        key = f"probe-{phase}-{uuid.uuid4()}"
        entry = {
            "phase": phase,
            "kind": kind,
            "thread": thread_id,
            "run_id": None,
            "statuses": [],
            "at": time.monotonic(),
            "ms": [],
        }
        with self.lock:
            self.runs[key] = entry
        deadline = time.monotonic() + retry_for
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                response = self.http().post(
                    f"/api/v1/threads/{thread_id}/runs",
                    json={
                        "input": f"{phase} question on thread {thread_index}",
                        "idempotency_key": key,
                    },
                )
                status: int | str = response.status_code
            except httpx.HTTPError as exc:
                response, status = None, type(exc).__name__
            entry["statuses"].append(status)
            entry["ms"].append(1000 * (time.monotonic() - sent))
            entry["done"] = time.monotonic()
            if status not in (200, 202):
                body = response.text[:240] if response is not None else ""
                with self.lock:
                    self.refusals.setdefault((phase, str(status)), [0, body])[0] += 1
            if response is not None and status in (200, 202):
                entry["run_id"] = response.json()["run_id"]
                return entry
            if response is not None and status != 503 and 400 <= status < 500:
                entry["error"] = response.text[:300]
                return entry  # refused: retrying the same body will not help
            if response is not None:
                entry["error"] = response.text[:300]
            if time.monotonic() >= deadline:
                return entry
            self.stop.wait(1.0)
        return entry

    # ---- SQL

    def run_ids(self, phase: str | None = None) -> list[str]:
        with self.lock:
            return [
                e["run_id"]
                for e in self.runs.values()
                if e["run_id"] and (phase is None or e["phase"] == phase)
            ]

    def settled(self, run_ids: list[str]) -> set[str]:
        rows = self.system.sql(
            "SELECT run_id::text FROM governance_settlement WHERE run_id::text = ANY(%s)",
            run_ids,
        )
        return {r for (r,) in rows}

    def wait_settled(self, phase: str, bound_s: float, *, also_until=None) -> float:
        """Wait until the phase's runs settled (bounded); how long it waited."""
        started = time.monotonic()
        while time.monotonic() - started < bound_s and not self.stop.is_set():
            pending = also_until() if also_until else False
            ids = self.run_ids(phase)
            if not pending and ids and len(self.settled(ids)) == len(ids):
                break
            time.sleep(0.5)
        return time.monotonic() - started

    def held_stages(
        self, *, kind: str | None = None, run_ids: list[str] | None = None, exclude: list[int] = ()
    ) -> list[dict]:
        rows = self.system.sql(
            "SELECT id, run_id::text, kind, holder, extract(epoch FROM now() - claimed_at) "
            "FROM governance_stage WHERE run_id::text = ANY(%s) AND finished_at IS NULL "
            "AND holder <> '' AND lease_until > now() "
            "AND claimed_at < now() - make_interval(secs => %s) "
            "AND (%s::text IS NULL OR kind = %s) AND NOT id = ANY(%s) ORDER BY random() LIMIT 20",
            run_ids if run_ids is not None else self.run_ids(),
            KILL_MIN_AGE_S,
            kind,
            kind,
            list(exclude),
        )
        return [
            {"stage_id": s, "run_id": r, "kind": k, "holder": h, "age_s": float(a)}
            for s, r, k, h, a in rows
        ]

    # ---- phase 1: kills

    def killable(self, stages: list[dict]) -> dict | None:
        worker = self.system.processes["worker"].pid
        for stage in stages:
            pid = holder_pid(stage["holder"])
            if pid_alive(pid) and parent_pid(pid) == worker:
                return stage
        return None

    def pick_stage(self, prefer_webhook: bool) -> dict | None:
        exclude = [k["stage_id"] for k in self.kills if k.get("stage_id")]
        if prefer_webhook:  # a webhook POST in flight at the receiver: kill its sender
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline and not self.stop.is_set():
                with self.receiver.lock:
                    runs = [
                        key.split(":")[1]
                        for key, since in self.receiver.hooks_in_flight.items()
                        if time.monotonic() - since > 0.2 and key.count(":") >= 1
                    ]
                if runs:
                    found = self.killable(
                        self.held_stages(kind="tool_call", run_ids=runs, exclude=exclude)
                    )
                    if found:
                        return found
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self.stop.is_set():
            found = self.killable(self.held_stages(exclude=exclude))
            if found:
                return found
            time.sleep(0.05)
        return None

    def kill_one(self, prefer_webhook: bool) -> dict | None:
        stage = self.pick_stage(prefer_webhook)
        if stage is None:
            return None
        try:
            queued = self.system.queued_stage_messages()
        except Exception as exc:  # context only
            queued = type(exc).__name__
        killed_at = time.monotonic()
        try:
            pid = kill_holder(self.system, stage)
        except HarnessError as exc:  # the holder moved on between the read and the kill
            log(f"kill skipped: {exc}")
            return None
        # What that child held when it died (normally the stage picked; if it
        # finished in between, whatever the child took next).
        held = self.system.sql(
            "SELECT id, kind, holder, run_id::text FROM governance_stage "
            "WHERE split_part(holder, '/', 3) = %s AND finished_at IS NULL",
            str(pid),
        )
        kill = {
            "pid": pid,
            "at": killed_at,
            "picked": stage["stage_id"],
            "picked_kind": stage["kind"],
            "picked_age_s": round(stage["age_s"], 2),
            "stages": [
                {
                    "stage_id": s,
                    "kind": k,
                    "holder": h,
                    "run_id": r,
                    "rerun_after_s": None,
                    "how": None,
                }
                for s, k, h, r in held
            ],
        }
        kill["stage_id"] = stage["stage_id"]
        kill["queued_messages"] = queued
        with self.lock:
            self.kills.append(kill)
        return kill

    def _watch_reruns(self) -> None:
        """When each killed stage runs again: a new holder on its row, or the row finished."""
        conn = None
        while not self.stop.is_set():
            time.sleep(0.1)
            with self.lock:
                pending = [
                    (kill, s)
                    for kill in self.kills
                    for s in kill["stages"]
                    if s["rerun_after_s"] is None and s["how"] is None
                ]
            if not pending:
                continue
            try:
                if conn is None or conn.closed or conn.broken:
                    conn = psycopg.connect(self.system.pg.url(), autocommit=True, connect_timeout=3)
                rows = dict(
                    (sid, (holder, finished, outcome))
                    for sid, holder, finished, outcome in conn.execute(
                        "SELECT id, holder, finished_at IS NOT NULL, outcome "
                        "FROM governance_stage WHERE id = ANY(%s)",
                        [[s["stage_id"] for _, s in pending]],
                    ).fetchall()
                )
            except psycopg.Error:
                conn = None
                continue
            now = time.monotonic()
            for kill, stage in pending:
                holder, finished, outcome = rows.get(stage["stage_id"], ("", False, ""))
                if finished or (holder and holder != stage["holder"]):
                    stage["rerun_after_s"] = round(now - kill["at"], 2)
                    stage["how"] = (
                        f"finished ({outcome})"
                        if finished and (not holder or holder == stage["holder"])
                        else "new holder"
                    )
                elif now - kill["at"] > RERUN_GIVE_UP_S:
                    stage["how"] = "never"
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def phase_kills(self) -> None:
        args = self.args
        n, threads = args.runs, len(self.threads)
        log(
            f"phase 1: {n} runs on {threads} threads over {args.submit_window:.0f} s, "
            f"{args.kills} SIGKILLs"
        )
        started = time.monotonic()
        futures = []
        for k in range(n):  # run k goes to thread k % threads at k/n of the window
            futures.append(
                self.pool.submit(
                    self._submit_at, "kills", k % threads, started + k * args.submit_window / n
                )
            )
        next_kill = started + min(5.0, args.submit_window / 4)
        rate_guess = 1.5  # runs settled per second on 2 worker children, before measuring
        while len(self.kills) < args.kills and not self.stop.is_set():
            time.sleep(max(0.0, next_kill - time.monotonic()))
            ids = self.run_ids("kills")
            done = len(self.settled(ids)) if ids else 0
            if done >= n:
                log(f"phase 1: every run settled after {len(self.kills)} kills")
                break
            kill = self.kill_one(prefer_webhook=len(self.kills) % 3 == 2)
            if kill is not None:
                stages = ", ".join(f"{s['kind']} {s['stage_id']}" for s in kill["stages"])
                log(
                    f"kill {len(self.kills)}/{args.kills}: pid {kill['pid']} holding "
                    f"[{stages or 'nothing any more'}] (picked {kill['picked_kind']} "
                    f"{kill['picked']}, held {kill['picked_age_s']} s; "
                    f"{kill['queued_messages']} messages queued)"
                )
            elapsed = time.monotonic() - started
            rate = done / elapsed if done >= 20 else rate_guess
            remaining = (n - done) / max(rate, 0.1)
            left = args.kills - len(self.kills)
            # At most 10 s apart: the phase's end is hard to foresee under a backlog.
            spacing = min(10.0, max(2.5, remaining / (left + 2)))
            next_kill = time.monotonic() + spacing if left else 0
        for future in futures:
            future.result()
        with self.lock:
            last = max(e.get("done", started) for e in self.runs.values() if e["phase"] == "kills")
        submitted = last - started
        waited = self.wait_settled(
            "kills",
            self.args.settle_bound,
            also_until=lambda: any(
                s["rerun_after_s"] is None and s["how"] is None
                for k in self.kills
                for s in k["stages"]
            ),
        )
        self.phase_notes["kills"] = {
            "took_s": round(time.monotonic() - started, 1),
            "submits_took_s": round(submitted, 1),
            "waited_s": round(waited, 1),
        }
        log(f"phase 1 done in {time.monotonic() - started:.0f} s")

    def _submit_at(self, phase: str, thread_index: int, at: float) -> dict:
        self.stop.wait(max(0.0, at - time.monotonic()))
        return self.submit(phase, thread_index)

    # ---- phase 2: PostgreSQL restart

    def phase_postgres(self) -> None:
        log("phase 2: PostgreSQL restart under load")
        started = time.monotonic()
        threads = len(self.threads)
        batch = [self.pool.submit(self.submit, "postgres", i % threads) for i in range(2 * threads)]
        for future in batch:
            future.result()
        ids = self.run_ids("postgres")
        wait_for(
            "two stages held inside their calls",
            lambda: len(self.held_stages(run_ids=ids)) >= 2,
            timeout=60,
            interval=0.05,
        )
        open_stages = self.system.sql(
            "SELECT count(*) FILTER (WHERE holder <> ''), count(*) FROM governance_stage "
            "WHERE finished_at IS NULL"
        )[0]
        load_stop = threading.Event()
        load_futures = []

        def load() -> None:  # one submit every 0.5 s through the restart
            index = 0
            while not load_stop.is_set() and not self.stop.is_set():
                load_futures.append(
                    self.pool.submit(self.submit, "postgres", index % threads, retry_for=90)
                )
                index += 1
                load_stop.wait(0.5)

        loader = threading.Thread(target=load, name="pg-load", daemon=True)
        loader.start()
        time.sleep(1.0)
        restart_at = time.monotonic()
        self.system.pg.restart()
        restart_took = time.monotonic() - restart_at
        health = []

        def healthy() -> bool:
            status = self.http().get("/healthz").status_code
            health.append(status)
            return status == 200

        wait_for("/healthz 200 after the restart", healthy, timeout=60, interval=0.25)
        healthy_after = time.monotonic() - restart_at
        time.sleep(max(0.0, 10.0 - (time.monotonic() - restart_at)))
        load_stop.set()
        loader.join(timeout=5)
        for future in list(load_futures):
            future.result()
        waited = self.wait_settled("postgres", self.args.settle_bound)
        during = [
            e
            for e in list(self.runs.values())
            if e["phase"] == "postgres" and e["at"] >= restart_at - 1.0
        ]
        self.phase_notes["postgres"] = {
            "held_and_open_stages_at_restart": tuple(open_stages),
            "restart_took_s": round(restart_took, 1),
            "healthz_200_after_s": round(healthy_after, 1),
            "healthz_seen": dict(Counter(health)),
            "submits_around_restart": len(during),
            "first_answers_around_restart": dict(
                Counter(str(e["statuses"][0]) for e in during if e["statuses"])
            ),
            "settled_after_restart_s": round(time.monotonic() - restart_at, 1),
            "waited_s": round(waited, 1),
            "took_s": round(time.monotonic() - started, 1),
        }
        log(f"phase 2 done: {self.phase_notes['postgres']}")

    # ---- phase 3: Redis flush and outage

    def phase_redis(self) -> None:
        log("phase 3: Redis FLUSHALL, then Redis stopped for 10 s")
        started = time.monotonic()
        threads = len(self.threads)
        batch = [self.pool.submit(self.submit, "redis", i) for i in range(threads)]
        for future in batch:
            future.result()
        ids = self.run_ids("redis")
        wait_for(
            "a stage held inside its call",
            lambda: self.held_stages(run_ids=ids),
            timeout=60,
            interval=0.05,
        )
        queued = self.system.sql(
            "SELECT count(*) FILTER (WHERE holder = '' AND parked_at IS NULL), "
            "count(*) FILTER (WHERE parked_at IS NOT NULL), count(*) FILTER (WHERE holder <> '') "
            "FROM governance_stage WHERE finished_at IS NULL"
        )[0]
        flushed_at = time.monotonic()
        self.system.redis.flushall()
        time.sleep(FLUSH_TO_STOP_S)
        self.system.redis.stop()
        stopped_at = time.monotonic()
        health: list[tuple[int | str, str]] = []
        outage: list = []
        index = 0
        while time.monotonic() - stopped_at < OUTAGE_S - 0.5 and not self.stop.is_set():
            outage.append(self.pool.submit(self.submit, "outage", index % threads))
            index += 1
            try:
                probe = self.http().get("/healthz", timeout=5)
                health.append((probe.status_code, probe.text[:300]))
            except httpx.HTTPError as exc:
                health.append((type(exc).__name__, ""))
            time.sleep(max(0.0, 1.0 - (time.monotonic() - stopped_at) % 1.0))
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - stopped_at)))
        self.system.redis.start()
        self.broker_back_at = time.time()  # wall clock: compared with settled_at
        outage_s = time.monotonic() - stopped_at
        alive = {name: p.alive() for name, p in self.system.processes.items()}
        for future in outage:
            future.result()
        resend = int(self.args.resend_after)
        bound = max(self.args.settle_bound, resend + 2 * 15 + 120)
        waited_redis = self.wait_settled("redis", bound)
        waited_outage = self.wait_settled("outage", bound)
        self.phase_notes["redis"] = {
            "stages_at_flush(queued, parked, held)": tuple(queued),
            "outage_s": round(outage_s, 1),
            "processes_alive_after": alive,
            "flush_to_settled_s": round(time.monotonic() - flushed_at, 1),
            "waited_s": round(waited_redis + waited_outage, 1),
            "took_s": round(time.monotonic() - started, 1),
            "healthz": health,
        }
        log(f"phase 3 done in {time.monotonic() - started:.0f} s")

    # ---- figures

    def figures(self) -> dict[str, Any]:
        system = self.system
        with self.lock:
            entries = list(self.runs.values())
        ids = [e["run_id"] for e in entries if e["run_id"]]
        settled_rows = system.sql(
            "SELECT s.run_id::text, s.outcome, s.reason_code, "
            "extract(epoch FROM s.settled_at - r.created_at) FROM governance_settlement s "
            "JOIN governance_run r ON r.id = s.run_id WHERE s.run_id::text = ANY(%s)",
            ids,
        )
        outcome = {r: o for r, o, _, _ in settled_rows}
        settle_s = [float(t) for *_, t in settled_rows]
        bad = Counter((o, c) for _, o, c, _ in settled_rows if o in ("partial", "failed"))
        lost = [r for r in ids if r not in outcome]
        try:
            wait_outbox_drained(system, timeout=self.args.outbox_bound)
            outbox_open = []
        except HarnessError as exc:
            outbox_open = [str(exc)[:600]]
        hook_runs = [e["run_id"] for e in entries if e["run_id"] and e["kind"] == "hook"]
        dupes, counts = checks.duplicate_problems(
            system, ids, self.receiver, webhook_runs=hook_runs, callback_runs=ids
        )
        deliveries = system.sql(
            "SELECT coalesce(max(deliveries), 0), coalesce(sum(deliveries), 0), count(*) "
            "FROM governance_stage WHERE run_id::text = ANY(%s)",
            ids,
        )[0]
        histogram = dict(
            system.sql(
                "SELECT deliveries, count(*) FROM governance_stage WHERE run_id::text = ANY(%s) "
                "GROUP BY 1 ORDER BY 1",
                ids,
            )
        )
        # How long a run's first stage waited in the queue (enqueued → first claim).
        queue_waits = system.sql(
            "SELECT run_id::text, extract(epoch FROM started_at - enqueued_at) "
            "FROM governance_stage WHERE seq = 1 AND started_at IS NOT NULL "
            "AND run_id::text = ANY(%s)",
            ids,
        )
        most_delivered = system.sql(
            "SELECT id, kind, deliveries, outcome FROM governance_stage "
            "WHERE run_id::text = ANY(%s) ORDER BY deliveries DESC, id LIMIT 3",
            ids,
        )
        executions = worker_executions(system.root / "worker.log")
        outage = [e for e in entries if e["phase"] == "outage"]
        outage_first = Counter(str(e["statuses"][0]) if e["statuses"] else "none" for e in outage)
        outage_non2xx = sum(
            1 for e in outage if not e["statuses"] or e["statuses"][0] not in (200, 202)
        )
        never_accepted = [e for e in entries if not e["run_id"]]
        reruns = [
            s["rerun_after_s"]
            for k in self.kills
            for s in k["stages"]
            if s["rerun_after_s"] is not None
        ]
        never_rerun = [s for k in self.kills for s in k["stages"] if s["how"] in (None, "never")]
        health = self.phase_notes.get("redis", {}).get("healthz", [])
        # Redis back → the last run of phase 3 (queued at the flush, or
        # submitted during the outage) settled; None while one never did.
        phase3 = [e["run_id"] for e in entries if e["run_id"] and e["phase"] in ("redis", "outage")]
        last_settled, unsettled = system.sql(
            "SELECT extract(epoch FROM max(s.settled_at)), count(*) FILTER (WHERE s.id IS NULL) "
            "FROM governance_run r LEFT JOIN governance_settlement s ON s.run_id = r.id "
            "WHERE r.id::text = ANY(%s)",
            phase3,
        )[0]
        return_settled = (
            float(last_settled) - self.broker_back_at
            if self.broker_back_at is not None and last_settled is not None and not unsettled
            else None
        )
        return {
            "intended": len(entries),
            "submitted": len(ids),
            "never_accepted": never_accepted,
            "by_phase": Counter(e["phase"] for e in entries if e["run_id"]),
            "settled": len(outcome),
            "lost": lost,
            "outcomes": Counter(outcome.values()),
            "partial_failed": bad,
            "duplicate_problems": dupes,
            "counts": counts,
            "outbox_open": outbox_open,
            "max_deliveries": deliveries[0],
            "deliveries_total": deliveries[1],
            "stages": deliveries[2],
            "deliveries_histogram": histogram,
            "most_delivered": most_delivered,
            "executions": executions,
            "outage_submits": len(outage),
            "outage_first": outage_first,
            "outage_non2xx": outage_non2xx,
            "healthz_outage": Counter(str(s) for s, _ in health),
            "healthz_outage_names_broker": all("broker" in t for s, t in health if s == 503),
            "healthz_sample": health[0][1] if health else "",
            "kills": len(self.kills),
            "killed_stages": sum(len(k["stages"]) for k in self.kills),
            "kills_hitting_nothing": sum(1 for k in self.kills if not k["stages"]),
            "kill_kinds": Counter(s["kind"] for k in self.kills for s in k["stages"]),
            "reruns": reruns,
            "return_settled_s": return_settled,
            "never_rerun": never_rerun,
            "settle_s": settle_s,
            "queue_wait_by_phase": {
                phase: [float(w) for r, w in queue_waits if phase_of(entries, r) == phase]
                for phase in ("kills", "postgres", "redis", "outage")
            },
            "submit_ms_by_phase": {
                phase: [ms for e in entries if e["phase"] == phase for ms in e["ms"]]
                for phase in ("kills", "postgres", "redis", "outage")
            },
            "settle_by_phase": {
                phase: [float(t) for r, _, _, t in settled_rows if phase_of(entries, r) == phase]
                for phase in ("kills", "postgres", "redis", "outage")
            },
        }


def phase_of(entries: list[dict], run_id: str) -> str | None:
    for entry in entries:
        if entry["run_id"] == run_id:
            return entry["phase"]
    return None


_EXECUTION = re.compile(
    r"Task tasks\.stages\.execute_stage\[[^\]]+\] succeeded in [\d.]+s: '([^']*)'"
)


def worker_executions(path: Path) -> dict[str, int]:
    """Stage executions by what the task returned (celery's INFO lines), plus
    the ones a SIGKILL or an exception ended."""
    counts: Counter = Counter()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    for match in _EXECUTION.finditer(text):
        counts[match.group(1)] += 1
    counts["(worker lost: SIGKILL)"] = len(
        re.findall(r"Task handler raised error: WorkerLostError", text)
    )
    counts["(raised)"] = len(re.findall(r"execute_stage\[[^\]]+\] raised unexpected", text))
    return {k: v for k, v in counts.items() if v}


def log_oddities(system: System, limit: int = 12) -> list[str]:
    """Error lines from the processes' logs, distinct, most frequent first."""
    found: Counter = Counter()
    for name in ("worker", "beat", "web"):
        path = system.root / f"{name}.log"
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if re.search(r"\b(ERROR|CRITICAL|Traceback)\b|WorkerLostError", line):
                text = re.sub(r"\[[0-9a-f-]{36}\]", "[…]", line)
                text = re.sub(r"\d{4}-\d\d-\d\d[ T][\d:,.]+", "", text)
                text = re.sub(r"\b\d+\b", "N", text)
                found[f"{name}: {text.strip()[:220]}"] += 1
    return [f"{n:4d} × {line}" for line, n in found.most_common(limit)]


# --------------------------------------------------------------------------- report


def print_report(probe: Probe, f: dict[str, Any]) -> None:
    args = probe.args
    counts = f["counts"]
    dup_keys = (
        "duplicate_attempts",
        "duplicate_receipts",
        "duplicate_ledger_keys",
        "webhook_duplicate_posts",
        "callback_duplicates",
        "alert_duplicates",
    )
    dup_total = sum(counts.get(k, 0) for k in dup_keys)
    outcomes = f["outcomes"]
    bad = sum(f["partial_failed"].values())
    executions = f["executions"]
    ran = sum(executions.values())
    waiting = executions.get("waiting", 0)
    reruns = f["reruns"]
    settle = f["settle_s"]
    phases = ", ".join(f"{k} {v}" for k, v in sorted(f["by_phase"].items()))
    bad_text = f"{bad} of {f['settled']} ({100 * bad / max(1, f['settled']):.0f} %)"
    if f["partial_failed"]:
        bad_text += ": " + ", ".join(f"{o}/{c} {n}" for (o, c), n in f["partial_failed"].items())
    rows = [
        (
            "runs submitted (accepted, by phase)",
            OLD["submitted"],
            f"{f['submitted']} ({phases})",
            f"{f['intended']}",
        ),
        ("runs settled", "–", str(f["settled"]), str(f["submitted"])),
        ("runs lost (not settled by the end)", OLD["lost"], str(len(f["lost"])), "0"),
        (
            "settled completed / partial / failed / cancelled",
            "–",
            " / ".join(
                str(outcomes.get(o, 0)) for o in ("completed", "partial", "failed", "cancelled")
            ),
            "all completed",
        ),
        (
            "partial or failed because of a fault (providers healthy)",
            OLD["partial_failed"],
            bad_text,
            "0",
        ),
        (
            "duplicate effects (attempts, receipts, ledger keys, webhook POSTs, callbacks, alerts)",
            OLD["duplicates"],
            f"{dup_total} ({', '.join(str(counts.get(k, 0)) for k in dup_keys)}); "
            f"{len(f['duplicate_problems'])} problems",
            "0",
        ),
        (
            "model requests charged with no attempt, not marked unknown",
            OLD["charged_without_attempt"],
            str(counts.get("charged_without_attempt", 0)),
            "0",
        ),
        (
            "model requests marked unknown (cut mid-call: killed or DB gone)",
            OLD["unknown_uses"],
            str(counts.get("ledger_unknown_uses", 0)),
            "1 per cut model call",
        ),
        ("most deliveries of one stage", OLD["max_deliveries"], str(f["max_deliveries"]), "small"),
        (
            "stage executions that were 'waiting'",
            OLD["waiting_share"],
            f"{100 * waiting / max(1, ran):.0f} % ({waiting} of {ran})",
            "–",
        ),
        (
            "submits answered non-2xx during the Redis outage",
            OLD["outage_non2xx"],
            f"{f['outage_non2xx']} of {f['outage_submits']} "
            f"({', '.join(f'{k}×{v}' for k, v in f['outage_first'].items())})",
            "0 (or 503 JSON)",
        ),
        (
            "/healthz during the Redis outage",
            OLD["healthz_outage"],
            ", ".join(f"{k}×{v}" for k, v in f["healthz_outage"].items())
            + (" naming the broker" if f["healthz_outage_names_broker"] else ""),
            "503",
        ),
        (
            "kill → stage running again (min / p50 / max)",
            OLD["kill_rerun"],
            f"{fmt_s(min(reruns) if reruns else None)} / {fmt_s(pct(reruns, 50))} / "
            f"{fmt_s(max(reruns) if reruns else None)} ({len(reruns)} stages, "
            f"{len(f['never_rerun'])} never)",
            "≤ 60 s",
        ),
        (
            "Redis back → last run of the outage phase settled",
            OLD["return_settled"],
            fmt_s(f["return_settled_s"]) if f["return_settled_s"] is not None else "never",
            "≤ 60 s",
        ),
        (
            "settle time, created → settled (p50 / p90 / max)",
            OLD["settle"],
            f"{fmt_s(pct(settle, 50))} / {fmt_s(pct(settle, 90))} / "
            f"{fmt_s(max(settle) if settle else None)}",
            "–",
        ),
    ]
    rows = [(a, b if b is not None else "not reported", c, d) for a, b, c, d in rows]
    header = ("figure", "old code", "now", "want")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print()
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    print("context:")
    print(
        f"  sizes: --runs {args.runs} --threads {args.threads} --kills {args.kills} "
        f"--submit-window {args.submit_window:.0f} s --hook-delay {args.hook_delay} s; "
        f"providers answer after 0.5 / 0.75 / 1.0 s; thread mix "
        f"{dict(Counter(k for _, k in probe.threads))}"
    )
    clocks = ", ".join(
        f"{k.removeprefix('GOVERNANCE_')}={v}" for k, v in probe_settings(args).items()
    )
    print(
        f"  settings: production defaults, {clocks}; "
        f"GOVERNANCE_STAGE_RESEND_AFTER_SECONDS default 120, used {args.resend_after}"
    )
    for need in HARNESS_NEEDS:
        print(f"  harness: {need}")
    print(
        f"  kills: {f['kills']} SIGKILLs, {f['killed_stages']} stages held by the killed "
        f"children ({dict(f['kill_kinds'])}), {f['kills_hitting_nothing']} hit a child "
        f"that had just finished its stage"
    )
    for kill in probe.kills:
        for stage in kill["stages"]:
            print(
                f"    pid {kill['pid']}: {stage['kind']} {stage['stage_id']} → "
                f"{stage['how']} after {fmt_s(stage['rerun_after_s'])} "
                f"({kill['queued_messages']} messages queued at the kill)"
            )
    for s in f["never_rerun"]:
        print(f"  NOT RE-RUN: {s}")
    print(
        f"  deliveries: {f['deliveries_total']} over {f['stages']} stages; "
        f"per stage {f['deliveries_histogram']}; most: "
        + ", ".join(f"{k} {i} ×{d} ({o})" for i, k, d, o in f["most_delivered"])
    )
    print(f"  stage executions by result (worker log): {executions}")
    for phase, values in f["settle_by_phase"].items():
        if values:
            print(
                f"  settle {phase}: n {len(values)}, p50 {fmt_s(pct(values, 50))}, "
                f"p90 {fmt_s(pct(values, 90))}, max {fmt_s(max(values))}"
            )
    for phase, values in f["queue_wait_by_phase"].items():
        if values:
            ms = f["submit_ms_by_phase"][phase]
            print(
                f"  {phase}: first stage enqueued → claimed p50 {fmt_s(pct(values, 50))}, "
                f"max {fmt_s(max(values))}; submit request p50 {pct(ms, 50):.0f} ms, "
                f"max {max(ms):.0f} ms"
            )
    for phase, notes in probe.phase_notes.items():
        shown = {k: v for k, v in notes.items() if k != "healthz"}
        print(f"  phase {phase}: {shown}")
    if f["healthz_sample"]:
        print(f"  /healthz body during the outage: {f['healthz_sample']}")
    print(f"  ledger/other counts: {counts}")
    for (phase, status), (n, body) in sorted(probe.refusals.items()):
        print(f"  submit answered {status} {n}x in phase {phase} (then retried): {body}")
    if f["never_accepted"]:
        sample = [
            (e["phase"], e["statuses"][:5], e.get("error", "")[:120])
            for e in f["never_accepted"][:5]
        ]
        print(f"  NEVER ACCEPTED: {len(f['never_accepted'])} submits: {sample}")
    for run_id in f["lost"][:10]:
        rows = probe.system.stage_rows(run_id)
        print(f"  LOST run {run_id}: {rows}"[:1500])
    for problem in f["duplicate_problems"][:20]:
        print(f"  DUPLICATE: {problem}")
    for line in f["outbox_open"]:
        print(f"  OUTBOX NOT DRAINED: {line}")
    oddities = log_oddities(probe.system)
    if oddities:
        print("  error lines in the logs (distinct, numbers as N):")
        for line in oddities:
            print(f"    {line}")


def probe_settings(args: argparse.Namespace) -> dict[str, str]:
    return {**PRODUCTION_CLOCKS, "GOVERNANCE_STAGE_RESEND_AFTER_SECONDS": str(args.resend_after)}


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300, help="runs of phase 1 (default 300)")
    parser.add_argument("--threads", type=int, default=30, help="threads (default 30)")
    parser.add_argument("--kills", type=int, default=15, help="SIGKILLs in phase 1 (default 15)")
    parser.add_argument(
        "--submit-window",
        type=float,
        default=60.0,
        help="phase 1 submits are spread over this many s (default 60)",
    )
    parser.add_argument(
        "--hook-delay",
        type=float,
        default=1.0,
        help="the webhook receiver answers after this many s (default 1)",
    )
    parser.add_argument(
        "--resend-after",
        type=int,
        default=120,
        help="GOVERNANCE_STAGE_RESEND_AFTER_SECONDS (production default 120)",
    )
    parser.add_argument(
        "--settle-bound",
        type=float,
        default=240.0,
        help="how long a phase waits for its runs to settle (default 240 s)",
    )
    parser.add_argument(
        "--outbox-bound",
        type=float,
        default=120.0,
        help="how long to wait for callbacks and alerts (default 120 s)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the logs and data directory (prints where)"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.threads <= 200 or not args.threads <= args.runs <= 5000:
        parser.error("--threads must be 1-200 and --runs between --threads and 5000")
    if not 0 <= args.kills <= 100 or args.resend_after < 1:
        parser.error("--kills must be 0-100 and --resend-after at least 1")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)

    def on_term(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in background
    if args.keep:
        os.environ["FAULTS_KEEP"] = "1"
    else:
        os.environ.pop("FAULTS_KEEP", None)
    receiver = system = probe = None
    began = time.monotonic()
    try:
        receiver = Receiver(hook_delay_s=args.hook_delay)
        system = System("probe", settings=probe_settings(args))
        system.receiver = receiver
        log(f"starting the system in {system.root}")
        system.start()
        system.seed(
            {"providers": scripts(receiver.url("/hook")), "alert_url": receiver.url("/alert")}
        )
        probe = Probe(system, receiver, args)
        probe.create_threads()
        probe.phase_kills()
        probe.phase_postgres()
        probe.phase_redis()
        log("collecting the figures")
        result = probe.figures()
        print_report(probe, result)
        dupes = sum(
            result["counts"].get(k, 0)
            for k in (
                "duplicate_attempts",
                "duplicate_receipts",
                "duplicate_ledger_keys",
                "webhook_duplicate_posts",
                "callback_duplicates",
                "alert_duplicates",
            )
        )
        print(f"\nprobe took {time.monotonic() - began:.0f} s")
        if dupes or result["duplicate_problems"] or result["lost"] or result["never_accepted"]:
            print("FAILED: duplicate effects, lost runs or refused submits (see above)")
            return 1
        return 0
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    except HarnessError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        if system is not None:
            print(system.logs(60), file=sys.stderr)
        return 2
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if probe is not None:
            probe.close()
        if system is not None:
            system.close()
        if receiver is not None:
            with contextlib.suppress(Exception):
                receiver.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
