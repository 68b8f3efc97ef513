"""One tool call (R4.1, R5.2, R6.4).

A call whose tool's policy asks for a person's approval waits for it first
(``rules.approvals``): the exact call is recorded and the stage parked; a yes
runs that call, a no or no answer is its result (R4.2).

The receipt is written before the effect; a redelivery reads it back or, when
an external effect may have happened, verifies it by key instead of replaying
it (``rules.tools.receipt_step``). The call is admitted from the run's one
ledger (and web searches from their own quota) before it is made.

A registry tool (an MCP server's ``"{server}.{tool}"`` or an HTTP
tool) runs the same way; its receipt also names its server, the schema
version the call was made against and its effect class, and that class (not
the built-ins' list) says whether an effect may have happened (R6.4).
"""

from __future__ import annotations

from typing import Any

from governance import time_source
from governance.models import Run, Stage
from governance.rules import approvals as approval_rules
from governance.rules import tools as tool_rules
from governance.rules.run_clocks import attempt_allowance
from governance.services import approvals, receipts, tool_servers
from governance.services import budget as ledger
from governance.services import stages as stage_service
from tasks import instrumentation as spans
from tasks import registry_tools, work_metrics
from tasks.tools import TOOLS, run_tool


def execute(run: Run, stage: Stage):
    payload = stage.typed_payload
    call = payload.call
    turn_stage = stage.id if payload.turn_stage is None else payload.turn_stage
    key = tool_rules.tool_key(str(run.id), turn_stage, payload.index, call["id"])
    now = time_source.now()
    registry = None if call["name"] in TOOLS else tool_servers.registry_tool(call["name"])
    approval = approvals.approval_of(key) if registry is not None else None
    approval_step = approval_rules.approval_step(
        registry is not None
        and approval_rules.needs_approval(registry.approval, registry.effect_class),
        approval.state if approval is not None else None,
    )
    if approval_step in ("ask", "wait"):
        # The exact call is recorded and the stage parked: no worker waits for a person.
        approvals.ask(run, stage, _call_to_approve(call, key, registry),
                      reasoning=approvals.turn_reasoning(run), now=now)  # fmt: skip
        return "awaiting approval", None
    if approval is not None:
        # A yes runs the recorded call: the arguments as the person saw them.
        call = {**call, "arguments": approval.arguments}
    receipt, created = receipts.open_receipt(
        run, stage, tool=call["name"], key=key, arguments=call["arguments"],
        call_id=call["id"], now=now,
        server=registry.server if registry else "",
        schema_version=registry.schema_version if registry else None,
        effect_class=registry.effect_class if registry else "",
    )  # fmt: skip
    if approval is not None and created:
        # Once per call (its receipt is written once): the person's wait, its own clock.
        spans.record_approval_wait_span(
            run.trace_context, run_id=str(run.id), stage_id=stage.id, tool=call["name"],
            requested_at=approval.requested_at, decided_at=approval.decided_at or now,
            answer=approval.state, decided_by=approval.decided_by,
        )  # fmt: skip
    external = tool_rules.has_external_effect(call["name"], receipt.effect_class)
    step = tool_rules.receipt_step(
        None if created else receipt.effect,
        external=external,
        # Only the first delivery of a replay the executor asked for may perform it.
        verified_replay=payload.replay and stage.deliveries <= 1,
    )
    close = True
    if step == "read_back":
        effect, output, error = receipt.effect, receipt.result, receipt.error
        close = False
    elif step == "verify":
        effect, output, error = "unknown", None, "a previous attempt may have run; verifying"
    elif approval_step == "refused":
        # A no, or no answer in time: the call's result, not the run's end (R4.2).
        effect, output, error = "refused", None, approvals.refusal_words(approval)
    else:
        try:
            effect, output, error = _perform(run, stage, call, key, now, registry)
        except Exception as exc:  # R4.1: the executor's fact, not the run's end (R4.2)
            # An external tool that broke mid-call may have had its effect.
            effect = tool_rules.uncertain_effect("external_effect" if external else "read_only")
            output, error = None, f"{type(exc).__name__}: {exc}"[:500]
    now = time_source.now()
    conclusion = tool_rules.conclude_tool_call(
        payload, effect=effect, output=output, error=error, key=key, close_receipt=close
    )
    return effect, stage_service.close_stage(stage, conclusion, now, run=run)


def _call_to_approve(call, key: str, registry) -> approvals.CallToApprove:
    return approvals.CallToApprove(
        tool=call["name"], server=registry.server, effect_class=registry.effect_class,
        annotations=registry.annotations, arguments=dict(call["arguments"]), key=key,
        call_id=call["id"], policy=registry.approval, approver_role=registry.approver_role,
        wait_s=registry.approval_wait_s,
    )  # fmt: skip


def _perform(run: Run, stage: Stage, call: dict, key: str, now, registry) -> tuple[str, Any, str]:
    with spans.tool_span(tool=call["name"], started_at=now, call_id=call["id"]) as span:
        effect, output, error = _admit_and_run(run, stage, call, key, now, registry)
        span.finish(time_source.now(), effect=effect, error=error)
    return effect, output, error


def _admit_and_run(
    run: Run, stage: Stage, call: dict, key: str, now, registry
) -> tuple[str, Any, str]:
    refused = tool_rules.surface_refusal(call["name"], stage_service.tool_surface(run))
    if refused:
        return "refused", None, refused
    for need in tool_rules.tool_admissions(call["name"]):
        # Per claim, as for model requests: a call re-run after a takeover is charged again.
        admission = ledger.admit(
            run, need.resource, 1, f"{key}.{stage.deliveries}:{need.key_suffix}",
            now=now, stage=stage,
        )  # fmt: skip
        if not admission.admitted:
            work_metrics.ledger_exhausted(str(need.resource))
            return "refused", None, need.refused_words
    if registry is not None:
        # R6.1: no call may wait past the stage budget, the deadline or the no-progress limit.
        allowance = attempt_allowance(
            now=now, stage_budget_s=run.stage_budget_s, deadline_at=run.deadline_at,
            run_started_at=run.created_at, last_progress_at=run.last_progress_at,
            no_progress_limit_s=run.no_progress_limit_s,
        )  # fmt: skip
        result = registry_tools.run(
            registry, call["arguments"], idempotency_key=key, now=now,
            limit_s=min(allowance.budget_s, allowance.no_progress_s),
        )  # fmt: skip
    else:
        result = run_tool(call["name"], call["arguments"], idempotency_key=key)
    return result.effect, result.output, result.error
