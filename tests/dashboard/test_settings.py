"""Settings: embedded defaults, the switch to PostgreSQL/Redis, and deploy checks."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.conftest import REPO_ROOT, requires_services


def _manage(
    *args: str, env: dict[str, str], tmp_path: Path, umask: int = -1
) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_", "CELERY_")) and k != "LOG_LEVEL"
    }
    clean.pop("REDIS_URL", None)
    clean.update({"GOVERNANCE_VAR_DIR": str(tmp_path / "var"), **env})
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        umask=umask,  # -1: this process's
    )


def test_check_deploy_passes_with_debug_off_and_real_secrets(tmp_path: Path):
    result = _manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        env={
            "DJANGO_DEBUG": "0",
            "DJANGO_SECRET_KEY": "q3Lr9v!Zp0sW7kT2mN8bX4cY6hJ1gF5dS-aE_uR+oI=lK^zV&Hy2Wc7Qe5Bn0Tm",
            "DJANGO_ALLOWED_HOSTS": "governance.example.com",
            "GOVERNANCE_CALLBACK_SECRET": "cb-9f2Kx7Lq3Vm8Rt1Wz5Yp0Hs4Nd6Jg2Ba",
        },
        tmp_path=tmp_path,
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout


def test_debug_off_without_secret_refuses_to_start(tmp_path: Path):
    result = _manage("check", env={"DJANGO_DEBUG": "0"}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE) must be set" in result.stderr


def test_embedded_defaults_need_no_server(tmp_path: Path):
    script = (
        "from django.conf import settings as s;"
        "print(s.DATABASES['default']['ENGINE']);"
        "print(s.CELERY_BROKER_URL);"
        "print(s.CACHES['default']['BACKEND'])"
    )
    result = _manage("shell", "--no-imports", "-c", script, env={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    engine, broker, cache = result.stdout.split()
    assert engine == "dashboard.site.sqlite3"
    assert broker == "filesystem://"
    assert cache.endswith("FileBasedCache")
    # Reading the settings makes no folder: they are made when the system starts.
    assert not (tmp_path / "var").exists()


@pytest.mark.parametrize(
    "args",
    [("--help",), ("up", "--help"), ("migrate", "--help"), ("check",), ("help", "up")],
)
def test_a_command_that_starts_nothing_creates_no_folder(tmp_path: Path, args):
    """`manage.py up --help` on a fresh clone leaves the checkout as it was."""
    result = _manage(*args, env={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "var").exists()
    assert list(tmp_path.iterdir()) == []


def test_migrate_on_a_fresh_clone_makes_the_sqlite_folder(tmp_path: Path):
    result = _manage("migrate", "--verbosity", "0", env={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    # Only what SQLite needs: the folder of its file (dashboard/site/sqlite3).
    assert sorted(p.name for p in (tmp_path / "var").iterdir()) == ["db.sqlite3"]


def test_publishing_makes_the_file_system_broker_folders(tmp_path: Path):
    script = (
        "from tasks.celery import app;app.send_task('tasks.jobs.ping', args=['x']);print('sent')"
    )
    result = _manage("shell", "--no-imports", "-c", script, env={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "No hostname was supplied" not in result.stderr
    queue = tmp_path / "var" / "broker" / "queue"
    assert len(list(queue.iterdir())) == 1  # the message, as a file
    assert (tmp_path / "var" / "broker" / "control").is_dir()
    assert not (tmp_path / "var" / "broker" / "processed").exists()  # store_processed off


def test_make_folders_makes_every_embedded_folder_once(tmp_path: Path):
    script = (
        "from dashboard.site.embedded import make_folders;"
        "print(len(make_folders()), len(make_folders()))"
    )
    result = _manage("shell", "--no-imports", "-c", script, env={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    made, again = result.stdout.split()
    assert again == "0"
    var = tmp_path / "var"
    assert sorted(str(p.relative_to(var)) for p in var.rglob("*")) == [
        "broker", "broker/control", "broker/queue", "staticfiles",
    ]  # fmt: skip
    assert made == "4"  # var, staticfiles, broker/queue (in and out), broker/control


def test_beat_makes_the_folder_of_its_schedule(tmp_path: Path):
    from dashboard.site.embedded import BeatScheduler
    from tasks.celery import app

    schedule = tmp_path / "not" / "yet" / "schedule"
    scheduler = BeatScheduler(app=app, schedule_filename=str(schedule), lazy=False)
    try:
        assert schedule.parent.is_dir()
    finally:
        scheduler.close()


@pytest.mark.parametrize("value", ["LOUD", "verbose", "5"])
def test_bad_log_level_refuses_to_start(tmp_path: Path, value):
    result = _manage("check", env={"LOG_LEVEL": value}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert f"LOG_LEVEL must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL, not {value!r}" in (
        result.stderr
    )


def test_log_level_is_read_in_any_case(tmp_path: Path):
    script = "from django.conf import settings as s; print(s.LOG_LEVEL, s.LOGGING['root']['level'])"
    given = _manage(
        "shell", "--no-imports", "-c", script, env={"LOG_LEVEL": "info"}, tmp_path=tmp_path
    )
    unset = _manage("shell", "--no-imports", "-c", script, env={}, tmp_path=tmp_path)
    assert given.stdout.split() == ["INFO", "INFO"]
    assert unset.stdout.split() == ["None", "INFO"]


def test_celery_delivery_settings_allow_redelivery():
    """Stages may run more than once: late acks, requeue on worker loss, prefetch 1."""
    assert settings.CELERY_TASK_ACKS_LATE is True
    assert settings.CELERY_TASK_REJECT_ON_WORKER_LOST is True
    assert settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1
    assert settings.CELERY_ACCEPT_CONTENT == ["json"]
    assert "scheduler-heartbeat" in settings.CELERY_BEAT_SCHEDULE


@pytest.mark.django_db
def test_suite_runs_on_postgresql_and_redis():
    """make test points the suite at the real servers; this proves it did."""
    assert requires_services(), "run the suite with `make test` (real PostgreSQL and Redis)"
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        assert "PostgreSQL" in cursor.fetchone()[0]
    assert settings.CELERY_BROKER_URL.startswith("redis://")
    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")


def test_run_time_settings_have_one_default_each(tmp_path: Path):
    """Settings read elsewhere as ``settings.NAME`` get their default here, once."""
    script = (
        "from django.conf import settings as s;"
        "print(s.GOVERNANCE_STAGE_LEASE_SECONDS, s.GOVERNANCE_STAGE_RESEND_AFTER_SECONDS,"
        " s.GOVERNANCE_VERIFY_DELAY_SECONDS,"
        " s.GOVERNANCE_CALLBACK_LEASE_SECONDS, s.GOVERNANCE_CLOCK_ADJUSTABLE,"
        " s.GOVERNANCE_DASHBOARD_URL, s.GOVERNANCE_NAMED_SECRET.__name__)"
    )
    result = _manage("shell", "--no-imports", "-c", script, env={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "30", "120", "0.0", "300", "False", "http://localhost:8000", "named_secret",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GOVERNANCE_STAGE_LEASE_SECONDS", "2", "must be at least 3"),
        ("GOVERNANCE_STAGE_RESEND_AFTER_SECONDS", "0", "must be at least 1"),
        ("GOVERNANCE_STAGE_LEASE_SECONDS", "10m", "must be an integer"),
        ("GOVERNANCE_VERIFY_DELAY_SECONDS", "-1", "must be at least 0"),
        ("GOVERNANCE_VERIFY_DELAY_SECONDS", "soon", "must be a number"),
        ("GOVERNANCE_CALLBACK_LEASE_SECONDS", "0", "must be at least 1"),
    ],
)
def test_bad_run_time_setting_refuses_to_start(tmp_path: Path, name, value, message):
    result = _manage("check", env={name: value}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert f"{name} {message}" in result.stderr


def test_sqlite_backend_makes_the_folder_of_its_file_and_nothing_for_memory(tmp_path: Path):
    from dashboard.site.env import database_from_url
    from dashboard.site.sqlite3.base import DatabaseWrapper

    entry = database_from_url(f"sqlite:///{tmp_path}/deep/er/db.sqlite3", base_dir=tmp_path)
    assert entry["ENGINE"] == "dashboard.site.sqlite3"
    umask = os.umask(0o022)
    try:
        for name in (":memory:", entry["NAME"]):
            wrapper = DatabaseWrapper({**entry, "NAME": name, **_WRAPPER_DEFAULTS}, alias="t")
            wrapper.get_new_connection(wrapper.get_connection_params()).close()
    finally:
        os.umask(umask)
    assert (tmp_path / "deep" / "er" / "db.sqlite3").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"]
    # Owner-only under the usual umask: the folders it made and the file.
    assert _mode(tmp_path / "deep") == _mode(tmp_path / "deep" / "er") == 0o700
    assert _mode(tmp_path / "deep" / "er" / "db.sqlite3") == 0o600


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# Under a permissive umask, what `manage.py up` makes, then a database write in
# each journal mode: the modes of the folders and of SQLite's files.
OWNER_ONLY_SCRIPT = """
import stat
from pathlib import Path
from django.conf import settings
from django.db import connection
from dashboard.site.embedded import make_folders

make_folders()
var = Path(settings.VAR_DIR)
database = Path(settings.DATABASES["default"]["NAME"])
modes = {}


def note(*names):
    for name in names:
        modes[name] = stat.S_IMODE(database.with_name(name).stat().st_mode)


with connection.cursor() as cursor:
    cursor.execute("PRAGMA journal_mode=PERSIST")  # keeps its -journal file
    cursor.execute("CREATE TABLE t (x)")
    note("db.sqlite3-journal")
    cursor.execute("PRAGMA journal_mode=WAL")  # deletes the -journal
    cursor.execute("INSERT INTO t VALUES (1)")
    note("db.sqlite3-wal", "db.sqlite3-shm")
for path in [var, *var.rglob("*")]:
    if path.name not in modes:
        modes[path.relative_to(var).as_posix()] = stat.S_IMODE(path.stat().st_mode)
print(" ".join(f"{name}={mode:o}" for name, mode in sorted(modes.items())))
"""


def test_embedded_folders_and_the_database_are_owner_only_whatever_the_umask(tmp_path: Path):
    result = _manage(
        "shell", "--no-imports", "-c", OWNER_ONLY_SCRIPT, env={}, tmp_path=tmp_path, umask=0o022
    )
    assert result.returncode == 0, result.stderr
    modes = dict(item.split("=") for item in result.stdout.split())
    assert modes == {
        ".": "700",
        "broker": "700",
        "broker/control": "700",
        "broker/queue": "700",
        "staticfiles": "700",
        "db.sqlite3": "600",
        "db.sqlite3-journal": "600",
        "db.sqlite3-wal": "600",
        "db.sqlite3-shm": "600",
    }
    assert "owner-only" not in result.stderr  # nothing to tighten on a fresh start


def test_what_an_older_version_left_readable_is_tightened_at_start_with_one_log_line(
    tmp_path: Path,
):
    var = tmp_path / "var"
    older = [var, var / "broker", var / "broker" / "queue", var / "staticfiles"]
    for folder in older:
        folder.mkdir()
        folder.chmod(0o755)
    files = [var / "db.sqlite3", var / "db.sqlite3-wal", var / "broker" / "queue" / "message"]
    for file in files:
        file.write_bytes(b"")
        file.chmod(0o644)
    script = "from dashboard.site.embedded import make_folders;make_folders();make_folders()"
    result = _manage("shell", "--no-imports", "-c", script, env={}, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(_mode(folder) == 0o700 for folder in older)
    assert _mode(var / "broker" / "control") == 0o700  # made
    assert _mode(var / "db.sqlite3") == _mode(var / "db.sqlite3-wal") == 0o600
    # A message of the broker is out of reach in its owner-only folder; left as it was.
    assert _mode(var / "broker" / "queue" / "message") == 0o644
    lines = [line for line in result.stderr.splitlines() if "owner-only" in line]
    assert len(lines) == 1, result.stderr  # the second start had nothing to tighten
    assert "WARNING" in lines[0]
    for path in (var, var / "broker", var / "db.sqlite3", var / "db.sqlite3-wal"):
        assert f"{path} 0755 → 0700" in lines[0] or f"{path} 0644 → 0600" in lines[0]


def test_a_shared_folder_named_as_var_dir_keeps_its_mode(tmp_path: Path, caplog):
    from dashboard.site.private_files import tighten

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert tighten([shared]) == []
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert "Could not make owner-only" in caplog.text and "a shared folder" in caplog.text


_WRAPPER_DEFAULTS = {
    "USER": "",
    "PASSWORD": "",
    "HOST": "",
    "PORT": "",
    "ATOMIC_REQUESTS": False,
    "AUTOCOMMIT": True,
    "CONN_MAX_AGE": 0,
    "CONN_HEALTH_CHECKS": False,
    "TIME_ZONE": None,
    "TEST": {},
}
