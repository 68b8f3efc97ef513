"""Benchmark: bad input on the real system is refused quickly and writes nothing.

The requirement: "Unknown fields → 400 naming the field. Every string refuses NUL
and lone surrogates; every number has a documented range; bodies over a
documented size → 413. All of it answers ``{"error": {"field": …,
"message": …}}`` within 50 ms, and writes nothing."

It starts the real system exactly as ``bench/throughput.py`` does (its
``System`` and ``Client``: ``manage.py up`` with ``DJANGO_DEBUG=0`` on a fresh
PostgreSQL database of its own, a Redis db it FLUSHDBs, the loopback
provider), with its own defaults: ``BENCH_DATABASE_URL`` (default
postgres://postgres@127.0.0.1:5432/governance_bench_bad_input) and
``BENCH_REDIS_URL`` (default redis://127.0.0.1:6379/6). It makes an
agent-client token, one thread and one settled run (for the run endpoints),
then sends each bad request below N times (default 50) in sequence over one
kept-alive httpx connection, after 3 unmeasured warm-up requests per case.

Per case it checks the status (the expected 4xx), the answer's shape (JSON,
exactly ``{"error": {"field": str|null, "message": str}}``) and the field
named, and measures the client's latency (request sent → whole answer read)
p50/p95/max; the ≤ 50 ms target is judged on p95 (max is printed beside it).
Around every case it counts the rows of every table (in a transaction it
rolls back): runs, stages and ledger entries (``governance_budgetentry``)
must not change, and any other table that changed is printed. The web
process's CPU per request (from /proc) is printed as context.

Beyond the issue's list, a 50 MB body shows whether the 413 depends on the
body's size. When a case misses its target (and unless ``--no-profile``), that
case is sent again (``4 × N`` times, fewer for a large body; ``--profile TEXT``
profiles a case anyway) with py-spy recording the web (uvicorn) process, and
the top functions by on-CPU samples are printed.

Run: .venv/bin/python bench/bad_input.py [N] [--only TEXT ...] [--profile TEXT ...]
[--no-profile] [--keep]. Exit 0 when every case answered its expected status and shape and
wrote nothing (whatever the latencies); 1 when the system did not start; 2
when a case answered 5xx, failed at the transport, or wrote rows; 3 when a case
answered another 4xx than expected or a malformed error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from throughput import (
    PYTHON,
    BenchError,
    Client,
    System,
    fmt_ms,
    log,
    pct,
    proc_table,
    require_loopback,
)

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/governance_bench_bad_input"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/6"  # throughput.py uses 13
TARGET_MS = 50.0
WARM_UP = 3  # unmeasured requests per case
CORE_TABLES = ("governance_run", "governance_stage", "governance_budgetentry")
BODY_LIMIT = 2_621_440  # DATA_UPLOAD_MAX_MEMORY_SIZE (dashboard/site/settings.py), 2.5 MiB
DEPTH = 100_000


@dataclass
class Case:
    name: str
    method: str
    path: str  # {thread} and {run} are filled in
    status: int  # the expected one
    fields: tuple[str | None, ...]  # acceptable error.field values
    body: bytes | None = None
    content_type: str | None = "application/json"
    params: dict[str, str] = field(default_factory=dict)


def _json(value: dict) -> bytes:
    return json.dumps(value).encode()


def cases() -> list[Case]:
    runs = "/api/v1/threads/{thread}/runs"
    deep = b"[" * DEPTH + b"]" * DEPTH
    big = b'{"input": "' + b"x" * 12_000_000 + b'"}'
    huge = b'{"input": "' + b"x" * 50_000_000 + b'"}'
    assert len(big) > BODY_LIMIT
    return [
        Case("NUL in input", "POST", runs, 400, ("input",), _json({"input": "a\x00b"})),
        # The raw JSON escape: json.dumps would refuse to make it from a str.
        Case("lone surrogate \\ud800 in input", "POST", runs, 400, (None, "input"),
             b'{"input": "a\\ud800b"}'),
        Case(f"JSON nested {DEPTH:,} deep", "POST", runs, 400, (None,), deep),
        Case("unknown field", "POST", runs, 400, ("colour",),
             _json({"input": "hi", "colour": "red"})),
        Case("no_progress_s: 1e-320", "POST", runs, 400, ("no_progress_s",),
             b'{"input": "hi", "no_progress_s": 1e-320}'),
        Case("deadline_s: 10**9", "POST", runs, 400, ("deadline_s",),
             _json({"input": "hi", "deadline_s": 10**9})),
        Case("budget.model_requests: 10**40", "POST", runs, 400, ("budget",),
             _json({"input": "hi", "budget": {"model_requests": 10**40}})),
        Case("NaN", "POST", runs, 400, (None, "deadline_s"),
             b'{"input": "hi", "deadline_s": NaN}'),
        Case(f"12 MB body (limit {BODY_LIMIT:,} B)", "POST", runs, 413, (None,), big),
        # Not in the list: the 413 should not depend on how much is sent.
        Case("50 MB body (extra)", "POST", runs, 413, (None,), huge),
        Case("wrong Content-Type (text/plain)", "POST", runs, 415, (None,),
             _json({"input": "hi"}), content_type="text/plain"),
        Case("events last_event_id=10**30", "GET", "/api/v1/runs/{run}/events", 400,
             ("Last-Event-ID",), None, content_type=None,
             params={"last_event_id": str(10**30)}),
        Case("unknown API path", "GET", "/api/v1/no-such-thing", 404, (None,), None,
             content_type=None),
        Case(f"acks nested {DEPTH:,} deep", "POST", "/api/v1/runs/{run}/acks", 400, (None,),
             b'{"through": ' + deep + b"}"),
    ]  # fmt: skip


# --------------------------------------------------------------------------- checks


def shape_problem(response: httpx.Response) -> str | None:
    """What is wrong with an error answer's shape (None: it is the API's one shape)."""
    kind = response.headers.get("content-type", "")
    if not kind.startswith("application/json"):
        return f"Content-Type {kind!r}"
    try:
        body = response.json()
    except ValueError:
        return "not JSON"
    if not isinstance(body, dict) or set(body) != {"error"}:
        return f"top-level keys {sorted(body) if isinstance(body, dict) else type(body)}"
    error = body["error"]
    if not isinstance(error, dict) or set(error) != {"field", "message"}:
        return f"error keys {sorted(error) if isinstance(error, dict) else type(error)}"
    if not (error["field"] is None or isinstance(error["field"], str)):
        return "error.field is neither a string nor null"
    if not isinstance(error["message"], str) or not error["message"]:
        return "error.message is not a non-empty string"
    return None


def table_counts(system: System) -> dict[str, int]:
    """Rows of every table of the system, read in a transaction that is rolled back."""
    with system.conn() as conn, conn.cursor() as cur:
        cur.execute("SELECT relname FROM pg_stat_user_tables WHERE schemaname = 'public'")
        names = sorted(r[0] for r in cur.fetchall())
        counts = {}
        for name in names:
            cur.execute(f'SELECT count(*) FROM "{name}"')
            counts[name] = cur.fetchone()[0]
        conn.rollback()
    return counts


def changed(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {
        name: after.get(name, 0) - before.get(name, 0)
        for name in sorted(set(before) | set(after))
        if after.get(name, 0) != before.get(name, 0)
    }


def quiet_counts(system: System, still_s: float = 2.0, timeout_s: float = 30.0) -> dict:
    """Table counts once they have not changed for ``still_s`` (the settled run's
    spans reach the span store up to SPAN_STORE_FLUSH_INTERVAL_MS, 5 s, later)."""
    counts, since = table_counts(system), time.monotonic()
    deadline = since + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = table_counts(system)
        if now != counts:
            counts, since = now, time.monotonic()
        elif time.monotonic() - since >= still_s:
            break
    return counts


def web_pid(system: System) -> int | None:
    return next((pid for pid, role in system.roles([]).items() if role == "web (uvicorn)"), None)


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    return proc_table().get(pid, (0, 0.0))[1]


# --------------------------------------------------------------------------- sending


@dataclass
class Result:
    case: Case
    latencies_ms: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    fields: Counter = field(default_factory=Counter)
    shape_problems: Counter = field(default_factory=Counter)
    transport_errors: Counter = field(default_factory=Counter)
    closes: int = 0  # answers with Connection: close
    message: str = ""
    wrote: dict[str, int] = field(default_factory=dict)
    web_cpu_ms: float | None = None

    @property
    def p95(self) -> float | None:
        return pct(self.latencies_ms, 95)

    def wrong(self) -> list[str]:
        """Why the answers are not what the case expects (empty: they are)."""
        problems = []
        others = {s: n for s, n in self.statuses.items() if s != self.case.status}
        if others:
            problems.append(f"statuses {others}")
        bad_fields = {f: n for f, n in self.fields.items() if f not in self.case.fields}
        if bad_fields:
            problems.append(f"fields {bad_fields}")
        if self.shape_problems:
            problems.append(f"shape {dict(self.shape_problems)}")
        if self.transport_errors:
            problems.append(f"transport {dict(self.transport_errors)}")
        return problems

    def verdict(self) -> str:
        if self.wrong() or any(t in self.wrote for t in CORE_TABLES):
            return "WRONG"
        p95 = self.p95
        return "ok" if p95 is not None and p95 <= TARGET_MS else "MISSING"


def send(client: Client, case: Case, targets: dict[str, str]) -> tuple[httpx.Response, float]:
    headers = {}
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    path = case.path.format(**targets)
    start = time.perf_counter()
    response = client.http.request(
        case.method, path, content=case.body, headers=headers, params=case.params or None
    )  # not streamed: the answer is read whole before this returns
    return response, (time.perf_counter() - start) * 1000


def run_case(system: System, client: Client, case: Case, targets: dict, n: int, pid) -> Result:
    result = Result(case)
    before = table_counts(system)  # the warm-up requests must not write either
    for _ in range(WARM_UP):
        with contextlib.suppress(httpx.HTTPError):  # counted in the measured requests
            send(client, case, targets)
    cpu_before = cpu_seconds(pid)
    for _ in range(n):
        try:
            response, latency = send(client, case, targets)
        except httpx.HTTPError as exc:
            result.transport_errors[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
            continue
        result.latencies_ms.append(latency)
        result.statuses[response.status_code] += 1
        if response.headers.get("connection", "").lower() == "close":
            result.closes += 1
        problem = shape_problem(response)
        if problem:
            result.shape_problems[problem] += 1
            continue
        error = response.json()["error"]
        result.fields[error["field"]] += 1
        result.message = result.message or error["message"]
    result.web_cpu_ms = (cpu_seconds(pid) - cpu_before) * 1000 / max(1, n)
    result.wrote = changed(before, table_counts(system))
    return result


# --------------------------------------------------------------------------- profile


def profile_case(
    system: System, client: Client, case: Case, targets: dict, n: int, pid: int, out: Path
) -> list[str]:
    """Send ``case`` n times with py-spy on the web process; its top functions (on CPU)."""
    spy = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
    if not Path(spy).exists():
        return [f"(no py-spy at {spy}: pip install py-spy)"]
    command = [spy, "record", "--pid", str(pid), "--format", "speedscope", "--output", str(out),
               "--rate", "500", "--threads", "--nonblocking"]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attached before the requests start
    began = time.perf_counter()
    latencies = []
    for _ in range(n):
        with contextlib.suppress(httpx.HTTPError):
            latencies.append(send(client, case, targets)[1])
    wall = time.perf_counter() - began
    proc.send_signal(signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
    if not out.exists():
        return [f"(py-spy wrote no profile: {err.decode(errors='replace')[-300:]})"]
    lines = [
        f"{n} requests in {wall:.2f} s under py-spy (p50 {fmt_ms(pct(latencies, 50))}, "
        f"p95 {fmt_ms(pct(latencies, 95))}); profile {out}"
    ]
    return lines + summarize(out, n)


ROOT = str(Path(__file__).resolve().parent.parent)


def _where(frame: dict) -> str:
    file = frame.get("file") or ""
    for marker in ("/site-packages/", f"{ROOT}/", "/lib/python3.11/", "/lib/python3"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


# Frames every sample passes through (threads, the event loop, uvicorn's start):
# left out of the inclusive list so what the request does shows.
PLUMBING = ("threading.py", "concurrent/", "asyncio/", "selectors.py", "click/", "<frozen runpy>",
            "uvicorn/main.py", "uvicorn/server.py", "uvicorn/_compat.py", "uvicorn/__main__.py",
            "asgiref/current_thread_executor.py")  # fmt: skip
# Leaves where a thread waits for work, though py-spy still sampled it: the event
# loop in epoll, pool threads on their queue. Counted apart, not as busy time.
WAITING = (
    ("selectors.py", "EpollSelector.select"),
    ("threading.py", "Condition.wait"),
    ("concurrent/futures/thread.py", "_worker"),
)


def summarize(path: Path, requests: int, top: int = 25) -> list[str]:
    """Samples of every thread of the web process (py-spy without --idle: on CPU,
    though it still catches the event loop in epoll now and then, shown apart):
    top functions by inclusive (own + children) share, then by own share, and
    own time by package / file."""
    data = json.loads(path.read_text())
    frames = data["shared"]["frames"]

    def key(index: int) -> tuple[str, str, object]:
        frame = frames[index]
        return frame.get("name", "?"), _where(frame), frame.get("line")

    inclusive: Counter = Counter()
    own: Counter = Counter()
    packages: Counter = Counter()
    total = waiting = 0.0
    for profile in data["profiles"]:
        samples = profile.get("samples") or []
        weights = profile.get("weights") or [1] * len(samples)
        for stack, weight in zip(samples, weights, strict=True):
            if not stack:
                continue
            leaf = key(stack[-1])
            if any(leaf[1].startswith(f) and leaf[0] == n for f, n in WAITING):
                waiting += weight
                continue
            total += weight
            for name in {key(i) for i in stack}:
                if name[0].startswith("thread (") or name[1].startswith(PLUMBING):
                    continue
                inclusive[name] += weight
            own[leaf] += weight
            packages[leaf[1].split("/", 1)[0] if "/" in leaf[1] else leaf[1]] += weight
    if not total:
        return ["(no samples)"]
    unit = data["profiles"][0].get("unit", "seconds")
    scale = 1000 if unit == "seconds" else 1
    lines = [
        f"web process busy {total * scale:.0f} ms in all ({total * scale / requests:.2f} ms per "
        f"request; waiting for work in epoll or a pool queue another "
        f"{waiting * scale / requests:.2f} ms per request, left out); shares of the busy time:",
        f"{'incl %':>7} {'own %':>6}  function  (file:line)",
    ]
    for name, weight in inclusive.most_common(top):
        lines.append(f"{100 * weight / total:7.1f} {100 * own[name] / total:6.1f}  {name[0]}  "
                     f"({name[1]}:{name[2]})")  # fmt: skip
    lines.append("top functions by own time:")
    for name, weight in own.most_common(12):
        lines.append(f"{100 * weight / total:7.1f}  {name[0]}  ({name[1]}:{name[2]})")
    lines.append("own time by top-level package / file:")
    for name, weight in packages.most_common(10):
        lines.append(f"{100 * weight / total:7.1f}  {name}")
    return lines


# --------------------------------------------------------------------------- report


def print_table(results: list[Result]) -> None:
    header = ("case", "status", "field", "p50", "p95", "max", "target", "ok")
    rows = []
    for r in results:
        status = ", ".join(f"{s}×{k}" if len(r.statuses) > 1 else str(s)
                           for s, k in sorted(r.statuses.items())) or "-"  # fmt: skip
        if r.transport_errors:
            status += f" (+{sum(r.transport_errors.values())} transport errors)"
        fields = ", ".join("null" if f is None else f for f in r.fields) or "-"
        rows.append((
            r.case.name, status, fields, fmt_ms(pct(r.latencies_ms, 50)), fmt_ms(r.p95),
            fmt_ms(max(r.latencies_ms, default=None)), f"≤ {TARGET_MS:.0f} ms", r.verdict(),
        ))  # fmt: skip
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print(" | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def print_context(results: list[Result], n: int, total_wrote: dict[str, int]) -> None:
    print()
    print(f"{n} requests per case after {WARM_UP} unmeasured ones, one kept-alive connection; "
          f"ok: expected status, error shape and field, no run/stage/ledger row written, "
          f"p95 ≤ {TARGET_MS:.0f} ms")  # fmt: skip
    print("per case: expected status, web process CPU per request, Connection: close answers, "
          "first message")  # fmt: skip
    for r in results:
        cpu = "n/a" if r.web_cpu_ms is None else f"{r.web_cpu_ms:.1f} ms"
        print(f"  {r.case.name}: expect {r.case.status}; web CPU {cpu}/request; "
              f"closes {r.closes}; {r.message[:110]!r}")  # fmt: skip
        for problem in r.wrong():
            print(f"    WRONG: {problem}")
        if r.wrote:
            print(f"    rows changed while it ran: {r.wrote}")
    core = {t: total_wrote.get(t, 0) for t in CORE_TABLES}
    others = {t: d for t, d in total_wrote.items() if t not in CORE_TABLES}
    print(f"rows changed over all cases: {core} (must be 0); other tables: {others or 'none'}")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"load average at the end: {load} ({os.cpu_count()} cores)")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str]) -> argparse.Namespace:
    names = [c.name for c in cases()]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=50, help="requests per case (50)")
    parser.add_argument(
        "--only", action="append", default=[], metavar="TEXT",
        help="only the cases whose name contains TEXT (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-profile", action="store_true", help="do not profile misses")
    parser.add_argument(
        "--profile", action="append", default=[], metavar="TEXT",
        help="also profile the cases whose name contains TEXT (repeatable)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the database and up.log")
    args = parser.parse_args(argv)
    if not 1 <= args.n <= 1000:
        parser.error("N must be 1-1000")
    if args.only and not any(o.lower() in n.lower() for o in args.only for n in names):
        parser.error(f"--only matches no case of {names}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    database_url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL)
    redis_url = os.environ.get("BENCH_REDIS_URL", DEFAULT_REDIS_URL)
    require_loopback(database_url, "BENCH_DATABASE_URL")
    require_loopback(redis_url, "BENCH_REDIS_URL")

    def on_term(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    selected = [
        c for c in cases() if not args.only or any(o.lower() in c.name.lower() for o in args.only)
    ]
    system = System(database_url, redis_url)
    system.keep = args.keep
    client = None
    try:
        system.start_provider()
        system.prepare()
        system.start_up()
        client = Client(system)
        thread_id = client.create_thread()
        run_id, _start, _latency = client.submit(thread_id)
        client.wait_settled(run_id)
        log(f"thread {thread_id} and settled run {run_id} made")
        targets = {"thread": thread_id, "run": run_id}
        pid = web_pid(system)
        start_counts = quiet_counts(system)
        results = []
        for case in selected:
            result = run_case(system, client, case, targets, args.n, pid)
            log(f"{case.name}: {dict(result.statuses)} p95 {fmt_ms(result.p95)}")
            results.append(result)
        total_wrote = changed(start_counts, table_counts(system))
        print_table(results)
        print_context(results, args.n, total_wrote)
        server_errors = system.server_errors()
        if server_errors:
            print(f"the system logged: {server_errors}")
        misses = [
            r for r in results
            if (r.verdict() == "MISSING" and not args.no_profile)
            or any(p.lower() in r.case.name.lower() for p in args.profile)
        ]  # fmt: skip
        if misses and pid is not None:
            for r in misses:
                out = Path(tempfile.gettempdir()) / f"bench-bad-input-{results.index(r)}.json"
                print()
                print(f"profile of the web process for {r.case.name!r}:")
                # At most about 1 GB sent again for a large body.
                times = min(4 * args.n, max(20, 10**9 // max(1, len(r.case.body or b""))))
                for line in profile_case(system, client, r.case, targets, times, pid, out):
                    print("  " + line)
        fatal = any(
            s >= 500 for r in results for s in r.statuses
        ) or any(r.transport_errors for r in results) or any(
            total_wrote.get(t) for t in CORE_TABLES
        ) or any(t in r.wrote for r in results for t in CORE_TABLES)  # fmt: skip
        if fatal:
            return 2
        return 3 if any(r.wrong() for r in results) else 0
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        if system.up is not None:
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
