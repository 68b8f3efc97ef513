from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth.models import Group

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


def requires_services() -> bool:
    """True when the suite runs against real PostgreSQL and Redis (make test)."""
    return bool(os.environ.get("DATABASE_URL", "").startswith("postgres")) and bool(
        os.environ.get("REDIS_URL")
    )


# --- users for every role (R8) ---------------------------------------------


@pytest.fixture
def make_user(django_user_model):
    from governance.roles import ensure_roles

    ensure_roles()  # a transactional test's flush removes the migration's groups

    def make(username: str, *groups: str, **extra):
        user = django_user_model.objects.create_user(username, password="pw-for-tests-1", **extra)
        for name in groups:
            user.groups.add(Group.objects.get(name=name))
        return user

    return make


@pytest.fixture
def oncall(make_user):
    return make_user("olive-oncall", "on-call")


@pytest.fixture
def operator(make_user):
    return make_user("oscar-operator", "operator")


@pytest.fixture
def manager(make_user):
    return make_user("mona-manager", "manager")


@pytest.fixture
def outsider(make_user):
    return make_user("otto-outsider")
