"""Who may do what — over the API exactly as in the dashboard (R8).

One name per action; the actions and their words are
``governance.roles.ACTIONS``. A user holds permissions through its role
(Django groups, ``governance/roles.py``); an API token may narrow them
further with its scopes (an empty scope list means "what its user may do").
"""

from __future__ import annotations

from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission
from django.db.models import Q

from governance.roles import ACTIONS

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


class RolePermissionsBackend(ModelBackend):
    """Django's model backend, reading a user's permissions (its own and its
    groups') in one query instead of Django's two: every API request that
    checks one reads them."""

    def get_all_permissions(self, user_obj, obj=None):
        if not user_obj.is_active or user_obj.is_anonymous or obj is not None:
            return set()
        if not hasattr(user_obj, "_perm_cache"):
            rows = Permission.objects.all()
            if not user_obj.is_superuser:
                held = Q(user=user_obj) | Q(group__user=user_obj)
                rows = rows.filter(id__in=Permission.objects.filter(held).values("id"))
            user_obj._perm_cache = {
                f"{label}.{codename}"
                for label, codename in rows.values_list("content_type__app_label", "codename")
            }
        return user_obj._perm_cache
