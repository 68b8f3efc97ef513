"""A real Prometheus (Debian's ``prometheus``) scrapes the running system's
GET /metrics with the bearer token, and its HTTP API reads the facts back:
a segment frozen for one provider and cooling for another (R3.2), and the
incident nobody acknowledged (R8.2)."""

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

from governance import services, time_source
from governance.models import Incident, Provider, SegmentRefusal
from governance.rules.outbound import parse_allow_list

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


def read_back(base: str, promql: str, log, timeout: float = 30.0) -> dict[str, float]:
    """The query's values by their ``provider`` (or "") once Prometheus has scraped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = query(base, promql)
        except OSError:
            found = []  # Prometheus is still starting
        if found:
            return {r["metric"].get("provider", ""): float(r["value"][1]) for r in found}
        time.sleep(0.5)
    raise AssertionError(f"nothing for {promql}\n{log.read_text()[-2000:]}")


def test_prometheus_reads_the_frozen_segment_and_the_unacknowledged_incident(prometheus):
    base, log = prometheus
    now = time_source.now()
    for pid in ("sentinel", "harbor"):
        Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-m", script={})
    thread = services.create_thread(provider_chain=["sentinel", "harbor"], now=now)
    segment = services.open_segment(thread)
    # sentinel refused the original and its three re-probes: frozen; harbor once: cooling.
    for pid, count in (("sentinel", 4), ("harbor", 1)):
        SegmentRefusal.objects.create(
            segment=segment, provider_id=pid, refusals=count, category="content_filter",
            refused_at=now - timedelta(minutes=2),
        )  # fmt: skip
    Incident.objects.create(key="incident:p:1", segment=segment, opened_at=now)

    frozen = read_back(base, 'governance_segments_refused{state="frozen"} > 0', log)
    assert frozen == {"sentinel": 1.0}
    cooling = read_back(base, 'governance_segments_refused{state="cooling"} > 0', log)
    assert cooling == {"harbor": 1.0}
    assert read_back(base, 'governance_incidents_open{state="triggered"}', log) == {"": 1.0}
    up = read_back(base, 'up{job="governance"}', log)
    assert up == {"": 1.0}
