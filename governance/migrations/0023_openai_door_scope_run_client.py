"""The OpenAI-compatible door's own permission (``use_openai_door``: the
operator and agent-client roles), and the API token that submitted a run
(``Run.api_token``, with its name copied as ``Run.client_name``).

Whoever could call the door keeps it: the door used to need ``submit_run``
alone, so every group and user that holds ``submit_run`` gets the door's
permission too, and every token scoped to ``submit_run`` gets the door's
scope (a token's scope narrows the role; it was never meant to shut a door
that did not have a name yet)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

# The roles as of this migration (governance/roles.py).
ROLES = {
    "on-call": ["acknowledge_notification", "cancel_run", "see_all_runs"],
    "operator": [
        "acknowledge_notification",
        "apply_boundary",
        "submit_run",
        "use_openai_door",
        "cancel_run",
        "view_insights",
        "see_all_runs",
    ],
    "manager": ["view_delivery_report", "view_insights", "see_all_runs"],
    "agent-client": ["submit_run", "use_openai_door", "cancel_run"],
}


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
    governance = Permission.objects.filter(content_type__app_label="governance")
    submit, door = governance.get(codename="submit_run"), governance.get(codename="use_openai_door")
    # Other groups and users given submit_run by hand keep the door they had.
    for group in Group.objects.filter(permissions=submit).exclude(name__in=ROLES):
        group.permissions.add(door)
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    for user in User.objects.filter(user_permissions=submit):
        user.user_permissions.add(door)
    ApiToken = apps.get_model("governance", "ApiToken")
    for token in ApiToken.objects.iterator():  # few; JSON containment is not SQLite's
        if "submit_run" in (token.scopes or ()) and "use_openai_door" not in token.scopes:
            token.scopes = sorted({*token.scopes, "use_openai_door"})
            token.save(update_fields=["scopes"])


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0022_client_tools"),
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
                    ("use_openai_door", "Can call the OpenAI-compatible door"),
                ],
            },
        ),
        migrations.AddField(
            model_name="run",
            name="api_token",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="runs",
                to="governance.apitoken",
            ),
        ),
        migrations.AddField(
            model_name="run",
            name="client_name",
            field=models.CharField(blank=True, max_length=100),
        ),
        migrations.RunPython(update_roles, migrations.RunPython.noop),
    ]
