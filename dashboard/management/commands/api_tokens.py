"""List and revoke API tokens: ``manage.py api_tokens list [--user U] [--all]``,
``manage.py api_tokens revoke ID``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from governance import time_source
from governance.models import ApiToken
from governance.services.tokens import revoke_token


class Command(BaseCommand):
    help = "List API tokens (never their secrets) or revoke one by id."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        listing = actions.add_parser("list", help="tokens, newest first")
        listing.add_argument("--user", help="only this user's tokens")
        listing.add_argument("--all", action="store_true", help="also revoked tokens")
        revoke = actions.add_parser("revoke", help="revoke a token at once")
        revoke.add_argument("id", type=int)

    def handle(self, *args, action, **options):
        if action == "revoke":
            row = ApiToken.objects.select_related("user").filter(id=options["id"]).first()
            if row is None:
                raise CommandError(f"no token with id {options['id']}")
            if revoke_token(row, by="manage.py", now=time_source.now()):
                self.stdout.write(f"revoked token {row.id} ({row.name}) of {row.user}")
            else:
                self.stdout.write(f"token {row.id} was already revoked at {row.revoked_at}")
            return
        rows = ApiToken.objects.select_related("user").order_by("-created_at", "-id")
        if options["user"]:
            rows = rows.filter(user__username=options["user"])
        if not options["all"]:
            rows = rows.filter(revoked_at__isnull=True)
        self.stdout.write(f"{'id':>5}  {'user':<20} {'name':<24} {'scopes':<30} {'last used':<20}")
        for row in rows:
            scopes = ",".join(row.scopes) or "(role)"
            used = row.last_used_at.strftime("%Y-%m-%d %H:%M") if row.last_used_at else "never"
            state = f"  revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else ""
            self.stdout.write(
                f"{row.id:>5}  {str(row.user)[:20]:<20} {row.name[:24]:<24} "
                f"{scopes[:30]:<30} {used:<20}{state}"
            )
