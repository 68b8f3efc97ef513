"""Benchmark: the refusal rule and turn routing on the hot path of every turn.

Target: routing a 5-provider chain with mixed refusal and health state, and
driving its refusal protocol, each stay well under 100 µs per turn on one
core, so governance never shows up next to a model call's latency.

Run: .venv/bin/python bench/routing.py
"""

from __future__ import annotations

import sys
import timeit
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from governance.rules.breaker import HealthVerdict
from governance.rules.refusal import ProviderRefusal, refusal_verdict
from governance.rules.routing import AttemptOutcome, ChainEntry, drive_turn, route_turn

TARGET_US = 100.0
NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
CHAIN = tuple(ChainEntry(f"p{i}", f"model-{i}") for i in range(5))
REFUSALS = {
    "p0": ProviderRefusal("p0", "model-0", "policy", 4, NOW - timedelta(hours=9)),
    "p1": ProviderRefusal("p1", "model-1", "policy", 1, NOW - timedelta(minutes=3)),
    "p2": ProviderRefusal("p2", "model-2", "policy", 2, (NOW - timedelta(hours=2)).isoformat()),
}
HEALTH = {"p3": HealthVerdict(False, "open", NOW + timedelta(seconds=30), "breaker open")}
REFUSE = AttemptOutcome("refused", refusal_category="policy")
ACCEPT = AttemptOutcome("accepted")


def one_turn() -> None:
    route = route_turn(CHAIN, now=NOW, health=HEALTH, refusals=REFUSALS)
    drive_turn(
        route,
        lambda candidate, _kind: REFUSE if candidate.provider_id == "p2" else ACCEPT,
        segment_key="sess#1",
        refusals=REFUSALS,
        has_unaccepted_increment=True,
        now=NOW,
    )


def main() -> int:
    results = {}
    for name, fn in {
        "refusal_verdict": lambda: refusal_verdict(REFUSALS["p2"], NOW),
        "route_turn + drive_turn": one_turn,
    }.items():
        loops, _ = timeit.Timer(fn).autorange()
        best = min(timeit.repeat(fn, number=loops, repeat=5)) / loops * 1e6
        results[name] = best
        print(f"{name:28s} {best:8.2f} µs per call")
    ok = results["route_turn + drive_turn"] < TARGET_US
    print(f"target: route + drive < {TARGET_US:.0f} µs — {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
