"""Run the whole system: migrate, ensure the demo admin and users (and seed the demo
scenario on an empty database), then web + worker + scheduler.

One foreground command for a fresh machine. If one of the three dies, it is
logged and restarted after a backoff (dashboard/site/supervisor.py) while the
others keep running; Ctrl-C (or SIGTERM) stops all three.

What it prints by default: the credentials and the URL, one line per start,
exit and restart of a child, the children's warnings and errors (they run at
WARNING, without Celery's banners), and a status line (runs in progress,
stages waiting, the last beat) when those change, checked every
``GOVERNANCE_UP_STATUS_SECONDS``. ``--verbose`` or ``LOG_LEVEL=INFO`` (or
DEBUG) gives the children's full logs instead.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sys
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from dashboard.management.commands.demo import ensure_demo_users
from dashboard.site.embedded import make_folders
from dashboard.site.private_files import make_private_file, make_private_folder
from dashboard.site.supervisor import StatusReport, Supervisor
from governance.models import Run, Stage, Thread

DEMO_USERNAME = "admin"
FULL_LOG_LEVELS = ("DEBUG", "INFO")
ACTIVE_RUN_STATES = (
    Run.Status.QUEUED,
    Run.Status.RUNNING,
    Run.Status.FINALIZING,
    Run.Status.VERIFYING,
)
ROOT_NOTICE = (
    "Running as root: Celery's worker warns about superuser privileges below "
    '(README.md, "Running as root", says what it means and what to do).'
)


def child_log_level(verbose: bool, log_level: str | None) -> str:
    """The children's log level: LOG_LEVEL when set, INFO with --verbose, else WARNING."""
    if verbose:
        return "DEBUG" if log_level == "DEBUG" else "INFO"
    return log_level or "WARNING"


def child_commands(
    *, host: str, port: int, concurrency: int, level: str, schedule: str, python: str
) -> dict[str, list[str]]:
    """The argv of web, workers and scheduler at ``level``; below INFO without banners."""
    quiet = [] if level in FULL_LOG_LEVELS else ["--quiet"]
    return {
        "web": [
            python, "-m", "uvicorn", "dashboard.site.asgi:application",
            "--host", host, "--port", str(port), "--no-access-log",
            "--log-level", level.lower(),
        ],
        "worker": [
            python, "-m", "celery", *quiet, "-A", "tasks", "worker",
            "--loglevel", level, "--concurrency", str(concurrency),
            "--hostname", f"worker@{settings.GOVERNANCE_HOST_NAME}",
            "--queues", ",".join(settings.GOVERNANCE_QUEUES),
        ],
        # Critical notifications never wait behind a backlog of turns (R3.6,
        # R8.2): one process that consumes the alerts queue alone.
        "alerts": [
            python, "-m", "celery", *quiet, "-A", "tasks", "worker",
            "--loglevel", level, "--concurrency", "1",
            "--hostname", f"alerts@{settings.GOVERNANCE_HOST_NAME}",
            "--queues", "alerts",
        ],
        "scheduler": [
            python, "-m", "celery", *quiet, "-A", "tasks", "beat",
            "--loglevel", level, "--schedule", schedule,
        ],
    }  # fmt: skip


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def describe_status(
    *,
    runs: int,
    waiting: int,
    beat_age: float | None,
    stale_after: float,
    url: str,
    at: datetime,
) -> StatusReport:
    """The status line; its state (what a change is) leaves out the beat's age."""
    if beat_age is None:
        beat, beat_state = "no beat yet", "none"
    elif beat_age > stale_after:
        beat, beat_state = f"last beat {beat_age:.0f} s ago (late)", "late"
    else:
        beat, beat_state = f"last beat {beat_age:.0f} s ago", "ok"
    line = (
        f"[{at:%H:%M:%S} UTC] {_plural(runs, 'run')} in progress, "
        f"{_plural(waiting, 'stage')} waiting, {beat} - {url}"
    )
    return StatusReport((runs, waiting, beat_state), line)


def read_status(url: str, now: datetime | None = None) -> StatusReport:
    """The status from the database (runs, stages not yet started) and the beat's heartbeat."""
    from django.db import close_old_connections, connection

    from tasks.jobs import read_heartbeat

    now = now or datetime.now(UTC)
    if not connection.in_atomic_block:
        close_old_connections()  # a connection the database dropped is replaced
    runs = Run.objects.filter(status__in=ACTIVE_RUN_STATES).count()
    waiting = Stage.objects.filter(
        run__status__in=ACTIVE_RUN_STATES, started_at__isnull=True, finished_at__isnull=True
    ).count()
    beat = read_heartbeat("scheduler")
    beat_age = None
    if beat and beat.get("at"):
        beat_age = max(0.0, (now - datetime.fromisoformat(beat["at"])).total_seconds())
    return describe_status(
        runs=runs,
        waiting=waiting,
        beat_age=beat_age,
        stale_after=3 * settings.HEARTBEAT_SECONDS,
        url=url,
        at=now,
    )


def ensure_demo_admin(var_dir: Path) -> tuple[str, str]:
    """A superuser for the embedded-defaults demo, password kept in var/.

    The password is random per machine and reused, so the printed credentials
    stay valid across restarts.
    """
    password_file = var_dir / "demo-admin-password"
    if password_file.exists():
        password = password_file.read_text().strip()
    else:
        password = secrets.token_urlsafe(12)
        make_private_file(password_file)  # 0600 before the password is in it
        password_file.write_text(password + "\n")
    user_model = get_user_model()
    user, _created = user_model.objects.get_or_create(
        username=DEMO_USERNAME, defaults={"email": "admin@localhost"}
    )
    user.is_staff = True
    user.is_superuser = True
    user.set_password(password)
    user.save()
    return DEMO_USERNAME, password


class Command(BaseCommand):
    help = "Migrate, create the demo admin, and run web + worker + scheduler in the foreground."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="web bind address")
        parser.add_argument("--port", type=int, default=8000, help="web port (default 8000)")
        parser.add_argument(
            "--concurrency", type=int, default=2, help="worker processes (default 2)"
        )
        parser.add_argument(
            "--no-demo-admin",
            action="store_true",
            help="do not create or reset the demo admin user",
        )
        parser.add_argument(
            "--verbose",
            action="store_true",
            help="the children's full logs (INFO and Celery's banners), as LOG_LEVEL=INFO "
            "does; by default they run at WARNING and a status line is printed",
        )

    def handle(self, *args, host, port, concurrency, no_demo_admin, verbose, **options):
        if not 0 < port < 65536:
            raise CommandError(f"--port must be 1-65535, not {port}")
        if concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, not {concurrency}")
        level = child_log_level(verbose, settings.LOG_LEVEL)
        if level not in FULL_LOG_LEVELS:
            logging.getLogger().setLevel(level)  # this process's own INFO lines too
        var_dir = Path(settings.VAR_DIR)
        make_folders()  # var/ (owner-only): SQLite, broker, static files, beat schedule
        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write("Database migrated.")
        if not settings.DEBUG:
            call_command("collectstatic", interactive=False, verbosity=0)
        if not no_demo_admin:
            if not settings.DEBUG:
                raise CommandError(
                    "refusing to create a demo admin with DJANGO_DEBUG=0; "
                    "use --no-demo-admin and manage.py createsuperuser"
                )
            username, password = ensure_demo_admin(var_dir)
            call_command("seed_demo_providers", verbosity=0)
            if not Thread.objects.exists():
                self.stdout.write("Seeding the demo scenario (manage.py demo)...")
                call_command("demo", verbosity=0)
            demo_users = ensure_demo_users(var_dir)
            self.stdout.write(
                self.style.SUCCESS(
                    f"Dashboard: http://{host}:{port}/  user: {username}  password: {password}"
                )
            )
            for demo_user, demo_password, group in demo_users:
                self.stdout.write(f"  {group:<9} user: {demo_user}  password: {demo_password}")
        commands = child_commands(
            host=host,
            port=port,
            concurrency=concurrency,
            level=level,
            schedule=settings.CELERY_BEAT_SCHEDULE_FILENAME,
            python=sys.executable,
        )
        if os.geteuid() == 0:
            self.stdout.write(ROOT_NOTICE)
        url = f"http://{host}:{port}/"
        status_every = 0 if level in FULL_LOG_LEVELS else settings.GOVERNANCE_UP_STATUS_SECONDS
        # The children read LOG_LEVEL for their Django logging (dashboard/site/settings.py).
        child_env = {**os.environ, "LOG_LEVEL": level}
        # Every child writes its work counts here; GET /metrics adds them up. Emptied
        # at each start: the files of processes that are gone would count twice.
        if not child_env.get("PROMETHEUS_MULTIPROC_DIR"):
            metrics_dir = Path(settings.VAR_DIR) / "metrics"
            shutil.rmtree(metrics_dir, ignore_errors=True)
            make_private_folder(metrics_dir)
            child_env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        self._supervise(commands, child_env, lambda: read_status(url), status_every)

    def _supervise(self, commands, env, status, status_every) -> None:
        def log(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        Supervisor(
            commands,
            cwd=Path(settings.BASE_DIR),
            log=log,
            env=env,
            status=status,
            status_every=status_every,
        ).run()
        self.stdout.write("Stopped web, worker and scheduler.")
