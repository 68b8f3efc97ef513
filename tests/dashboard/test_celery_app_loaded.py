"""A process that only set Django up sends through the project's Celery app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _shell(script: str, tmp_path: Path) -> list[str]:
    """What a fresh `manage.py shell` prints for ``script`` (embedded defaults)."""
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", script],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "GOVERNANCE_VAR_DIR": str(tmp_path / "var")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_r6_6_a_management_shell_publishes_to_the_configured_broker(tmp_path):
    script = (
        "from celery import current_app;"
        "from django.conf import settings;"
        "print(current_app.main);"
        "print(current_app.conf.broker_url == settings.CELERY_BROKER_URL)"
    )
    assert _shell(script, tmp_path) == ["governance", "True"]


def test_r6_6_sending_a_task_first_thing_leaves_the_process_logging_alone(tmp_path):
    """The first send imports the task modules; Celery's own way of doing so ran
    django.setup() again and put the root logger back to INFO (the demo's
    seeding then printed every callback attempt under `manage.py up`)."""
    script = (
        "import logging;"
        "logging.getLogger().setLevel('WARNING');"
        "from celery import current_app;"
        "current_app.conf.task_always_eager = True;"
        "from governance.services.broker import send_by_name;"
        "send_by_name('tasks.jobs.ping', ['x']);"
        "print(logging.getLogger().level, 'tasks.jobs.ping' in current_app.tasks)"
    )
    assert _shell(script, tmp_path) == ["30", "True"]
