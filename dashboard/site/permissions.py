"""Who may do what — over the API exactly as in the dashboard (R8).

One name per action; the actions and their words are
``governance.roles.ACTIONS``. A user holds permissions through its role
(Django groups, ``governance/roles.py``); an API token may narrow them
further with its scopes (an empty scope list means "what its user may do").

Every view declares, per HTTP method, the permission it checks
(:func:`requires` for pages, ``dashboard.api.base.api_view`` for the API); a
test walks the URL map and fails on a write that declares none.

Ownership: threads and runs belong to the user who created them. Without
``see_all_runs`` (a service account, the agent-client role) a user sees and
acts on its own only; someone else's answers 404, as if it did not exist.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache, wraps
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpResponseNotAllowed

from governance.roles import ACTIONS
from governance.services import statements as sql

SUBMIT_RUN = "governance.submit_run"
CANCEL_RUN = "governance.cancel_run"
APPLY_BOUNDARY = "governance.apply_boundary"
ACKNOWLEDGE = "governance.acknowledge_notification"
DECIDE_APPROVAL = "governance.decide_approval"
VIEW_REPORT = "governance.view_delivery_report"
VIEW_INSIGHTS = "governance.view_insights"
MANAGE_PROVIDERS = "governance.change_provider"
MANAGE_TOOLS = "governance.change_toolserver"
RUN_TOOL_COMMAND = "governance.run_tool_command"
SEE_ALL_RUNS = "governance.see_all_runs"
USE_OPENAI_DOOR = "governance.use_openai_door"
# Declared by a write on the user's own things only (its API tokens): being
# signed in is the check. Never a write on shared facts.
SIGNED_IN = "signed-in"
# Declared by sign-in itself (the login form).
ANYONE = "anyone"
# Declared by a write on one run that its owner may make whatever their role
# (R7.1: who asked stops their run; R7.2: their client's acks). The view
# checks it, once it has read the run: ``(CANCEL_RUN, OWN_RUN)`` is "cancel_run,
# or the run's owner"; ``OWN_RUN`` alone is the owner only.
OWN_RUN = "own-run"
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def allowed(user, permission: str, scopes=()) -> bool:
    """The user's role grants it, and the token's scopes (if any) include it."""
    if not user.has_perm(permission):
        return False
    return not scopes or permission.split(".", 1)[1] in scopes


def refusal(permission: str) -> str:
    codename = permission.split(".", 1)[1]
    return f"this needs the '{codename}' permission (to {ACTIONS[codename]})"


def door_refusal(user, scopes=()) -> str | None:
    """Why the OpenAI-compatible door refuses the token (None: it may call it).
    The door submits runs, so the role must grant both ``use_openai_door`` and
    ``submit_run``; a token's scopes need only name the door (a token scoped to
    the door alone calls it, and the run API's writes stay closed to it)."""
    if not allowed(user, USE_OPENAI_DOOR, scopes):
        return refusal(USE_OPENAI_DOOR)
    if not user.has_perm(SUBMIT_RUN):
        return refusal(SUBMIT_RUN)
    return None


def sees_all(user, scopes=()) -> bool:
    """People with a role see every thread and run; a service account its own."""
    return allowed(user, SEE_ALL_RUNS, scopes)


def may_see(user, owner_id: Any, scopes=()) -> bool:
    """The user owns it, or sees everything."""
    return (owner_id is not None and owner_id == user.pk) or sees_all(user, scopes)


def visible(rows: QuerySet, user, scopes=(), *, owner: str = "owner") -> QuerySet:
    """``rows`` narrowed to the user's own unless it sees everything."""
    return rows if sees_all(user, scopes) else rows.filter(Q(**{owner: user}))


def _owns(user, owner_id: Any, scopes, codename: str) -> bool:
    """The run is the user's, and its token (if scoped) may act as its client."""
    return owner_id is not None and owner_id == user.pk and (not scopes or codename in scopes)


def may_stop(user, run, scopes=()) -> bool:
    """R7.1: who asked may stop their own run, whatever their role; others need
    cancel_run and to see the run (a service account: its own only)."""
    if _owns(user, run.owner_id, scopes, "cancel_run"):
        return True
    return allowed(user, CANCEL_RUN, scopes) and may_see(user, run.owner_id, scopes)


def records_delivery(user, owner_id: Any, scopes=()) -> bool:
    """R7.2: what a client was sent and shown is evidence only from the run's
    owner: staff watching someone else's run never mark it."""
    return _owns(user, owner_id, scopes, "submit_run")


def checked_before_the_view(needed: Any) -> str | None:
    """The permission a declaration lets the decorator check up front; None
    when the view checks (ownership needs the run) or nothing is needed."""
    return needed if isinstance(needed, str) and needed.startswith("governance.") else None


def declared(**by_method: str | None) -> Callable:
    """:func:`declare` as a decorator, for a view that checks by itself."""
    return lambda view: declare(view, by_method)


def declare(view: Callable, by_method: dict[str, str | None]) -> Callable:
    """Record on ``view`` what each method needs (None: any signed-in user may
    read); outer decorators copy it (``functools.wraps``)."""
    view.required_permissions = dict(by_method)
    return view


def requires(refused: Callable | None = None, **by_method: str | None) -> Callable:
    """A page's permission per method, declared and checked: any other method
    answers 405, a user without the permission 403 (a signed-in user; put it
    inside ``login_required``). ``GET=None``: any signed-in user may read.
    ``refused(request, *args, **kwargs)``: the page's own 403 answer."""

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def checked(request, *args, **kwargs):
            if request.method == "HEAD" and "GET" in by_method:
                needed = by_method["GET"]
            elif request.method in by_method:
                needed = by_method[request.method]
            else:
                return HttpResponseNotAllowed(list(by_method))
            needed = checked_before_the_view(needed)
            if needed is not None and not allowed(request.user, needed):
                if refused is not None:
                    return refused(request, *args, **kwargs)
                raise PermissionDenied(refusal(needed))
            return view(request, *args, **kwargs)

        return declare(checked, by_method)

    return decorate


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
