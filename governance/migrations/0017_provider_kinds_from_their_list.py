"""A provider's kind takes its choices from the one list of kinds
(``governance.provider_kinds.choices``, read when asked) instead of a copy of
it on the model. Choices are not in the database: this changes no column, and
a kind added to that list later needs no migration.
"""

from django.db import migrations, models

import governance.provider_kinds


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0016_attempt_tiers"),
    ]

    operations = [
        migrations.AlterField(
            model_name="provider",
            name="kind",
            field=models.CharField(choices=governance.provider_kinds.choices, max_length=16),
        ),
    ]
