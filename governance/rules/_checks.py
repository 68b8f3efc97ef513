"""Checks rule modules share on the values they are given (pure).

A naive datetime, or a bool where a count belongs, is a caller's bug: the
rules raise rather than guess (time is always a parameter, in UTC).
"""

from __future__ import annotations

from datetime import UTC, datetime


def require_aware(value: datetime, name: str) -> datetime:
    """``value`` in UTC; TypeError for a non-datetime, ValueError for a naive one."""
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {value!r}")
    return value.astimezone(UTC)


def optional_aware(value: datetime | None, name: str) -> None:
    """None, or an aware datetime (``require_aware``)."""
    if value is not None:
        require_aware(value, name)


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)
