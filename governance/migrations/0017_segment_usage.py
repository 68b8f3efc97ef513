"""Issue 12: each segment's billed tokens, summed as its requests are written.

The segment page's cost line summed every request of the segment on each view
(20,000 requests of a long-lived segment: ≈ 20 ms, and growing with the
segment). ``governance_segmentusage`` keeps those sums: per segment, provider,
refused or not, and usage shape (reported, and which kinds of token it bills —
the grouping of ``governance.services.usage.usage_shapes``), the number of
requests and their billed input, output and cached tokens. The page prices a
handful of rows with the prices of the day (``rules.cost``), as before.

A database trigger keeps them, whoever writes an attempt (the runner's bulk
insert, the admin, a restore), in the same transaction as the write: a sum is
never stale and no writer needs to know. It reads the generated ``usage_*``
columns (migration 0013: the cost rule's reading of ``usage``), so PostgreSQL
only; elsewhere the page sums the requests as before. An update fires it only
when a column the sums read changes (not for an Insights tier); a row whose
requests fall to 0 (its attempts deleted or moved) is removed; emptying the
attempts table empties the sums. No foreign key: a segment or provider is
deleted after its attempts, which takes its rows with them, and Django's flush
(tests) truncates only its models' tables.

The sums start from the attempts already written, under the trigger's lock, so
no attempt written meanwhile is counted twice or missed.
Written out here, not imported: a migration must not change with the code.
"""

from django.db import migrations

TABLE = "governance_segmentusage"
ATTEMPTS = "governance_providerattempt"
FUNCTION = "governance_segment_usage_changed"
TRUNCATED = "governance_segment_usage_truncated"
KEY = ("segment_id", "provider_id", "refused", "reported", "bills_input", "bills_output",
       "bills_cached")  # fmt: skip


def _key_of(row: str) -> str:
    """The sums' key of an attempt row (OLD or NEW), as a condition on the table."""
    return (
        f"segment_id = {row}.segment_id AND provider_id = {row}.provider_id "
        f"AND refused = ({row}.result = 'refused') AND reported = {row}.usage_reported "
        f"AND bills_input = ({row}.usage_billed_input > 0) "
        f"AND bills_output = ({row}.usage_output > 0) AND bills_cached = ({row}.usage_cached > 0)"
    )


def _up():
    yield f"""
        CREATE TABLE {TABLE} (
            segment_id bigint NOT NULL,
            provider_id bigint NOT NULL,
            refused boolean NOT NULL,
            reported boolean NOT NULL,
            bills_input boolean NOT NULL,
            bills_output boolean NOT NULL,
            bills_cached boolean NOT NULL,
            requests bigint NOT NULL,
            billed_input bigint NOT NULL,
            output bigint NOT NULL,
            cached bigint NOT NULL,
            PRIMARY KEY ({", ".join(KEY)})
        )"""
    yield f"""
        CREATE FUNCTION {FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$
        DECLARE
            left_over bigint;
        BEGIN
            IF TG_OP <> 'INSERT' THEN
                UPDATE {TABLE} SET requests = requests - 1,
                       billed_input = billed_input - OLD.usage_billed_input,
                       output = output - OLD.usage_output, cached = cached - OLD.usage_cached
                 WHERE {_key_of("OLD")}
                RETURNING requests INTO left_over;
                IF left_over = 0 THEN
                    DELETE FROM {TABLE} WHERE {_key_of("OLD")} AND requests = 0;
                END IF;
            END IF;
            IF TG_OP <> 'DELETE' THEN
                INSERT INTO {TABLE} AS total ({", ".join(KEY)}, requests, billed_input,
                                              output, cached)
                VALUES (NEW.segment_id, NEW.provider_id, NEW.result = 'refused',
                        NEW.usage_reported, NEW.usage_billed_input > 0, NEW.usage_output > 0,
                        NEW.usage_cached > 0, 1, NEW.usage_billed_input, NEW.usage_output,
                        NEW.usage_cached)
                ON CONFLICT ({", ".join(KEY)})
                DO UPDATE SET requests = total.requests + 1,
                              billed_input = total.billed_input + excluded.billed_input,
                              output = total.output + excluded.output,
                              cached = total.cached + excluded.cached;
            END IF;
            RETURN NULL;
        END $$"""
    yield f"""
        CREATE FUNCTION {TRUNCATED}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            TRUNCATE {TABLE};
            RETURN NULL;
        END $$"""
    yield (
        f"CREATE TRIGGER {ATTEMPTS}_segment_usage AFTER INSERT OR DELETE ON {ATTEMPTS} "
        f"FOR EACH ROW EXECUTE FUNCTION {FUNCTION}()"
    )
    # Only the columns the sums read (usage's generated columns follow from it), and
    # only when one of them changed: Django's save() sets every column.
    yield (
        f"CREATE TRIGGER {ATTEMPTS}_segment_usage_update "
        f"AFTER UPDATE OF segment_id, provider_id, result, usage ON {ATTEMPTS} FOR EACH ROW "
        "WHEN (OLD.segment_id IS DISTINCT FROM NEW.segment_id "
        "OR OLD.provider_id IS DISTINCT FROM NEW.provider_id "
        "OR OLD.result IS DISTINCT FROM NEW.result OR OLD.usage IS DISTINCT FROM NEW.usage) "
        f"EXECUTE FUNCTION {FUNCTION}()"
    )
    yield (
        f"CREATE TRIGGER {ATTEMPTS}_segment_usage_truncate AFTER TRUNCATE ON {ATTEMPTS} "
        f"FOR EACH STATEMENT EXECUTE FUNCTION {TRUNCATED}()"
    )
    # After the triggers, in the same transaction: CREATE TRIGGER holds a lock that
    # keeps every other writer of attempts out until this commits.
    yield f"""
        INSERT INTO {TABLE} ({", ".join(KEY)}, requests, billed_input, output, cached)
        SELECT segment_id, provider_id, result = 'refused', usage_reported,
               usage_billed_input > 0, usage_output > 0, usage_cached > 0,
               count(*), sum(usage_billed_input), sum(usage_output), sum(usage_cached)
          FROM {ATTEMPTS}
         GROUP BY 1, 2, 3, 4, 5, 6, 7"""


def _down():
    for suffix in ("", "_update", "_truncate"):
        yield f"DROP TRIGGER IF EXISTS {ATTEMPTS}_segment_usage{suffix} ON {ATTEMPTS}"
    yield f"DROP FUNCTION IF EXISTS {FUNCTION}()"
    yield f"DROP FUNCTION IF EXISTS {TRUNCATED}()"
    yield f"DROP TABLE IF EXISTS {TABLE}"


def _run(statements):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return  # no generated usage columns to sum (0013): the page reads each request
        for statement in statements():
            schema_editor.execute(statement)

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("governance", "0016_attempt_tiers"),
    ]

    operations = [migrations.RunPython(_run(_up), _run(_down))]
