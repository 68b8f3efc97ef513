"""Tool receipts, written before the effect (R4.1, R6.4)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from governance.models import (
    Run,
    Stage,
    ToolReceipt,
)


def open_receipt(
    run: Run, stage: Stage, *, tool: str, key: str, arguments: dict, call_id: str, now: datetime
) -> tuple[ToolReceipt, bool]:
    """Write the attempt before the effect: a receipt in ``pending``."""
    receipt, created = ToolReceipt.objects.get_or_create(
        idempotency_key=key,
        defaults={
            "run": run,
            "stage": stage,
            "tool": tool,
            "tool_call_id": call_id,
            "arguments": arguments,
            "created_at": now,
        },
    )
    return receipt, created


def close_receipt(
    receipt: ToolReceipt, *, effect: str, output: Any, error: str, now: datetime, verified=False
) -> None:
    receipt.effect = effect
    receipt.result = output
    receipt.error = error[:4000]
    receipt.finished_at = receipt.finished_at or now
    if verified:
        receipt.verified_at = now
    receipt.save(update_fields=["effect", "result", "error", "finished_at", "verified_at"])
