"""The dashboard's roles as Django groups with their permissions (R8).

Migration 0004 creates them; ``ensure_roles`` restores them where a database
was flushed (transactional tests) or set up without migrations.
"""

from __future__ import annotations

ROLES: dict[str, tuple[str, ...]] = {
    "on-call": ("acknowledge_notification",),
    "operator": ("acknowledge_notification", "apply_boundary"),
    "manager": ("view_delivery_report",),
}


def ensure_roles() -> None:
    from django.contrib.auth.models import Group, Permission

    for name, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(
            Permission.objects.filter(content_type__app_label="governance", codename__in=codenames)
        )
