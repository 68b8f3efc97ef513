"""tasks/metric_files.py: in multiprocess mode each process's counts go to a
file named by its host and its process id, so two containers that share
PROMETHEUS_MULTIPROC_DIR never write one file, though their process ids may
be the same; GET /metrics still adds every file up."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.conftest import REPO_ROOT

# One process of a container whose host name holds prometheus_client's separator.
COUNT_ONE_ATTEMPT = """
import os, socket
socket.gethostname = lambda: sys_host
from tasks import work_metrics
work_metrics.attempt("p", "")
print(os.getpid())
"""


def _count_on(host: str, folder) -> int:
    ran = subprocess.run(
        [sys.executable, "-c", f"sys_host = {host!r}\n" + COUNT_ONE_ATTEMPT],
        cwd=REPO_ROOT, env={"PROMETHEUS_MULTIPROC_DIR": str(folder), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    return int(ran.stdout.split()[-1])


def test_each_host_and_process_writes_its_own_file_and_a_scrape_adds_them_up(tmp_path):
    pids = [_count_on("web_1", tmp_path), _count_on("turns", tmp_path)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"counter_web-1-{pids[0]}.db", f"counter_turns-{pids[1]}.db"]
    )
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    scraped = generate_latest(registry).decode()
    assert 'governance_provider_attempts_total{outcome="accepted",provider="p"} 2.0' in scraped


def test_one_process_keeps_its_counts_in_memory():
    from prometheus_client import values

    from tasks import metric_files

    assert values.ValueClass is values.MutexValue  # the tests: no PROMETHEUS_MULTIPROC_DIR
    metric_files.name_files_by_host()
    assert values.ValueClass is values.MutexValue
