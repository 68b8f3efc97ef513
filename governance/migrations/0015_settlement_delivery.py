"""Issue 12: each settled run's delivery judged once, not on every report request.

The settlement carries the judgement (R7.4 by ``governance.rules.publication``,
written by ``governance.services.deliveries``) and two revisions: the
judgement stands for ``judged_rev``; ``delivery_rev`` goes up whenever a row of
the run's body chunks, completion callback, tool receipts or provider attempts
is inserted, changed or deleted. Database triggers bump it, whoever writes the
row, so no writer can leave a stale judgement behind; a settlement whose two
revisions differ is judged again (the partial index finds them).
``SettledDay`` and ``SettledUsageDay`` sum the judged columns and the billed
tokens of settled runs per UTC day, run provider and outcome, so the report
reads whole days without reading each run.
Written out here, not imported: a migration must not change with the code.
"""

import django.db.models.deletion
from django.db import migrations, models

TABLES = (
    "governance_bodychunk",
    "governance_runcallback",
    "governance_toolreceipt",
    "governance_providerattempt",
)
FUNCTION = "governance_delivery_changed"


def _postgresql_up():
    yield f"""
        CREATE OR REPLACE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP <> 'INSERT' THEN
                UPDATE governance_settlement SET delivery_rev = delivery_rev + 1
                 WHERE run_id = OLD.run_id;
            END IF;
            IF TG_OP <> 'DELETE' AND (TG_OP = 'INSERT' OR NEW.run_id IS DISTINCT FROM OLD.run_id)
            THEN
                UPDATE governance_settlement SET delivery_rev = delivery_rev + 1
                 WHERE run_id = NEW.run_id;
            END IF;
            RETURN NULL;
        END $$"""
    for table in TABLES:
        yield (
            f"CREATE TRIGGER {table}_delivery AFTER INSERT OR UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )


def _sqlite_up():
    bump = "UPDATE governance_settlement SET delivery_rev = delivery_rev + 1 WHERE run_id = {}."
    for table in TABLES:
        for event, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            body = bump.format(row) + "run_id;"
            if event == "UPDATE":
                body += " " + bump.format("OLD") + "run_id;"
            yield (
                f"CREATE TRIGGER {table}_delivery_{event.lower()} AFTER {event} ON {table} "
                f"FOR EACH ROW BEGIN {body} END"
            )


def add_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    statements = {"postgresql": _postgresql_up, "sqlite": _sqlite_up}.get(vendor)
    if statements is None:
        raise RuntimeError(f"no delivery triggers written for {vendor}")
    for statement in statements():
        schema_editor.execute(statement)


def drop_triggers(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    for table in TABLES:
        if vendor == "postgresql":
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_delivery ON {table}")
        else:
            for event in ("insert", "update", "delete"):
                schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_delivery_{event}")
    if vendor == "postgresql":
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {FUNCTION}()")


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0014_page_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="SettledDay",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateField()),
                ("provider_key", models.CharField(blank=True, max_length=64)),
                ("outcome", models.CharField(max_length=16)),
                ("runs", models.BigIntegerField(default=0)),
                ("committed", models.BigIntegerField(default=0)),
                ("sent", models.BigIntegerField(default=0)),
                ("observed", models.BigIntegerField(default=0)),
                ("all_acknowledged", models.BigIntegerField(default=0)),
                ("part_acknowledged", models.BigIntegerField(default=0)),
                ("no_evidence", models.BigIntegerField(default=0)),
                ("nothing_committed", models.BigIntegerField(default=0)),
                ("flagged", models.BigIntegerField(default=0)),
                ("discrepancies", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="SettledUsageDay",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateField()),
                ("provider_key", models.CharField(blank=True, max_length=64)),
                ("outcome", models.CharField(max_length=16)),
                ("refused", models.BooleanField()),
                ("reported", models.BooleanField()),
                ("bills_input", models.BooleanField()),
                ("bills_output", models.BooleanField()),
                ("bills_cached", models.BooleanField()),
                ("requests", models.BigIntegerField(default=0)),
                ("billed_input", models.BigIntegerField(default=0)),
                ("output", models.BigIntegerField(default=0)),
                ("cached", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.AddField(
            model_name="settlement",
            name="chunks_committed",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="settlement",
            name="chunks_observed",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="settlement",
            name="chunks_sent",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="settlement",
            name="delivery",
            field=models.JSONField(
                blank=True, db_default=models.Value({}, models.JSONField()), default=dict
            ),
        ),
        migrations.AddField(
            model_name="settlement",
            name="delivery_rev",
            field=models.PositiveIntegerField(db_default=1, default=1),
        ),
        migrations.AddField(
            model_name="settlement",
            name="delivery_verdict",
            field=models.CharField(blank=True, db_default="", default="", max_length=40),
        ),
        migrations.AddField(
            model_name="settlement",
            name="discrepancy_count",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="settlement",
            name="judged_rev",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="settlement",
            name="provider_key",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
        migrations.AddField(
            model_name="settlement",
            name="usage_in_rollup",
            field=models.JSONField(
                blank=True, db_default=models.Value({}, models.JSONField()), default=dict
            ),
        ),
        migrations.AddIndex(
            model_name="settlement",
            index=models.Index(fields=["settled_at", "run_id"], name="settlement_settled_at"),
        ),
        migrations.AddIndex(
            model_name="settlement",
            index=models.Index(
                condition=models.Q(("judged_rev__lt", models.F("delivery_rev"))),
                fields=["id"],
                name="settlement_unjudged",
            ),
        ),
        migrations.AddConstraint(
            model_name="settledday",
            constraint=models.UniqueConstraint(
                fields=("day", "provider_key", "outcome"), name="settled_day_key"
            ),
        ),
        migrations.AddField(
            model_name="settledusageday",
            name="provider",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="governance.provider",
            ),
        ),
        migrations.AddConstraint(
            model_name="settledusageday",
            constraint=models.UniqueConstraint(
                fields=(
                    "day",
                    "provider_key",
                    "outcome",
                    "provider",
                    "refused",
                    "reported",
                    "bills_input",
                    "bills_output",
                    "bills_cached",
                ),
                name="settled_usage_day_key",
            ),
        ),
        migrations.RunPython(add_triggers, drop_triggers),
    ]
