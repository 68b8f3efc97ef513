"""Ownership: a run's owner (who submitted it), and the see_all_runs
permission that lets the roles of people see every thread and run; a service
account (agent-client) sees its own only. Existing runs get the user their
admission recorded, else their thread's creator."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import OuterRef, Subquery

# The roles as of this migration (governance/roles.py).
ROLES = {
    "on-call": ["acknowledge_notification", "cancel_run", "see_all_runs"],
    "operator": [
        "acknowledge_notification",
        "apply_boundary",
        "submit_run",
        "cancel_run",
        "view_insights",
        "see_all_runs",
    ],
    "manager": ["view_delivery_report", "view_insights", "see_all_runs"],
    "agent-client": ["submit_run", "cancel_run"],
}


def give_owners(apps, schema_editor):
    Run = apps.get_model("governance", "Run")
    Thread = apps.get_model("governance", "Thread")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    # One update per user (there are few): the user its admission recorded.
    for username, user_id in User.objects.values_list("username", "id").iterator():
        Run.objects.filter(owner__isnull=True, authorization__user=username).update(
            owner_id=user_id
        )
    creator = Thread.objects.filter(id=OuterRef("thread_id")).values("created_by_id")[:1]
    Run.objects.filter(owner__isnull=True).update(owner_id=Subquery(creator))


def update_roles(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    # The new permission is normally created after migrate; the groups need it now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for name, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(
            Permission.objects.filter(content_type__app_label="governance", codename__in=codenames)
        )


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0018_stage_due_at"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="run",
            options={
                "ordering": ["-created_at"],
                "permissions": [
                    ("submit_run", "Can submit runs"),
                    ("cancel_run", "Can stop runs"),
                    ("see_all_runs", "Can see every thread and run, not only their own"),
                ],
            },
        ),
        migrations.AddField(
            model_name="run",
            name="owner",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.RunPython(give_owners, migrations.RunPython.noop),
        migrations.RunPython(update_roles, migrations.RunPython.noop),
    ]
