"""Benchmark: a critical freeze notification while a flood of turns is queued.

Design under test (R6.7): work waits in queues by kind, and the
alerts queue has a worker of its own, so the page to on-call that a segment
froze never waits behind a backlog of model turns.

It starts the real system (``manage.py up``: web, a worker on every queue, the
alerts worker, beat; ``DJANGO_DEBUG=0``) on a fresh PostgreSQL database and a
Redis db of its own (the same machinery as ``bench/throughput.py``), a
loopback OpenAI-compatible provider that takes 200 ms per answer, and a
webhook alert channel pointing at a receiver in this process. Then:

1. the flood: N single-turn runs on N threads, admitted and published
   through the services in one ``manage.py shell`` (admission's backpressure
   is turned off for the flood: it is meant to be queued);
2. after ``--settle`` seconds of work, the freeze: a thread whose only
   provider refuses (its segment's last re-probe is due) gets a run whose
   turn is executed at once, out of the queue, the way a worker would run it
   (``tasks.stages.run_stage`` in a ``manage.py shell``) — the segment
   freezes and the critical notification is written;
3. it prints the time from the notification's ``created_at`` to the webhook
   receiving it, beside the target (≤ 5 s), and the turns' queue clock.

``--baseline REV`` runs the same against a checkout of ``REV`` (a git
worktree made under /tmp; e.g. the tree before the queues by kind, where
everything shared one FIFO queue) and prints both. A notification not
delivered within ``--wait`` seconds is reported with the number of messages
queued ahead of it.

Run: .venv/bin/python bench/flood.py [N] [--settle S] [--wait S] [--baseline REV]
[--keep] (defaults 10000 runs, 10 s, 120 s). Uses only HTTP, manage.py and
SQL (never the project's modules). Exit 0 whatever the figures; 1 when the
system did not start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput as tp  # the same system machinery

PROVIDER_DELAY_S = 0.2
TARGET_S = 5.0
REFUSER_ID = "bench-refuser"


# --------------------------------------------------------------------------- loopback servers


class _SlowProvider(tp._ProviderHandler):
    """Answers after 200 ms; the refuser's model is refused (content_filter)."""

    def _post(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            request = {}
        if request.get("model") == "refuser-model":
            chunk = {
                "id": "x",
                "object": "chat.completion.chunk",
                "model": "refuser-model",
                "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}],
            }
            data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        time.sleep(PROVIDER_DELAY_S)
        # The parent's handler reads the body itself: hand it back.
        self.rfile = _Replay(raw)
        self.headers.replace_header("Content-Length", str(len(raw)))
        super()._post()


class _Replay:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, _n: int = -1) -> bytes:
        data, self.data = self.data, b""
        return data


def serve_slow_provider(port_queue) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    server = tp._Server(("127.0.0.1", 0), _SlowProvider)
    port_queue.put(server.server_address[1])
    server.serve_forever(poll_interval=0.2)


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[float, dict]] = []  # noqa: RUF012

    def log_message(self, *_args) -> None:
        pass

    def do_POST(self) -> None:
        at = time.time()
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            payload = json.loads(body or b"{}")
        except ValueError:
            payload = {"raw": body.decode(errors="replace")}
        type(self).received.append((at, payload))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


# --------------------------------------------------------------------------- the system


class FloodSystem(tp.System):
    def __init__(self, database_url: str, redis_url: str, root: Path) -> None:
        super().__init__(database_url, redis_url)
        self.root = root
        self.env.update({
            # The flood is meant to be queued: admission's backpressure is off.
            "GOVERNANCE_ADMISSION_MAX_QUEUE_AGE_SECONDS": "0",
            "GOVERNANCE_ADMISSION_MAX_QUEUED": "0",
            "GOVERNANCE_OUTBOUND_ALLOW": "127.0.0.1",
            "DATABASE_POOL_MAX_SIZE": "4",
        })  # fmt: skip

    def use_root(self) -> None:
        tp.ROOT, tp.MANAGE = self.root, str(self.root / "manage.py")

    def start_provider(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        port_queue = context.Queue()
        self.provider_proc = context.Process(target=serve_slow_provider, args=(port_queue,))
        self.provider_proc.start()
        self.provider_port = port_queue.get(timeout=30)
        tp.log(f"slow provider ({PROVIDER_DELAY_S * 1000:.0f} ms) on :{self.provider_port}")

    def shell(self, script: str, timeout: float = 900) -> str:
        return self.manage("shell", "-c", script, timeout=timeout)


FLOOD = """
import inspect, json, time
import tasks.celery  # the project's Celery app (a tree before dashboard.apps loads it)
from governance import services, time_source
from governance.models import Thread
from governance.services.broker import publish
by_stage = "stages" in inspect.signature(publish).parameters
began = time.time()
for index in range({n}):
    now = time_source.now()
    thread = services.create_thread(provider_chain=[{provider!r}], now=now, title="flood")
    run, stage, _ = services.submit_run(
        Thread.objects.get(id=thread.id), input=f"flood {{index}}", now=now,
        idempotency_key=f"flood-{{index}}")
    publish([stage] if by_stage else [stage.id])
print(json.dumps({{"seconds": time.time() - began}}))
"""

FREEZE = """
import json
from datetime import timedelta
from governance import services, time_source
from governance.models import AlertChannel, Notification, SegmentRefusal, Thread
from tasks.stages import run_stage
now = time_source.now()
thread = services.create_thread(provider_chain=[{refuser!r}], now=now, title="freezes")
segment = services.open_segment(Thread.objects.get(id=thread.id))
# Two re-probes already spent; the last one is due: its refusal freezes the segment.
SegmentRefusal.objects.create(segment=segment, provider_id={refuser!r}, model="refuser-model",
                              refusals=3, refused_at=now - timedelta(hours=7))
run, stage, _ = services.submit_run(Thread.objects.get(id=thread.id), input="freeze",
                                    now=time_source.now(), idempotency_key="freeze")
result = run_stage(stage.id)
notice = Notification.objects.filter(segment=segment, severity="critical").first()
print(json.dumps({{"result": result, "notification": notice and notice.id,
                  "created_at": notice and notice.created_at.timestamp()}}))
"""


def prepare(system: FloodSystem, receiver_url: str) -> None:
    system.prepare()
    base_url = f"http://127.0.0.1:{system.provider_port}/v1"
    system.shell(
        "from governance.models import AlertChannel, Provider\n"
        f"Provider.objects.create(provider_id={REFUSER_ID!r}, kind='openai', "
        f"model='refuser-model', base_url={base_url!r})\n"
        f"AlertChannel.objects.create(name='bench-webhook', kind='webhook', "
        f"target={receiver_url!r})\n"
    )


def queue_clock(system: FloodSystem) -> dict:
    with system.conn() as conn:
        started = [
            row[0]
            for row in conn.execute(
                "SELECT (clocks->>'queue_ms')::int FROM governance_stage "
                "WHERE started_at IS NOT NULL AND clocks ? 'queue_ms'"
            )
        ]
        waiting, oldest = conn.execute(
            "SELECT count(*), min(enqueued_at) FROM governance_stage WHERE started_at IS NULL"
        ).fetchone()
        conn.rollback()
    return {
        "executed": len(started),
        "queue_p50_ms": statistics.median(started) if started else None,
        "queue_max_ms": max(started) if started else None,
        "waiting": waiting,
        "oldest_wait_s": (datetime.now(oldest.tzinfo) - oldest).total_seconds() if oldest else None,
    }


def ahead_of_alert(system: FloodSystem) -> int | None:
    """Messages queued ahead of a waiting alert delivery (the single FIFO queue)."""
    import redis

    client = redis.Redis.from_url(system.redis_url)
    for name in ("alerts", "celery", "turns"):
        messages = client.lrange(name, 0, -1)
        for index, raw in enumerate(messages):
            if b"tasks.alerts.deliver_alert" in raw:
                return len(messages) - 1 - index  # consumed from the right
    return None


def measure(root: Path, label: str, args) -> dict:
    database_url = os.environ.get(
        "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/governance_flood"
    )
    redis_url = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    _Receiver.received = []
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    receiver_url = f"http://127.0.0.1:{receiver.server_address[1]}/alerts"
    system = FloodSystem(database_url, redis_url, root)
    system.keep = args.keep
    system.use_root()
    figures: dict = {"label": label, "root": str(root)}
    try:
        system.start_provider()
        prepare(system, receiver_url)
        system.start_up()
        tp.log(f"[{label}] flooding {args.runs:,} runs")
        flood = json.loads(
            system.shell(FLOOD.format(n=args.runs, provider=tp.PROVIDER_ID)).splitlines()[-1]
        )
        figures["flood_seconds"] = flood["seconds"]
        tp.log(f"[{label}] flood queued in {flood['seconds']:.1f} s; working for {args.settle} s")
        time.sleep(args.settle)
        figures["before"] = queue_clock(system)
        freeze = json.loads(system.shell(FREEZE.format(refuser=REFUSER_ID)).splitlines()[-1])
        if not freeze["created_at"]:
            raise tp.BenchError(2, f"the freeze wrote no critical notification: {freeze}")
        tp.log(f"[{label}] segment frozen (stage {freeze['result']}); waiting for the webhook")
        deadline = time.time() + args.wait
        while time.time() < deadline and not _Receiver.received:
            time.sleep(0.02)
        figures["after"] = queue_clock(system)
        if _Receiver.received:
            figures["delivered_s"] = _Receiver.received[0][0] - freeze["created_at"]
        else:
            figures["delivered_s"] = None
            figures["ahead"] = ahead_of_alert(system)
    finally:
        system.stop()
        receiver.shutdown()
    return figures


def baseline_root(rev: str) -> Path:
    path = Path("/tmp") / f"flood-baseline-{rev[:12]}"
    if not path.exists():
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), rev], cwd=tp.ROOT, check=True,
            capture_output=True,
        )  # fmt: skip
    return path


def report(figures: list[dict], args) -> None:
    print()
    print(
        f"critical notification after a freeze, {args.runs:,} single-turn runs queued, "
        f"provider {PROVIDER_DELAY_S * 1000:.0f} ms, 2 worker processes + the alerts worker"
    )
    print(f"{'tree':<44} | {'freeze → webhook':<28} | {'target':<8} | ok")
    for f in figures:
        if f["delivered_s"] is not None:
            got = f"{f['delivered_s']:.2f} s"
        else:
            got = f"not in {args.wait:.0f} s ({f.get('ahead') or '?'} ahead)"
        ok = "ok" if f["delivered_s"] is not None and f["delivered_s"] <= TARGET_S else "MISSING"
        print(f"{f['label']:<44} | {got:<28} | ≤ {TARGET_S:.0f} s  | {ok}")
    print()
    for f in figures:
        b, a = f["before"], f["after"]
        print(
            f"  {f['label']}: flood queued in {f['flood_seconds']:.1f} s; at the freeze "
            f"{b['executed']:,} turns done, {b['waiting']:,} waiting "
            f"(oldest {b['oldest_wait_s']:.0f} s); turns' queue clock "
            f"p50 {a['queue_p50_ms']} ms, max {a['queue_max_ms']} ms"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="?", type=int, default=10_000)
    parser.add_argument("--settle", type=float, default=10.0)
    parser.add_argument("--wait", type=float, default=120.0)
    parser.add_argument("--baseline", help="a git revision to measure beside this tree")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if not 1 <= args.runs <= 50_000:
        print("runs must be from 1 to 50,000", file=sys.stderr)
        return 2
    here = Path(__file__).resolve().parent.parent
    figures = []
    try:
        if args.baseline:
            figures.append(measure(baseline_root(args.baseline), f"baseline {args.baseline}", args))
        figures.append(measure(here, "this tree", args))
    except tp.BenchError as exc:
        print(f"flood: {exc}", file=sys.stderr)
        return exc.code
    report(figures, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
