"""Tool receipts, written before the effect (R4.1, R6.4)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F
from django.db.models.functions import Coalesce

from governance.models import (
    Run,
    Stage,
    ToolReceipt,
)


def open_receipt(
    run: Run,
    stage: Stage,
    *,
    tool: str,
    key: str,
    arguments: dict,
    call_id: str,
    now: datetime,
    server: str = "",
    schema_version: int | None = None,
    effect_class: str = "",
) -> tuple[ToolReceipt, bool]:
    """Write the attempt before the effect: a receipt in ``pending``. A registry
    tool's receipt names its server, the schema version called against and its
    effect class (registry tools); a redelivery reads the first delivery's."""
    receipt, created = ToolReceipt.objects.get_or_create(
        idempotency_key=key,
        defaults={
            "run": run,
            "stage": stage,
            "tool": tool[:200],
            "server": server,
            "schema_version": schema_version,
            "effect_class": effect_class,
            "tool_call_id": call_id,
            "arguments": arguments,
            "created_at": now,
        },
    )
    return receipt, created


def close_receipt(
    receipt: ToolReceipt, *, effect: str, output: Any, error: str, now: datetime, verified=False
) -> None:
    close_receipt_by_key(
        receipt.idempotency_key, effect=effect, output=output, error=error, now=now,
        verified=verified,
    )  # fmt: skip
    receipt.refresh_from_db(fields=["effect", "result", "error", "finished_at", "verified_at"])


def close_receipt_by_key(
    key: str, *, effect: str, output: Any, error: str, now: datetime, verified: bool = False
) -> None:
    """A receipt's result, as its executor reported or verified it (R4.1, R6.4);
    the first finish time stands."""
    updates: dict[str, Any] = {
        "effect": effect,
        "result": output,
        "error": error[:4000],
        "finished_at": Coalesce(F("finished_at"), now),
    }
    if verified:
        updates["verified_at"] = now
    ToolReceipt.objects.filter(idempotency_key=key).update(**updates)
