"""The one clock of the system (an I/O module: rule modules take time as a parameter).

``now()`` is real UTC time unless a clock has been installed: tests install a
``ManualClock`` and move it without sleeping; rehearsals shift the whole
system (web, worker, beat) by an offset kept in the shared cache.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

_lock = threading.Lock()
_installed: Callable[[], datetime] | None = None
OFFSET_CACHE_KEY = "governance:clock-offset-seconds"


class ManualClock:
    """A clock that moves only when told to. Thread-safe."""

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("ManualClock needs an aware datetime")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta | float | None = None, /, **parts: float) -> datetime:
        """Move forward by a timedelta, a number of seconds, or timedelta parts."""
        if isinstance(delta, int | float):
            step = timedelta(seconds=delta)
        else:
            step = delta if delta is not None else timedelta(**parts)
        if step < timedelta(0):
            raise ValueError("time does not run backwards")
        with self._lock:
            self._now += step
            return self._now

    def set(self, moment: datetime) -> None:
        with self._lock:
            self._now = moment.astimezone(UTC)


def install(clock: Callable[[], datetime] | None) -> None:
    """Use ``clock`` for every ``now()`` in this process (None restores real time)."""
    global _installed
    with _lock:
        _installed = clock


def _offset() -> timedelta:
    from django.conf import settings

    if not settings.GOVERNANCE_CLOCK_ADJUSTABLE:
        return timedelta(0)
    from django.core.cache import cache

    return timedelta(seconds=float(cache.get(OFFSET_CACHE_KEY) or 0))


def now() -> datetime:
    clock = _installed
    if clock is not None:
        return clock()
    return datetime.now(UTC) + _offset()


def shift(delta: timedelta) -> timedelta:
    """Rehearsals: move the shared clock of every process forward by ``delta``."""
    from django.conf import settings
    from django.core.cache import cache

    if not settings.GOVERNANCE_CLOCK_ADJUSTABLE:
        raise RuntimeError("set GOVERNANCE_CLOCK_ADJUSTABLE=1 to move the shared clock")
    if delta < timedelta(0):
        raise ValueError("time does not run backwards")
    total = _offset() + delta
    cache.set(OFFSET_CACHE_KEY, total.total_seconds(), None)
    return total


def current() -> Callable[[], datetime]:
    """The installed clock object itself (a ManualClock in tests), else ``now``.

    Adapters that simulate time (the scripted provider's heartbeats) advance it.
    """
    return _installed or now
