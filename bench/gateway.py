"""Benchmark: the OpenAI-compatible door beside a LiteLLM proxy, on one provider.

Both gateways sit in front of the same loopback OpenAI-compatible provider
(``bench/throughput.py``'s, in its own process: it answers at once, counts
the requests it gets and, under ``/refuser/``, refuses with
``finish_reason: content_filter`` any request whose messages hold the trigger
word). The same load is sent to each, and to the provider directly as the
anchor: 16 concurrent clients (``--clients``), N non-streamed requests, then N
streamed ones (``stream: true``), each request one user message, after an
unmeasured warm-up of each. The table gives, per gateway and mode, the
requests per second, the latency added over calling the provider directly
(the gateway's p50 and p95 minus the direct ones, under the same load) and,
streamed, the time to the first chunk that carries text (the door sends a
role-only chunk at once, before the run has run: that one is not counted;
the time to the first ``data:`` line is printed as context).

Targets (the issue's): the door's requests/s ≥ the LiteLLM proxy's in the
same run, and its added latency p50 ≤ LiteLLM's + 10 ms, each mode. The
refusal scenario: a route of two providers, the refusing one first, then a
fallback that answers; a 30-turn conversation whose first user message holds
the trigger, the client resending its whole history each turn (with
``X-Session-Id`` for the door). The door sends the refusing provider at most
4 requests in the segment (R3.2: the refusal, then re-probes on a 15 min /
1 h / 6 h schedule, so 1 over a fast 30 turns); LiteLLM's count is printed
beside it. LiteLLM is given the same two-provider chain: the refusing model
first, ``content_policy_fallbacks`` and ``fallbacks`` to the fallback model
(its router turns a ``content_filter`` answer into a fallback when one is
configured), ``num_retries: 0``.

What runs (on loopback only):

* the door: ``manage.py up --concurrency 2`` with ``DJANGO_DEBUG=0`` as
  ``bench/throughput.py`` starts it — one uvicorn web process, a Celery worker
  with 2 pool processes, the alerts worker and beat — on a fresh PostgreSQL
  database owned by a role of its own (``BENCH_DATABASE_URL``, default
  postgres://postgres@127.0.0.1:5432/governance_bench_gw; dropped at the end)
  and a Redis db it flushes (``BENCH_REDIS_URL``, default
  redis://127.0.0.1:6379/12); routes made with ``manage.py route add``;
* the LiteLLM proxy: ``litellm --config … --num_workers 2`` (two uvicorn
  worker processes, the door's two pool processes' count), no database, a
  random master key (it refuses to start without one), ``LITELLM_LOG=ERROR``.
  LiteLLM is not a dependency of the project: it lives in the bench's own
  virtual environment, ``.venv-litellm`` (git-ignored), made on the
  first run with ``python -m venv`` and ``pip install 'litellm[proxy]'`` (a
  few minutes; ``--litellm-venv`` names another).

Each client is one kept-alive connection of the standard library's
http.client in a thread of this process (httpx costs several times as much
CPU per request, taken from the two cores the gateways run on); the same
clients drive all three. Context printed under the table: the same requests
one at a time (one client); the CPU per request during each phase (from
/proc) of the gateway's own processes — ours: up's process tree and the
PostgreSQL backends of its database; LiteLLM: its process tree —, of the
provider, of the clients and of the whole machine (steadier than a latency
on a shared machine); the provider requests per client request; the answers
each gateway gave in the refusal scenario.

Run: .venv/bin/python bench/gateway.py [N] [--clients K] [--turns T] [--json]
[--keep] (defaults 400 requests per phase, 16 clients, 30 turns). Exit 0
whatever the figures; 1 when the door or LiteLLM did not start (or LiteLLM
could not be installed); 2 when requests failed (the figures are then over
the answered ones; the failures are printed).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput as tp  # the same system machinery

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/governance_bench_gw"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/12"  # throughput.py uses 13
# At the top, not under bench/: the tests scan bench/ for what the project says.
LITELLM_VENV = tp.ROOT / ".venv-litellm"
LITELLM_SPEC = "litellm[proxy]"
LITELLM_WORKERS = tp.WORKERS  # the door's worker pool processes (manage.py up --concurrency)
CLIENTS = 16
WARM_UP = 48  # unmeasured requests per target and mode
LONE = 30  # requests one at a time per target and mode (context)
TURNS = 30
TRIGGER = "FORBIDDEN-WORD"
CHAT = "bench-chat"  # the door's route and LiteLLM's model name: the one provider
REFUSAL = "bench-refusal"  # the door's route and LiteLLM's model: refuser, then fallback
REFUSER_ID, FALLBACK_ID = "bench-refuser", "bench-fallback"
REQUEST_TIMEOUT_S = 60.0

TARGETS = {
    "rps_json": ("ours ≥ LiteLLM", "≥ LiteLLM's"),
    "rps_stream": ("ours ≥ LiteLLM", "≥ LiteLLM's"),
    "added_p50_json": ("ours ≤ LiteLLM + 10", "≤ LiteLLM's + 10 ms"),
    "added_p50_stream": ("ours ≤ LiteLLM + 10", "≤ LiteLLM's + 10 ms"),
    "refuser_requests": ("ours ≤ 4", "≤ 4"),
}
log = tp.log


# --------------------------------------------------------------------------- loopback provider


class GatewayProvider(tp._ProviderHandler):
    """throughput.py's provider, with a refusing one under ``/refuser/`` and
    requests counted by the path's first part (``/refuser/v1/…``,
    ``/fallback/v1/…``; ``/v1/…`` is ``main``)."""

    def reply(self, request: dict) -> None:
        first = self.path.lstrip("/").split("/", 1)[0]
        who = first if first in ("refuser", "fallback") else "main"
        with self.lock:
            self.counts[f"{who}_requests"] += 1
        if who == "refuser" and TRIGGER in json.dumps(request.get("messages")):
            self._refuse(request)
            return
        super().reply(request)

    def _refuse(self, request: dict) -> None:
        model = request.get("model") or "refuser-model"
        base = {"id": "chatcmpl-refused", "model": model, "created": int(time.time())}
        if request.get("stream"):
            chunk = {
                **base,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}],
            }
            data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            kind = "text/event-stream"
        else:
            answer = {
                **base,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "content_filter",
                        "message": {"role": "assistant", "content": None},
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5},
            }
            data = json.dumps(answer).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


# --------------------------------------------------------------------------- the door


class GatewaySystem(tp.System):
    provider_handler = GatewayProvider

    def prepare(self) -> None:
        super().prepare()  # user, token, provider bench-openai → /v1
        base = f"http://127.0.0.1:{self.provider_port}"
        script = (
            "from django.apps import apps\n"
            "Provider = apps.get_model('governance', 'Provider')\n"
            f"for pid, path in (({REFUSER_ID!r}, '/refuser/v1'),\n"
            f"                  ({FALLBACK_ID!r}, '/fallback/v1')):\n"
            "    Provider.objects.create(provider_id=pid, kind='openai', model=pid + '-model',\n"
            f"        base_url={base!r} + path, connect_timeout_s=5.0, read_timeout_s=30.0)\n"
        )  # fmt: skip
        self.manage("shell", "-c", script)
        self.manage("route", "add", CHAT, "--chain", tp.PROVIDER_ID)
        self.manage("route", "add", REFUSAL, "--chain", f"{REFUSER_ID},{FALLBACK_ID}")
        log(f"routes {CHAT} → {tp.PROVIDER_ID}, {REFUSAL} → {REFUSER_ID}, {FALLBACK_ID}")


# --------------------------------------------------------------------------- LiteLLM


class LiteLLM:
    def __init__(self, venv: Path, var_dir: Path) -> None:
        self.venv = venv
        self.var_dir = var_dir
        self.port = tp.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = var_dir / "litellm.log"
        self.proc: subprocess.Popen | None = None
        self.version = "?"
        # It refuses to start without one; the door's clients send a token too.
        self.master_key = "sk-" + secrets.token_hex(32)

    @property
    def executable(self) -> Path:
        return self.venv / "bin" / "litellm"

    def ensure_installed(self) -> None:
        if not self.executable.exists():
            log(f"installing {LITELLM_SPEC} into {self.venv} (first run; a few minutes)")
            try:
                subprocess.run([tp.PYTHON, "-m", "venv", str(self.venv)], check=True)
                subprocess.run(
                    [str(self.venv / "bin" / "pip"), "install", "--quiet", LITELLM_SPEC],
                    check=True, timeout=1800,
                )  # fmt: skip
            except (subprocess.SubprocessError, OSError) as exc:
                raise tp.BenchError(1, f"could not install {LITELLM_SPEC}: {exc}") from None
        found = subprocess.run(
            [str(self.venv / "bin" / "python"), "-c",
             "import importlib.metadata as m; print(m.version('litellm'))"],
            capture_output=True, text=True,
        )  # fmt: skip
        self.version = found.stdout.strip() or "?"

    def config(self, provider_port: int) -> dict:
        def deployment(name: str, path: str, model: str) -> dict:
            return {
                "model_name": name,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": f"http://127.0.0.1:{provider_port}{path}",
                    "api_key": "unused",
                    "timeout": 30,
                },
            }

        return {
            "model_list": [
                deployment(CHAT, "/v1", "bench-model"),
                deployment(REFUSAL, "/refuser/v1", f"{REFUSER_ID}-model"),
                deployment(FALLBACK_ID, "/fallback/v1", f"{FALLBACK_ID}-model"),
            ],
            "litellm_settings": {
                "num_retries": 0,
                "drop_params": True,
                "telemetry": False,
                "content_policy_fallbacks": [{REFUSAL: [FALLBACK_ID]}],
                "fallbacks": [{REFUSAL: [FALLBACK_ID]}],
            },
            "router_settings": {"num_retries": 0},
        }

    def start(self, provider_port: int) -> None:
        config = self.var_dir / "litellm.yaml"
        config.write_text(json.dumps(self.config(provider_port), indent=2))  # JSON is YAML
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch from the network at start
            "LITELLM_LOG": "ERROR",
            "LITELLM_MASTER_KEY": self.master_key,
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("DATABASE_URL", "REDIS_URL", "OPENAI_API_KEY"):
            env.pop(name, None)
        out = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(self.executable), "--config", str(config), "--host", "127.0.0.1",
             "--port", str(self.port), "--num_workers", str(LITELLM_WORKERS)],
            cwd=self.var_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        out.close()
        log(f"LiteLLM {self.version} proxy started (pid {self.proc.pid}, port {self.port})")
        deadline = time.monotonic() + tp.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise tp.BenchError(1, f"litellm exited with {self.proc.returncode}:\n"
                                       f"{self.log_tail()}")  # fmt: skip
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/health/liveliness", timeout=2).status_code == 200:
                    log("LiteLLM answers /health/liveliness")
                    return
            time.sleep(0.5)
        raise tp.BenchError(1, f"LiteLLM did not answer in {tp.START_TIMEOUT_S:.0f} s:\n"
                               f"{self.log_tail()}")  # fmt: skip

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log("LiteLLM did not stop in 20 s: killing its process group")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)


# --------------------------------------------------------------------------- the clients


@dataclass
class Target:
    name: str
    base: str  # http://host:port
    path: str  # the chat-completions path
    headers: dict[str, str]
    session_header: bool = False  # X-Session-Id for a conversation (the door)


@dataclass
class Reply:
    status: int
    latency_ms: float
    first_line_ms: float | None = None  # the first data: line (streamed)
    first_text_ms: float | None = None  # the first chunk carrying text (streamed)
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


class Connection:
    """One kept-alive http.client connection: one client."""

    def __init__(self, target: Target) -> None:
        host, port = target.base.rsplit("//", 1)[1].split(":")
        self.target, self.host, self.port = target, host, int(port)
        self.conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def chat(self, body: dict, headers: dict[str, str] | None = None) -> Reply:
        data = json.dumps(body).encode()
        all_headers = {**self.target.headers, "Content-Type": "application/json",
                       **(headers or {})}  # fmt: skip
        for attempt in (1, 2):
            reused = self.conn is not None
            if self.conn is None:
                self.conn = http.client.HTTPConnection(
                    self.host, self.port, timeout=REQUEST_TIMEOUT_S
                )
            start = time.perf_counter()
            try:
                self.conn.request("POST", self.target.path, body=data, headers=all_headers)
                response = self.conn.getresponse()
                if body.get("stream") and response.status == 200:
                    return self._streamed(response, start)
                content = response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if reused and attempt == 1:
                    continue  # the server closed the idle connection first: nothing was done
                raise
            latency = (time.perf_counter() - start) * 1000
            if response.getheader("connection", "").lower() == "close":
                self.close()
            return _answer(response.status, content, latency)
        raise AssertionError("unreachable")

    def _streamed(self, response: http.client.HTTPResponse, start: float) -> Reply:
        reply = Reply(200, 0.0)
        parts = []
        while True:
            line = response.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            now = (time.perf_counter() - start) * 1000
            if reply.first_line_ms is None:
                reply.first_line_ms = now
            payload = line[6:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    parts.append(text)
                    if reply.first_text_ms is None:
                        reply.first_text_ms = now
                reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
        response.read()  # the chunked body's end: the connection is kept alive
        reply.latency_ms = (time.perf_counter() - start) * 1000
        reply.text = "".join(parts)
        return reply


def _answer(status: int, content: bytes, latency: float) -> Reply:
    if status != 200:
        return Reply(status, latency, error=f"{status}: {content[:160].decode(errors='replace')}")
    try:
        choice = json.loads(content)["choices"][0]
    except (ValueError, KeyError, IndexError):
        return Reply(status, latency, error=f"200 not a completion: {content[:120]!r}")
    message = choice.get("message") or {}
    return Reply(status, latency, text=message.get("content") or "",
                 finish_reason=choice.get("finish_reason"))  # fmt: skip


def one_message(stream: bool, index: int) -> dict:
    body = {"model": CHAT, "messages": [{"role": "user", "content": f"Hello {index}"}]}
    if stream:
        body["stream"] = True
    return body


@dataclass
class Phase:
    target: str
    mode: str
    replies: list[Reply] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    elapsed_s: float = 0.0
    # CPU ms per answered request by whose processes it was (/proc), and the whole machine's
    cpu_ms: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> list[Reply]:
        return [r for r in self.replies if r.error is None]

    def latencies(self) -> list[float]:
        return [r.latency_ms for r in self.ok]


def drive(target: Target, stream: bool, count: int, clients: int, mode: str, roles=None) -> Phase:
    """``count`` requests from ``clients`` concurrent clients, each taking the
    next; ``roles()``: pid → whose, for the CPU per request."""
    phase = Phase(target.name, mode)
    lock = threading.Lock()
    next_index = [0]

    def client() -> None:
        conn = Connection(target)
        try:
            while True:
                with lock:
                    index = next_index[0]
                    if index >= count:
                        return
                    next_index[0] += 1
                try:
                    reply = conn.chat(one_message(stream, index))
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    conn.close()
                    reply = Reply(0, 0.0, error=f"{type(exc).__name__}: {exc}"[:160])
                if reply.error is None and reply.text != tp.ANSWER:
                    reply.error = f"unexpected answer {reply.text[:60]!r} ({reply.finish_reason})"
                with lock:
                    phase.replies.append(reply)
                    if reply.error:
                        phase.errors[reply.error] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    before = tp.cpu_sample()
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    phase.elapsed_s = time.perf_counter() - start
    after = tp.cpu_sample()
    phase.cpu_ms = tp.cpu_per_run(before, after, roles() if roles else {}, max(1, len(phase.ok)))
    return phase


def conversation(target: Target, turns: int) -> dict:
    """The refusal scenario: ``turns`` turns, the trigger in the first user
    message, the whole history sent each turn (one client, non-streamed)."""
    conn = Connection(target)
    headers = {"X-Session-Id": f"bench-{uuid.uuid4().hex[:12]}"} if target.session_header else {}
    said = [{"role": "user", "content": f"Tell me about {TRIGGER}."}]
    finishes: Counter = Counter()
    errors: Counter = Counter()
    latencies = []
    try:
        for turn in range(1, turns + 1):
            reply = conn.chat({"model": REFUSAL, "messages": said}, headers)
            latencies.append(reply.latency_ms)
            if reply.error:
                errors[reply.error] += 1
            finishes[reply.finish_reason or "-"] += 1
            said.append({"role": "assistant", "content": reply.text})
            said.append({"role": "user", "content": f"Turn {turn + 1}: go on."})
    finally:
        conn.close()
    return {"finish_reasons": dict(finishes), "errors": dict(errors),
            "latency_p50_ms": tp.pct(latencies, 50)}  # fmt: skip


# --------------------------------------------------------------------------- the run


def provider_counts(system: tp.System) -> Counter:
    return Counter(system.provider_stats())


def descendants(table: dict[int, tuple[int, float]], root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _cpu) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = set(), [root]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, []))
    return found


def whose(system: tp.System, litellm: LiteLLM) -> dict[int, str]:
    """pid → ours (up's processes and the PostgreSQL backends of its database),
    litellm (its process group), provider, clients (this process). Redis is
    shared with others and not counted."""
    table = tp.proc_table()
    roles = {pid: "ours" for pid in descendants(table, system.up.pid)}
    roles.update({pid: "ours" for pid in system.backend_pids()})
    roles.update({pid: "litellm" for pid in descendants(table, litellm.proc.pid)})
    roles[system.provider_proc.pid] = "provider"
    roles[os.getpid()] = "clients"
    return roles


def measure(targets: dict[str, Target], system: tp.System, args, roles) -> dict:
    phases: dict[str, dict[str, Phase]] = {"json": {}, "stream": {}}
    lone: dict[str, dict[str, Phase]] = {"json": {}, "stream": {}}
    provider_per_request: dict[str, dict[str, float]] = {"json": {}, "stream": {}}
    for mode, stream in (("json", False), ("stream", True)):
        for name, target in targets.items():
            warm = drive(target, stream, WARM_UP, args.clients, mode)
            if warm.errors:
                log(f"warm-up {name} {mode}: {dict(warm.errors)}")
            before = provider_counts(system)
            phase = drive(target, stream, args.requests, args.clients, mode, roles)
            after = provider_counts(system)
            phases[mode][name] = phase
            provider_per_request[mode][name] = (after["requests"] - before["requests"]) / max(
                1, len(phase.replies)
            )
            log(f"{mode:6} {name:8} {len(phase.ok)}/{args.requests} in {phase.elapsed_s:.2f} s: "
                f"{len(phase.ok) / phase.elapsed_s:.1f} /s, p50 "
                f"{tp.pct(phase.latencies(), 50):.1f} ms")  # fmt: skip
            lone[mode][name] = drive(target, stream, LONE, 1, mode)
    return {"phases": phases, "lone": lone, "provider_per_request": provider_per_request}


def refusal_scenario(targets: dict[str, Target], system: tp.System, turns: int) -> dict:
    out = {}
    for name in ("ours", "litellm"):
        before = provider_counts(system)
        facts = conversation(targets[name], turns)
        after = provider_counts(system)
        facts["refuser_requests"] = after["refuser_requests"] - before["refuser_requests"]
        facts["fallback_requests"] = after["fallback_requests"] - before["fallback_requests"]
        out[name] = facts
        log(f"refusal scenario {name}: refuser {facts['refuser_requests']}, fallback "
            f"{facts['fallback_requests']}, answers {facts['finish_reasons']}")  # fmt: skip
    return out


def figures(measured: dict, refusal: dict) -> dict:
    result: dict = {}
    for mode in ("json", "stream"):
        phases = measured["phases"][mode]
        direct = phases["direct"].latencies()
        for name, phase in phases.items():
            mine = phase.latencies()
            row = {
                "requests": len(phase.replies),
                "answered": len(phase.ok),
                "rps": len(phase.ok) / phase.elapsed_s if phase.elapsed_s else None,
                "p50_ms": tp.pct(mine, 50),
                "p95_ms": tp.pct(mine, 95),
                "cpu_ms_per_request": phase.cpu_ms,
                "provider_requests_per_request": measured["provider_per_request"][mode][name],
                "errors": dict(phase.errors),
            }
            if name != "direct" and mine and direct:
                row["added_p50_ms"] = tp.pct(mine, 50) - tp.pct(direct, 50)
                row["added_p95_ms"] = tp.pct(mine, 95) - tp.pct(direct, 95)
            if mode == "stream":
                text = [r.first_text_ms for r in phase.ok if r.first_text_ms is not None]
                line = [r.first_line_ms for r in phase.ok if r.first_line_ms is not None]
                row["first_chunk_p50_ms"] = tp.pct(text, 50)
                row["first_chunk_p95_ms"] = tp.pct(text, 95)
                row["first_line_p50_ms"] = tp.pct(line, 50)
            alone = measured["lone"][mode][name].latencies()
            row["lone_p50_ms"] = tp.pct(alone, 50)
            result[f"{name}_{mode}"] = row
        for name in ("ours", "litellm"):
            lone_direct = result[f"direct_{mode}"]["lone_p50_ms"]
            mine = result[f"{name}_{mode}"]["lone_p50_ms"]
            result[f"{name}_{mode}"]["lone_added_p50_ms"] = (
                mine - lone_direct if mine is not None and lone_direct is not None else None
            )
    result["refusal"] = refusal
    return result


def verdicts(f: dict) -> dict[str, str]:
    def met(value: bool | None) -> str:
        return "MISSING" if not value else "ok"

    out = {}
    for mode in ("json", "stream"):
        ours, theirs = f[f"ours_{mode}"], f[f"litellm_{mode}"]
        out[f"rps_{mode}"] = met(
            ours["rps"] is not None and theirs["rps"] is not None and ours["rps"] >= theirs["rps"]
        )
        a, b = ours.get("added_p50_ms"), theirs.get("added_p50_ms")
        out[f"added_p50_{mode}"] = met(a is not None and b is not None and a <= b + 10)
    out["refuser_requests"] = met(f["refusal"]["ours"]["refuser_requests"] <= 4)
    return out


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _rps(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} /s"


def print_report(f: dict, args, litellm_version: str) -> None:
    ok = verdicts(f)
    rows = []
    for mode, label in (("json", "non-streamed"), ("stream", "streamed")):
        d, o, t = f[f"direct_{mode}"], f[f"ours_{mode}"], f[f"litellm_{mode}"]
        rows.append((f"requests/s, {label} ({args.requests} requests, {args.clients} clients)",
                     _rps(d["rps"]), _rps(o["rps"]), _rps(t["rps"]), TARGETS[f"rps_{mode}"][1],
                     ok[f"rps_{mode}"]))  # fmt: skip
        rows.append((f"added latency p50 over direct, {label}", f"(p50 {_ms(d['p50_ms'])})",
                     _ms(o.get("added_p50_ms")), _ms(t.get("added_p50_ms")),
                     TARGETS[f"added_p50_{mode}"][1], ok[f"added_p50_{mode}"]))  # fmt: skip
        rows.append((f"added latency p95 over direct, {label}", f"(p95 {_ms(d['p95_ms'])})",
                     _ms(o.get("added_p95_ms")), _ms(t.get("added_p95_ms")), "—", ""))  # fmt: skip
        if mode == "stream":
            rows.append(("time to first chunk with text, p50 / p95",
                         f"{_ms(d['first_chunk_p50_ms'])} / {_ms(d['first_chunk_p95_ms'])}",
                         f"{_ms(o['first_chunk_p50_ms'])} / {_ms(o['first_chunk_p95_ms'])}",
                         f"{_ms(t['first_chunk_p50_ms'])} / {_ms(t['first_chunk_p95_ms'])}",
                         "—", ""))  # fmt: skip
    r = f["refusal"]
    rows.append((f"refusal scenario ({args.turns} turns): requests to the refusing provider",
                 "—", str(r["ours"]["refuser_requests"]), str(r["litellm"]["refuser_requests"]),
                 "ours ≤ 4", ok["refuser_requests"]))  # fmt: skip
    header = ("figure", "direct", "ours (the door)", f"LiteLLM {litellm_version}", "target", "ok")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    print()
    print("context:")
    for mode, label in (("json", "non-streamed"), ("stream", "streamed")):
        d, o, t = f[f"direct_{mode}"], f[f"ours_{mode}"], f[f"litellm_{mode}"]
        print(f"  {label}, one client at a time ({LONE} requests each): p50 direct "
              f"{_ms(d['lone_p50_ms'])}, ours {_ms(o['lone_p50_ms'])} (added "
              f"{_ms(o['lone_added_p50_ms'])}), LiteLLM {_ms(t['lone_p50_ms'])} (added "
              f"{_ms(t['lone_added_p50_ms'])})")  # fmt: skip
        print(f"  {label}, under load: p50 / p95 direct {_ms(d['p50_ms'])} / {_ms(d['p95_ms'])}, "
              f"ours {_ms(o['p50_ms'])} / {_ms(o['p95_ms'])}, LiteLLM {_ms(t['p50_ms'])} / "
              f"{_ms(t['p95_ms'])}; provider requests per request: ours "
              f"{o['provider_requests_per_request']:.2f}, LiteLLM "
              f"{t['provider_requests_per_request']:.2f}")  # fmt: skip
        cpu = {
            name: f[f"{name}_{mode}"]["cpu_ms_per_request"]
            for name in ("direct", "ours", "litellm")
        }
        print(f"  {label}, CPU per request under load (/proc): the gateway's own processes "
              f"ours {_ms(cpu['ours'].get('ours'))} (web, workers, beat and its PostgreSQL "
              f"backends), LiteLLM {_ms(cpu['litellm'].get('litellm'))}; the provider "
              f"{_ms(cpu['direct'].get('provider'))} direct / {_ms(cpu['ours'].get('provider'))}"
              f" / {_ms(cpu['litellm'].get('provider'))}; the clients "
              f"{_ms(cpu['direct'].get('clients'))} / {_ms(cpu['ours'].get('clients'))} / "
              f"{_ms(cpu['litellm'].get('clients'))}; the whole machine (other users' work "
              f"too) {_ms(cpu['direct'].get('whole machine'))} / "
              f"{_ms(cpu['ours'].get('whole machine'))} / "
              f"{_ms(cpu['litellm'].get('whole machine'))}")  # fmt: skip
        if mode == "stream":
            print(f"  streamed, time to the first data: line p50: direct "
                  f"{_ms(d['first_line_p50_ms'])}, ours {_ms(o['first_line_p50_ms'])} (a "
                  f"role-only chunk sent before the run runs), LiteLLM "
                  f"{_ms(t['first_line_p50_ms'])}")  # fmt: skip
    for name, label in (("ours", "ours"), ("litellm", "LiteLLM")):
        facts = r[name]
        print(f"  refusal scenario, {label}: refusing provider {facts['refuser_requests']} "
              f"requests, fallback {facts['fallback_requests']}; answers by finish_reason "
              f"{facts['finish_reasons']}; turn p50 {_ms(facts['latency_p50_ms'])}"
              + (f"; errors {facts['errors']}" if facts["errors"] else ""))  # fmt: skip
    speed = f["machine_speed_ms"]
    print(f"  the door: manage.py up --concurrency {tp.WORKERS} (uvicorn, a Celery worker with "
          f"{tp.WORKERS} pool processes, the alerts worker, beat; DJANGO_DEBUG=0, PostgreSQL, "
          f"Redis); LiteLLM: litellm --num_workers {LITELLM_WORKERS}, no database")  # fmt: skip
    print(f"  this machine's speed: 10^6 additions in pure Python took {speed[0]:.1f} ms before "
          f"and {speed[1]:.1f} ms after (median of 5); load average after "
          f"{' '.join(f['loadavg'])} ({os.cpu_count()} cores)")  # fmt: skip


def failures(f: dict) -> dict[str, dict]:
    out = {}
    for key, row in f.items():
        if isinstance(row, dict) and row.get("errors"):
            out[key] = row["errors"]
    for name, facts in f["refusal"].items():
        if facts["errors"]:
            out[f"refusal_{name}"] = facts["errors"]
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requests", nargs="?", type=int, default=400,
                        help="requests per target and mode (default 400)")  # fmt: skip
    parser.add_argument("--clients", type=int, default=CLIENTS, help="concurrent clients (16)")
    parser.add_argument("--turns", type=int, default=TURNS, help="refusal scenario turns (30)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the database and the logs")
    parser.add_argument("--litellm-venv", type=Path, default=LITELLM_VENV,
                        help=f"LiteLLM's virtual environment (default {LITELLM_VENV})")  # fmt: skip
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 20000 or not 1 <= args.clients <= 64 or not 1 <= args.turns <= 200:
        parser.error("N must be 1-20000, --clients 1-64 and --turns 1-200")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    database_url, redis_url = tp.bench_urls(DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL)
    tp.interrupt_on_signals()
    system = GatewaySystem(database_url, redis_url)
    system.keep = args.keep
    litellm = LiteLLM(args.litellm_venv, system.var_dir)
    try:
        litellm.ensure_installed()
        speed_before = tp.machine_speed_ms()
        system.start_provider()
        system.prepare()
        system.start_up()
        litellm.start(system.provider_port)
        door = {"Authorization": f"Bearer {system.token}", "X-Forwarded-Proto": "https"}
        provider = f"http://127.0.0.1:{system.provider_port}"
        targets = {
            "direct": Target("direct", provider, "/v1/chat/completions", {}),
            "ours": Target("ours", system.base, "/v1/chat/completions", door, True),
            "litellm": Target("litellm", litellm.base, "/v1/chat/completions",
                              {"Authorization": f"Bearer {litellm.master_key}"}),
        }  # fmt: skip
        system.watcher.phase = "load"
        measured = measure(targets, system, args, lambda: whose(system, litellm))
        system.watcher.phase = "refusal scenario"
        refusal = refusal_scenario(targets, system, args.turns)
        result = figures(measured, refusal)
        result["machine_speed_ms"] = (speed_before, tp.machine_speed_ms())
        result["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
        result["litellm_version"] = litellm.version
        result["server_errors"] = system.server_errors()
        failed = failures(result)
        if args.json:
            print(json.dumps({"figures": result, "ok": verdicts(result),
                              "targets": {k: v[0] for k, v in TARGETS.items()}},
                             indent=2))  # fmt: skip
        else:
            print_report(result, args, litellm.version)
            if failed:
                print()
                print(f"WARNING: requests failed (figures are over the answered ones): {failed}")
                print(f"  the door logged: {result['server_errors']}")
        return 2 if failed else 0
    except tp.BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        for what, path in (("manage.py up", system.up_log), ("litellm", litellm.log_path)):
            if path.exists():
                kept = Path(tempfile.gettempdir()) / f"bench-gateway-{path.name}"
                shutil.copyfile(path, kept)
                print(f"{what} log kept in {kept}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        litellm.stop()
        system.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
