"""Strict settings readers: a bad value stops start-up with the variable's name."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from dashboard.site.env import database_from_url, env_bool, env_int, env_list, env_secret


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("yes", True), ("off", False)])
def test_env_bool_reads_common_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("FLAG", raw)
    assert env_bool("FLAG", not expected) is expected


def test_env_bool_rejects_garbage_naming_the_variable(monkeypatch):
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FLAG"):
        env_bool("FLAG", False)


def test_env_bool_default_when_unset(monkeypatch):
    monkeypatch.delenv("FLAG", raising=False)
    assert env_bool("FLAG", True) is True


def test_env_int_checks_type_and_minimum(monkeypatch):
    monkeypatch.setenv("N", "12")
    assert env_int("N", 3, minimum=1) == 12
    monkeypatch.setenv("N", "twelve")
    with pytest.raises(ImproperlyConfigured, match="N must be an integer"):
        env_int("N", 3)
    monkeypatch.setenv("N", "0")
    with pytest.raises(ImproperlyConfigured, match="at least 1"):
        env_int("N", 3, minimum=1)


def test_env_list_splits_and_trims(monkeypatch):
    monkeypatch.setenv("HOSTS", " a.example, ,b.example ")
    assert env_list("HOSTS", []) == ["a.example", "b.example"]


def test_env_secret_has_no_production_default(monkeypatch):
    monkeypatch.delenv("TOKEN", raising=False)
    monkeypatch.delenv("TOKEN_FILE", raising=False)
    with pytest.raises(ImproperlyConfigured, match="TOKEN"):
        env_secret("TOKEN", required=True, dev_default="dev")
    assert env_secret("TOKEN", required=False, dev_default="dev") == "dev"


def test_env_secret_reads_file_variant(monkeypatch, tmp_path: Path):
    secret_file = tmp_path / "token"
    secret_file.write_text("s3cret\n")
    monkeypatch.delenv("TOKEN", raising=False)
    monkeypatch.setenv("TOKEN_FILE", str(secret_file))
    assert env_secret("TOKEN", required=True) == "s3cret"
    monkeypatch.setenv("TOKEN", "other")
    with pytest.raises(ImproperlyConfigured, match="not both"):
        env_secret("TOKEN", required=True)


def test_env_secret_unreadable_or_empty_file(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("TOKEN", raising=False)
    monkeypatch.setenv("TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        env_secret("TOKEN", required=True)
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    monkeypatch.setenv("TOKEN_FILE", str(empty))
    with pytest.raises(ImproperlyConfigured, match="is empty"):
        env_secret("TOKEN", required=True)


def test_database_url_postgres(tmp_path: Path):
    config = database_from_url(
        "postgres://app:p%40ss@db.internal:6543/gov?sslmode=require", base_dir=tmp_path
    )
    assert config["ENGINE"] == "dashboard.site.postgresql"
    assert (config["NAME"], config["USER"], config["PASSWORD"]) == ("gov", "app", "p@ss")
    assert (config["HOST"], config["PORT"]) == ("db.internal", "6543")
    assert config["OPTIONS"] == {
        "sslmode": "require", "options": "-c jit=off",
        "server_side_binding": True, "prepare_threshold": 2,
    }  # fmt: skip


@pytest.mark.django_db
def test_postgres_statements_are_prepared_after_their_second_use(tmp_path: Path):
    """A stage's statements repeat on every turn: bound on the server, each is
    parsed and planned once per connection (psycopg's prepared statements)."""
    from django.db import connection

    from governance.models import Provider

    for _ in range(3):
        list(Provider.objects.filter(provider_id="prepared-probe"))
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ['%"governance_provider"."provider_id" = $1%'],
        )
        assert cursor.fetchone()[0] == 1


@pytest.mark.parametrize(
    ("query", "options"),
    [
        ("server_side_binding=false", {"server_side_binding": False, "prepare_threshold": 2}),
        ("prepare_threshold=none", {"server_side_binding": True, "prepare_threshold": None}),
        ("prepare_threshold=0", {"server_side_binding": True, "prepare_threshold": 0}),
    ],
)
def test_a_database_url_chooses_its_own_prepared_statement_options(tmp_path: Path, query, options):
    config = database_from_url(f"postgres://app@db/gov?{query}", base_dir=tmp_path)
    assert {k: config["OPTIONS"][k] for k in options} == options


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("server_side_binding=maybe", "server_side_binding must be one of 1/0/true/false"),
        ("prepare_threshold=-1", "prepare_threshold must be a whole number or none"),
    ],
)
def test_a_bad_prepared_statement_option_is_one_clear_error(tmp_path: Path, query, words):
    with pytest.raises(ImproperlyConfigured, match=words):
        database_from_url(f"postgres://app@db/gov?{query}", base_dir=tmp_path)


@pytest.mark.django_db
def test_postgres_sessions_run_without_jit(tmp_path: Path):
    """JIT compiles cost tens of ms per statement that a page or a stage never earns
    back; a URL's own options still come after (and win)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"
    own = database_from_url("postgres://app@db/gov?options=-c%20jit%3Don", base_dir=tmp_path)
    assert own["OPTIONS"]["options"] == "-c jit=off -c jit=on"


def test_database_url_postgres_with_a_connection_pool(tmp_path: Path):
    """Under ASGI a pool reuses connections instead of one per request thread."""
    config = database_from_url("postgres://app@db/gov", base_dir=tmp_path, pool_max_size=8)
    assert config["OPTIONS"]["pool"] == {"min_size": 1, "max_size": 8, "timeout": 10}
    assert config["CONN_HEALTH_CHECKS"] is True  # the pool tries a connection before handing it out
    assert config["CONN_MAX_AGE"] == 0  # the pool holds the connections
    plain = database_from_url("postgres://app@db/gov", base_dir=tmp_path)
    assert "pool" not in plain["OPTIONS"] and plain["CONN_MAX_AGE"] == 60


def test_database_url_sqlite_relative_and_absolute(tmp_path: Path):
    relative = database_from_url("sqlite:///var/x.sqlite3", base_dir=tmp_path)
    assert relative["NAME"] == str(tmp_path / "var/x.sqlite3")
    absolute = database_from_url("sqlite:////srv/x.sqlite3", base_dir=tmp_path)
    assert absolute["NAME"] == "/srv/x.sqlite3"


@pytest.mark.parametrize(
    "url",
    ["mysql://root@localhost/db", "postgres://localhost/", "sqlite:///", "postgres://h:bad/db"],
)
def test_database_url_rejects_what_it_cannot_run_on(url, tmp_path: Path):
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL"):
        database_from_url(url, base_dir=tmp_path)


def test_r3_2_reprobe_delays_come_from_the_environment(monkeypatch):
    from datetime import timedelta

    from dashboard.site.env import env_durations

    monkeypatch.setenv("DELAYS", "1m, 2h,90s")
    assert env_durations("DELAYS", "15m,1h,6h") == (
        timedelta(minutes=1),
        timedelta(hours=2),
        timedelta(seconds=90),
    )
    monkeypatch.delenv("DELAYS")
    assert env_durations("DELAYS", "15m,1h,6h")[-1] == timedelta(hours=6)
    for bad in ("soon", "-5m", "0s"):
        monkeypatch.setenv("DELAYS", bad)
        with pytest.raises(ImproperlyConfigured, match="DELAYS"):
            env_durations("DELAYS", "15m")


def test_env_float_checks_number_finiteness_and_minimum(monkeypatch):
    from dashboard.site.env import env_float

    monkeypatch.delenv("DELAY", raising=False)
    assert env_float("DELAY", 0.0, minimum=0) == 0.0
    monkeypatch.setenv("DELAY", " 2.5 ")
    assert env_float("DELAY", 0.0, minimum=0) == 2.5
    for bad, message in (
        ("soon", "must be a number"),
        ("nan", "must be a finite"),
        ("inf", "must be a finite"),
    ):
        monkeypatch.setenv("DELAY", bad)
        with pytest.raises(ImproperlyConfigured, match=f"DELAY {message}"):
            env_float("DELAY", 0.0)
    monkeypatch.setenv("DELAY", "-1")
    with pytest.raises(ImproperlyConfigured, match="DELAY must be at least 0"):
        env_float("DELAY", 0.0, minimum=0)


def test_named_secret_reads_the_named_variable_at_call_time(monkeypatch):
    from dashboard.site.env import named_secret

    monkeypatch.delenv("PROVIDER_KEY", raising=False)
    monkeypatch.delenv("PROVIDER_KEY_FILE", raising=False)
    assert named_secret("PROVIDER_KEY") is None
    monkeypatch.setenv("PROVIDER_KEY", "  sk-123 \n")
    assert named_secret("PROVIDER_KEY") == "sk-123"
    monkeypatch.setenv("PROVIDER_KEY", "   ")
    assert named_secret("PROVIDER_KEY") is None


def test_named_secret_honours_the_file_variant(monkeypatch, tmp_path: Path):
    from dashboard.site.env import named_secret

    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    monkeypatch.delenv("PROVIDER_KEY", raising=False)
    monkeypatch.setenv("PROVIDER_KEY_FILE", str(key_file))
    assert named_secret("PROVIDER_KEY") == "sk-from-file"
    monkeypatch.setenv("PROVIDER_KEY", "other")
    with pytest.raises(ImproperlyConfigured, match="not both"):
        named_secret("PROVIDER_KEY")
    monkeypatch.delenv("PROVIDER_KEY")
    monkeypatch.setenv("PROVIDER_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        named_secret("PROVIDER_KEY")


@pytest.mark.parametrize("name", ["", "1KEY", "MY-KEY", "KEY NAME", "KEY=x", "KEY\n", None])
def test_named_secret_rejects_what_is_not_a_variable_name(name):
    from dashboard.site.env import named_secret

    with pytest.raises(ImproperlyConfigured, match="not an environment variable name"):
        named_secret(name)


def test_named_secret_is_the_settings_accessor():
    from django.conf import settings

    from dashboard.site.env import named_secret

    assert settings.GOVERNANCE_NAMED_SECRET is named_secret


def test_r3_2_the_default_reprobe_schedule_is_the_rules_and_an_override_passes_its_check(
    monkeypatch,
):
    from datetime import timedelta

    from dashboard.site.env import env_reprobe_schedule
    from governance.rules.refusal import REFUSAL_REPROBE_DELAYS

    monkeypatch.delenv("SCHEDULE", raising=False)
    assert env_reprobe_schedule("SCHEDULE") == REFUSAL_REPROBE_DELAYS
    monkeypatch.setenv("SCHEDULE", "1m,2m,5m")  # a rehearsal's
    assert env_reprobe_schedule("SCHEDULE") == (
        timedelta(minutes=1), timedelta(minutes=2), timedelta(minutes=5),
    )  # fmt: skip
    for bad, why in (
        ("1h,30m", "longer"),  # each delay longer than the one before
        ("1h,7h", "at most 6 h"),  # the refusal memory's reach
        ("1m,2m,3m,4m,5m,6m", "1 to 5 re-probes"),
        ("soon", "SCHEDULE"),
    ):
        monkeypatch.setenv("SCHEDULE", bad)
        with pytest.raises(ImproperlyConfigured, match=why) as raised:
            env_reprobe_schedule("SCHEDULE")
        assert str(raised.value).startswith("SCHEDULE: "), bad
