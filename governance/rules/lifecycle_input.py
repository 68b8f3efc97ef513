"""The error and the input checks the run's lifecycle rules share (R4, R6).

Each rule of R4 (who may say "no") and R6.3–R6.5 (decisions, recovery,
settlement) validates its values at construction and raises
``LifecycleError`` for illegal input. Pure: no I/O, no clock.
"""

from __future__ import annotations


class LifecycleError(ValueError):
    """Illegal input to a lifecycle rule (R4, R6)."""


def is_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def require_text(name: str, value: object) -> None:
    if not is_text(value):
        raise LifecycleError(f"{name} must be a non-empty string")
