"""R6.2 (issue 14): a stage's failure class is a field of its own, apart from
the clock that ran out; stages recorded as timeout_name="interrupted" move."""

from django.db import migrations, models


def interrupted_is_not_a_timeout(apps, schema_editor):
    Stage = apps.get_model("governance", "Stage")
    Stage.objects.filter(timeout_name="interrupted").update(
        timeout_name="", failure_class="interrupted"
    )


def back(apps, schema_editor):
    Stage = apps.get_model("governance", "Stage")
    Stage.objects.filter(failure_class="interrupted").update(timeout_name="interrupted")


class Migration(migrations.Migration):
    dependencies = [("governance", "0010_tool_servers")]

    operations = [
        migrations.AddField(
            model_name="stage",
            name="failure_class",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.RunPython(interrupted_is_not_a_timeout, back),
    ]
