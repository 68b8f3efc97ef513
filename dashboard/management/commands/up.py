"""Run the whole system: migrate, ensure the demo admin and users (and seed the demo
scenario on an empty database), then web + worker + scheduler.

One foreground command for a fresh machine. If one of the three dies, it is
logged and restarted after a backoff (dashboard/supervisor.py) while the
others keep running; Ctrl-C (or SIGTERM) stops all three.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from dashboard.management.commands.demo import ensure_demo_users
from dashboard.supervisor import Supervisor
from governance.models import Thread

DEMO_USERNAME = "admin"


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
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
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

    def handle(self, *args, host, port, concurrency, no_demo_admin, **options):
        if not 0 < port < 65536:
            raise CommandError(f"--port must be 1-65535, not {port}")
        if concurrency < 1:
            raise CommandError(f"--concurrency must be at least 1, not {concurrency}")
        var_dir = Path(settings.VAR_DIR)
        var_dir.mkdir(parents=True, exist_ok=True)
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
        python = sys.executable
        commands = {
            "web": [
                python, "-m", "uvicorn", "dashboard.asgi:application",
                "--host", host, "--port", str(port), "--no-access-log",
            ],
            "worker": [
                python, "-m", "celery", "-A", "tasks", "worker",
                "--loglevel", "INFO", "--concurrency", str(concurrency),
                "--hostname", f"worker@{os.uname().nodename}",
            ],
            "scheduler": [
                python, "-m", "celery", "-A", "tasks", "beat",
                "--loglevel", "INFO", "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME,
            ],
        }  # fmt: skip
        self._supervise(commands)

    def _supervise(self, commands: dict[str, list[str]]) -> None:
        def log(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        Supervisor(commands, cwd=Path(settings.BASE_DIR), log=log).run()
        self.stdout.write("Stopped web, worker and scheduler.")
