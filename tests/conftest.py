from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


def requires_services() -> bool:
    """True when the suite runs against real PostgreSQL and Redis (make test)."""
    return bool(os.environ.get("DATABASE_URL", "").startswith("postgres")) and bool(
        os.environ.get("REDIS_URL")
    )
