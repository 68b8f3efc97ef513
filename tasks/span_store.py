"""The embedded span store (R6.1): the spans the run page draws, in ``SpanRecord``.

The dashboard shows a run's trace — the run span, each stage's queue and
execution spans with the four clocks, provider attempts and tool calls —
without an OpenTelemetry collector. ``build_providers`` (tasks/telemetry.py)
adds a :class:`SpanStoreProcessor` unless ``GOVERNANCE_SPAN_STORE`` is off.

What is stored is decided by an explicit mark, not by a span's name: only
spans that ``tasks.instrumentation.stored_in_span_store`` accepts (a
``governance.span.kind`` in the closed set and a ``governance.run_id``).
Django request, SQL, Celery and HTTP client spans never reach the store;
they go to OTLP, sampled, when an endpoint is configured.

Writes are batched off the caller's thread: ``on_end`` only appends to a
bounded buffer. A writer thread — its own database connection, in
autocommit, so it never joins, holds up or breaks the caller's transaction —
writes the buffer in one multi-row INSERT per batch when a stage's execution
span or the run span ends (after ``SPAN_STORE_FLUSH_DELAY_MS``, so spans and
stages ending together share it), when the buffer holds a batch, at the
latest ``SPAN_STORE_FLUSH_INTERVAL_MS`` after a span arrived (a stage still
running), on ``force_flush`` and on shutdown. A single-turn run thus costs
one INSERT of four rows (run, queue, execution, attempt) where it used to
cost one row per SQL statement, ~70–85 rows in ~0.25 INSERTs.

The store is capped by age (``SPAN_STORE_MAX_AGE_HOURS``) and by count
(``SPAN_STORE_MAX_ROWS``): the writer checks both every
``SPAN_STORE_PRUNE_EVERY_ROWS`` rows it writes, and the beat job
``prune_span_store`` every ``SPAN_STORE_PRUNE_SECONDS``; both delete oldest
first, in batches of ``PRUNE_BATCH_ROWS``.

Telemetry must never hurt the run (R4.2): the exporter bounds what it writes
(spans per call, attributes per span, size of each value) and turns every
error into a logged ``FAILURE`` instead of an exception; a full buffer drops
spans (counted) instead of blocking. Redelivered Celery stages may emit the
same span twice; the unique (trace_id, span_id) pair and ``ignore_conflicts``
keep one row.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.db.models import Max, Min, Q
from opentelemetry.context import Context
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tasks.instrumentation import (
    EXECUTION_KIND,
    RUN_KIND,
    SPAN_KIND_ATTRIBUTE,
    stored_in_span_store,
)

logger = logging.getLogger(__name__)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

DEFAULT_MAX_SPANS_PER_EXPORT = 512  # the BatchSpanProcessor's default batch size
DEFAULT_MAX_ATTRIBUTES = 64
DEFAULT_MAX_VALUE_CHARS = 1024
DEFAULT_MAX_SEQUENCE_ITEMS = 32
MAX_KEY_CHARS = 128
DROPPED_ATTRIBUTES_KEY = "governance.span_store.dropped_attributes"
# Attributes the dashboard reads come first when a span has too many.
_PRIORITY_PREFIXES = ("governance.", "gen_ai.", "error.", "exception.")

# The writer's buffer: spans beyond it are dropped (and counted), never waited for.
DEFAULT_MAX_QUEUE = 4096
# Spans whose end makes the writer flush soon: a stage (or the run) is over, show it.
FLUSH_KINDS = frozenset({EXECUTION_KIND, RUN_KIND})
# Rows one pruning DELETE removes at most (oldest first).
PRUNE_BATCH_ROWS = 5000

# SpanRecord column widths (governance/models.py).
_NAME_CHARS = 200
_STATUS_CHARS = 16
_COMPONENT_CHARS = 32


def _model():
    # Imported late: build_providers runs before some callers have apps ready.
    from governance.models import SpanRecord

    return SpanRecord


def ns_to_datetime(ns: int) -> datetime:
    """Aware UTC datetime from OTel nanoseconds (microsecond precision, no float)."""
    return _EPOCH + timedelta(microseconds=int(ns) // 1000)


class DatabaseSpanExporter(SpanExporter):
    """Writes finished spans to ``governance.models.SpanRecord``.

    At most ``max_spans_per_export`` spans are written per call; the rest are
    dropped and counted in :attr:`dropped_spans`. Errors are logged and
    reported as ``FAILURE`` (counted in :attr:`failed_exports`), never raised.
    """

    def __init__(
        self,
        *,
        max_spans_per_export: int = DEFAULT_MAX_SPANS_PER_EXPORT,
        max_attributes: int = DEFAULT_MAX_ATTRIBUTES,
        max_value_chars: int = DEFAULT_MAX_VALUE_CHARS,
        max_sequence_items: int = DEFAULT_MAX_SEQUENCE_ITEMS,
        using: str = "default",
    ) -> None:
        if min(max_spans_per_export, max_attributes, max_value_chars, max_sequence_items) < 1:
            raise ValueError("span store bounds must be positive")
        self.max_spans_per_export = max_spans_per_export
        self.max_attributes = max_attributes
        self.max_value_chars = max_value_chars
        self.max_sequence_items = max_sequence_items
        self.using = using
        self.dropped_spans = 0
        self.failed_exports = 0
        self._lock = threading.Lock()
        self._shutdown = False
        self._failing = False

    # ------------------------------------------------------------------ export

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            spans = list(spans)
            kept = spans[: self.max_spans_per_export]
            dropped = len(spans) - len(kept)
            if dropped:
                self._count_dropped(dropped, "over the per-export bound")
            rows, seen, bad = [], set(), 0
            for span in kept:
                try:
                    row = self.to_row(span)
                except Exception:  # one malformed span must not cost the batch
                    logger.debug("span store: cannot convert span", exc_info=True)
                    bad += 1
                    continue
                if row is None or (row.trace_id, row.span_id) in seen:
                    continue
                seen.add((row.trace_id, row.span_id))
                rows.append(row)
            if bad:
                self._count_dropped(bad, "malformed")
            if rows:
                # Our own INSERT must not become psycopg spans that we store again.
                with suppress_instrumentation():
                    _model().objects.using(self.using).bulk_create(rows, ignore_conflicts=True)
        except Exception:
            with self._lock:
                self.failed_exports += 1
                first = not self._failing
                self._failing = True
            # Log the first failure of a streak in full; a down database would
            # otherwise write a traceback every few seconds.
            if first:
                logger.exception("span store: export failed; spans of this batch are lost")
            else:
                logger.warning("span store: export failed again (%d so far)", self.failed_exports)
            self._drop_broken_connection()
            return SpanExportResult.FAILURE
        self._failing = False
        return SpanExportResult.SUCCESS

    def _count_dropped(self, n: int, why: str) -> None:
        with self._lock:
            self.dropped_spans += n
            total = self.dropped_spans
        logger.warning("span store: dropped %d span(s) %s (%d in total)", n, why, total)

    def _drop_broken_connection(self) -> None:
        # The batch thread is not a request: nothing else recycles its
        # connection, so after a database restart it would fail forever.
        # Close it (outside any transaction) and let the next export reconnect.
        from django.db import connections

        try:
            connection = connections[self.using]
            if not connection.in_atomic_block:
                connection.close()
        except Exception:
            logger.debug("span store: could not close the connection", exc_info=True)

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # ------------------------------------------------------------------ conversion

    def to_row(self, span: ReadableSpan):
        """The unsaved ``SpanRecord`` for ``span`` (None for an invalid context)."""
        context = span.context
        if context is None or not context.is_valid:
            return None
        raw = dict(span.attributes or {})
        extra: dict[str, Any] = {}
        if span.status.description:
            extra["otel.status_description"] = span.status.description
        for event in reversed(span.events or ()):
            if event.name == "exception":
                for key in ("exception.type", "exception.message"):
                    if event.attributes and key in event.attributes:
                        extra[key] = event.attributes[key]
                break
        start_ns = span.start_time or 0
        end_ns = span.end_time or start_ns
        resource = span.resource.attributes if span.resource is not None else {}
        return _model()(
            trace_id=format(context.trace_id, "032x"),
            span_id=format(context.span_id, "016x"),
            parent_span_id=format(span.parent.span_id, "016x") if span.parent else "",
            name=_clean_str(span.name or "")[:_NAME_CHARS],
            start=ns_to_datetime(start_ns),
            end=ns_to_datetime(max(end_ns, start_ns)),
            status=span.status.status_code.name.lower()[:_STATUS_CHARS],
            attributes=self.bounded_attributes({**raw, **extra}),
            run_id=_as_uuid(raw.get("governance.run_id")),
            component=_clean_str(str(resource.get("service.component") or ""))[:_COMPONENT_CHARS],
        )

    def bounded_attributes(self, attributes: Mapping[str, Any]) -> dict[str, Any]:
        """JSON-safe attributes: at most ``max_attributes`` keys, values capped."""
        items = sorted(
            attributes.items(),
            key=lambda kv: 0 if str(kv[0]).startswith(_PRIORITY_PREFIXES) else 1,
        )
        limit = self.max_attributes
        dropped = 0
        if len(items) > limit:
            # Keep room for the marker so the total stays within the cap.
            dropped = len(items) - (limit - 1)
            items = items[: limit - 1]
        out = {_clean_str(str(key))[:MAX_KEY_CHARS]: self._value(value) for key, value in items}
        if dropped:
            out[DROPPED_ATTRIBUTES_KEY] = dropped
        return out

    def _value(self, value: Any) -> Any:
        if isinstance(value, str | bool | int | float) or value is None:
            return self._scalar(value, self.max_value_chars)
        if isinstance(value, Iterable) and not isinstance(value, bytes | Mapping):
            budget = self.max_value_chars
            out = []
            for item in value:
                if len(out) >= self.max_sequence_items or budget <= 0:
                    break
                item = self._scalar(item, budget)
                if isinstance(item, str):
                    budget -= len(item)
                out.append(item)
            return out
        return self._scalar(str(value), self.max_value_chars)

    @staticmethod
    def _scalar(value: Any, max_chars: int) -> Any:
        if value is None or isinstance(value, bool | int):
            return value
        if isinstance(value, float):
            # NaN and infinities are not JSON; PostgreSQL's jsonb rejects them.
            return value if math.isfinite(value) else str(value)
        text = _clean_str(value if isinstance(value, str) else str(value))
        if len(text) > max_chars:
            text = text[: max_chars - 1] + "…"
        return text


def _clean_str(text: str) -> str:
    # PostgreSQL text and jsonb cannot hold NUL.
    return text.replace("\x00", "")


def _as_uuid(value: Any) -> uuid.UUID | None:
    if value is None or value == "":
        return None
    try:
        return uuid.UUID(str(value))
    except (ValueError, TypeError, AttributeError):
        return None


# --------------------------------------------------------------------------- the processor


class SpanStoreProcessor(SpanProcessor):
    """Buffers the spans the dashboard draws and writes them in batches.

    ``on_end`` (the caller's thread) keeps only spans ``stored_in_span_store``
    accepts, appends them to a bounded buffer and returns: no SQL, no waiting.
    A writer thread started on first use (and again after a fork) writes
    them through ``exporter`` — one INSERT per ``max_batch`` spans — when

    * a stage's execution span (or the run span) ended ``flush_delay_s``
      ago (what ends within that window shares the INSERT),
    * the buffer holds ``max_batch`` spans,
    * the oldest buffered span waited ``flush_interval_s``,
    * ``force_flush`` or ``shutdown`` asks.

    The writer has its own database connection in autocommit: the store
    write never becomes part of the caller's transaction, and its failure is
    logged by the exporter, never raised. Every ``prune_every_rows`` rows it
    wrote, it enforces the cap (``prune``) so the store stays bounded under
    load between two beat runs.
    """

    def __init__(
        self,
        exporter: DatabaseSpanExporter,
        *,
        max_batch: int = DEFAULT_MAX_SPANS_PER_EXPORT,
        max_queue: int = DEFAULT_MAX_QUEUE,
        flush_delay_s: float = 0.05,
        flush_interval_s: float = 5.0,
        prune_every_rows: int = 0,
        prune: Callable[[], int] | None = None,
    ) -> None:
        if min(max_batch, max_queue) < 1 or min(flush_delay_s, flush_interval_s) < 0:
            raise ValueError("span store processor bounds must be positive")
        self.exporter = exporter
        self.max_batch = min(max_batch, exporter.max_spans_per_export)
        self.max_queue = max_queue
        self.flush_delay_s = flush_delay_s
        self.flush_interval_s = flush_interval_s
        self.prune_every_rows = prune_every_rows
        self.prune = prune
        self.dropped_spans = 0  # buffer full, or arrived after shutdown
        self.written_batches = 0
        self._rows_since_prune = 0
        self._shutdown = False
        self._init_state()
        # A forked child (a prefork worker) gets a fresh lock, buffer and thread.
        weak_reinit = weakref.WeakMethod(self._init_state)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=lambda: (weak_reinit() or (lambda: None))())

    def _init_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[ReadableSpan] = deque()
        self._first_at: float | None = None  # monotonic time the oldest buffered span came
        self._due: float | None = None  # an execution span ended: write by then
        self._enqueued = 0  # spans accepted so far
        self._handled = 0  # spans the writer has taken and written (or lost)
        self._flush_to = 0  # force_flush wants everything up to this sequence
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    # ------------------------------------------------------------------ caller side

    def on_start(self, span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes
        if not stored_in_span_store(attributes):
            return
        with self._cond:
            if self._shutdown or len(self._queue) >= self.max_queue:
                self.dropped_spans += 1
                dropped = self.dropped_spans
                report = dropped == 1 or dropped % 1000 == 0
            else:
                report = False
                now = time.monotonic()
                if not self._queue:
                    self._first_at = now
                self._queue.append(span)
                self._enqueued += 1
                wake = len(self._queue) >= self.max_batch
                if attributes.get(SPAN_KIND_ATTRIBUTE) in FLUSH_KINDS:
                    due = now + self.flush_delay_s
                    if self._due is None or due < self._due:
                        self._due = due
                        wake = True
                self._ensure_writer()
                if wake:
                    self._cond.notify()
        if report:
            logger.warning("span store: buffer full or closed, %d span(s) dropped so far", dropped)

    def _ensure_writer(self) -> None:
        # Called with the lock held.
        if self._thread is not None and self._thread.is_alive() and self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._writer, name="span-store-writer", daemon=True)
        self._thread.start()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Write everything buffered so far; True when it was written in time."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._cond:
            target = self._enqueued
            if self._handled >= target:
                return True
            self._flush_to = max(self._flush_to, target)
            self._ensure_writer()
            self._cond.notify_all()
            while self._handled < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def shutdown(self) -> None:
        """Write what is buffered (bounded wait), stop the writer, close the exporter."""
        with self._cond:
            if self._shutdown:
                return
            self._shutdown = True
            thread = self._thread if self._pid == os.getpid() else None
            if self._queue and (thread is None or not thread.is_alive()):
                thread = self._thread = threading.Thread(
                    target=self._writer, name="span-store-writer", daemon=True
                )
                thread.start()
            self._cond.notify_all()
        if thread is not None:
            thread.join(30)
        self.exporter.shutdown()

    # ------------------------------------------------------------------ writer side

    def _take(self) -> list[ReadableSpan] | None:
        """Wait until a write is due; the spans to write, or None to stop."""
        with self._cond:
            while True:
                if self._queue:
                    now = time.monotonic()
                    due = self._first_at + self.flush_interval_s
                    if self._due is not None:
                        due = min(due, self._due)
                    if (
                        self._shutdown
                        or self._flush_to > self._handled
                        or len(self._queue) >= self.max_batch
                        or due <= now
                    ):
                        break
                    self._cond.wait(due - now)
                elif self._shutdown:
                    return None
                else:
                    self._cond.wait()
            # Everything buffered now goes, in max_batch chunks; later spans wait.
            spans = list(self._queue)
            self._queue.clear()
            self._first_at = self._due = None
            return spans

    def _writer(self) -> None:
        from django.db import connections

        try:
            with suppress_instrumentation():  # our own SQL is not telemetry
                while (spans := self._take()) is not None:
                    for begin in range(0, len(spans), self.max_batch):
                        self._write(spans[begin : begin + self.max_batch])
        except Exception:  # the writer must not die silently
            logger.exception("span store: writer stopped")
        finally:
            # The writer's own connection; a test database can then be dropped.
            connections.close_all()

    def _write(self, batch: list[ReadableSpan]) -> None:
        try:
            result = self.exporter.export(batch)
        except Exception:  # export() reports its own errors; this is a bug guard
            logger.exception("span store: export raised")
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self._rows_since_prune += len(batch)
            if self.prune and self.prune_every_rows <= self._rows_since_prune:
                self._rows_since_prune = 0
                self._prune()
        # Handled once the cap is applied too: a flushed store is a bounded one.
        with self._cond:
            self._handled += len(batch)
            self.written_batches += 1
            self._cond.notify_all()

    def _prune(self) -> None:
        try:
            deleted = self.prune()
        except Exception:
            logger.exception("span store: pruning failed")
            self.exporter._drop_broken_connection()
        else:
            if deleted:
                logger.info("span store: pruned %d span(s) to stay within the cap", deleted)


# --------------------------------------------------------------------------- pruning


def prune_spans(
    now: datetime, max_age: timedelta, max_rows: int, *, batch_rows: int = PRUNE_BATCH_ROWS
) -> int:
    """Delete spans that started before ``now - max_age``, then the oldest
    beyond ``max_rows``, oldest first, at most ``batch_rows`` per DELETE.
    Returns the number of rows deleted."""
    if max_rows < 0:
        raise ValueError("max_rows must not be negative")
    if batch_rows < 1:
        raise ValueError("batch_rows must be positive")
    model = _model()
    deleted = _delete_oldest(model.objects.filter(start__lt=now - max_age), batch_rows)
    # Ids only grow, so there are at most max(id) - min(id) + 1 rows: two index
    # lookups spare the ranking below (~50 ms at 200k rows) while under the cap.
    ids = model.objects.aggregate(low=Min("id"), high=Max("id"))
    if ids["high"] is None or ids["high"] - ids["low"] + 1 <= max_rows:
        return deleted
    # The newest max_rows rows stay; ties on start are broken by id.
    newest = model.objects.order_by("-start", "-id").values_list("start", "id")
    cut = list(newest[max_rows : max_rows + 1])
    if cut:
        start, row_id = cut[0]
        older = model.objects.filter(Q(start__lt=start) | Q(start=start, id__lte=row_id))
        deleted += _delete_oldest(older, batch_rows)
    return deleted


def _delete_oldest(queryset, batch_rows: int) -> int:
    deleted = 0
    while True:
        ids = queryset.order_by("start", "id").values("id")[:batch_rows]
        n, _ = _model().objects.filter(id__in=ids).delete()
        deleted += n
        if n < batch_rows:
            return deleted


def prune_now() -> int:
    """Apply the configured cap (age and count) against the injected clock."""
    from governance import time_source

    return prune_spans(
        time_source.now(),
        timedelta(hours=float(settings.SPAN_STORE_MAX_AGE_HOURS)),
        int(settings.SPAN_STORE_MAX_ROWS),
    )


def span_store_enabled() -> bool:
    """``GOVERNANCE_SPAN_STORE`` (default on); ``0``/``false``/``off``/``no`` turn it off."""
    value = settings.GOVERNANCE_SPAN_STORE
    if isinstance(value, str):
        return value.strip().lower() not in {"0", "false", "off", "no", ""}
    return bool(value)


def build_processor() -> SpanStoreProcessor:
    """The processor ``build_providers`` installs, configured from settings."""
    return SpanStoreProcessor(
        DatabaseSpanExporter(),
        flush_delay_s=settings.SPAN_STORE_FLUSH_DELAY_MS / 1000,
        flush_interval_s=settings.SPAN_STORE_FLUSH_INTERVAL_MS / 1000,
        prune_every_rows=settings.SPAN_STORE_PRUNE_EVERY_ROWS,
        prune=prune_now,
    )


@shared_task(name="tasks.span_store.prune_span_store", ignore_result=True)
def prune_span_store() -> int:
    """Beat job: keep the span store bounded (SPAN_STORE_MAX_AGE_HOURS / _MAX_ROWS)."""
    deleted = prune_now()
    if deleted:
        logger.info("span store: pruned %d span(s)", deleted)
    return deleted
