"""A stage sent with a delay (a recovery wait, a verification delay) records
when it is due, so a message sent again after a loss keeps what is left of the
delay, and the watchdog's last-resort timer counts from then, not from the
enqueue. Null for every existing row: due at once.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0017_provider_kinds_from_their_list"),
    ]

    operations = [
        migrations.AddField(
            model_name="stage",
            name="due_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
