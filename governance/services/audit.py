"""The audit log: who did what, to what, why and when (R8.3)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from governance.models import (
    AuditEntry,
)


def audit(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    reason: str,
    detail: dict[str, Any],
    now: datetime,
    idempotency_key: str | None = None,
) -> AuditEntry:
    return AuditEntry.objects.create(
        at=now,
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        reason=reason,
        detail=detail,
        idempotency_key=idempotency_key or None,
    )
