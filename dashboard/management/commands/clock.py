"""Rehearsals: show or move the shared clock of every process.

manage.py clock show
manage.py clock advance 15m      (needs GOVERNANCE_CLOCK_ADJUSTABLE=1)
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from dashboard.site.env import parse_duration
from governance import time_source


class Command(BaseCommand):
    help = "Show the system clock, or move it forward for a rehearsal (e.g. 'advance 15m')."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["show", "advance"])
        parser.add_argument("duration", nargs="?", help="e.g. 90s, 15m, 1h, 2d")

    def handle(self, *args, action, duration, **options):
        if action == "advance":
            if not duration:
                raise CommandError("say how far to move the clock, e.g. 'advance 15m'")
            try:
                total = time_source.shift(parse_duration(duration))
            except (ValueError, RuntimeError) as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(f"Clock moved forward; total offset {total}.")
        self.stdout.write(f"Now: {time_source.now().isoformat()}")
