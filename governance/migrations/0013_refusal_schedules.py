"""Issue 12: a re-probe schedule per provider (and per refusal category), and the
schedule each segment refusal started under, so a change never re-judges it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("governance", "0012_insights_prices_and_indexes")]

    operations = [
        migrations.AddField(
            model_name="provider",
            name="refusal_schedule",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="segmentrefusal",
            name="delays_s",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
