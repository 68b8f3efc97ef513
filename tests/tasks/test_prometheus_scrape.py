"""A real Prometheus (Debian's ``prometheus``) scrapes the running system's
GET /metrics with the bearer token while a refusal is driven to a freeze on
the real turn path, and its HTTP API reads back the frozen segment, the
re-probe counters and the incident nobody acknowledged (R3.2, R8.2)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import timedelta

import pytest

from governance.rules.outbound import parse_allow_list
from tasks.jobs import tier_attempts

pytestmark = pytest.mark.django_db(transaction=True)

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
TOKEN = "scrape-token-" + "p" * 24


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def prometheus(tmp_path, live_server, settings):
    """Prometheus on a port of its own, scraping the live server every second."""
    settings.GOVERNANCE_METRICS_TOKEN = TOKEN
    settings.GOVERNANCE_METRICS_ALLOW = parse_allow_list([])  # the token, nothing else
    assert shutil.which(PROMETHEUS), (
        "prometheus not found: apt-get install prometheus (.ci/services.sh does on CI)"
    )
    target = live_server.url.removeprefix("http://")
    (tmp_path / "token").write_text(TOKEN)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: governance\n"
        f"    authorization:\n      credentials_file: {tmp_path / 'token'}\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}", tmp_path / "prometheus.log"
    finally:
        proc.terminate()
        proc.wait(30)


def query(base: str, promql: str) -> list[dict]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]["result"]


def read_back(
    base: str, promql: str, log, timeout: float = 30.0, *, key: str = "provider", until=bool
) -> dict[str, float]:
    """The query's values by their ``key`` label (or "") once Prometheus has
    scraped what ``until`` waits for (any answer, by default)."""
    deadline = time.monotonic() + timeout
    found: dict[str, float] = {}
    while time.monotonic() < deadline:
        try:
            results = query(base, promql)
        except OSError:
            results = []  # Prometheus is still starting
        found = {r["metric"].get(key, ""): float(r["value"][1]) for r in results}
        if found and until(found):
            return found
        time.sleep(0.5)
    raise AssertionError(f"{found} for {promql}\n{log.read_text()[-2000:]}")


def test_r3_2_prometheus_reads_a_freeze_driven_through_the_engine(
    prometheus, api, worker, manual_clock, scripted_provider
):
    """R3.2 on the real turn path: sentinel refuses the segment's bytes, is
    re-probed after 15 min, 1 h and 6 h, refuses each time and is frozen;
    harbor answers every turn. Prometheus reads the frozen segment, the sends
    by tier (once the beat's tiering pass has decided them), the re-probes,
    and the incident the freeze opened (R3.6, R8.2)."""
    base, log = prometheus
    scripted_provider("sentinel", {"default": {"refuse": {"category": "policy"}}})
    scripted_provider("harbor", {"default": {"answer": {"text": "Here you are."}}})
    thread = api.post(
        "/api/v1/threads", {"provider_chain": ["sentinel", "harbor"]}, expect=201
    ).json()
    # This process's re-probes so far (other tests' included), once Prometheus has scraped.
    assert read_back(base, 'up{job="governance"} == 1', log) == {"": 1.0}
    reprobes_before = read_back(
        base, 'sum(governance_turn_events_total{event="reprobe"}) or vector(0)', log, key=""
    )[""]
    for wait in (None, timedelta(minutes=15), timedelta(hours=1), timedelta(hours=6)):
        if wait is not None:
            manual_clock.advance(wait)
        run = api.run_and_wait(thread["id"], "Tell me about the vault.")
        assert run["settlement"]["outcome"] == "completed"
        tier_attempts()  # the beat's pass: each send's tier, decided once

    frozen = read_back(base, 'governance_segments_by_refusal_state{state="frozen"} > 0', log)
    assert frozen == {"sentinel": 1.0}
    sends = read_back(
        base, 'sum by (tier) (governance_refusal_sends_total{provider="sentinel"})', log,
        key="tier", until=lambda found: len(found) == 4,
    )  # fmt: skip
    assert sends == {"original": 1.0, "re_probe_1": 1.0, "re_probe_2": 1.0, "re_probe_3": 1.0}
    refused = read_back(
        base, 'governance_provider_attempts_total{provider="sentinel"}', log, key="outcome"
    )
    assert refused == {"refusal": 4.0}  # R3.2: at most 4 sends in the segment
    reprobes = read_back(
        base, 'sum(governance_turn_events_total{event="reprobe"})', log, key="",
        until=lambda found: found[""] >= reprobes_before + 3,
    )  # fmt: skip
    assert reprobes[""] - reprobes_before == 3
    assert read_back(base, 'governance_incidents_open{state="triggered"}', log) == {"": 1.0}
    assert read_back(base, "governance_critical_notifications_unacknowledged", log) == {"": 1.0}
    up = read_back(base, 'up{job="governance"}', log)
    assert up == {"": 1.0}
