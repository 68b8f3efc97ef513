"""Every transaction that changes a fact, one module per topic.

Views and tasks call these; they never write fact tables themselves and never
re-implement a rule (the rules are ``governance.rules``). The names callers
use most are re-exported here; the topic modules ``alerts``, ``callbacks`` and
``stream`` are used by module (``from governance.services import alerts``).
"""

from __future__ import annotations

from governance.services.audit import audit
from governance.services.budget import admit, budget_view, run_budget_view
from governance.services.claims import holder_gone, lost_process, new_holder, renew_leases
from governance.services.errors import BoundaryConflict, ServiceError
from governance.services.events import record_event, record_fact
from governance.services.health import (
    breaker_policy,
    health_verdicts,
    provider_health,
    record_provider_result,
)
from governance.services.incidents import (
    acknowledge_incident,
    acknowledge_notification,
    emit_notice,
    resolve_incident,
)
from governance.services.receipts import close_receipt, open_receipt
from governance.services.refusals import (
    record_turn,
    refusal_of,
    refusal_rows_view,
    remember_turn_refusal,
    reprobe_delays,
    reprobe_schedules,
    schedule_choice,
    segment_refusals,
    turn_memory,
)
from governance.services.runs import (
    claim_stage,
    enqueue_stage,
    finish_stage,
    mark_progress,
    request_cancel,
    run_facts,
    run_goal,
    submit_run,
)
from governance.services.stream import commit_chunks
from governance.services.threads import (
    TOOL_NAMES,
    append_history,
    apply_boundary,
    boundary_for_key,
    create_thread,
    open_segment,
    segment_config_of,
    session_history,
)

__all__ = [
    "TOOL_NAMES",
    "BoundaryConflict",
    "ServiceError",
    "acknowledge_incident",
    "acknowledge_notification",
    "admit",
    "append_history",
    "apply_boundary",
    "audit",
    "boundary_for_key",
    "breaker_policy",
    "budget_view",
    "claim_stage",
    "close_receipt",
    "commit_chunks",
    "create_thread",
    "emit_notice",
    "enqueue_stage",
    "finish_stage",
    "health_verdicts",
    "holder_gone",
    "lost_process",
    "mark_progress",
    "new_holder",
    "open_receipt",
    "open_segment",
    "provider_health",
    "record_event",
    "record_fact",
    "record_provider_result",
    "record_turn",
    "refusal_of",
    "refusal_rows_view",
    "remember_turn_refusal",
    "renew_leases",
    "reprobe_delays",
    "reprobe_schedules",
    "request_cancel",
    "resolve_incident",
    "run_budget_view",
    "run_facts",
    "run_goal",
    "schedule_choice",
    "segment_config_of",
    "segment_refusals",
    "session_history",
    "submit_run",
    "turn_memory",
]
