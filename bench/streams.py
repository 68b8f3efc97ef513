"""Benchmark: hundreds of idle SSE streams on one uvicorn process (R7.1).

Design under test: ``GET /api/v1/runs/{id}/events`` is an async Django view; an
idle stream is one suspended coroutine, and one poller per event loop looks for
new events (``max(RunEvent.id)``) every 0.5 s for all streams together, so idle
streams cost neither a thread nor a database query each.

Target (2 cores): STREAMS idle streams held HOLD_S seconds on a running run add
at most 64 MB of server RSS (≈ 220 KB per stream) and use at most 10 % of one
core while idle; every stream receives the run's replay first, and a chunk
committed while they are open reaches every one of them.

Run: DATABASE_URL=postgres://… .venv/bin/python bench/streams.py [STREAMS] [HOLD_S]
(without DATABASE_URL it uses the SQLite file under var/). Bounded: at most
1000 streams and 60 s of holding; the server is stopped at the end.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.site.settings")

STREAMS = min(int(sys.argv[1]) if len(sys.argv) > 1 else 300, 1000)
HOLD_S = min(float(sys.argv[2]) if len(sys.argv) > 2 else 10.0, 60.0)
TARGET_RSS_MB = 64.0
TARGET_CPU_PCT = 10.0
TOKEN = "bench-streams-token-" + "z" * 16
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def setup_run() -> str:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from governance import services, time_source
    from governance.models import ApiToken, Provider
    from governance.services.tokens import token_digest

    call_command("migrate", verbosity=0)
    user, _ = get_user_model().objects.get_or_create(username="bench-streams")
    ApiToken.objects.get_or_create(
        key_digest=token_digest(TOKEN), defaults={"user": user, "name": "bench"}
    )
    Provider.objects.get_or_create(
        provider_id="bench-streams", defaults={"kind": "scripted", "model": "m"}
    )
    thread = services.create_thread(provider_chain=["bench-streams"], now=time_source.now())
    run, _stage, _ = services.submit_run(thread, input="a long answer", now=time_source.now())
    services.commit_chunks(run, [f"part {i} " for i in range(1, 21)], time_source.now())
    return str(run.id)


def commit_one(run_id: str) -> None:
    from governance import services, time_source
    from governance.models import Run

    services.commit_chunks(Run.objects.get(id=run_id), ["the late part"], time_source.now())


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def proc_rss_mb(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def open_stream(port: int, run_id: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"GET /api/v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    seen = b""
    while b"part 20" not in seen:  # the replay of the committed chunks
        data = await asyncio.wait_for(reader.read(65536), 30)
        if not data:
            raise RuntimeError(f"stream closed early: {seen[:300]!r}")
        seen += data
    return reader, writer


async def wait_for(reader, needle: bytes) -> None:
    seen = b""
    while needle not in seen:
        data = await asyncio.wait_for(reader.read(65536), 30)
        if not data:
            raise RuntimeError("stream closed")
        seen += data


async def main(run_id: str) -> dict:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "dashboard.site.asgi:application", "--host", "127.0.0.1",
         "--port", str(port), "--log-level", "warning", "--no-access-log"],
        cwd=ROOT, env={**os.environ, "OTEL_SDK_DISABLED": "true"},
    )  # fmt: skip
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        # Warm up one stream so the baseline includes Django's imports.
        _reader, writer = await open_stream(port, run_id)
        writer.close()
        await asyncio.sleep(1.0)
        base_rss = proc_rss_mb(server.pid)
        started = time.monotonic()
        streams = []
        for start in range(0, STREAMS, 50):  # open in batches of 50
            batch = [open_stream(port, run_id) for _ in range(start, min(start + 50, STREAMS))]
            streams += await asyncio.gather(*batch)
        open_s = time.monotonic() - started
        await asyncio.sleep(1.0)
        cpu0, t0 = proc_cpu_s(server.pid), time.monotonic()
        await asyncio.sleep(HOLD_S)
        idle_cpu = 100 * (proc_cpu_s(server.pid) - cpu0) / (time.monotonic() - t0)
        rss = proc_rss_mb(server.pid)
        fan0 = time.monotonic()
        await asyncio.to_thread(commit_one, run_id)
        await asyncio.gather(*(wait_for(r, b"the late part") for r, _w in streams))
        fan_out_s = time.monotonic() - fan0
        for _r, w in streams:
            w.close()
        await asyncio.sleep(2.0)
    finally:
        server.terminate()
        server.wait(10)
    return {"open_s": open_s, "base_rss": base_rss, "rss": rss, "idle_cpu": idle_cpu,
            "fan_out_s": fan_out_s}  # fmt: skip


def report(run_id: str, m: dict) -> int:
    from governance.models import Run, RunViewer

    open_s, base_rss, rss = m["open_s"], m["base_rss"], m["rss"]
    idle_cpu, fan_out_s = m["idle_cpu"], m["fan_out_s"]
    detached = RunViewer.objects.filter(run_id=run_id, disconnected_at__isnull=False).count()
    cancelled = Run.objects.get(id=run_id).cancel_requested_at is not None
    extra = rss - base_rss
    print(f"streams open: {STREAMS} (opened and replayed in {open_s:.2f} s)")
    per_stream_kb = 1024 * extra / STREAMS
    print(f"server RSS: {base_rss:.1f} MB before, {rss:.1f} MB with streams (+{extra:.1f} MB, "
          f"{per_stream_kb:.0f} KB per stream); target ≤ +{TARGET_RSS_MB:.0f} MB")  # fmt: skip
    print(f"server CPU while idle for {HOLD_S:.0f} s: {idle_cpu:.1f} % of one core; "
          f"target ≤ {TARGET_CPU_PCT:.0f} %")  # fmt: skip
    print(f"a new chunk reached all {STREAMS} streams in {fan_out_s:.2f} s")
    print(f"viewers detached after close: {detached} of {STREAMS + 1}; run cancelled: {cancelled}")
    ok = extra <= TARGET_RSS_MB and idle_cpu <= TARGET_CPU_PCT and not cancelled
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    the_run = setup_run()
    sys.exit(report(the_run, asyncio.run(main(the_run))))
