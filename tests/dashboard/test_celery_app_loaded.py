"""A process that only set Django up sends through the project's Celery app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_r6_6_a_management_shell_publishes_to_the_configured_broker(tmp_path):
    script = (
        "from celery import current_app;"
        "from django.conf import settings;"
        "print(current_app.main);"
        "print(current_app.conf.broker_url == settings.CELERY_BROKER_URL)"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", script],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "GOVERNANCE_VAR_DIR": str(tmp_path / "var")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["governance", "True"]
