"""Approvals as the inbox, the API and the run page read them."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from governance.models import Run, ToolApproval
from governance.rules.approvals import waits_for_answer


def approvals() -> QuerySet[ToolApproval]:
    return ToolApproval.objects.select_related("run", "run__thread", "run__segment")


def waiting(rows: QuerySet[ToolApproval]) -> QuerySet[ToolApproval]:
    """``rules.approvals.waits_for_answer`` as a filter: open, and the run not settled."""
    return rows.filter(state=ToolApproval.State.PENDING).exclude(run__status=Run.Status.SETTLED)


def approval_json(approval: ToolApproval, *, url: str = "") -> dict[str, Any]:
    run = approval.run
    return {
        "id": approval.id,
        "state": approval.state,
        "waiting": waits_for_answer(approval.state, run_settled=run.status == Run.Status.SETTLED),
        "tool": approval.tool,
        "server": approval.server or None,
        "effect_class": approval.effect_class or None,
        "annotations": approval.annotations,
        "arguments": approval.arguments,
        "idempotency_key": approval.idempotency_key,
        "reasoning": approval.reasoning,
        "policy": approval.policy,
        "approver_role": approval.approver_role,
        "run_id": str(run.id),
        "thread_id": str(run.thread_id),
        "thread_title": run.thread.title,
        "requested_at": approval.requested_at.isoformat(),
        "expires_at": approval.expires_at.isoformat(),
        "decided_by": approval.decided_by or None,
        "decided_at": approval.decided_at.isoformat() if approval.decided_at else None,
        "reason": approval.reason or None,
        "url": url,
    }
