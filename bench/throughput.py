"""Benchmark: single-turn runs on the real system (web + 2 workers + beat).

Design under test: ``POST /api/v1/threads/{id}/runs`` writes the run and its
first stage in one transaction and publishes the stage; a Celery worker claims
it, asks the provider once (a loopback OpenAI-compatible server that answers at
once), records the turn, commits the body and settles the run. Everything a
run costs beyond the provider's own latency is governance overhead.

Targets (2 cores):

* N single-turn runs on N fresh threads, submitted concurrently by 16 HTTP
  clients, settle at ≥ 60 runs/s (first submit → the poll that sees the last
  settlement);
* a lone run (one at a time) goes from the client's submit to the client
  holding its settlement in p50 ≤ 25 ms. The client asks once,
  ``GET /api/v1/runs/{id}?wait=10``, which answers when the run settles (how
  the API offers to wait instead of polling); the same runs seen by polling
  ``GET /api/v1/runs/{id}`` every 2 ms are printed beside it (the polls take
  CPU the run needs on two cores);
* governance overhead per model turn (the stage's ``finished_at − started_at``
  minus its provider attempts' ``latency_ms``) p50 ≤ 8 ms;
* the submit request (client-measured) p50 ≤ 10 ms;
* ≤ 6 database commits and ≤ 15 inserted rows per run
  (``pg_stat_database.xact_commit`` / ``tup_inserted`` over the throughput
  window, minus an idle window of the same length measured right after it, so
  beat and heartbeat traffic is not counted; the benchmark's own reads run
  in transactions it rolls back, so they add no commit).

It starts everything itself on loopback: a fresh PostgreSQL database
(``BENCH_DATABASE_URL``, default postgres://postgres@127.0.0.1:5432/
governance_bench, dropped and recreated, dropped again at the end) owned by a
role of its own that may hold at most 64 connections
(``BENCH_DB_CONNECTION_LIMIT``; fewer if the shared server has less room), so
the system under test cannot take the server's connections from its other
users; a Redis database number that it FLUSHDBs (``BENCH_REDIS_URL``, default
redis://127.0.0.1:6379/13); the loopback provider (its own process; it counts
requests); and ``manage.py up --concurrency 2`` with ``DJANGO_DEBUG=0``,
random secrets and ``DJANGO_BEHIND_TLS_PROXY=1`` (the client sends
``X-Forwarded-Proto: https`` like a TLS proxy would). It uses only HTTP,
manage.py and SQL, never the project's modules, so it survives refactorings.

The lone-run latency is what a client sees (submit start → the answer that
shows the settlement); the server's ``Run.created_at → Settlement.settled_at``
is printed beside it. The lone client is one kept-alive connection of the
standard library's http.client: on two cores the client's own CPU is taken
from the system it measures, and httpx costs about three times as much per
run; the report prints the lone runs again with both clients taking turns
run by run, httpx's p50 beside. Before the lone runs, lone runs as measured
but unmeasured (``WARM_UP_LONE_RUNS``): the figures are of a system that has
been serving. Each phase's peak number of database connections, the CPU
used by each process (during the throughput phase in cores, during the lone
runs in milliseconds per run) and the rows per table are printed as context.

Run: .venv/bin/python bench/throughput.py [N] [LONE] [--clients K] [--json]
[--profile OUT] [--keep] (defaults 300, 30 and 16 clients; at most 5000, 500
and 64). ``--profile OUT`` records one worker pool process with py-spy during
the throughput phase (speedscope file OUT) and prints its top functions;
``--keep`` leaves the database and up.log for a post-mortem. Exit 0 whatever
the figures; 1 when the system did not start; 2 when submits failed (the
figures are then over the accepted runs) or runs did not settle in time (what
was stuck is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import multiprocessing
import os
import re
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
MANAGE = str(ROOT / "manage.py")
PYTHON = sys.executable

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/governance_bench"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
PROVIDER_ID = "bench-openai"
CLIENTS = 16  # concurrent HTTP clients in the throughput phase (--clients)
WORKERS = 2  # worker processes (manage.py up --concurrency)
WARM_UP_LONE_RUNS = 30  # lone runs before the measured ones (their statements prepared)
LONE_POLL_S = 0.002  # the polling lone client asks GET /api/v1/runs/{id} this often
LONE_WAIT_S = 10  # the waiting lone client asks GET /api/v1/runs/{id}?wait= this long
SETTLE_POLL_S = 0.01  # the throughput phase polls the settlements (SQL) this often
# A PostgreSQL (15+) backend flushes its statistics when a transaction ends, but at
# most once a second; what is left over waits until it has been idle for 10 s.
STATS_FLUSH_S = 11.5
DB_CONNECTION_LIMIT = int(os.environ.get("BENCH_DB_CONNECTION_LIMIT", "64"))
SETUP_CLIENTS = 2  # threads are created with fewer clients (not measured)
START_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 30.0  # one lone or warm-up run
ANSWER = "The answer is 42."

TARGETS = {
    "runs_per_s": (">=", 60.0),
    "lone_p50_ms": ("<=", 25.0),
    "overhead_p50_ms": ("<=", 8.0),
    "submit_p50_ms": ("<=", 10.0),
    "commits_per_run": ("<=", 6.0),
    "inserts_per_run": ("<=", 15.0),
    # R6.6: a turn waiting behind its thread's turn is woken by that turn's
    # close, not re-sent on a timer (once to park, once when woken).
    "max_deliveries": ("<=", 2.0),
}


def log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- helpers


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_loopback(url: str, what: str) -> None:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK:
        raise BenchError(1, f"{what} must point at a loopback address, not {host!r}")


def with_db(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def with_user(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


TICK = os.sysconf("SC_CLK_TCK")


def proc_table() -> dict[int, tuple[int, float]]:
    """pid → (ppid, CPU seconds used) for every process we can read."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    return table


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / TICK, sum(values) / TICK


def cmdline(pid: int) -> list[bytes]:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


@dataclass
class CpuSample:
    at: float
    machine: tuple[float, float]
    procs: dict[int, tuple[int, float]]


def cpu_sample() -> CpuSample:
    return CpuSample(time.monotonic(), machine_cpu(), proc_table())


def cpu_report(a: CpuSample, b: CpuSample, roles: dict[int, str]) -> dict[str, float]:
    """Cores used between two samples, by role, plus the machine's busy cores."""
    wall = max(b.at - a.at, 1e-9)
    used: dict[str, float] = defaultdict(float)
    for pid, role in roles.items():
        if pid in b.procs:
            start = a.procs.get(pid, (0, 0.0))[1]
            used[role] += (b.procs[pid][1] - start) / wall
    busy = (b.machine[0] - a.machine[0]) / wall
    used["machine busy"] = busy
    used["everything else"] = busy - sum(v for k, v in used.items() if k != "machine busy")
    return dict(used)


def cpu_per_run(a: CpuSample, b: CpuSample, roles: dict[int, str], runs: int) -> dict[str, float]:
    """CPU milliseconds per run between two samples, by role, and the whole
    machine's: steadier than a latency on a noisy VM, and where it went."""
    used: dict[str, float] = defaultdict(float)
    for pid, role in roles.items():
        if pid in b.procs:
            used[role] += (b.procs[pid][1] - a.procs.get(pid, (0, 0.0))[1]) * 1000 / runs
    used["whole machine"] = (b.machine[0] - a.machine[0]) * 1000 / runs
    return dict(used)


# --------------------------------------------------------------------------- loopback provider


class _ProviderHandler(BaseHTTPRequestHandler):
    """OpenAI-compatible chat completions that answer at once (SSE or JSON)."""

    protocol_version = "HTTP/1.1"  # keep-alive, like a real provider
    disable_nagle_algorithm = True  # TCP_NODELAY: no 40 ms delayed-ACK stalls
    wbufsize = -1  # headers and body leave in one write (flushed when the handler ends)
    counts: ClassVar[Counter] = Counter()
    lock: ClassVar[threading.Lock] = threading.Lock()

    def log_message(self, *_args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path != "/_stats":
            self.send_error(404)
            return
        with self.lock:
            body = json.dumps(dict(self.counts)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        began = time.perf_counter()
        try:
            self._post()
        finally:
            with self.lock:
                self.counts["service_us"] += int((time.perf_counter() - began) * 1e6)

    def _post(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.path.endswith("/chat/completions"):
            self.send_error(404)
            return
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            request = {}
        stream = bool(request.get("stream"))
        with self.lock:
            self.counts["requests"] += 1
            self.counts["stream" if stream else "json"] += 1
            self.counts["with_tools"] += 1 if request.get("tools") else 0
        self.reply(request)

    def reply(self, request: dict) -> None:
        """The answer to a chat-completions request (a subclass may answer otherwise)."""
        stream = bool(request.get("stream"))
        model = request.get("model") or "bench-model"
        usage = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
        if not stream:
            body = json.dumps({
                "id": "chatcmpl-bench", "object": "chat.completion", "model": model,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": ANSWER}}],
                "usage": usage,
            }).encode()  # fmt: skip
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "model": model}
        chunks = [
            {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ANSWER},
                                  "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**base, "choices": [], "usage": usage},
        ]  # fmt: skip
        payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        data = payload.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))  # the whole stream at once
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def serve_provider(port_queue, handler: type[_ProviderHandler] | None = None) -> None:
    """Runs in its own process so the benchmark's clients do not share its GIL."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    server = _Server(("127.0.0.1", 0), handler or _ProviderHandler)
    port_queue.put(server.server_address[1])
    server.serve_forever(poll_interval=0.2)


# --------------------------------------------------------------------------- database stats


@dataclass
class Snapshot:
    at: float
    db: dict[str, int]
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    backend_pids: list[int] = field(default_factory=list)


def snapshot(conn: psycopg.Connection) -> Snapshot:
    """Statistics as of now, read in a transaction that is rolled back (no commit)."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
            "FROM pg_stat_database WHERE datname = current_database()"
        )
        row = cur.fetchone()
        cur.execute("SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables")
        tables = {r[0]: {"ins": r[1], "upd": r[2], "del": r[3]} for r in cur.fetchall()}
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
        pids = [r[0] for r in cur.fetchall()]
    conn.rollback()
    names = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")
    return Snapshot(time.monotonic(), dict(zip(names, row, strict=True)), tables, pids)


def delta(a: Snapshot, b: Snapshot) -> tuple[dict[str, int], dict[str, dict[str, int]]]:
    db = {k: b.db[k] - a.db[k] for k in a.db}
    tables = {}
    for name, after in b.tables.items():
        before = a.tables.get(name, {"ins": 0, "upd": 0, "del": 0})
        tables[name] = {k: after[k] - before[k] for k in after}
    return db, tables


class ConnectionWatcher(threading.Thread):
    """Peak number of the system's connections to the bench database, per phase.

    It reads ``pg_stat_activity`` over a connection to the ``postgres``
    database, so its own commits are not counted in the bench database.
    """

    def __init__(self, admin_url: str, db_name: str, role: str) -> None:
        super().__init__(daemon=True)
        self.admin_url, self.db_name, self.role = admin_url, db_name, role
        self.phase = "start-up"
        self.peaks: dict[str, int] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                while not self.stopping.wait(0.05):
                    count = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename = %s",
                        (self.db_name, self.role),
                    ).fetchone()[0]
                    self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), count)
        except psycopg.Error as exc:
            log(f"connection watcher stopped: {exc}")

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)


# --------------------------------------------------------------------------- the system


class System:
    # The loopback provider's request handler (a subclass of _ProviderHandler
    # defined at a module's top level, so the spawned process can import it).
    provider_handler: type[_ProviderHandler] | None = None

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.database_url = database_url
        self.redis_url = redis_url
        self.db_name = urlsplit(database_url).path.lstrip("/")
        # The system runs as its own role, not a superuser, so that the
        # connection limit holds (superusers ignore it) and the shared server
        # keeps connections for everybody else.
        self.app_role = f"{self.db_name}_app"
        self.app_password = secrets.token_hex(16)
        self.app_url = with_user(database_url, self.app_role, self.app_password)
        self.var_dir = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.up: subprocess.Popen | None = None
        self.up_log = self.var_dir / "up.log"
        self.provider_proc = None
        self.provider_port = 0
        self.token = ""
        self.db_created = False
        self.keep = False  # --keep: leave the database and the log for a post-mortem
        self.connection_limit = DB_CONNECTION_LIMIT
        self.watcher: ConnectionWatcher | None = None
        self.env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "dashboard.site.settings",
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
            "GOVERNANCE_CALLBACK_SECRET": secrets.token_urlsafe(32),
            "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
            "DJANGO_BEHIND_TLS_PROXY": "1",
            "DATABASE_URL": self.app_url,
            "REDIS_URL": redis_url,
            "GOVERNANCE_VAR_DIR": str(self.var_dir),
            # The fake provider is plain http on loopback: production's outbound
            # rules refuse it unless listed (a provider's base_url obeys them, R2.5).
            "GOVERNANCE_OUTBOUND_ALLOW": "127.0.0.1",
            "PYTHONUNBUFFERED": "1",
        }
        for name in (
            "CELERY_BROKER_URL",
            "CELERY_RESULT_BACKEND",
            "DJANGO_SECRET_KEY_FILE",
            "GOVERNANCE_CALLBACK_SECRET_FILE",
            "GOVERNANCE_CLOCK_ADJUSTABLE",
        ):
            self.env.pop(name, None)  # fmt: skip

    # ---- database and broker
    def admin_conn(self) -> psycopg.Connection:
        return psycopg.connect(with_db(self.database_url, "postgres"), autocommit=True)

    def conn(self) -> psycopg.Connection:
        return psycopg.connect(self.database_url)

    def fresh_database(self) -> None:
        name = self.db_name
        if not name or not name.replace("_", "").isalnum():
            raise BenchError(1, f"bench database name must be [A-Za-z0-9_]+, not {name!r}")
        role = self.app_role
        with self.admin_conn() as conn:
            room = conn.execute(
                "SELECT current_setting('max_connections')::int - count(*) FROM pg_stat_activity"
            ).fetchone()[0]
            # Leave at least 16 connections to the other users of the server.
            limit = self.connection_limit = max(8, min(DB_CONNECTION_LIMIT, room - 16))
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')
            self.db_created = True
            conn.execute(
                f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
                f"CONNECTION LIMIT {limit} PASSWORD '{self.app_password}'"
            )
            conn.execute(f'CREATE DATABASE "{name}" OWNER "{role}" CONNECTION LIMIT {limit}')
        log(f"database {name} created, owned by role {role} (at most {limit} connections)")
        self.watcher = ConnectionWatcher(with_db(self.database_url, "postgres"), name, role)
        self.watcher.start()

    def drop_database(self) -> None:
        if not self.db_created:
            return
        try:
            with self.admin_conn() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
                conn.execute(f'DROP ROLE IF EXISTS "{self.app_role}"')
            log(f"database {self.db_name} and role {self.app_role} dropped")
        except psycopg.Error as exc:
            log(f"could not drop database {self.db_name}: {exc}")

    def flush_redis(self) -> None:
        import redis

        parts = urlsplit(self.redis_url)
        number = parts.path.lstrip("/") or "0"
        if not number.isdigit() or number == "0":
            raise BenchError(1, f"BENCH_REDIS_URL must name a db number other than 0: {number}")
        client = redis.Redis.from_url(self.redis_url)
        client.flushdb()
        client.close()
        log(f"redis db {number} flushed")

    # ---- manage.py
    def manage(self, *args: str, timeout: float = 180) -> str:
        result = subprocess.run(
            [PYTHON, MANAGE, *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise BenchError(
                1, f"manage.py {' '.join(args)[:80]} failed ({result.returncode}):\n"
                   f"{result.stderr[-3000:]}{result.stdout[-1000:]}",
            )  # fmt: skip
        return result.stdout

    def prepare(self) -> None:
        self.fresh_database()
        self.flush_redis()
        self.manage("migrate", "--noinput")
        log("migrated")
        base_url = f"http://127.0.0.1:{self.provider_port}/v1"
        script = (
            "from django.apps import apps\n"
            "from django.contrib.auth import get_user_model\n"
            "get_user_model().objects.create_user('bench', email='bench@localhost')\n"
            "apps.get_model('governance', 'Provider').objects.create(\n"
            f"    provider_id={PROVIDER_ID!r}, kind='openai', model='bench-model',\n"
            f"    base_url={base_url!r}, connect_timeout_s=5.0, read_timeout_s=30.0)\n"
        )
        self.manage("shell", "-c", script)
        self.token = self.manage(
            "create_api_token", "bench", "--name", "bench", "--role", "agent-client"
        ).strip()
        self.token = self.token.splitlines()[-1].strip()
        log(f"user, token and provider {PROVIDER_ID} → {base_url} created")

    # ---- processes
    def start_provider(self) -> None:
        context = multiprocessing.get_context("spawn")
        port_queue = context.Queue()
        self.provider_proc = context.Process(
            target=serve_provider, args=(port_queue, self.provider_handler)
        )
        self.provider_proc.start()
        self.provider_port = port_queue.get(timeout=30)
        log(f"loopback provider on 127.0.0.1:{self.provider_port} (pid {self.provider_proc.pid})")

    def provider_stats(self) -> dict[str, int]:
        url = f"http://127.0.0.1:{self.provider_port}/_stats"
        return httpx.get(url, timeout=5).json()

    def start_up(self) -> None:
        out = self.up_log.open("wb")
        self.up = subprocess.Popen(
            [PYTHON, MANAGE, "up", "--no-demo-admin", "--host", "127.0.0.1",
             "--port", str(self.port), "--concurrency", str(WORKERS)],
            cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped by us, not by a stray ^C
        )  # fmt: skip
        out.close()
        log(f"manage.py up started (pid {self.up.pid}, port {self.port}, log {self.up_log})")
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.up.poll() is not None:
                raise BenchError(1, f"manage.py up exited with {self.up.returncode}:\n"
                                    f"{self.log_tail()}")  # fmt: skip
            try:
                response = httpx.get(
                    f"{self.base}/healthz", headers={"X-Forwarded-Proto": "https"}, timeout=2
                )
                if response.status_code == 200:
                    log(f"/healthz answers 200: {response.text[:200]}")
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise BenchError(1, f"/healthz did not answer 200 in {START_TIMEOUT_S:.0f} s:\n"
                            f"{self.log_tail()}")  # fmt: skip

    def server_errors(self) -> dict[str, int]:
        """The exceptions the system logged (last line of each traceback), counted."""
        found: Counter = Counter()
        pattern = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")
        try:
            text = self.up_log.read_text(errors="replace")
        except OSError:
            return {}
        for line in text.splitlines():
            if pattern.match(line):
                found[line[:200]] += 1
        return dict(found.most_common(5))

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.up_log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def worker_pool_pids(self) -> list[int]:
        """The prefork pool processes of the Celery worker that up started."""
        if self.up is None:
            return []
        parents: dict[int, list[int]] = defaultdict(list)
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            parents[ppid].append(int(entry.name))
        for pid in parents.get(self.up.pid, []):
            try:
                cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"celery" in b" ".join(cmdline) and b"worker" in cmdline:
                return sorted(parents.get(pid, []))
        return []

    def backend_pids(self) -> list[int]:
        """The PostgreSQL backends serving the bench database now."""
        with psycopg.connect(with_db(self.database_url, "postgres"), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.db_name,)
            ).fetchall()
        return [row[0] for row in rows]

    def roles(self, backend_pids: list[int]) -> dict[int, str]:
        """pid → what it is: web, worker main, worker pool, beat, bench DB backend, bench."""
        roles: dict[int, str] = {os.getpid(): "bench client"}
        if self.provider_proc is not None and self.provider_proc.pid:
            roles[self.provider_proc.pid] = "loopback provider"
        table = proc_table()
        children: dict[int, list[int]] = defaultdict(list)
        for pid, (ppid, _cpu) in table.items():
            children[ppid].append(pid)
        if self.up is not None:
            roles[self.up.pid] = "manage.py up"
            for pid in children.get(self.up.pid, []):
                line = b" ".join(cmdline(pid))
                if b"uvicorn" in line:
                    roles[pid] = "web (uvicorn)"
                elif b"worker" in line:
                    roles[pid] = "worker main"
                    for child in children.get(pid, []):
                        roles[child] = "worker pool (2 processes)"
                elif b"beat" in line:
                    roles[pid] = "beat"
        for pid in backend_pids:
            roles[pid] = "PostgreSQL backends (bench db)"
        return roles

    def stop(self) -> None:
        if self.up is not None and self.up.poll() is None:
            log("stopping manage.py up (SIGTERM)")
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log("up did not stop in 30 s: killing its process group")
        if self.up is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.up.pid, signal.SIGKILL)  # stragglers of the group, if any
        if self.provider_proc is not None and self.provider_proc.is_alive():
            self.provider_proc.terminate()
            self.provider_proc.join(10)
        if self.watcher is not None:
            self.watcher.stop()
        if self.keep:
            log(f"kept database {self.db_name} (role {self.app_role}) and {self.var_dir}")
            return
        self.drop_database()
        with contextlib.suppress(Exception):
            self.flush_redis()
        shutil.rmtree(self.var_dir, ignore_errors=True)


# --------------------------------------------------------------------------- the client


@dataclass
class Answer:
    status_code: int
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)


class KeptAliveHttp:
    """One kept-alive connection through the standard library's http.client,
    for the lone runs: the client's own CPU is taken from the two cores the
    system under test runs on, and httpx costs several times as much per
    request (the report prints the lone runs through httpx beside)."""

    def __init__(self, base: str, headers: dict[str, str], timeout: float = 30) -> None:
        parts = urlsplit(base)
        self.host, self.port, self.timeout = parts.hostname, parts.port, timeout
        self.headers = headers
        self.conn: http.client.HTTPConnection | None = None

    def _request(self, method: str, path: str, body: bytes | None = None) -> Answer:
        headers = dict(self.headers)
        if body is not None:
            headers["Content-Type"] = "application/json"
        reused = self.conn is not None
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
            content = response.read()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.close()
            if not reused:
                raise
            # The server closed the idle kept-alive connection before this
            # request reached it: nothing was done, so it is sent once more.
            return self._request(method, path, body)
        answer_headers = {k.lower(): v for k, v in response.getheaders()}
        return Answer(response.status, answer_headers, content)

    def post(self, path: str, json: dict) -> Answer:
        return self._request("POST", path, _json_bytes(json))

    def get(self, path: str) -> Answer:
        return self._request("GET", path)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _json_bytes(value: dict) -> bytes:
    return json.dumps(value).encode()


class Client:
    def __init__(self, system: System, *, kept_alive: bool = False) -> None:
        headers = {
            "Authorization": f"Bearer {system.token}",
            "X-Forwarded-Proto": "https",  # as the TLS proxy in front would send
        }
        if kept_alive:
            self.http = KeptAliveHttp(system.base, headers)
            return
        self.http = httpx.Client(
            base_url=system.base,
            headers=headers,
            limits=httpx.Limits(max_connections=CLIENTS + 4, max_keepalive_connections=CLIENTS + 4),
            timeout=30,
        )

    def create_thread(self) -> str:
        response = self.http.post(
            "/api/v1/threads", json={"provider_chain": [PROVIDER_ID], "title": "bench"}
        )
        if response.status_code != 201:
            raise BenchError(1, f"POST /api/v1/threads → {response.status_code}: "
                                f"{response.text[:300]}")  # fmt: skip
        return response.json()["id"]

    def submit(self, thread_id: str) -> tuple[str, float, float]:
        """(run id, start on perf_counter, client latency in ms)."""
        start = time.perf_counter()
        response = self.http.post(f"/api/v1/threads/{thread_id}/runs", json={"input": "Hello"})
        latency = (time.perf_counter() - start) * 1000
        if response.status_code != 202:
            kind = response.headers.get("content-type", "")
            detail = response.text[:200] if "json" in kind else kind
            raise BenchError(2, f"POST /api/v1/threads/{{id}}/runs → {response.status_code} "
                                f"({detail})")  # fmt: skip
        return response.json()["run_id"], start, latency

    def wait_settled(
        self, run_id: str, timeout: float = RUN_TIMEOUT_S, *, poll: bool = False
    ) -> tuple[dict, int]:
        """GET /api/v1/runs/{id}?wait= until settled, or with ``poll`` a plain
        GET every LONE_POLL_S: (the run, requests)."""
        deadline = time.perf_counter() + timeout
        polls = 0
        address = f"/api/v1/runs/{run_id}" + ("" if poll else f"?wait={LONE_WAIT_S}")
        while True:
            response = self.http.get(address)
            polls += 1
            if response.status_code == 200:
                body = response.json()
                if body.get("status") == "settled" and body.get("settlement"):
                    return body, polls
            if time.perf_counter() > deadline:
                raise BenchError(2, f"run {run_id} not settled after {timeout:.0f} s "
                                    f"(last answer {response.status_code}: "
                                    f"{response.text[:300]})")  # fmt: skip
            if poll:
                time.sleep(LONE_POLL_S)

    def close(self) -> None:
        self.http.close()


# --------------------------------------------------------------------------- phases


def parallel_threads(client: Client, count: int, clients: int = SETUP_CLIENTS) -> list[str]:
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda _i: client.create_thread(), range(count)))


def warm_up(client: Client, lone_client: Client) -> None:
    """A few concurrent runs so both pool processes have imported everything,
    then lone runs as measured, unmeasured: the figures are of a system that
    has been serving (each pooled connection has prepared its statements —
    psycopg prepares one at its second use on a connection —, the listener
    listens, the interpreter's caches are warm), not of its first minute."""
    threads = parallel_threads(client, 2 * WORKERS)
    with ThreadPoolExecutor(2 * WORKERS) as pool:
        runs = list(pool.map(lambda t: client.submit(t)[0], threads))
        list(pool.map(client.wait_settled, runs))
    for thread_id in parallel_threads(client, WARM_UP_LONE_RUNS):
        lone_client.wait_settled(lone_client.submit(thread_id)[0])
    log(f"warm-up: {len(runs)} concurrent runs and {WARM_UP_LONE_RUNS} lone runs settled")


def lone_phase(system: System, client: Client, count: int, *, poll: bool = False) -> dict:
    threads = [client.create_thread() for _ in range(count)]
    log(f"lone: {count} threads created")
    run_ids, settle_ms, submit_ms, polls, walls = [], [], [], [], []
    cpu_before = cpu_sample()
    for thread_id in threads:
        wall = time.time()  # the server's timestamps are on this machine's wall clock
        run_id, start, latency = client.submit(thread_id)
        _body, n = client.wait_settled(run_id, poll=poll)
        settle_ms.append((time.perf_counter() - start) * 1000)
        walls.append((wall, wall + latency / 1000, wall + settle_ms[-1] / 1000))
        submit_ms.append(latency)
        polls.append(n)
        run_ids.append(run_id)
    cpu_after = cpu_sample()
    how = f"polling every {LONE_POLL_S * 1000:g} ms" if poll else f"?wait={LONE_WAIT_S}"
    log(f"lone ({how}): {count} runs settled, p50 {pct(settle_ms, 50):.1f} ms")
    return {
        "run_ids": run_ids, "settle_ms": settle_ms, "submit_ms": submit_ms, "polls": polls,
        "walls": walls,
        "cpu_ms": cpu_per_run(cpu_before, cpu_after, system.roles(system.backend_pids()), count),
    }  # fmt: skip


def client_comparison(clients: dict[str, Client], count: int) -> dict[str, dict[str, float]]:
    """Lone runs again, the clients taking turns run by run (the machine's
    drift hits each alike): each one's p50 and its own CPU per run."""
    names = list(clients)
    threads = [clients[names[0]].create_thread() for _ in range(count * len(names))]
    settle: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, float] = defaultdict(float)
    for index, thread_id in enumerate(threads):
        name = names[index % len(names)]
        client, used = clients[name], time.thread_time()
        run_id, start, _latency = client.submit(thread_id)
        client.wait_settled(run_id)
        settle[name].append((time.perf_counter() - start) * 1000)
        cpu[name] += (time.thread_time() - used) * 1000
    log("lone, the clients taking turns: " + ", ".join(
        f"{name} p50 {pct(settle[name], 50):.1f} ms" for name in names))  # fmt: skip
    return {
        name: {"p50_ms": pct(settle[name], 50), "cpu_ms": cpu[name] / len(settle[name])}
        for name in names
    }


def throughput_phase(
    system: System, client: Client, count: int, profile: str | None, thread_count: int
) -> dict:
    system.watcher.phase = "thread creation"
    threads = parallel_threads(client, thread_count)
    log(
        f"throughput: {thread_count} threads created for {count} runs; "
        f"waiting {STATS_FLUSH_S:.0f} s for quiet stats"
    )
    system.watcher.phase = "quiet"
    stats_conn, poll_conn = system.conn(), system.conn()
    provider_before = system.provider_stats()
    time.sleep(STATS_FLUSH_S)
    spy = start_profile(system, profile)
    before = snapshot(stats_conn)
    cpu_before = cpu_sample()
    results: list = [None] * count
    errors: Counter = Counter()

    def submit(index: int) -> None:
        try:
            results[index] = client.submit(threads[index % len(threads)])
        except Exception as exc:  # a failed submit is counted, not fatal to the others
            errors[str(exc).split("\n", 1)[0][:160]] += 1

    system.watcher.phase = "throughput"
    first = time.perf_counter()
    pool = ThreadPoolExecutor(CLIENTS)
    futures = [pool.submit(submit, index) for index in range(count)]
    # Poll the settlements inside one read transaction that is rolled back at
    # the end: READ COMMITTED sees each new commit, and no commit is added.
    timeout = max(120.0, count / 2)
    settled = 0
    last = first
    milestones: dict[int, float] = {}  # share of the N runs settled → seconds
    with poll_conn.cursor() as cur:
        while True:
            cur.execute(
                "SELECT count(*) FROM governance_settlement s JOIN governance_run r "
                "ON r.id = s.run_id WHERE r.thread_id = ANY(%s::uuid[])",
                (threads,),
            )
            settled = cur.fetchone()[0]
            last = time.perf_counter()
            for share in (50, 90, 99):
                if share not in milestones and settled * 100 >= share * count:
                    milestones[share] = last - first
            submitted = all(f.done() for f in futures)
            if submitted and settled >= sum(1 for r in results if r is not None):
                break
            if last - first > timeout:
                break
            time.sleep(SETTLE_POLL_S)
    cpu_after = cpu_sample()
    poll_conn.rollback()
    pool.shutdown(wait=True)
    elapsed = last - first
    accepted = [r for r in results if r is not None]
    system.watcher.phase = "flush and idle baseline"
    stop_profile(spy)
    if settled < len(accepted):
        stats_conn.close()
        poll_conn.close()
        raise BenchError(
            2, f"{settled} of {len(accepted)} accepted runs settled within {timeout:.0f} s "
               f"({count - len(accepted)} submits failed: {dict(errors)})\n"
               f"{describe_stuck(system, threads)}",
        )  # fmt: skip
    log(f"throughput: {settled}/{count} settled in {elapsed:.2f} s; "
        f"waiting {STATS_FLUSH_S:.0f} s for the stats to flush")  # fmt: skip
    if errors:
        log(f"throughput: {sum(errors.values())} submits failed: {dict(errors)}")
    time.sleep(STATS_FLUSH_S)
    after = snapshot(stats_conn)
    window = after.at - before.at
    provider_after = system.provider_stats()
    log(f"idle baseline: {window:.1f} s with no runs")
    time.sleep(window)
    idle = snapshot(stats_conn)
    stats_conn.close()
    poll_conn.close()
    roles = system.roles(sorted(set(before.backend_pids) | set(after.backend_pids)))
    busy_db, busy_tables = delta(before, after)
    idle_db, idle_tables = delta(after, idle)
    return {
        "run_ids": [r[0] for r in accepted],
        "submit_ms": [r[2] for r in accepted],
        "accepted": len(accepted),
        "submit_errors": dict(errors),
        "server_errors": system.server_errors(),
        "elapsed_s": elapsed,
        "threads": len(threads),
        "milestones_s": milestones,
        "window_s": window,
        "idle_window_s": idle.at - after.at,
        "busy_db": busy_db,
        "idle_db": idle_db,
        "busy_tables": busy_tables,
        "idle_tables": idle_tables,
        "provider_requests": provider_after.get("requests", 0) - provider_before.get("requests", 0),
        "provider_stream": provider_after.get("stream", 0) - provider_before.get("stream", 0),
        "provider_service_us": provider_after.get("service_us", 0)
        - provider_before.get("service_us", 0),
        "cpu_cores": cpu_report(cpu_before, cpu_after, roles),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def describe_stuck(system: System, threads: list[str]) -> str:
    lines = []
    with system.conn() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT r.status, count(*) FROM governance_run r LEFT JOIN governance_settlement s "
            "ON s.run_id = r.id WHERE r.thread_id = ANY(%s::uuid[]) AND s.id IS NULL "
            "GROUP BY r.status",
            (threads,),
        )
        lines.append(f"unsettled runs by status: {dict(cur.fetchall())}")
        cur.execute(
            "SELECT r.id, r.status, st.seq, st.kind, st.deliveries, st.enqueued_at, "
            "st.started_at, st.finished_at, st.claimed_at, st.outcome, left(st.detail, 120) "
            "FROM governance_run r JOIN governance_stage st ON st.run_id = r.id "
            "LEFT JOIN governance_settlement s ON s.run_id = r.id "
            "WHERE r.thread_id = ANY(%s::uuid[]) AND s.id IS NULL ORDER BY r.created_at, st.seq "
            "LIMIT 20",
            (threads,),
        )
        for row in cur.fetchall():
            lines.append("  " + " | ".join(str(v) for v in row))
        conn.rollback()
    lines.append("manage.py up log (tail):\n" + system.log_tail(30))
    return "\n".join(lines)


# --------------------------------------------------------------------------- facts (SQL)


TIMELINE_STEPS = (
    "submit→Run.created_at",
    "created→stage enqueued",
    "enqueued→started",
    "started→finished",
    "finished→settled",
    "settled→answer in hand",
)


def lone_timeline(system: System, run_ids: list[str], walls: list[tuple]) -> dict[str, float]:
    """p50 of each hop of a lone run, from the client's wall clock and the rows'
    timestamps (one machine, one clock): where the client's wait goes."""
    with system.conn() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT r.id::text, extract(epoch FROM r.created_at), "
            "extract(epoch FROM st.enqueued_at), extract(epoch FROM st.started_at), "
            "extract(epoch FROM st.finished_at), extract(epoch FROM s.settled_at) "
            "FROM governance_run r JOIN governance_settlement s ON s.run_id = r.id "
            "JOIN governance_stage st ON st.run_id = r.id AND st.seq = 1 "
            "WHERE r.id = ANY(%s::uuid[])",
            (run_ids,),
        )
        rows = {row[0]: [float(v) for v in row[1:]] for row in cur.fetchall()}
        conn.rollback()
    hops: dict[str, list[float]] = defaultdict(list)
    for run_id, (sent, _answered, held) in zip(run_ids, walls, strict=True):
        if run_id not in rows:
            continue
        points = [sent, *rows[run_id], held]
        for name, a, b in zip(TIMELINE_STEPS, points, points[1:], strict=False):
            hops[name].append((b - a) * 1000)
    return {name: pct(values, 50) for name, values in hops.items()}


def run_facts(system: System, run_ids: list[str]) -> dict:
    """Per run: server created→settled, model-turn execution, provider latency, stages."""
    with system.conn() as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT r.id::text, extract(epoch FROM s.settled_at - r.created_at) * 1000, "
            "s.outcome FROM governance_run r JOIN governance_settlement s ON s.run_id = r.id "
            "WHERE r.id = ANY(%s::uuid[])",
            (run_ids,),
        )
        settle = {row[0]: (float(row[1]), row[2]) for row in cur.fetchall()}
        cur.execute(
            "SELECT st.run_id::text, st.kind, st.deliveries, st.outcome, "
            "extract(epoch FROM st.finished_at - st.started_at) * 1000, "
            "extract(epoch FROM st.started_at - st.enqueued_at) * 1000, "
            "(SELECT coalesce(sum(a.latency_ms), 0) FROM governance_providerattempt a "
            " WHERE a.stage_id = st.id), "
            "(SELECT count(*) FROM governance_providerattempt a WHERE a.stage_id = st.id) "
            "FROM governance_stage st WHERE st.run_id = ANY(%s::uuid[])",
            (run_ids,),
        )
        stages = cur.fetchall()
        conn.rollback()
    overhead, execution, queue, provider = [], [], [], []
    provider_per_run: dict[str, float] = defaultdict(float)
    kinds, deliveries, outcomes, attempts = Counter(), Counter(), Counter(), Counter()
    for run_id, kind, delivered, outcome, exec_ms, queue_ms, latency_ms, n_attempts in stages:
        kinds[kind] += 1
        deliveries[delivered] += 1
        outcomes[f"{kind}:{outcome or '-'}"] += 1
        attempts[n_attempts] += 1
        queue.append(float(queue_ms or 0))
        provider_per_run[run_id] += float(latency_ms)
        if kind in ("model_turn", "finalization") and exec_ms is not None:
            execution.append(float(exec_ms))
            provider.append(float(latency_ms))
            overhead.append(float(exec_ms) - float(latency_ms))
    server = [settle[r][0] for r in run_ids if r in settle]
    run_overhead = [settle[r][0] - provider_per_run[r] for r in run_ids if r in settle]
    return {
        "server_settle_ms": server,
        "run_overhead_ms": run_overhead,
        "turn_overhead_ms": overhead,
        "turn_execution_ms": execution,
        "provider_latency_ms": provider,
        "queue_ms": queue,
        "stages_per_run": sum(kinds.values()) / max(1, len(run_ids)),
        "stage_kinds": dict(kinds),
        "deliveries": {str(k): v for k, v in sorted(deliveries.items())},
        "stage_outcomes": dict(outcomes),
        "attempts_per_stage": {str(k): v for k, v in sorted(attempts.items())},
        "settlements": dict(Counter(settle[r][1] for r in run_ids if r in settle)),
    }


# --------------------------------------------------------------------------- profile


def start_profile(system: System, out: str | None):
    if not out:
        return None
    pids = system.worker_pool_pids()
    spy = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
    if not pids or not Path(spy).exists():
        log(f"cannot profile: pool pids {pids}, py-spy at {spy}")
        return None
    pid = pids[0]
    command = [spy, "record", "--pid", str(pid), "--format", "speedscope", "--output", out,
               "--rate", "250", "--idle", "--function", "--nonblocking"]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # attach before the load starts
    log(f"py-spy recording worker pool process {pid} (of {pids}) → {out}")
    return proc, out, pid


def stop_profile(spy) -> None:
    if spy is None:
        return
    proc, out, _pid = spy
    proc.send_signal(signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
    if not Path(out).exists():
        log(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")


TASK_ANCHORS = ("fast_trace_task", "trace_task", "execute_stage")


def _short(file: str) -> str:
    for marker in ("/site-packages/", f"{ROOT}/", "/lib/python3.11/", "/lib/python3"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def summarize_profile(path: str, top: int = 25) -> list[str]:
    """Top functions inside the worker's task execution by inclusive (own +
    children) wall time, from a py-spy speedscope file recorded with --idle.

    Percentages are of the time the pool process spent inside a task (from
    Celery's task tracer down), so waiting on PostgreSQL, Redis and the
    provider counts where it happens.
    """
    data = json.loads(Path(path).read_text())
    frames = data["shared"]["frames"]
    profiles = [p for p in data["profiles"] if p.get("samples")]
    if not profiles:
        return ["(no samples)"]
    main = next((p for p in profiles if "MainThread" in p.get("name", "")), profiles[0])
    samples = main["samples"]
    weights = main.get("weights") or [1] * len(samples)
    total = sum(weights)

    def key(index: int) -> tuple[str, str]:
        frame = frames[index]
        return frame.get("name", "?"), f"{_short(frame.get('file') or '')}:{frame.get('line', '?')}"

    inclusive: Counter = Counter()
    own: Counter = Counter()
    packages: Counter = Counter()
    in_task = 0.0
    for stack, weight in zip(samples, weights, strict=True):
        anchor = next(
            (i for i, f in enumerate(stack) if frames[f].get("name") in TASK_ANCHORS), None
        )
        if anchor is None:
            continue
        in_task += weight
        for name in {key(i) for i in stack[anchor:]}:
            inclusive[name] += weight
        leaf = frames[stack[-1]]
        own[key(stack[-1])] += weight
        file = _short(leaf.get("file") or "")
        packages[file.split("/", 1)[0] if "/" in file else file] += weight
    if not in_task:
        return [f"(no samples inside a task among {len(samples)})"]
    lines = [
        f"pool process main thread: {len(samples)} samples over {total:.1f} s; inside a task "
        f"{100 * in_task / total:.1f} % (the rest waits for the next task)",
        "percentages of the time inside tasks (wall time: waiting on I/O counts)",
        f"{'incl %':>7} {'own %':>6}  function  (file:first line)",
    ]
    for name, weight in inclusive.most_common(top):
        incl, mine = 100 * weight / in_task, 100 * own[name] / in_task
        lines.append(f"{incl:7.1f} {mine:6.1f}  {name[0]}  ({name[1]})")
    lines.append("own time by top-level package / file:")
    for name, weight in packages.most_common(12):
        lines.append(f"{100 * weight / in_task:7.1f}  {name}")
    return lines


# --------------------------------------------------------------------------- report


def figures(
    system: System, n: int, lone: dict, lone_facts: dict, load: dict, load_facts: dict
) -> dict:
    idle_scale = load["window_s"] / max(load["idle_window_s"], 1e-9)

    def per_run(key: str) -> float:
        busy = load["busy_db"][key]
        idle = load["idle_db"][key] * idle_scale
        return (busy - idle) / n

    return {
        "max_deliveries": float(max((int(k) for k in load_facts["deliveries"]), default=0)),
        "runs_per_s": n / load["elapsed_s"],
        "lone_p50_ms": pct(lone["settle_ms"], 50),
        "lone_p95_ms": pct(lone["settle_ms"], 95),
        "overhead_p50_ms": pct(lone_facts["turn_overhead_ms"], 50),
        "submit_p50_ms": pct(lone["submit_ms"], 50),
        "commits_per_run": per_run("xact_commit"),
        "inserts_per_run": per_run("tup_inserted"),
        # context
        "updates_per_run": per_run("tup_updated"),
        "deletes_per_run": per_run("tup_deleted"),
        "rollbacks_per_run": per_run("xact_rollback"),
        "lone_server_p50_ms": pct(lone_facts["server_settle_ms"], 50),
        "lone_server_p95_ms": pct(lone_facts["server_settle_ms"], 95),
        "lone_run_overhead_p50_ms": pct(lone_facts["run_overhead_ms"], 50),
        "lone_provider_p50_ms": pct(lone_facts["provider_latency_ms"], 50),
        "lone_turn_execution_p50_ms": pct(lone_facts["turn_execution_ms"], 50),
        "lone_queue_p50_ms": pct(lone_facts["queue_ms"], 50),
        "lone_submit_p95_ms": pct(lone["submit_ms"], 95),
        "lone_polls_p50": pct(lone["polls"], 50),
        "lone_polling_p50_ms": pct(lone["polling"]["settle_ms"], 50),
        "lone_cpu_ms": lone["cpu_ms"],
        "lone_clients": lone["clients"],
        "lone_polling_p95_ms": pct(lone["polling"]["settle_ms"], 95),
        "lone_polling_polls_p50": pct(lone["polling"]["polls"], 50),
        "lone_polling_submit_p50_ms": pct(lone["polling"]["submit_ms"], 50),
        "load_submit_p50_ms": pct(load["submit_ms"], 50),
        "load_submit_p95_ms": pct(load["submit_ms"], 95),
        "load_overhead_p50_ms": pct(load_facts["turn_overhead_ms"], 50),
        "load_server_p50_ms": pct(load_facts["server_settle_ms"], 50),
        "load_server_p95_ms": pct(load_facts["server_settle_ms"], 95),
        "provider_requests_per_run": load["provider_requests"] / n,
        "provider_stream_requests": load["provider_stream"],
        "provider_service_ms": load["provider_service_us"]
        / 1000
        / max(1, load["provider_requests"]),
        **reference_costs(system),
    }


def machine_speed_ms() -> float:
    """A fixed piece of pure-Python work, timed (median of 5): the machine's own
    speed, printed before and after the run. A shared VM's speed can change by
    half from one minute to the next, and every figure above moves with it."""
    times = []
    for _ in range(5):
        start = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def reference_costs(system: System) -> dict[str, float]:
    """What a provider call costs on this machine outside the system (medians of 20)."""
    url = f"http://127.0.0.1:{system.provider_port}/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    build, fresh, kept = [], [], []
    with httpx.Client(timeout=5) as reused:
        for _ in range(20):
            start = time.perf_counter()
            client = httpx.Client(timeout=5)
            build.append((time.perf_counter() - start) * 1000)
            client.close()
            for close, into in ((True, fresh), (False, kept)):
                headers = {"Connection": "close"} if close else {}
                start = time.perf_counter()
                with reused.stream("POST", url, json=body, headers=headers) as response:
                    response.read()
                into.append((time.perf_counter() - start) * 1000)
    return {
        "httpx_client_build_ms": pct(build, 50),
        "provider_round_trip_ms": pct(kept, 50),
        "provider_round_trip_new_connection_ms": pct(fresh, 50),
        **server_round_trips(system),
    }


def server_round_trips(system: System) -> dict[str, float]:
    """What PostgreSQL and Redis cost on this machine outside the system (medians
    of 50): two VMs at the same pure-Python speed have differed by half on every
    hop, and this line says whether the servers themselves were the difference.
    Read after the throughput window's counters, so its own commits are not
    counted as the system's."""
    import redis

    select, transaction, ping = [], [], []
    with system.conn() as conn:
        conn.autocommit = True
        conn.execute("CREATE TABLE bench_probe (n int PRIMARY KEY, seen int)")
        try:
            for n in range(50):
                start = time.perf_counter()
                conn.execute("SELECT 1").fetchone()
                select.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                with conn.transaction():
                    conn.execute("INSERT INTO bench_probe VALUES (%s, 0)", [n])
                    conn.execute("UPDATE bench_probe SET seen = seen + 1 WHERE n = %s", [n])
                    conn.execute("SELECT seen FROM bench_probe WHERE n = %s", [n]).fetchone()
                transaction.append((time.perf_counter() - start) * 1000)
        finally:
            conn.execute("DROP TABLE bench_probe")
    broker = redis.Redis.from_url(system.redis_url)
    try:
        for _ in range(50):
            start = time.perf_counter()
            broker.ping()
            ping.append((time.perf_counter() - start) * 1000)
    finally:
        broker.close()
    return {
        "postgresql_round_trip_ms": pct(select, 50),
        "postgresql_transaction_ms": pct(transaction, 50),
        "redis_round_trip_ms": pct(ping, 50),
    }


def ok(name: str, value: float | None) -> str:
    op, target = TARGETS[name]
    if value is None:
        return "MISSING"
    met = value >= target if op == ">=" else value <= target
    return "ok" if met else "MISSING"


def print_report(n: int, lone_n: int, f: dict, load: dict, lone_facts, load_facts) -> None:
    rows = [
        (f"single-turn runs settled per second ({n} runs, {load['threads']} threads, "
         f"{CLIENTS} clients)",
         f"{f['runs_per_s']:.1f} /s", "≥ 60 /s", ok("runs_per_s", f["runs_per_s"])),
        (f"lone run, client submit → settlement in hand ({lone_n} sequential, ?wait=)",
         f"p50 {fmt_ms(f['lone_p50_ms'])}, p95 {fmt_ms(f['lone_p95_ms'])}", "p50 ≤ 25 ms",
         ok("lone_p50_ms", f["lone_p50_ms"])),
        ("governance overhead per turn (stage exec − provider latency), p50, lone runs",
         fmt_ms(f["overhead_p50_ms"]), "≤ 8 ms", ok("overhead_p50_ms", f["overhead_p50_ms"])),
        ("POST /api/v1/threads/{id}/runs, client-measured p50, lone runs",
         fmt_ms(f["submit_p50_ms"]), "≤ 10 ms", ok("submit_p50_ms", f["submit_p50_ms"])),
        ("database commits per run (xact_commit, idle baseline subtracted)",
         f"{f['commits_per_run']:.2f}", "≤ 6", ok("commits_per_run", f["commits_per_run"])),
        ("rows inserted per run (tup_inserted, idle baseline subtracted)",
         f"{f['inserts_per_run']:.2f}", "≤ 15", ok("inserts_per_run", f["inserts_per_run"])),
        ("most deliveries of one stage (throughput phase)",
         f"{f['max_deliveries']:.0f}", "≤ 2", ok("max_deliveries", f["max_deliveries"])),
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    header = ("figure", "measured", "target", "ok")
    widths = [max(w, len(h)) for w, h in zip(widths, header, strict=True)]
    line = " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    print("context:")
    print(
        f"  lone run server-side (Run.created_at → Settlement.settled_at): "
        f"p50 {fmt_ms(f['lone_server_p50_ms'])}, p95 {fmt_ms(f['lone_server_p95_ms'])}; "
        f"created→settled minus provider latency p50 {fmt_ms(f['lone_run_overhead_p50_ms'])}"
    )
    print(
        "  lone run hop by hop, p50 (client wall clock and row timestamps): "
        + ", ".join(f"{k} {v:.1f} ms" for k, v in lone_facts["timeline"].items())
    )
    cpu = f["lone_cpu_ms"]
    print(
        f"  the lone runs' client is one kept-alive http.client connection; {lone_n} more "
        "of each, the clients taking turns run by run: "
        + "; ".join(
            f"{name} p50 {fmt_ms(c['p50_ms'])}, its own CPU {c['cpu_ms']:.1f} ms per run"
            for name, c in f["lone_clients"].items()
        )
    )
    print(
        "  lone run CPU, ms per run (?wait=; /proc): "
        + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items() if k != "whole machine" and v >= 0.05)
        + f"; whole machine {cpu['whole machine']:.1f}"
    )
    print(
        f"  lone turn: stage started→finished p50 {fmt_ms(f['lone_turn_execution_p50_ms'])}, "
        f"provider latency_ms p50 {fmt_ms(f['lone_provider_p50_ms'])}, "
        f"stage queue (enqueued→started) p50 {fmt_ms(f['lone_queue_p50_ms'])}; "
        f"submit p95 {fmt_ms(f['lone_submit_p95_ms'])}; GET requests per run p50 "
        f"{f['lone_polls_p50']}"
    )
    print(
        f"  lone run seen by polling GET every {LONE_POLL_S * 1000:g} ms instead of ?wait= "
        f"({lone_n} more runs): p50 {fmt_ms(f['lone_polling_p50_ms'])}, "
        f"p95 {fmt_ms(f['lone_polling_p95_ms'])}; {f['lone_polling_polls_p50']} polls per run; "
        f"submit p50 {fmt_ms(f['lone_polling_submit_p50_ms'])}"
    )
    print(
        f"  under load: submit p50 {fmt_ms(f['load_submit_p50_ms'])}, "
        f"p95 {fmt_ms(f['load_submit_p95_ms'])}; overhead per turn p50 "
        f"{fmt_ms(f['load_overhead_p50_ms'])}; server created→settled p50 "
        f"{fmt_ms(f['load_server_p50_ms'])}, p95 {fmt_ms(f['load_server_p95_ms'])}"
    )
    marks = ", ".join(f"{k} % at {v:.2f} s" for k, v in load["milestones_s"].items())
    print(f"  throughput phase: settled {marks}, all {n} at {load['elapsed_s']:.2f} s")
    print(
        f"  provider requests per run: {f['provider_requests_per_run']:.2f} "
        f"({f['provider_stream_requests']} with stream: true); the loopback server spends "
        f"{f['provider_service_ms']:.2f} ms per request"
    )
    print(
        f"  reference outside the system: one streamed round trip to the loopback provider "
        f"{fmt_ms(f['provider_round_trip_ms'])} kept alive, "
        f"{fmt_ms(f['provider_round_trip_new_connection_ms'])} on a new connection; building "
        f"an httpx.Client() {fmt_ms(f['httpx_client_build_ms'])} (p50 of 20 each); "
        f"PostgreSQL SELECT 1 {f['postgresql_round_trip_ms']:.2f} ms, a committed "
        f"transaction of three statements {f['postgresql_transaction_ms']:.2f} ms, "
        f"Redis PING {f['redis_round_trip_ms']:.2f} ms (p50 of 50 each)"
    )
    before, after = f["machine_speed_ms"]
    print(
        f"  this machine's speed: 10^6 additions in pure Python took {before:.1f} ms before "
        f"the run and {after:.1f} ms after it (median of 5; compare runs only at like speeds)"
    )
    print(
        f"  stages per run {load_facts['stages_per_run']:.2f}: {load_facts['stage_kinds']}; "
        f"deliveries per stage {load_facts['deliveries']}; attempts per stage "
        f"{load_facts['attempts_per_stage']}"
    )
    print(
        f"  stage outcomes {load_facts['stage_outcomes']}; settlements {load_facts['settlements']}"
    )
    busy, idle = load["busy_db"], load["idle_db"]
    print(
        f"  throughput window {load['window_s']:.1f} s (incl. {STATS_FLUSH_S:.0f} s for the "
        f"stats to flush): commits {busy['xact_commit']}, inserted {busy['tup_inserted']}, "
        f"updated {busy['tup_updated']}, deleted {busy['tup_deleted']}, rollbacks "
        f"{busy['xact_rollback']}"
    )
    print(
        f"  idle baseline {load['idle_window_s']:.1f} s: commits {idle['xact_commit']}, "
        f"inserted {idle['tup_inserted']}, updated {idle['tup_updated']} (subtracted)"
    )
    print(
        f"  per run also: {f['updates_per_run']:.2f} rows updated, "
        f"{f['deletes_per_run']:.2f} deleted, {f['rollbacks_per_run']:.2f} rollbacks"
    )
    cores = ", ".join(f"{k} {v:.2f}" for k, v in load["cpu_cores"].items())
    print(f"  CPU cores used during the throughput phase ({os.cpu_count()} cores): {cores}")
    print(f"  load average after the phase: {' '.join(load['loadavg'])}")
    peaks = ", ".join(f"{k} {v}" for k, v in load.get("connection_peaks", {}).items())
    print(f"  peak connections of the system to its database by phase: {peaks} "
          f"(its role may hold {load.get('connection_limit')})")  # fmt: skip
    per_table = []
    for name, d in load["busy_tables"].items():
        i = load["idle_tables"].get(name, {"ins": 0, "upd": 0, "del": 0})
        ins, upd = (d["ins"] - i["ins"]) / n, (d["upd"] - i["upd"]) / n
        if ins or upd:
            per_table.append((name, ins, upd))
    per_table.sort(key=lambda t: -(t[1] + t[2]))
    print("  rows per run by table (inserted / updated):")
    for name, ins, upd in per_table:
        print(f"    {name:<40} {ins:6.2f} / {upd:6.2f}")


# --------------------------------------------------------------------------- main


def bench_urls(database_default: str, redis_default: str) -> tuple[str, str]:
    """``BENCH_DATABASE_URL`` and ``BENCH_REDIS_URL`` (or the bench's defaults), on loopback."""
    database_url = os.environ.get("BENCH_DATABASE_URL", database_default)
    redis_url = os.environ.get("BENCH_REDIS_URL", redis_default)
    require_loopback(database_url, "BENCH_DATABASE_URL")
    require_loopback(redis_url, "BENCH_REDIS_URL")
    return database_url, redis_url


def interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt, so the system is stopped."""

    def on_term(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    # Also when started in the background, where a shell leaves SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=int, default=300, help="N (default 300)")
    parser.add_argument("lone", nargs="?", type=int, default=30, help="lone runs (default 30)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="keep the database and up.log at the end"
    )
    parser.add_argument(
        "--clients", type=int, default=CLIENTS, help=f"concurrent submitters (default {CLIENTS})"
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="threads the N runs share (default N: one run each; fewer makes turns wait)",
    )  # fmt: skip
    parser.add_argument("--profile", metavar="OUT", help="py-spy one worker (speedscope file)")
    args = parser.parse_args(argv)
    if not 1 <= args.runs <= 5000 or not 1 <= args.lone <= 500 or not 1 <= args.clients <= 64:
        parser.error("N must be 1-5000, LONE 1-500 and --clients 1-64")
    args.threads = args.runs if args.threads is None else args.threads
    if not 1 <= args.threads <= args.runs:
        parser.error("--threads must be 1-N")
    return args


def main(argv: list[str]) -> int:
    global CLIENTS
    args = parse_args(argv)
    CLIENTS = args.clients
    database_url, redis_url = bench_urls(DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL)
    interrupt_on_signals()
    system = System(database_url, redis_url)
    system.keep = args.keep
    client = None
    try:
        speed_before = machine_speed_ms()
        system.start_provider()
        system.prepare()
        system.start_up()
        client, lone_client = Client(system), Client(system, kept_alive=True)
        system.watcher.phase = "warm-up"
        warm_up(client, lone_client)
        system.watcher.phase = "lone runs"
        lone = lone_phase(system, lone_client, args.lone)
        lone["polling"] = lone_phase(system, lone_client, args.lone, poll=True)
        lone["clients"] = client_comparison(
            {"http.client": lone_client, "httpx": client}, args.lone
        )
        lone_client.close()
        load = throughput_phase(system, client, args.runs, args.profile, args.threads)
        system.watcher.phase = "after"
        lone_facts = run_facts(system, lone["run_ids"])
        lone_facts["timeline"] = lone_timeline(system, lone["run_ids"], lone["walls"])
        load_facts = run_facts(system, load["run_ids"])
        load["connection_peaks"] = dict(system.watcher.peaks)
        load["connection_limit"] = system.connection_limit
        result = figures(system, load["accepted"], lone, lone_facts, load, load_facts)
        result["machine_speed_ms"] = (speed_before, machine_speed_ms())
        if args.json:
            print(json.dumps({
                "figures": result,
                "targets": {k: f"{op} {t}" for k, (op, t) in TARGETS.items()},
                "ok": {k: ok(k, result[k]) for k in TARGETS},
                "throughput": {k: v for k, v in load.items() if k not in ("run_ids", "submit_ms")},
                "lone_stages": lone_facts | {k: None for k in (
                    "server_settle_ms", "run_overhead_ms", "turn_overhead_ms",
                    "turn_execution_ms", "provider_latency_ms", "queue_ms")},
                "load_stages": load_facts | {k: None for k in (
                    "server_settle_ms", "run_overhead_ms", "turn_overhead_ms",
                    "turn_execution_ms", "provider_latency_ms", "queue_ms")},
            }, indent=2))  # fmt: skip
        else:
            print_report(load["accepted"], args.lone, result, load, lone_facts, load_facts)
            if load["submit_errors"]:
                print()
                print(f"WARNING: {args.runs - load['accepted']} of {args.runs} submits failed "
                      f"(figures are over the {load['accepted']} accepted runs): "
                      f"{load['submit_errors']}")  # fmt: skip
                print(f"  the system logged: {load['server_errors']}")
        failed_submits = args.runs - load["accepted"]
        if args.profile and Path(args.profile).exists():
            print()
            print(f"worker profile ({args.profile}), top 25 by own + children time:")
            for line in summarize_profile(args.profile):
                print("  " + line)
        return 2 if failed_submits else 0
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        if system.watcher is not None:
            print(f"peak connections to the bench database by phase: {system.watcher.peaks} "
                  f"(limit {system.connection_limit})", file=sys.stderr)  # fmt: skip
        if system.up is not None:
            kept = Path(tempfile.gettempdir()) / "bench-throughput-up.log"
            shutil.copyfile(system.up_log, kept)
            print(f"manage.py up log (tail; whole log kept in {kept}):", file=sys.stderr)
            print(system.log_tail(60), file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if client is not None:
            client.close()
        system.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
