"""Issue 12 at production size (``bench/scale.py``): indexes matching the dashboard
pages' filters and orders.

- ``attempt_segment_time``: a segment's requests in time order — the segment page's
  timeline reads its newest 50 instead of scanning the newest requests of every
  segment. On PostgreSQL it also carries the columns the cost summary reads
  (``provider_id``, ``result`` and 0013's generated usage columns), so a long-lived
  segment's cost (20,000 requests) is summed from the index alone; elsewhere it is a
  plain index (the generated columns exist on PostgreSQL only).
- ``stage_finished``: the overview's clocks, stages finished in the last hour.
- ``segment_open_newest`` / ``segment_newest``: the segments page, newest first.

The delivery report's migration 0015 follows this one. Written out here, not
imported: a migration must not change with the code.
"""

from django.db import migrations, models

ATTEMPT_INDEX = models.Index(fields=["segment", "started_at", "id"], name="attempt_segment_time")
COVERED = ("provider_id", "result", "usage_reported", "usage_billed_input", "usage_output",
           "usage_cached")  # fmt: skip


def add_attempt_index(apps, schema_editor):
    model = apps.get_model("governance", "ProviderAttempt")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, ATTEMPT_INDEX)
        return
    schema_editor.execute(
        "CREATE INDEX attempt_segment_time ON governance_providerattempt "
        f"(segment_id, started_at, id) INCLUDE ({', '.join(COVERED)})"
    )


def drop_attempt_index(apps, schema_editor):
    schema_editor.remove_index(apps.get_model("governance", "ProviderAttempt"), ATTEMPT_INDEX)


class Migration(migrations.Migration):
    dependencies = [("governance", "0013_refusal_schedules")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add_attempt_index, drop_attempt_index)],
            state_operations=[
                migrations.AddIndex(model_name="providerattempt", index=ATTEMPT_INDEX),
            ],
        ),
        migrations.AddIndex(
            model_name="stage",
            index=models.Index(
                condition=models.Q(finished_at__isnull=False),
                fields=["-finished_at"],
                name="stage_finished",
            ),
        ),
        migrations.AddIndex(
            model_name="segment",
            index=models.Index(
                condition=models.Q(closed_at__isnull=True),
                fields=["-opened_at", "-id"],
                name="segment_open_newest",
            ),
        ),
        migrations.AddIndex(
            model_name="segment",
            index=models.Index(fields=["-opened_at", "-id"], name="segment_newest"),
        ),
    ]
