"""A person approves the exact call (rules.approvals): the request recorded
with its stage parked, the answer that unparks it, the expiry that answers
for nobody. Each in one transaction; the stage is sent again after commit.

A parked stage holds no worker and sends no message: the watchdog leaves it
alone while its request is open (``rules.claims.needs_resend``), and the
no-progress clock does not run for its run (``rules.run_clocks``); the
overall deadline does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from governance.models import HistoryItem, Run, Stage, ToolApproval
from governance.rules import approvals as rules
from governance.services.audit import audit
from governance.services.broker import publish
from governance.services.errors import ServiceError
from governance.services.incidents import emit_notice
from governance.services.runs import mark_progress


class ApprovalRefused(ServiceError):
    """The answer does not count (``status``: 409 decided or expired, 403 not
    theirs to give); ``approval`` is the request as it stands."""

    def __init__(self, status: int, message: str, approval: ToolApproval) -> None:
        super().__init__("decision", message)
        self.status, self.approval = status, approval


@dataclass(frozen=True)
class CallToApprove:
    """The exact call, as it will be sent."""

    tool: str
    server: str
    effect_class: str
    annotations: dict[str, Any]
    arguments: dict[str, Any]
    key: str
    call_id: str
    policy: str
    approver_role: str
    wait_s: float


def approval_of(key: str) -> ToolApproval | None:
    return ToolApproval.objects.filter(idempotency_key=key).first()


def ask(run: Run, stage: Stage, call: CallToApprove, *, reasoning: str, now: datetime):
    """Record the call as a pending request and park its stage (no message,
    no held worker): an answer or the expiry sends it again. A repeated
    delivery finds the request and only parks again."""
    with transaction.atomic():
        approval, created = ToolApproval.objects.get_or_create(
            idempotency_key=call.key,
            defaults={
                "run": run, "stage": stage, "tool": call.tool, "server": call.server,
                "effect_class": call.effect_class, "annotations": call.annotations,
                "arguments": call.arguments, "call_id": call.call_id,
                "reasoning": reasoning[:20_000], "policy": call.policy,
                "approver_role": call.approver_role, "requested_at": now,
                "expires_at": now + timedelta(seconds=call.wait_s),
            },
        )  # fmt: skip
        Stage.objects.filter(id=stage.id, holder=stage.holder).update(
            claimed_at=None, holder="", lease_until=None, parked_at=now
        )
        if created:
            emit_notice(
                rules.approval_notice(
                    key=call.key, tool=call.tool, run_id=str(run.id),
                    segment_key=run.segment.key, role=call.approver_role,
                    requested_at=now, expires_at=approval.expires_at,
                ),
                run.segment,
            )  # fmt: skip
    return approval


def decide(approval_id: int, *, decision: str, reason: str, user, now: datetime) -> ToolApproval:
    """A person's yes or no. Raises ``ApprovalRefused`` (409 already decided or
    expired, 403 not theirs) with nothing changed; a repeat of the same answer
    is refused like any other (the decision that stands is in it)."""
    if decision not in rules.DECISIONS:
        raise ServiceError("decision", f"one of {', '.join(rules.DECISIONS)}")
    reason = (reason or "").strip()
    if len(reason) > rules.REASON_MAX:
        raise ServiceError("reason", f"at most {rules.REASON_MAX} characters")
    if decision == "deny" and not reason:
        raise ServiceError("reason", "say why: the model reads it as the call's result")
    with transaction.atomic():
        approval = (
            ToolApproval.objects.select_for_update().select_related("run").get(id=approval_id)
        )
        facts = rules.DecisionFacts(
            state=approval.state,
            expires_at=approval.expires_at,
            approver_in_role=user.is_superuser
            or user.groups.filter(name=approval.approver_role).exists(),
            approver_submitted_run=approval.run.owner_id == user.pk,
            four_eyes=settings.GOVERNANCE_APPROVAL_FOUR_EYES,
            run_settled=approval.run.status == Run.Status.SETTLED,
        )
        refused = rules.decision_refusal(facts, now)
        if refused is not None:
            status, words = refused
            if status == 403 and not facts.approver_in_role:
                words += f" ({approval.approver_role})"
            raise ApprovalRefused(status, words, approval)
        approval.state = (
            rules.ApprovalState.APPROVED if decision == "approve" else rules.ApprovalState.DENIED
        )
        approval.decided_by, approval.decided_at, approval.reason = user.get_username(), now, reason
        approval.save(update_fields=["state", "decided_by", "decided_at", "reason"])
        audit(
            actor=user.get_username(), action=f"approval.{decision}", target_type="run",
            target_id=str(approval.run_id), reason=reason,
            detail={"tool": approval.tool, "idempotency_key": approval.idempotency_key},
            now=now,
        )  # fmt: skip
        _resume(approval, now)
    return approval


def expire_due(now: datetime) -> int:
    """Every open request past its wait is answered for nobody (R4.2: the
    model reads it and the run goes on). Returns how many."""
    expired = 0
    for approval_id in ToolApproval.objects.filter(
        state=ToolApproval.State.PENDING, expires_at__lte=now
    ).values_list("id", flat=True):
        with transaction.atomic():
            approval = (
                ToolApproval.objects.select_for_update().select_related("run").get(id=approval_id)
            )
            if not rules.expired(approval.state, approval.expires_at, now):
                continue  # answered meanwhile
            approval.state, approval.decided_at = rules.ApprovalState.EXPIRED, now
            approval.save(update_fields=["state", "decided_at"])
            _resume(approval, now)
            expired += 1
    return expired


def _resume(approval: ToolApproval, now: datetime) -> None:
    """The stage goes again once this commits; the no-progress clock starts
    again now (it did not run while a person was asked, R6.1)."""
    # Sent again now: its queue and execution clocks start here, the person's
    # wait (requested_at to decided_at) is a clock of its own. A stage already
    # closed (its run was stopped meanwhile) has nothing to resume.
    if Stage.objects.filter(id=approval.stage_id, finished_at__isnull=True).update(
        parked_at=None, enqueued_at=now, started_at=None
    ):
        mark_progress(approval.run, now)
        publish([(approval.stage_id, Stage.Kind.TOOL_CALL)])


def turn_reasoning(run: Run) -> str:
    """The model's words in the turn that asked for the call, as accepted."""
    return (
        HistoryItem.objects.filter(run=run, role="assistant")
        .order_by("-seq")
        .values_list("content", flat=True)
        .first()
        or ""
    )


def refusal_words(approval: ToolApproval) -> str:
    """The call's result the model reads after a no or no answer."""
    return rules.refusal_words(
        approval.state, decided_by=approval.decided_by, reason=approval.reason,
        wait=approval.expires_at - approval.requested_at,
    )  # fmt: skip
