"""deploy/: the compose file describes the system the code runs (R6.7's queues)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from django.conf import settings

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
COMPOSE = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]


def _command(name: str) -> list[str]:
    return [str(part) for part in SERVICES[name].get("command") or []]


def _queues(name: str) -> set[str]:
    command = _command(name)
    return (
        set(command[command.index("--queues") + 1].split(",")) if "--queues" in command else set()
    )


WORKERS = [n for n in SERVICES if "worker" in _command(n)]


def test_every_queue_has_a_worker_and_alerts_have_one_of_their_own():
    consumed = set().union(*(_queues(n) for n in WORKERS))
    assert consumed == set(settings.GOVERNANCE_QUEUES)
    assert [n for n in WORKERS if _queues(n) == {"alerts"}] == ["alerts"]
    assert all("alerts" not in _queues(n) for n in WORKERS if n != "alerts")


def test_exactly_one_beat():
    beats = [n for n in SERVICES if "beat" in _command(n)]
    assert beats == ["beat"]
    assert SERVICES["beat"]["deploy"]["replicas"] == 1


def test_workers_name_their_host_and_every_long_running_part_has_a_health_check():
    for name in WORKERS:
        command = _command(name)
        assert command[command.index("--hostname") + 1] == f"{name}@%h"
        assert SERVICES[name]["environment"]["WORKER_NAME"] == name
    for name in ("postgres", "redis", "web", *WORKERS):
        assert "healthcheck" in SERVICES[name], name
    assert "/healthz" in " ".join(SERVICES["web"]["healthcheck"]["test"])


def test_the_environment_it_sets_is_what_the_settings_read():
    read = (Path(settings.BASE_DIR) / "dashboard" / "site" / "settings.py").read_text()
    named = set(COMPOSE["x-app"]["environment"])
    named |= {
        line.split("=", 1)[0].lstrip("# ")
        for line in (DEPLOY / "env.example").read_text().splitlines()
        if re.match(r"#? ?[A-Z_]+=", line) and not line.startswith("# Provider")
    }
    # PostgreSQL's own, Grafana's own; a provider's key
    named -= {"POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "OPENAI_API_KEY"}
    missing = sorted(n for n in named if f'"{n}"' not in read)
    assert not missing, missing


def test_the_image_holds_every_part_the_processes_import():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    for part in ("dashboard", "governance", "tasks", "templates", "static", "manage.py"):
        assert (Path(settings.BASE_DIR) / part).exists()
        assert re.search(rf"^COPY {re.escape(part)}\b", dockerfile, re.M), part
    assert "USER governance" in dockerfile  # Celery's workers do not run as root
