"""R2.3: the turn-level refusal memory.

A refusal is a fact about *these request bytes*, never a provider-health
failure (it never moves the breaker of ``rules.breaker``). The memory only
keeps the same turn from being sent to that provider again for
``REFUSAL_SCOPE_TTL`` (the last re-probe delay of R3.2): it remembers, per
provider, the digest of a refused request.

Time is always a parameter (aware datetimes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from governance.rules._checks import require_aware
from governance.rules.refusal import REFUSAL_SCOPE_TTL

__all__ = [
    "TurnRefusal",
    "TurnRefusalMemory",
    "remember_turn_refusal",
    "turn_recently_refused",
]


@dataclass(frozen=True)
class TurnRefusal:
    """One remembered refusal: this provider refused these request bytes at ``refused_at``."""

    provider_id: str
    request_digest: str
    refused_at: datetime

    def __post_init__(self) -> None:
        _check_turn_key(self.provider_id, self.request_digest)
        require_aware(self.refused_at, "refused_at")


def _check_turn_key(provider_id: str, request_digest: str) -> None:
    if not isinstance(provider_id, str) or not provider_id:
        raise ValueError("provider_id must be a non-empty string")
    if not isinstance(request_digest, str) or not request_digest:
        raise ValueError("request_digest must be a non-empty string")


def _check_ttl(ttl: timedelta) -> None:
    if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
        raise ValueError(f"ttl must be a positive timedelta, got {ttl!r}")


@dataclass(frozen=True)
class TurnRefusalMemory:
    """Immutable map (provider_id, request_digest) → refused_at (R2.3).

    Kept sorted by key so equal memories compare equal.
    """

    entries: tuple[TurnRefusal, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.entries, tuple) or not all(
            isinstance(entry, TurnRefusal) for entry in self.entries
        ):
            raise ValueError("TurnRefusalMemory.entries must be a tuple of TurnRefusal")
        keys = [(entry.provider_id, entry.request_digest) for entry in self.entries]
        if len(set(keys)) != len(keys):
            raise ValueError("TurnRefusalMemory holds one entry per (provider_id, request_digest)")
        ordered = tuple(sorted(self.entries, key=lambda e: (e.provider_id, e.request_digest)))
        object.__setattr__(self, "entries", ordered)

    def __len__(self) -> int:
        return len(self.entries)

    def refused_at(self, provider_id: str, request_digest: str) -> datetime | None:
        """When this provider last refused these bytes, or None."""
        for entry in self.entries:
            if entry.provider_id == provider_id and entry.request_digest == request_digest:
                return entry.refused_at
        return None


def remember_turn_refusal(
    memory: TurnRefusalMemory, provider_id: str, request_digest: str, now: datetime
) -> TurnRefusalMemory:
    """Remember that ``provider_id`` refused the request ``request_digest`` at ``now`` (R2.3).

    Anchored on the latest refusal: a report older than the one remembered
    (out-of-order workers) never moves the time back.
    """
    _check_turn_key(provider_id, request_digest)
    now = require_aware(now, "now")
    previous = memory.refused_at(provider_id, request_digest)
    refused_at = now if previous is None else max(previous, now)
    kept = tuple(
        entry
        for entry in memory.entries
        if (entry.provider_id, entry.request_digest) != (provider_id, request_digest)
    )
    return TurnRefusalMemory((*kept, TurnRefusal(provider_id, request_digest, refused_at)))


def turn_recently_refused(
    memory: TurnRefusalMemory,
    provider_id: str,
    request_digest: str,
    now: datetime,
    ttl: timedelta = REFUSAL_SCOPE_TTL,
) -> bool:
    """True while ``now < refused_at + ttl``: do not re-send this turn there (R2.3)."""
    _check_turn_key(provider_id, request_digest)
    _check_ttl(ttl)
    now = require_aware(now, "now")
    refused_at = memory.refused_at(provider_id, request_digest)
    return refused_at is not None and now < refused_at + ttl
