"""Real processes for the fault tests: an own PostgreSQL cluster, an own Redis
server, the web, a prefork worker and beat, and loopback receivers.

Nothing here touches the shared servers (5432 / 6379): every fault test starts
its own cluster (initdb into a temporary directory, its own port) and its own
redis-server, and points the system's processes at them. Every wait is
bounded; every process started here is stopped by its own id (its process
group) in ``close()``, even when a test failed half-way.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# Ports for the servers a fault system starts: picked at random below the
# kernel's ephemeral range (32768 and up by default), so an outgoing connection
# never takes one while Redis is down for its outage, and each one held under
# a lock file while the system lives, so harnesses running side by side (other
# checkouts, other people) never pick the same one.
SERVER_PORTS = range(20000, 32000)
PORT_LOCKS = Path(tempfile.gettempdir()) / "gov-faults-ports"


class HarnessError(AssertionError):
    """A fixture could not do its part (a server did not start, a wait ran out)."""


# --------------------------------------------------------------------------- small helpers


def wait_for(
    what: str, check: Callable[[], Any], *, timeout: float, interval: float = 0.1, explain=None
):
    """Poll ``check`` until it returns something truthy; its value. Bounded."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = check()
        except Exception as exc:  # the server may not be up yet
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            extra = f"\n{explain()}" if explain else ""
            raise HarnessError(f"gave up waiting {timeout:.0f} s for {what}{detail}{extra}")
        time.sleep(interval)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(candidates: Iterable[int] | None = None) -> int:
    if candidates is None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]
    for port in candidates:
        if port_is_free(port):
            return port
    raise HarnessError(f"no free port in {candidates}")


class PortLease:
    """A port of ``SERVER_PORTS`` held for one fault system: free when taken,
    and locked (``flock`` on a file per port) until ``release``, so a second
    harness skips it even while our server is stopped on purpose."""

    def __init__(self, tries: int = 200) -> None:
        if not PORT_LOCKS.exists():
            PORT_LOCKS.mkdir(exist_ok=True)
            with contextlib.suppress(OSError):
                PORT_LOCKS.chmod(0o1777)  # shared by every user, like /tmp
        for port in random.sample(SERVER_PORTS, tries):
            try:
                lock = (PORT_LOCKS / f"{port}.lock").open("a")
            except OSError:  # another user's lock file: theirs
                continue
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            if port_is_free(port):
                self.port, self._lock = port, lock
                return
            lock.close()
        raise HarnessError(f"no free port in {SERVER_PORTS} after {tries} tries")

    def release(self) -> None:
        self._lock.close()  # closing the file drops the lock


def tail(path: Path, lines: int = 60) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"({path}: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces.
    return int(stat.rsplit(")", 1)[1].split()[1])


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _stop_group(proc: subprocess.Popen, grace: float = 8.0) -> None:
    """Stop a process we started, with its children (it leads its own group)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    # Children may outlive their parent (a prefork pool): the group goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


# --------------------------------------------------------------------------- PostgreSQL


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = glob.glob(f"/usr/lib/postgresql/*/bin/{name}")

    def version(path: str) -> tuple[int, ...]:
        part = Path(path).parent.parent.name
        return tuple(int(x) for x in re.findall(r"\d+", part)) or (0,)

    if not candidates:
        raise HarnessError(f"PostgreSQL's {name} is neither on PATH nor in /usr/lib/postgresql")
    return max(candidates, key=version)


class PgCluster:
    """A PostgreSQL cluster of our own: initdb into ``root``, our own port.

    initdb and postgres refuse to run as root, so as root they run as the
    ``postgres`` OS user (the data and socket directories are chowned to it).
    """

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.data = root / "pgdata"
        self.sockets = root / "pgsock"
        self.log = root / "postgres.log"
        self.initdb = _pg_bin("initdb")
        self.pg_ctl = str(Path(self.initdb).with_name("pg_ctl"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [*self.as_user, *command], capture_output=True, text=True, timeout=timeout
        )
        if result.returncode != 0:
            raise HarnessError(
                f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n"
                f"{result.stderr}\n--- postgres log ---\n{tail(self.log)}"
            )
        return result

    def _chown(self, *paths: Path) -> None:
        if not self.as_user:
            return
        owner = pwd.getpwnam("postgres")
        for path in paths:
            os.chown(path, owner.pw_uid, owner.pw_gid)

    def init(self) -> None:
        self.data.mkdir()
        self.sockets.mkdir()
        self.log.touch()
        self._chown(self.data, self.sockets, self.log)
        self._run(
            self.initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres",
            "-E", "UTF8", "--no-sync", "--no-instructions",
        )  # fmt: skip

    @property
    def options(self) -> str:
        # Durability does not matter to a throw-away cluster; speed does.
        return (
            f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200"
        )

    def start(self) -> None:
        self._run(
            self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "30",
            "-o", self.options, "start",
        )  # fmt: skip
        wait_for("PostgreSQL to accept connections", self.ready, timeout=30)

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, the cluster comes back."""
        self._run(
            self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "30",
            "-m", "fast", "-o", self.options, "restart",
        )  # fmt: skip
        wait_for("PostgreSQL to accept connections again", self.ready, timeout=30)

    def ready(self) -> bool:
        with psycopg.connect(self.url("postgres"), connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True

    def url(self, database: str = "governance") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        if not self.data.exists():
            return
        with contextlib.suppress(Exception):
            subprocess.run(
                [*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w",
                 "-t", "15", "stop"],
                capture_output=True, timeout=30,
            )  # fmt: skip
        pid = self.postmaster_pid()
        if pid and pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --------------------------------------------------------------------------- Redis


class RedisServer:
    """A redis-server of our own on its own port, without persistence."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.port = port
        self.log = root / "redis.log"
        self.proc: subprocess.Popen | None = None
        self.binary = shutil.which("redis-server") or "/usr/bin/redis-server"

    def start(self) -> None:
        wait_for(f"port {self.port} to be free for Redis", lambda: port_is_free(self.port),
                 timeout=15)  # fmt: skip
        self.proc = subprocess.Popen(
            [
                self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.root),
                "--logfile", str(self.log), "--daemonize", "no",
            ],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        wait_for("Redis to answer PING", self.ping, timeout=15,
                 explain=lambda: tail(self.log))  # fmt: skip

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def ping(self) -> bool:
        with contextlib.closing(self.client()) as client:
            return bool(client.ping())

    def flushall(self) -> None:
        with contextlib.closing(self.client()) as client:
            client.flushall()

    def stop(self) -> None:
        if self.proc is None:
            return
        _stop_group(self.proc, grace=5)
        self.proc = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"


# --------------------------------------------------------------------------- receivers


class Receiver:
    """A loopback HTTP server playing three outside parties, counting what it gets.

    - ``POST /hook``: a webhook receiver (the ``webhook`` tool). It records the
      ``Idempotency-Key`` as processed the moment the request arrives (the
      effect happened), then sleeps ``hook_delay_s`` before answering 200, so
      a test can kill the worker while the request is in flight.
      ``GET /hook?idempotency_key=K`` is the verification contract of
      ``tasks.tools.verify_webhook``: 200 processed / 404 unseen.
    - ``POST /callback``: completion callbacks (R7.3), counted per key.
    - ``POST /alert``: a webhook alert channel (R8.2), counted per
      (notification, delivery event).
    """

    def __init__(self, hook_delay_s: float = 0.0) -> None:
        self.hook_delay_s = hook_delay_s
        self.lock = threading.Lock()
        self.hooks: dict[str, int] = {}
        self.hooks_in_flight: dict[str, float] = {}
        self.callbacks: dict[str, list[dict]] = {}
        self.alerts: dict[tuple[Any, Any], int] = {}
        self.verifications = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the caller died while we slept (the point of the test)

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path != "/hook":
                    return self._answer(404, {"error": "no such path"})
                key = (parse_qs(parts.query).get("idempotency_key") or [""])[0]
                key = key or self.headers.get("Idempotency-Key", "")
                with receiver.lock:
                    receiver.verifications += 1
                    seen = key in receiver.hooks
                if seen:
                    return self._answer(200, {"status": "processed", "idempotency_key": key})
                return self._answer(404, {"status": "unseen"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                path = urlsplit(self.path).path
                key = self.headers.get("Idempotency-Key", "")
                if path == "/hook":
                    with receiver.lock:
                        receiver.hooks[key] = receiver.hooks.get(key, 0) + 1
                        receiver.hooks_in_flight[key] = time.monotonic()
                    time.sleep(receiver.hook_delay_s)
                    with receiver.lock:
                        receiver.hooks_in_flight.pop(key, None)
                    return self._answer(200, {"status": "processed", "idempotency_key": key})
                if path == "/callback":
                    try:
                        body = json.loads(raw or b"{}")
                    except ValueError:
                        body = {"unparsed": raw[:200].decode(errors="replace")}
                    with receiver.lock:
                        receiver.callbacks.setdefault(key, []).append(body)
                    return self._answer(200, {"ok": True})
                if path == "/alert":
                    body = json.loads(raw or b"{}")
                    ident = (body.get("notification_id"), body.get("delivery_event"))
                    with receiver.lock:
                        receiver.alerts[ident] = receiver.alerts.get(ident, 0) + 1
                    return self._answer(200, {"ok": True})
                return self._answer(404, {"error": "no such path"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="faults-receiver", daemon=True
        )
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --------------------------------------------------------------------------- the system


class Process:
    def __init__(self, name: str, command: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.command = command
        self.log = log
        self._log_file = log.open("ab")
        self.proc = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=self._log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        _stop_group(self.proc)
        self._log_file.close()


class System:
    """Web + prefork worker + beat on an own PostgreSQL and an own Redis."""

    def __init__(self, name: str, *, settings: dict[str, str] | None = None) -> None:
        self.name = name
        self.root = Path(tempfile.mkdtemp(prefix=f"gov-faults-{name}-"))
        self.root.chmod(0o755)  # the postgres user must reach its directories
        self.processes: dict[str, Process] = {}
        self.pg: PgCluster | None = None
        self.redis: RedisServer | None = None
        self.extra_settings = settings or {}
        self.web_port = 0
        self.token = ""
        self.http: httpx.Client | None = None
        self._db: psycopg.Connection | None = None
        self.receiver: Receiver | None = None
        self.ports: list[PortLease] = []

    # ---- start / stop

    def _lease_port(self) -> int:
        lease = PortLease()
        self.ports.append(lease)
        return lease.port

    def start(self) -> System:
        self.pg = PgCluster(self.root, self._lease_port())
        self.pg.init()
        self.pg.start()
        self.pg.create_database("governance")
        self.redis = RedisServer(self.root, self._lease_port())
        self.redis.start()
        (self.root / "var").mkdir()
        self.web_port = self._lease_port()
        self.env = self._env()
        self.manage("migrate", "--no-input", "-v", "0", timeout=120)
        self.start_web()
        self.start_worker()
        self.start_beat()
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.web_port}", timeout=15)
        wait_for("the web to answer /healthz", self._web_up, timeout=30, explain=self.logs)
        return self

    def _env(self) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("DJANGO_", "GOVERNANCE_", "CELERY_", "OTEL_", "PYTEST_"))
            and key not in {"DATABASE_URL", "REDIS_URL"}
        }
        env.update(
            {
                "DATABASE_URL": self.pg.url(),
                "REDIS_URL": self.redis.url(0),
                "DJANGO_SETTINGS_MODULE": "dashboard.site.settings",
                "DJANGO_DEBUG": "0",
                "DJANGO_SECRET_KEY": "faults-secret-key-" + "k" * 40,
                "GOVERNANCE_CALLBACK_SECRET": "faults-callback-secret-" + "c" * 20,
                "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
                "DJANGO_SECURE_SSL_REDIRECT": "0",
                "DJANGO_SESSION_COOKIE_SECURE": "0",
                "DJANGO_CSRF_COOKIE_SECURE": "0",
                "DJANGO_SECURE_HSTS_SECONDS": "0",
                "GOVERNANCE_VAR_DIR": str(self.root / "var"),
                "LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                "GOVERNANCE_DASHBOARD_URL": f"http://127.0.0.1:{self.web_port}",
                # The receivers of these tests listen on loopback over plain http:
                # the outbound check lets exactly that address through.
                "GOVERNANCE_OUTBOUND_ALLOW": "127.0.0.1",
            }
        )
        env.update(self.extra_settings)
        return env

    def manage(self, *args: str, timeout: float = 60, stdin: str | None = None) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=REPO_ROOT, env=self.env, input=stdin,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if result.returncode != 0:
            raise HarnessError(
                f"manage.py {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
            )
        return result.stdout

    def _spawn(self, name: str, command: list[str]) -> Process:
        process = Process(name, command, self.env, self.root / f"{name}.log")
        self.processes[name] = process
        return process

    def start_web(self) -> None:
        self._spawn("web", [
            sys.executable, "-m", "uvicorn", "dashboard.site.asgi:application",
            "--host", "127.0.0.1", "--port", str(self.web_port), "--no-access-log",
            "--log-level", "warning",
        ])  # fmt: skip

    def start_worker(self) -> None:
        self._spawn("worker", [
            sys.executable, "-m", "celery", "-A", "tasks", "worker", "-P", "prefork", "-c", "2",
            "-l", "INFO", "--hostname", f"faults-{self.name}@%h",
            "--without-mingle", "--without-gossip",
        ])  # fmt: skip
        wait_for(
            "the worker to say it is ready",
            lambda: " ready." in (self.root / "worker.log").read_text(errors="replace"),
            timeout=45, explain=self.logs,
        )  # fmt: skip

    def start_beat(self) -> None:
        self._spawn("beat", [
            sys.executable, "-m", "celery", "-A", "tasks", "beat", "-l", "WARNING",
            "--schedule", str(self.root / "var" / "beat-schedule"),
        ])  # fmt: skip

    def _web_up(self) -> bool:
        return self.http.get("/healthz").status_code in (200, 503)

    def close(self) -> None:
        for closer in (
            lambda: self.http and self.http.close(),
            lambda: self._db and self._db.close(),
            *[process.stop for process in reversed(list(self.processes.values()))],
            lambda: self.redis and self.redis.stop(),
            lambda: self.pg and self.pg.stop(),
            *[lease.release for lease in self.ports],
        ):
            with contextlib.suppress(Exception):
                closer()
        if os.environ.get("FAULTS_KEEP"):  # for a person reading the logs afterwards
            print(f"fault system {self.name}: logs kept in {self.root}", file=sys.stderr)
            return
        shutil.rmtree(self.root, ignore_errors=True)

    def queued_stage_messages(self) -> int:
        """Messages waiting in the stage queues' Redis lists (every lane of
        ``turns`` and ``tools``)."""
        with contextlib.closing(self.redis.client()) as client:
            keys = [k for p in ("turns*", "tools*") for k in client.keys(p)]
            return sum(client.llen(k) for k in keys if client.type(k) == b"list")

    def worker_log(self) -> str:
        return (self.root / "worker.log").read_text(errors="replace")

    # ---- what went wrong

    def logs(self, lines: int = 40) -> str:
        parts = []
        for name in ("worker", "beat", "web"):
            if name in self.processes:
                state = "running" if self.processes[name].alive() else "exited"
                parts.append(
                    f"--- {name} log tail ({state}) ---\n{tail(self.root / f'{name}.log', lines)}"
                )
        if self.pg is not None:
            parts.append(f"--- postgres log tail ---\n{tail(self.pg.log, 15)}")
        if self.redis is not None:
            parts.append(f"--- redis log tail ---\n{tail(self.redis.log, 10)}")
        return "\n".join(parts)

    # ---- data

    def seed(self, spec: dict[str, Any]) -> str:
        """Providers, an alert channel and an API user through the ORM in a child
        process with the system's settings; returns the API token."""
        result = subprocess.run(
            [sys.executable, "-c", SEED_CODE], cwd=REPO_ROOT,
            env={**self.env, "FAULTS_SEED": json.dumps(spec)},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if result.returncode != 0:
            raise HarnessError(f"seeding failed:\n{result.stdout}\n{result.stderr[-5000:]}")
        self.token = result.stdout.strip().splitlines()[-1]
        self.http.headers["Authorization"] = f"Bearer {self.token}"
        return self.token

    def db(self) -> psycopg.Connection:
        """A read connection to the system's own database (reconnects after a restart)."""
        if self._db is not None and not self._db.closed and not self._db.broken:
            return self._db
        self._db = psycopg.connect(self.pg.url(), autocommit=True, connect_timeout=5)
        return self._db

    def sql(self, query: str, *params: Any) -> list[tuple]:
        for attempt in range(2):
            try:
                return self.db().execute(query, params).fetchall()
            except psycopg.OperationalError:
                if attempt:
                    raise
                self._db = None
        return []

    # ---- the API

    def create_thread(self, **body: Any) -> str:
        response = self.http.post("/api/v1/threads", json=body)
        assert response.status_code == 201, f"create thread: {response.status_code} {response.text}"
        return response.json()["id"]

    def submit(self, thread_id: str, text: str, **extra: Any) -> httpx.Response:
        return self.http.post(f"/api/v1/threads/{thread_id}/runs", json={"input": text, **extra})

    def submit_ok(self, thread_id: str, text: str, **extra: Any) -> str:
        response = self.submit(thread_id, text, **extra)
        assert response.status_code == 202, f"submit: {response.status_code} {response.text}"
        return response.json()["run_id"]

    def run(self, run_id: str) -> dict:
        response = self.http.get(f"/api/v1/runs/{run_id}")
        assert response.status_code == 200, f"run {run_id}: {response.status_code} {response.text}"
        return response.json()

    def wait_settled(self, run_ids: list[str], *, timeout: float) -> dict[str, float]:
        """Wait (bounded) until every run settled; when each was first seen settled."""
        started = time.monotonic()
        settled: dict[str, float] = {}
        deadline = started + timeout
        while time.monotonic() < deadline:
            rows = self.sql(
                "SELECT id::text FROM governance_run "
                "WHERE status = 'settled' AND id::text = ANY(%s)",
                list(run_ids),
            )
            now = time.monotonic()
            for (run_id,) in rows:
                settled.setdefault(run_id, now - started)
            if len(settled) == len(run_ids):
                return settled
            time.sleep(0.25)
        missing = [r for r in run_ids if r not in settled]
        details = []
        for run_id in missing[:3]:
            try:
                body = self.run(run_id)
                details.append(json.dumps(
                    {k: body[k] for k in ("id", "status", "phase", "lifecycle", "stages")},
                    indent=1, default=str,
                )[:2500])  # fmt: skip
            except Exception as exc:
                details.append(f"{run_id}: {exc!r}")
            details.append(json.dumps(self.stage_rows(run_id), default=str)[:1500])
        raise HarnessError(
            f"{len(missing)} of {len(run_ids)} runs did not settle within {timeout:.0f} s: "
            f"{missing}\n" + "\n".join(details)
        )

    def stage_rows(self, run_id: str) -> list[dict]:
        wanted = ("seq", "kind", "holder", "lease_until", "claimed_at", "started_at",
                  "finished_at", "outcome", "deliveries")  # fmt: skip
        cols = [c for c in wanted if c in self.stage_columns()]
        rows = self.sql(
            f"SELECT {', '.join(cols)} FROM governance_stage WHERE run_id::text = %s ORDER BY seq",
            run_id,
        )
        return [dict(zip(cols, row, strict=True)) for row in rows]

    def stage_columns(self) -> set[str]:
        rows = self.sql(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'governance_stage'"
        )
        return {name for (name,) in rows}

    def settlements(self, run_ids: list[str]) -> dict[str, tuple[str, str, str]]:
        rows = self.sql(
            "SELECT run_id::text, outcome, reason_code, reason FROM governance_settlement "
            "WHERE run_id::text = ANY(%s)",
            list(run_ids),
        )
        return {run_id: (outcome, code, reason) for run_id, outcome, code, reason in rows}


# The seed runs in a child process with the system's environment (never in the
# pytest process, whose Django settings point at the shared servers).
SEED_CODE = r"""
import json, os, secrets
import django
django.setup()
from django.contrib.auth.models import Permission, User
from governance.services.tokens import token_digest
from governance.models import AlertChannel, ApiToken, Provider
spec = json.loads(os.environ["FAULTS_SEED"])
for provider_id, script in spec.get("providers", {}).items():
    Provider.objects.update_or_create(
        provider_id=provider_id,
        defaults={"kind": "scripted", "model": provider_id + "-model", "script": script},
    )
if spec.get("alert_url"):
    AlertChannel.objects.update_or_create(
        name="faults-alerts", defaults={"kind": "webhook", "target": spec["alert_url"]}
    )
user, _ = User.objects.get_or_create(username="faults")
user.user_permissions.add(
    *Permission.objects.filter(codename__in=["apply_boundary", "submit_run", "cancel_run"])
)
token = secrets.token_urlsafe(24)
ApiToken.objects.create(user=user, name="faults", key_digest=token_digest(token))
print(token)
"""


# --------------------------------------------------------------------------- worker kills


def holder_pid(holder: str) -> int:
    """The pid in a stage holder "host/pid-namespace/pid/token" (the prefork child)."""
    parts = holder.split("/")
    if len(parts) != 4 or not parts[2].isdigit():
        raise HarnessError(f"stage holder {holder!r} is not 'host/pid-namespace/pid/token'")
    return int(parts[2])


def held_stage(
    system: System,
    run_ids: list[str],
    kind: str,
    *,
    min_age_s: float,
    timeout: float = 30,
    exclude: Iterable[int] = (),
    need_holder: bool = True,
) -> dict[str, Any]:
    """Wait for a stage of ``kind`` that a worker holds and has run at least
    ``min_age_s`` (so it is inside its provider or tool call, not at its claim);
    stages in ``exclude`` (already killed once) are not chosen. ``need_holder``
    False: a claimed stage will do (a fault that needs no pid)."""
    has_holder = "holder" in system.stage_columns()
    if need_holder and not has_holder:
        raise HarnessError("governance_stage has no 'holder' column: nothing names the process")
    holder_col = "holder" if has_holder else "''"
    held = "holder <> ''" if has_holder else "claimed_at IS NOT NULL"

    def find():
        rows = system.sql(
            f"SELECT id, run_id::text, {holder_col}, deliveries, "
            "extract(epoch FROM now() - claimed_at) "
            "FROM governance_stage WHERE run_id::text = ANY(%s) AND kind = %s "
            f"AND finished_at IS NULL AND {held} AND claimed_at < now() - make_interval("
            "secs => %s) AND NOT id = ANY(%s) ORDER BY claimed_at LIMIT 1",
            list(run_ids), kind, min_age_s, list(exclude),
        )  # fmt: skip
        if rows:
            stage_id, run_id, holder, deliveries, age = rows[0]
            return {"stage_id": stage_id, "run_id": run_id, "holder": holder,
                    "deliveries": deliveries, "age_s": float(age)}  # fmt: skip
        return None

    return wait_for(f"a {kind} stage held by a worker for {min_age_s} s", find, timeout=timeout,
                    interval=0.05, explain=system.logs)  # fmt: skip


def kill_holder(system: System, stage: dict[str, Any]) -> int:
    """SIGKILL the prefork child that holds ``stage``: by pid, only if it is a
    child of the worker this test started."""
    pid = holder_pid(stage["holder"])
    worker = system.processes["worker"].pid
    if parent_pid(pid) != worker:
        raise HarnessError(
            f"holder pid {pid} of stage {stage['stage_id']} is not a child of our worker "
            f"{worker} (its parent: {parent_pid(pid)}); not killing it"
        )
    os.kill(pid, signal.SIGKILL)
    wait_for(f"pid {pid} to die", lambda: not pid_alive(pid), timeout=10)
    return pid


def wait_rerun(system: System, stage: dict[str, Any], *, timeout: float = 60) -> dict[str, Any]:
    """Wait until the killed holder's stage runs again: a new holder on the same
    row, or the row finished. Returns what was seen and when."""
    started = time.monotonic()

    def check():
        rows = system.sql(
            "SELECT holder, finished_at IS NOT NULL, outcome, deliveries FROM governance_stage "
            "WHERE id = %s",
            stage["stage_id"],
        )
        holder, finished, outcome, deliveries = rows[0]
        if finished or (holder and holder != stage["holder"]):
            return {"rerun_after_s": round(time.monotonic() - started, 2), "new_holder": holder,
                    "finished": finished, "outcome": outcome, "deliveries": deliveries}  # fmt: skip
        return None

    return wait_for(
        f"stage {stage['stage_id']} to run again after its holder was killed", check,
        timeout=timeout, interval=0.1,
        explain=lambda: f"{system.stage_rows(stage['run_id'])}\n{system.logs()}",
    )  # fmt: skip


def wait_outbox_drained(system: System, *, timeout: float = 30) -> None:
    """Wait until every callback and alert delivery reached a final state."""

    def drained():
        rows = system.sql(
            "SELECT 'callback', id, state FROM governance_runcallback "
            "WHERE state IN ('pending', 'sending', 'retry') UNION ALL "
            "SELECT 'alert', id, state FROM governance_notificationdelivery "
            "WHERE state IN ('pending', 'sending', 'retry')"
        )
        drained.left = rows
        return not rows

    drained.left = []
    wait_for("callbacks and alert deliveries to be delivered", drained, timeout=timeout,
             interval=0.25, explain=lambda: f"still open: {drained.left}")  # fmt: skip
