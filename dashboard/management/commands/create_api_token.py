"""Create an API token for a user and print it once (only its digest is stored)."""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from dashboard.api import token_digest
from governance.models import ApiToken


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it (it is not shown again)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="what the token is for")

    def handle(self, *args, username, name, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        token = secrets.token_urlsafe(32)
        ApiToken.objects.create(user=user, name=name, key_digest=token_digest(token))
        self.stdout.write(token)
