"""Create an API token for a user and print it once (only its digest is stored)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from governance import time_source
from governance.roles import ACTIONS, ROLES, ensure_roles
from governance.services.errors import ServiceError
from governance.services.tokens import TOKEN_SCOPES, create_token


class Command(BaseCommand):
    help = (
        "Create an API token for USERNAME and print it (it is not shown again). "
        "--role puts the user in a role first (e.g. agent-client for a service account)."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="cli", help="what the token is for")
        parser.add_argument(
            "--role", choices=sorted(ROLES), help="add the user to this role (a Django group)"
        )
        parser.add_argument(
            "--create-user", action="store_true", help="make the user if it does not exist"
        )
        scopes = "; ".join(f"{scope}: {ACTIONS[scope]}" for scope in TOKEN_SCOPES)
        parser.add_argument(
            "--scope", action="append", default=[], choices=TOKEN_SCOPES, metavar="SCOPE",
            help="limit the token to this permission (repeatable; default: the user's role)."
            f" Scopes: {scopes}",
        )  # fmt: skip

    def handle(self, *args, username, name, role, create_user, scope, **options):
        users = get_user_model().objects
        user = users.filter(username=username).first()
        if user is None and create_user:
            user = users.create_user(username)  # no password: a service account
        if user is None:
            raise CommandError(f"no user named {username!r} (add --create-user to make one)")
        if role:
            ensure_roles()
            user.groups.add(Group.objects.get(name=role))
            user = users.get(pk=user.pk)  # permissions are cached per instance
        try:
            _row, secret = create_token(
                user, name=name, scopes=scope, by="manage.py", now=time_source.now()
            )
        except ServiceError as exc:
            raise CommandError(f"{exc.field}: {exc.message}") from None
        self.stdout.write(secret)
