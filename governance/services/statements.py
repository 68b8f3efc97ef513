"""The stage path's statements, without the ORM's compile on every call.

Django builds a statement's SQL anew each time a queryset runs: measured on a
single-turn stage, that compile and the model building around it were about
0.5 ms of CPU per statement, most of the stage's cost (bench/throughput.py).
The statements here keep their SQL text per process, so PostgreSQL also gets
the same text every time and runs it as a prepared statement.

They stay the models' statements: column names, value preparation
(``get_db_prep_save``, ``pre_save``) and result conversion (the backend's and
the field's converters) come from the model fields, so the same code runs on
PostgreSQL and SQLite (``make run``'s embedded default) and a model change
reaches them. Only equality and ``IS NULL`` conditions are offered: anything
richer is a hand-written SELECT loaded with :class:`Columns`, or the ORM.

A fenced exception: only the run's hot paths use it (the claim, the close, the
ledger's admission, the submit; tests/test_fixed_sql_fence.py). It leans on the
parts of Django a queryset's compiler uses (``Field.get_col``, the converters,
``Model._state``, ``from_db``; Django 5.x, kept below 6 in pyproject.toml), and
tests/governance/test_statements.py checks its rows against the ORM's. It can
go when building a queryset's SQL costs a stage little (Django caches no
compiled SQL today).
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import AutoField, BigAutoField, Field, Model, SmallAutoField
from django.db.models.constants import OnConflict
from django.db.models.fields.related_descriptors import ReverseOneToOneDescriptor
from django.db.models.signals import pre_save
from django.dispatch import receiver

Row = tuple[Any, ...]
T = TypeVar("T")
_AUTO = (AutoField, BigAutoField, SmallAutoField)


def quote(name: str) -> str:
    return connection.ops.quote_name(name)


def table(model: type[Model]) -> str:
    return quote(model._meta.db_table)


def placeholders(count: int) -> str:
    """``%s, %s, …`` for an IN list of ``count`` values."""
    return ", ".join(["%s"] * count)


def is_in(column: str, count: int) -> str:
    """``column IN (%s, …)`` for ``count`` values (none: a condition never true)."""
    return f"{column} IN ({placeholders(count)})" if count else "1 = 0"


def lock_clause(*aliases: str) -> str:
    """``FOR UPDATE OF …`` where the database locks rows (SQLite locks the whole
    file for a write, as Django's ``select_for_update`` leaves it there too)."""
    if not connection.features.has_select_for_update:
        return ""
    if aliases and connection.features.has_select_for_update_of:
        return " FOR UPDATE OF " + ", ".join(aliases)
    return " FOR UPDATE"


def _db(using: str = DEFAULT_DB_ALIAS):
    """This thread's connection itself: ``django.db.connection`` is a proxy that
    looks it up on every attribute, and a row's values pass it to each field's
    preparation and converter (about 90 lookups in a stage's close)."""
    return connections[using]


def _executed(sql: str, params: Sequence[Any], using: str):
    """A cursor that has run ``sql``. On PostgreSQL, once this thread's
    connection is open and checked, and while nobody logs or wraps statements
    (Django's debug cursor, ``execute_wrapper``, the tests' query capture),
    psycopg's own cursor: Django's wrapper around each statement repeats checks
    made once per connection, and a stage runs dozens (A/B, median of five
    alternating bench runs: governance overhead per turn 7.0 ms with it, 8.0
    without; docs/performance.md). Errors are still Django's
    (``wrap_database_errors``), so callers catch the same exceptions. It reads
    Django's connection state (``queries_logged``, ``execute_wrappers``,
    ``health_check_done``, ``create_cursor``; Django 5.x, below 6 in
    pyproject.toml) and can go when Django's cursor costs a statement little."""
    db = _db(using)
    if (
        db.vendor != "postgresql"
        or db.connection is None
        or db.queries_logged
        or db.execute_wrappers
        or db.needs_rollback  # Django's cursor says why nothing may run
        or (db.health_check_enabled and not db.health_check_done)
    ):
        cursor = db.cursor()
        cursor.execute(sql, params)
        return cursor
    with db.wrap_database_errors:
        cursor = db.create_cursor()
        cursor.execute(sql, params)
    return cursor


class Later(Generic[T]):
    """A read sent now whose rows are read, and built into a value, when first
    asked for: inside :func:`together` several reads share one round trip."""

    def __init__(
        self,
        sql: str,
        params: Sequence[Any],
        build: Callable[[list[Row]], T],
        *,
        using: str = DEFAULT_DB_ALIAS,
    ):
        self._build, self._built, self._using = build, False, using
        self._cursor = _executed(sql, params, using)

    def value(self) -> T:
        if not self._built:
            try:
                with _db(self._using).wrap_database_errors:
                    rows = self._cursor.fetchall()
                self._value = self._build(rows)
            finally:
                self._cursor.close()
            self._built = True
        return self._value


def fetch(sql: str, params: Sequence[Any] = ()) -> list[Row]:
    """The rows of a read, now (inside :func:`together`: with what was queued before it)."""
    return Later(sql, params, list).value()


_blocks = threading.local()  # this thread's open together() blocks: inserts' keys to read


@contextmanager
def together() -> Iterator[None]:
    """Send the statements started inside together: on PostgreSQL psycopg's
    pipeline mode queues them and the first read asked for sends them all in
    one round trip (a stage's claim and its reads: 2 round trips, not 7); the
    block's end is one more. A :class:`Later` whose value is asked for only
    after the block costs none of its own. The keys of rows inserted inside are
    set when the block ends.

    Inside, a statement's count of changed rows is not known: only writes
    whose count nobody reads belong here — an ORM ``save()`` of an existing
    row (or ``update_or_create``) raises ``CountedWriteInside`` instead of
    silently reading no count, on every database. Elsewhere (SQLite) each
    statement runs when started."""
    _blocks.depth = getattr(_blocks, "depth", 0) + 1
    try:
        if connection.vendor != "postgresql":
            yield
            return
        connection.ensure_connection()
        stack = _blocks.__dict__.setdefault("stack", [])
        stack.append([])
        try:
            with connection.connection.pipeline():
                yield
            # The block's end synced the pipeline: every result is in its cursor, and
            # reading them costs no further round trip.
            for inserted in stack[-1]:
                inserted.value()
        finally:
            stack.pop()
    finally:
        _blocks.depth -= 1


class CountedWriteInside(RuntimeError):
    """An ORM save() of an existing row inside :func:`together`: Django reads the
    UPDATE's count to decide whether the row exists, and inside the block that
    count is not known (it would insert a second row or lose the write)."""


@receiver(pre_save, dispatch_uid="statements.no_counted_write_inside_together")
def _no_counted_write_inside_together(sender, instance, raw=False, **kwargs) -> None:
    if getattr(_blocks, "depth", 0) and not instance._state.adding:
        raise CountedWriteInside(
            f"{sender.__name__}.save() of an existing row inside statements.together(): "
            "use statements.update (its count is not read) or save outside the block"
        )


def execute(sql: str, params: Sequence[Any] = (), *, using: str = DEFAULT_DB_ALIAS) -> int:
    """Run a statement; the number of rows it changed (-1 inside :func:`together`:
    not known until the block's round trip)."""
    with _executed(sql, params, using) as cursor:
        return cursor.rowcount


def notify(channel: str, payload: str) -> None:
    """PostgreSQL's NOTIFY: listeners of ``channel`` hear ``payload`` when this
    transaction commits, never if it rolls back. Elsewhere (SQLite) nothing is
    sent; a listener must not depend on hearing it (it is a prompt, not a fact)."""
    if connection.vendor == "postgresql":
        execute("SELECT pg_notify(%s, %s)", (channel, payload))


def field(model: type[Model], name: str) -> Field:
    return model._meta.get_field(name)


def value(model: type[Model], name: str, raw: Any, db=None) -> Any:
    """A value for comparing with the column ``name`` (a lookup's preparation)."""
    return field(model, name).get_db_prep_value(raw, db or _db(), prepared=False)


def _converting(columns) -> list[tuple[int, Any, list]]:
    """For each selected column (a field's ``Col``) that needs one, its
    converters in the compiler's order: the backend's, then the field's."""
    converting = []
    for index, column in enumerate(columns):
        found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        if found:
            converting.append((index, column, found))
    return converting


def _convert(values: list[Any], converting) -> list[Any]:
    db = _db() if converting else None
    for index, column, converters in converting:
        converted = values[index]
        for convert in converters:
            converted = convert(converted, column, db)
        values[index] = converted
    return values


class Columns:
    """One model's columns in a hand-written SELECT, and how to load them."""

    def __init__(self, model: type[Model], alias: str, only: Iterable[str] | None = None):
        wanted = None if only is None else set(only)
        self.model, self.alias = model, alias
        self.fields = tuple(
            f
            for f in model._meta.concrete_fields
            if wanted is None or f.name in wanted or f.attname in wanted
        )
        self.attnames = [f.attname for f in self.fields]
        self.width = len(self.fields)
        self.pk_index = next((i for i, f in enumerate(self.fields) if f.primary_key), None)
        self.sql = ", ".join(f"{alias}.{quote(f.column)}" for f in self.fields)
        self.converters = _converting([f.get_col(alias) for f in self.fields])

    def values(self, row: Row, start: int = 0) -> list[Any]:
        return _convert(list(row[start : start + self.width]), self.converters)

    def load(self, row: Row, start: int = 0) -> Model | None:
        """The instance in ``row`` from ``start``; None for an outer join's empty side."""
        if self.pk_index is not None and row[start + self.pk_index] is None:
            return None
        return self.model.from_db(DEFAULT_DB_ALIAS, self.attnames, self.values(row, start))


def fields_of(model: type[Model], *names: str, prefix: str = "") -> dict[str, Field]:
    """``model``'s fields by name (``prefix``: for a joined model's names), for :class:`Read`."""
    return {prefix + name: model._meta.get_field(name) for name in names}


class Read:
    """``SELECT`` the columns given as ``{name: field}`` (fields of one table or
    of joined ones, under their table names), then ``rest``: FROM, JOIN, WHERE
    and ORDER BY, with ``%s`` for values. Its rows are named tuples of those
    names, each value read as the ORM reads its field."""

    def __init__(self, columns: dict[str, Field], rest: str) -> None:
        self.row = namedtuple("Row", columns)
        # Each column as a queryset selects it (the expression its converters expect).
        self.columns = tuple(f.get_col(f.model._meta.db_table) for f in columns.values())
        selected = ", ".join(f"{table(f.model)}.{quote(f.column)}" for f in columns.values())
        self.sql = f"SELECT {selected} {rest}"
        self._converting = None  # on first use: the backend is known by then

    def rows(self, *params: Any) -> list[Any]:
        return self.later(*params).value()

    def later(self, *params: Any) -> Later[list[Any]]:
        """The read sent now, its rows built when asked for (inside
        :func:`together`: several reads in one round trip)."""
        if self._converting is None:
            self._converting = _converting(self.columns)
        converting = self._converting
        return Later(
            self.sql,
            params,
            lambda rows: [self.row._make(_convert(list(row), converting)) for row in rows],
        )


@cache
def columns(model: type[Model], alias: str) -> Columns:
    """All of a model's columns under ``alias`` (built once per process)."""
    return Columns(model, alias)


def cache_related(instance: Model, name: str, related: Model | None) -> None:
    """Set what ``instance.<name>`` answers without a query: a forward relation,
    or a reverse one-to-one (None then raises DoesNotExist, as a missing row does)."""
    descriptor = getattr(type(instance), name)
    if isinstance(descriptor, ReverseOneToOneDescriptor):
        descriptor.related.set_cached_value(instance, related)
    else:
        descriptor.field.set_cached_value(instance, related)


def insert(
    rows: Sequence[Model], *, ignore_conflicts: bool = False, using: str = DEFAULT_DB_ALIAS
) -> None:
    """INSERT new instances of one model in one statement, as ``bulk_create``
    would (``pre_save`` fills auto_now fields; an auto primary key comes back).
    ``ignore_conflicts``: a row that collides with one stored is left out, and
    no key comes back (``bulk_create(ignore_conflicts=True)``); as many
    statements as the database's limit on parameters needs (SQLite's)."""
    if not rows:
        return
    model = type(rows[0])
    meta = model._meta
    auto = isinstance(meta.pk, _AUTO) and getattr(rows[0], meta.pk.attname) is None
    fields = [f for f in meta.concrete_fields if not (auto and f.primary_key)]
    attnames = tuple(f.attname for f in fields)
    db = _db(using)
    if ignore_conflicts:
        size = max(1, db.ops.bulk_batch_size(fields, rows))
        for begin in range(0, len(rows), size):
            batch = rows[begin : begin + size]
            sql = _insert_sql(model, attnames, len(batch), False, True, using)
            execute(sql, _prepared(batch, fields, db), using=using)
        return
    sql = _insert_sql(model, attnames, len(rows), auto, False, using)
    params = _prepared(rows, fields, db)
    if not auto:
        execute(sql, params, using=using)
        return

    def keys(found: list[Row]) -> None:
        for row, (pk,) in zip(rows, found, strict=True):
            setattr(row, meta.pk.attname, pk)

    inserted = Later(sql, params, keys, using=using)
    blocks = _blocks.__dict__.get("stack")
    if blocks:
        blocks[-1].append(inserted)  # read with the block's last round trip
    else:
        inserted.value()


def _prepared(rows: Sequence[Model], fields: Sequence[Field], db) -> list[Any]:
    """The rows' values as their fields prepare them for ``db``; the rows count
    as saved there from now on."""
    params = [f.get_db_prep_save(f.pre_save(row, add=True), db) for row in rows for f in fields]
    for row in rows:
        row._state.adding, row._state.db = False, db.alias
    return params


@cache
def _insert_sql(
    model: type[Model],
    attnames: tuple[str, ...],
    count: int,
    returning: bool,
    ignore_conflicts: bool,
    using: str,
) -> str:
    """INSERT of ``count`` rows, in the database's words (``ignore_conflicts``:
    ON CONFLICT DO NOTHING, SQLite's INSERT OR IGNORE)."""
    ops, meta = connections[using].ops, model._meta
    fields = [meta.get_field(a) for a in attnames]
    on_conflict = OnConflict.IGNORE if ignore_conflicts else None
    names = ", ".join(ops.quote_name(f.column) for f in fields)
    group = f"({placeholders(len(attnames))})"
    sql = (
        f"{ops.insert_statement(on_conflict=on_conflict)} {ops.quote_name(meta.db_table)}"
        f" ({names}) VALUES {', '.join([group] * count)}"
    )
    if on_conflict is not None:
        sql += f" {ops.on_conflict_suffix_sql(fields, on_conflict, None, None)}".rstrip()
    return sql + (f" RETURNING {ops.quote_name(meta.pk.column)}" if returning else "")


def update(model: type[Model], where: Mapping[str, Any], **values: Any) -> int:
    """UPDATE the rows matching ``where`` (equality; None means IS NULL) and
    say how many changed, as ``QuerySet.update`` does (-1 inside :func:`together`)."""
    sql = _update_sql(model, tuple(values), tuple((k, v is None) for k, v in where.items()))
    db = _db()
    params = [field(model, k).get_db_prep_save(v, db) for k, v in values.items()]
    params += [value(model, k, v, db) for k, v in where.items() if v is not None]
    return execute(sql, params)


@cache
def _update_sql(
    model: type[Model], names: tuple[str, ...], where: tuple[tuple[str, bool], ...]
) -> str:
    def column(name: str) -> str:
        return quote(field(model, name).column)

    sets = ", ".join(f"{column(n)} = %s" for n in names)
    conditions = " AND ".join(
        f"{column(n)} IS NULL" if null else f"{column(n)} = %s" for n, null in where
    )
    return f"UPDATE {table(model)} SET {sets} WHERE {conditions}"
