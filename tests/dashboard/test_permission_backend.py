"""dashboard.site.permissions.RolePermissionsBackend: Django's answers, in one query."""

from __future__ import annotations

import pytest
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.site import permissions
from dashboard.site.permissions import RolePermissionsBackend

pytestmark = pytest.mark.django_db


def _fresh(user):
    return type(user).objects.get(pk=user.pk)  # no permission cache


@pytest.mark.parametrize("groups", [(), ("operator",), ("on-call", "manager")])
def test_a_users_permissions_are_django_models_own_answer(make_user, groups):
    user = make_user("role-" + "-".join(groups or ("none",)), *groups)
    user.user_permissions.add(Permission.objects.get(codename="view_run"))
    expected = ModelBackend().get_all_permissions(_fresh(user))
    user = _fresh(user)
    with CaptureQueriesContext(connection) as queries:
        got = RolePermissionsBackend().get_all_permissions(user)
    assert got == expected
    assert "governance.view_run" in got
    assert len(queries) == 1


def test_a_superuser_holds_every_permission_and_an_inactive_user_none(make_user):
    boss = make_user("boss", is_superuser=True)
    assert RolePermissionsBackend().get_all_permissions(_fresh(boss)) == {
        f"{p.content_type.app_label}.{p.codename}"
        for p in Permission.objects.select_related("content_type")
    }
    gone = make_user("gone", "operator", is_active=False)
    assert RolePermissionsBackend().get_all_permissions(_fresh(gone)) == set()


def test_the_api_checks_a_permission_with_this_backend(make_user):
    user = _fresh(make_user("client", "agent-client"))
    with CaptureQueriesContext(connection) as queries:
        assert permissions.allowed(user, permissions.SUBMIT_RUN)
        assert not permissions.allowed(user, permissions.APPLY_BOUNDARY)
    assert len(queries) == 1  # read once, then cached on the user
