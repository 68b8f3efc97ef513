"""Who may do what — over the API exactly as in the dashboard (R8).

One name per action; the actions and their words are
``governance.roles.ACTIONS``. A user holds permissions through its role
(Django groups, ``governance/roles.py``); an API token may narrow them
further with its scopes (an empty scope list means "what its user may do").
"""

from __future__ import annotations

from functools import cache

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType

from governance.roles import ACTIONS
from governance.services import statements as sql

SUBMIT_RUN = "governance.submit_run"
CANCEL_RUN = "governance.cancel_run"
APPLY_BOUNDARY = "governance.apply_boundary"
ACKNOWLEDGE = "governance.acknowledge_notification"
VIEW_REPORT = "governance.view_delivery_report"
VIEW_INSIGHTS = "governance.view_insights"
MANAGE_PROVIDERS = "governance.change_provider"
MANAGE_TOOLS = "governance.change_toolserver"


def allowed(user, permission: str, scopes=()) -> bool:
    """The user's role grants it, and the token's scopes (if any) include it."""
    if not user.has_perm(permission):
        return False
    return not scopes or permission.split(".", 1)[1] in scopes


def refusal(permission: str) -> str:
    codename = permission.split(".", 1)[1]
    return f"this needs the '{codename}' permission (to {ACTIONS[codename]})"


def may_stop(user, run, scopes=()) -> bool:
    """R7.1: the user who asked may stop their own run; others need cancel_run."""
    if allowed(user, CANCEL_RUN, scopes):
        return True
    own = bool(user.get_username()) and run.authorization.get("user") == user.get_username()
    return own and (not scopes or CANCEL_RUN.split(".", 1)[1] in scopes)


@cache
def _held_permissions_sql() -> tuple[str, str]:
    """A user's permissions (its own and its groups'), and every permission,
    as (app_label, codename) rows: fixed SQL with the auth models' tables."""
    user_model = get_user_model()
    perm, ctype = sql.table(Permission), sql.table(ContentType)
    own = sql.quote(user_model.user_permissions.through._meta.db_table)
    groups = sql.quote(user_model.groups.through._meta.db_table)
    granted = sql.quote(Group.permissions.through._meta.db_table)
    every = (
        f"SELECT ct.app_label, p.codename FROM {perm} p"
        f" JOIN {ctype} ct ON ct.id = p.content_type_id"
    )
    held = (
        f"{every} WHERE p.id IN (SELECT permission_id FROM {own} WHERE user_id = %s"
        f" UNION SELECT gp.permission_id FROM {granted} gp"
        f" JOIN {groups} ug ON ug.group_id = gp.group_id WHERE ug.user_id = %s)"
    )
    return every, held


class RolePermissionsBackend(ModelBackend):
    """Django's model backend, reading a user's permissions (its own and its
    groups') in one fixed statement instead of two querysets: every API request
    that checks one reads them (a fenced hot path, services.statements)."""

    def get_all_permissions(self, user_obj, obj=None):
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            every, held = _held_permissions_sql()
            rows = (
                sql.fetch(every)
                if user_obj.is_superuser
                else sql.fetch(held, [user_obj.pk, user_obj.pk])
            )
            user_obj._perm_cache = {f"{label}.{codename}" for label, codename in rows}
        return user_obj._perm_cache
