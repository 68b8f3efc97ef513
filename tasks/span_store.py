"""The embedded span store (R6.1): finished spans land in ``SpanRecord``.

The dashboard shows a run's trace — its stage spans with the four clocks —
without an OpenTelemetry collector. ``build_providers`` (tasks/telemetry.py)
always adds a ``BatchSpanProcessor`` with :class:`DatabaseSpanExporter`
unless ``GOVERNANCE_SPAN_STORE`` is off; OTLP/console exporters come on top.

Telemetry must never hurt the run (R4.2): the exporter bounds what it writes
(spans per call, attributes per span, size of each value) and turns every
error into a logged ``FAILURE`` instead of an exception. Redelivered Celery
stages may emit the same span twice; the unique (trace_id, span_id) pair and
``ignore_conflicts`` keep one row.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

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

DEFAULT_MAX_AGE_HOURS = 72
DEFAULT_MAX_ROWS = 200_000

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


# --------------------------------------------------------------------------- pruning


def prune_spans(now: datetime, max_age: timedelta, max_rows: int) -> int:
    """Delete spans that started before ``now - max_age``, then the oldest
    beyond ``max_rows``. Returns the number of rows deleted."""
    if max_rows < 0:
        raise ValueError("max_rows must not be negative")
    model = _model()
    deleted, _ = model.objects.filter(start__lt=now - max_age).delete()
    # Ties on start are broken by id so the newest max_rows rows are exact.
    beyond = model.objects.order_by("-start", "-id").values("id")[max_rows:]
    extra, _ = model.objects.filter(id__in=beyond).delete()
    return deleted + extra


def span_store_enabled() -> bool:
    """``GOVERNANCE_SPAN_STORE`` (default on); ``0``/``false``/``off``/``no`` turn it off."""
    value = getattr(settings, "GOVERNANCE_SPAN_STORE", True)
    if isinstance(value, str):
        return value.strip().lower() not in {"0", "false", "off", "no", ""}
    return bool(value)


@shared_task(name="tasks.span_store.prune_span_store", ignore_result=True)
def prune_span_store() -> int:
    """Beat job: keep the span store bounded (SPAN_STORE_MAX_AGE_HOURS / _MAX_ROWS)."""
    from governance import time_source

    max_age = timedelta(
        hours=float(getattr(settings, "SPAN_STORE_MAX_AGE_HOURS", DEFAULT_MAX_AGE_HOURS))
    )
    max_rows = int(getattr(settings, "SPAN_STORE_MAX_ROWS", DEFAULT_MAX_ROWS))
    deleted = prune_spans(time_source.now(), max_age, max_rows)
    if deleted:
        logger.info("span store: pruned %d span(s)", deleted)
    return deleted
