"""Routes: a named provider chain the OpenAI-compatible door's ``model`` may
name. The name shares one namespace with provider ids (checked by the routes
and providers services, both ways)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0019_run_owner"),
    ]

    operations = [
        migrations.CreateModel(
            name="Route",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.SlugField(max_length=64, unique=True)),
                ("provider_chain", models.JSONField(help_text="provider ids, tried in order")),
                ("description", models.TextField(blank=True)),
                ("enabled", models.BooleanField(default=True)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={"ordering": ["name"]},
        ),
    ]
