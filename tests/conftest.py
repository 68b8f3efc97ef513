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


# --- the test database ------------------------------------------------------


@pytest.fixture(autouse=True, scope="session")
def test_database_left_alone_at_the_end(django_db_setup, django_db_blocker):
    """Live servers' and event loops' threads keep pooled connections to the test
    database, and PostgreSQL waits 5 s before it refuses to drop a database in
    use: at the end the pools are closed and the other sessions ended (from a
    connection to the ``postgres`` database), so it is dropped at once."""
    yield
    import psycopg
    from django.db import connections

    from dashboard.site.loop_db import plain_params

    with django_db_blocker.unblock():
        for connection in connections.all():
            if connection.vendor != "postgresql":
                continue
            connection.close()
            connection.close_pool()
            params = plain_params(connection)
            name = params["dbname"]
            with psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND pid <> pg_backend_pid()",
                    [name],
                )


# --- users for every role (R8) ---------------------------------------------


@pytest.fixture(autouse=True, scope="session")
def fast_password_hashing():
    """Hashing a password the production way (PBKDF2, 10^6 rounds) costs about
    0.2 s here, and most tests make a user or three: the suite hashes with MD5.
    Logging in still checks the password; no test is about the hash's cost."""
    from django.test.utils import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


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


# --- outbound URLs ------------------------------------------------------------------

LOOPBACK_ALLOW = ("127.0.0.1", "::1", "localhost")


@pytest.fixture(autouse=True)
def outbound_allows_loopback(settings):
    """Tests post to real loopback servers: the outbound check (callbacks, alert
    channels, the webhook tool) lets loopback through, whatever DJANGO_DEBUG
    says. SSRF tests set ``settings.GOVERNANCE_OUTBOUND_ALLOW`` themselves."""
    from governance.rules.outbound import parse_allow_list

    settings.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(LOOPBACK_ALLOW)


@pytest.fixture(autouse=True)
def admission_without_backpressure(settings):
    """The suite shares one Redis db, and a test that publishes without a worker
    leaves its messages in the turns queue: later tests would meet them as a
    backlog (R6.7) and be refused with 429. Backpressure is off unless a test
    sets its bounds (tests/tasks/test_backpressure.py)."""
    settings.GOVERNANCE_ADMISSION_MAX_QUEUE_AGE_SECONDS = 0
    settings.GOVERNANCE_ADMISSION_MAX_QUEUED = 0


@pytest.fixture(autouse=True)
def fresh_script_counters():
    """Scripted providers count their ``times`` rules in this process: each test
    starts from zero, whatever an earlier test (the demo, say) already used."""
    from tasks.adapters.scripted import DEFAULT_SCRIPT_STATE

    DEFAULT_SCRIPT_STATE.reset()
    yield
    DEFAULT_SCRIPT_STATE.reset()


# --- the embedded defaults' folders ---------------------------------------------


@pytest.fixture(autouse=True, scope="session")
def embedded_folders():
    """What `manage.py up` makes at start (importing the settings makes nothing):
    WhiteNoise reads STATIC_ROOT when a test's request builds the middleware."""
    from dashboard.site.embedded import make_folders

    make_folders()


def streamed_body(response) -> bytes:
    """The whole body of a streamed response, its iterator synchronous or not
    (the CSV exports stream an asynchronous one: dashboard/pages/streaming.py)."""
    from asgiref.sync import async_to_sync

    assert response.streaming
    if not response.is_async:
        return b"".join(response.streaming_content)

    async def collect() -> bytes:
        return b"".join([part async for part in response.streaming_content])

    return async_to_sync(collect)()
