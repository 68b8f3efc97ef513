"""Issue 12: each provider attempt's Insights tier, decided once and kept on it.

``governance.services.insight_tiers`` tiers the attempts of a segment once their
turns are over (by ``governance.rules.insights.tier_sends``) and writes the tier
here; the Insights page sums these columns over its period instead of replaying
every refusal timeline on each request. ``tiered`` marks an attempt done (an
empty ``insight_tier``: it is in no tier). The database defaults as well as
Django's: rows written without the ORM (bench/scale.py's COPY, an older worker
during an upgrade) start untiered and the beat tiers them.

- ``attempt_untiered``: what is left to tier, by segment — empty at rest.
- ``attempt_tier_time``: the page's sums over a period, only the sends in a tier.

0015's trigger marks a run's delivery judgement stale on any write to its
attempts. Writing a tier changes nothing the judgement reads, and a backlog of
tiers (a million attempts after this migration) must not re-judge every
settlement: the update trigger now fires for an UPDATE that sets one of the
columns the attempt had before this migration (Django's ``save()`` sets them
all), not for one that sets only the tier. ``UPDATE OF`` costs nothing per row;
a ``WHEN`` comparing the rows without the tier columns cost 30 µs a row
(to_jsonb), a third of a tier write. A column added later joins this list in its
own migration if the judgement reads it. SQLite adds (and removes) columns by
remaking the table, which drops its triggers: all three are written again after
the columns are added, and again after they are removed.
Written out here, not imported: a migration must not change with the code.
"""

from django.db import migrations, models

TABLE = "governance_providerattempt"
FUNCTION = "governance_delivery_changed"  # 0015's
# The attempt's columns before this migration (PostgreSQL's generated usage columns
# follow from ``usage``).
OTHER_COLUMNS = (
    "id", "run_id", "stage_id", "segment_id", "provider_id", "model", "kind",
    "request_digest", "started_at", "latency_ms", "result", "failure_class",
    "refusal_category", "status_code", "finish_reason", "usage", "error", "tool_names",
)  # fmt: skip


def _postgresql(columns):
    def statements():
        of = f" OF {', '.join(columns)}" if columns else ""
        yield f"DROP TRIGGER IF EXISTS {TABLE}_delivery ON {TABLE}"
        yield f"DROP TRIGGER IF EXISTS {TABLE}_delivery_update ON {TABLE}"
        if not columns:  # 0015's one trigger
            yield (
                f"CREATE TRIGGER {TABLE}_delivery AFTER INSERT OR UPDATE OR DELETE ON {TABLE} "
                f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
            )
            return
        yield (
            f"CREATE TRIGGER {TABLE}_delivery AFTER INSERT OR DELETE ON {TABLE} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )
        yield (
            f"CREATE TRIGGER {TABLE}_delivery_update AFTER UPDATE{of} ON {TABLE} "
            f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
        )

    return statements


SQLITE_BUMP = "UPDATE governance_settlement SET delivery_rev = delivery_rev + 1 WHERE run_id = {}."


def _sqlite(columns):
    """SQLite adds these columns by remaking the table, which drops 0015's three
    triggers on it: all three are written again."""

    def statements():
        of = f" OF {', '.join(columns)}" if columns else ""
        for event, rows in (("INSERT", ("NEW",)), ("UPDATE", ("NEW", "OLD")), ("DELETE", ("OLD",))):
            name = f"{TABLE}_delivery_{event.lower()}"
            body = " ".join(SQLITE_BUMP.format(row) + "run_id;" for row in rows)
            yield f"DROP TRIGGER IF EXISTS {name}"
            yield (
                f"CREATE TRIGGER {name} AFTER {event}{of if event == 'UPDATE' else ''} "
                f"ON {TABLE} FOR EACH ROW BEGIN {body} END"
            )

    return statements


def _run(ups):
    def apply(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        statements = ups.get(vendor)
        if statements is None:
            raise RuntimeError(f"no delivery triggers written for {vendor}")
        for statement in statements():
            schema_editor.execute(statement)

    return apply


narrow_trigger = _run({"postgresql": _postgresql(OTHER_COLUMNS), "sqlite": _sqlite(OTHER_COLUMNS)})
restore_trigger = _run({"postgresql": _postgresql(()), "sqlite": _sqlite(())})


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0015_settlement_delivery"),
    ]

    operations = [
        # Undone last: 0015's triggers back (SQLite dropped them removing the columns).
        migrations.RunPython(migrations.RunPython.noop, restore_trigger),
        migrations.AddField(
            model_name="providerattempt",
            name="tiered",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name="providerattempt",
            name="insight_tier",
            field=models.CharField(blank=True, db_default="", default="", max_length=16),
        ),
        migrations.AddField(
            model_name="providerattempt",
            name="insight_step",
            field=models.PositiveSmallIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="providerattempt",
            name="insight_boundary_kind",
            field=models.CharField(blank=True, db_default="", default="", max_length=32),
        ),
        migrations.AddField(
            model_name="providerattempt",
            name="insight_category",
            field=models.CharField(blank=True, db_default="", default="", max_length=64),
        ),
        migrations.AddField(
            model_name="providerattempt",
            name="insight_since_refusal_s",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="providerattempt",
            index=models.Index(
                condition=models.Q(("tiered", False)),
                fields=["segment", "started_at"],
                name="attempt_untiered",
            ),
        ),
        migrations.AddIndex(
            model_name="providerattempt",
            index=models.Index(
                condition=models.Q(("insight_tier", ""), _negated=True),
                fields=["started_at"],
                name="attempt_tier_time",
            ),
        ),
        migrations.RunPython(narrow_trigger, migrations.RunPython.noop),
    ]
