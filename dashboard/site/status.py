"""What the overview and /healthz report about the running system."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.db import DatabaseError, connection

from governance.rules.refusal import RULE_TEXT, max_sends
from governance.services.broker import QueueState, queue_states
from governance.services.refusals import reprobe_delays
from tasks.jobs import read_heartbeat
from tasks.telemetry import exporter_mode


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    ok: bool
    detail: str
    last_seen: datetime | None = None
    age_seconds: float | None = None


def redact_url(url: str) -> str:
    """A URL safe to show: the password is replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def database_status() -> ComponentStatus:
    vendor = connection.vendor
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return ComponentStatus("database", False, f"{vendor}: {exc}".strip())
    return ComponentStatus("database", True, vendor)


def broker_status() -> ComponentStatus:
    """Whether the broker takes a connection now (a short, bounded probe).
    The detail names the broker's URL without its password; /healthz, which
    answers anyone, leaves the URL out."""
    from tasks.celery import app

    where = redact_url(settings.CELERY_BROKER_URL)
    url = app.conf.broker_write_url or app.conf.broker_url or ""
    try:
        if url.startswith(("redis://", "rediss://")):
            # A PING over a pooled connection: a real round trip, without the new
            # connection and handshake per page (6 ms of the overview) of kombu's probe.
            _redis_client(url).ping()
        else:
            with app.connection_for_write() as conn:
                conn.ensure_connection(
                    max_retries=1, interval_start=0, interval_step=0.2, timeout=2
                )
    except Exception as exc:  # any transport's failure means "not reachable now"
        return ComponentStatus("broker", False, f"{where}: unreachable ({type(exc).__name__})")
    return ComponentStatus("broker", True, where)


@functools.cache
def _redis_client(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def heartbeat_status(component: str, now: datetime) -> ComponentStatus:
    # A component is late after three missed beats.
    stale_after = 3 * settings.HEARTBEAT_SECONDS
    try:
        beat = read_heartbeat(component)
    except Exception as exc:  # the heartbeat store (the cache) is away
        return ComponentStatus(component, False, f"heartbeat unreadable ({type(exc).__name__})")
    if not beat or not beat.get("at"):
        return ComponentStatus(component, False, "no heartbeat yet")
    seen = datetime.fromisoformat(beat["at"])
    age = max(0.0, (now - seen).total_seconds())
    ok = age <= stale_after
    where = beat.get("hostname") or "unknown host"
    detail = f"last beat {age:.0f} s ago on {where}"
    if not ok:
        detail += f" (late: expected every {settings.HEARTBEAT_SECONDS} s)"
    return ComponentStatus(component, ok, detail, seen, age)


_TELEMETRY_WORDS = {
    "otlp": "stored here and exported over OTLP/HTTP",
    "console": "stored here and printed to the console",
    "none": "stored here only (set OTEL_EXPORTER_OTLP_ENDPOINT to export)",
}


def human_duration(delay: timedelta) -> str:
    """15 min, 1 h, 6 h — the way people say re-probe delays."""
    seconds = int(delay.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def system_status(now: datetime) -> list[ComponentStatus]:
    return [
        database_status(),
        broker_status(),
        heartbeat_status("worker", now),
        heartbeat_status("scheduler", now),
        ComponentStatus("telemetry", True, _TELEMETRY_WORDS[exporter_mode()]),
    ]


def refusal_rule_summary() -> dict[str, object]:
    """R3.2 as it runs here: the schedule in force (settings), not the rule's default."""
    delays = reprobe_delays()
    return {
        "text": RULE_TEXT,
        "delays": [human_duration(delay) for delay in delays],
        "max_reprobes": len(delays),
        "max_sends": max_sends(delays),
    }


def queue_report() -> list[QueueState]:
    """Each queue's depth and the age of its oldest message (R6.7); empty
    when the broker cannot be read now (its own component says so)."""
    try:
        return queue_states()
    except Exception:  # the broker component reports the failure
        return []
