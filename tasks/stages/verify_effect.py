"""Verification of an unknown effect by its executor (R6.4).

Each unknown receipt is looked up by its idempotency key; what the lookup
proves (``rules.tools.effect_evidence`` → ``rules.effects.effect_state_after``)
decides, in ``rules.tools.conclude_verification``: read back, replay with the
same key, or verify again later. Never a blind replay. A registry tool is
verified by its own contract (an HTTP tool's verification URL); one without
any (an MCP tool) stays unknown and the run settles saying so.
"""

from __future__ import annotations

from governance import time_source
from governance.models import Run, Stage, ToolReceipt
from governance.rules import tools as tool_rules
from governance.rules.effects import effect_state_after
from governance.services import stages as stage_service
from tasks import registry_tools
from tasks.tools import verify_webhook


def execute(run: Run, stage: Stage):
    payload = stage.typed_payload
    verdicts = []
    for key in payload.keys:
        receipt = ToolReceipt.objects.get(idempotency_key=key)
        if receipt.server:  # a registry tool: its own contract, or none
            lookup, verifiable = registry_tools.verify(receipt)
        else:
            lookup, verifiable = verify_webhook(receipt.arguments, idempotency_key=key), True
        state = effect_state_after(key, tool_rules.effect_evidence(key, lookup.effect))
        verdicts.append(
            tool_rules.ReceiptVerdict(key, receipt.tool, state, lookup.output, verifiable)
        )
    conclusion = tool_rules.conclude_verification(payload, verdicts)
    now = time_source.now()
    return conclusion.outcome, stage_service.close_stage(stage, conclusion, now, run=run)
