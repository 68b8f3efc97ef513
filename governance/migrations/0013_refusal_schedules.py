"""Issue 12: a re-probe schedule per provider (and per refusal category), and the
schedule each segment refusal started under, so a change never re-judges it.

On PostgreSQL, the cost rule's reading of each attempt's reported ``usage``
(``governance.rules.cost.usage_shape``: the first of the keys below holding a
whole number ≥ 0; input not cached = max(0, input − cached)) is stored in
generated columns, computed by the database whoever writes the row, so the
report and the segment page sum costs over many requests without reading JSON
(``dashboard.queries.costs.usage_shapes``; tests/dashboard/test_costs.py checks
the sums against the rule on odd usage). Elsewhere the rows are read one by one.
Written out here, not imported: a migration must not change with the code.

And the runs page's order, newest first, as an index (``bench/scale.py``: at
10,000 runs the page otherwise joins and sorts every run).
"""

from django.db import migrations, models

INPUT_KEYS = ("input_tokens", "prompt_tokens")
OUTPUT_KEYS = ("output_tokens", "completion_tokens")
CACHED_KEYS = ("cached_tokens", "cache_read_input_tokens")
COLUMNS = ("usage_reported", "usage_billed_input", "usage_output", "usage_cached")


def _tokens(keys):
    cases = " ".join(
        f"WHEN jsonb_typeof(usage -> '{key}') = 'number' AND (usage ->> '{key}') ~ '^[0-9]+$' "
        f"THEN (usage ->> '{key}')::bigint"
        for key in keys
    )
    return f"(CASE {cases} END)"


def add_usage_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    i, o, c = (_tokens(keys) for keys in (INPUT_KEYS, OUTPUT_KEYS, CACHED_KEYS))
    expressions = {
        "usage_reported": ("boolean", f"({i} IS NOT NULL OR {o} IS NOT NULL OR {c} IS NOT NULL)"),
        "usage_billed_input": ("bigint", f"GREATEST(0, COALESCE({i}, 0) - COALESCE({c}, 0))"),
        "usage_output": ("bigint", f"COALESCE({o}, 0)"),
        "usage_cached": ("bigint", f"COALESCE({c}, 0)"),
    }
    schema_editor.execute(
        "ALTER TABLE governance_providerattempt "
        + ", ".join(
            f"ADD COLUMN {name} {kind} GENERATED ALWAYS AS ({expression}) STORED"
            for name, (kind, expression) in expressions.items()
        )
    )


def drop_usage_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "ALTER TABLE governance_providerattempt "
        + ", ".join(f"DROP COLUMN IF EXISTS {name}" for name in COLUMNS)
    )


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
        migrations.RunPython(add_usage_columns, drop_usage_columns),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["-created_at", "-id"], name="run_newest_first"),
        ),
    ]
