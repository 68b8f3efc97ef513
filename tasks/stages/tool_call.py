"""One tool call (R4.1, R5.2, R6.4).

The receipt is written before the effect; a redelivery reads it back or, when
an external effect may have happened, verifies it by key instead of replaying
it (``rules.tools.receipt_step``). The call is admitted from the run's one
ledger (and web searches from their own quota) before it is made.
"""

from __future__ import annotations

from typing import Any

from governance import time_source
from governance.models import Run, Stage
from governance.rules import tools as tool_rules
from governance.services import budget as ledger
from governance.services import receipts
from governance.services import stages as stage_service
from tasks import instrumentation as spans
from tasks.tools import EXTERNAL_TOOLS, run_tool


def execute(run: Run, stage: Stage):
    payload = stage.payload
    call = payload["calls"][payload["index"]]
    key = tool_rules.tool_key(
        str(run.id), payload.get("turn_stage", stage.id), payload["index"], call["id"]
    )
    now = time_source.now()
    receipt, created = receipts.open_receipt(
        run, stage, tool=call["name"], key=key, arguments=call["arguments"],
        call_id=call["id"], now=now,
    )  # fmt: skip
    step = tool_rules.receipt_step(
        None if created else receipt.effect,
        external=call["name"] in EXTERNAL_TOOLS,
        # Only the first delivery of a replay the executor asked for may perform it.
        verified_replay=bool(payload.get("replay")) and stage.deliveries <= 1,
    )
    close = True
    if step == "read_back":
        effect, output, error = receipt.effect, receipt.result, receipt.error
        close = False
    elif step == "verify":
        effect, output, error = "unknown", None, "a previous attempt may have run; verifying"
    else:
        try:
            effect, output, error = _perform(run, stage, call, key, now)
        except Exception as exc:  # R4.1: the executor's fact, not the run's end (R4.2)
            # An external tool that broke mid-call may have had its effect.
            effect = "unknown" if call["name"] in EXTERNAL_TOOLS else "failed"
            output, error = None, f"{type(exc).__name__}: {exc}"[:500]
    now = time_source.now()
    conclusion = tool_rules.conclude_tool_call(
        payload, effect=effect, output=output, error=error, key=key, close_receipt=close
    )
    return effect, stage_service.close_stage(stage, conclusion, now, run=run)


def _perform(run: Run, stage: Stage, call: dict, key: str, now) -> tuple[str, Any, str]:
    with spans.tool_span(tool=call["name"], started_at=now, call_id=call["id"]) as span:
        effect, output, error = _admit_and_run(run, stage, call, key, now)
        span.finish(time_source.now(), effect=effect, error=error)
    return effect, output, error


def _admit_and_run(run: Run, stage: Stage, call: dict, key: str, now) -> tuple[str, Any, str]:
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
            return "refused", None, need.refused_words
    result = run_tool(call["name"], call["arguments"], idempotency_key=key)
    return result.effect, result.output, result.error
