"""Facts written straight to the database, as the engine would leave them, for
tests that start from a run's later life (a decision kept, a settlement
written). The engine writes these inside a stage's close
(``services.stages.close_stage``); nothing in the runtime calls these."""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from governance.models import Run, RunEvent, Settlement
from governance.rules import settlement as rules_settlement
from governance.rules.decision_table import Decision, Path
from governance.services.runs import decision_entry, run_facts, settlement_row


def record_decision(run: Run, decision: Decision, now: datetime) -> None:
    """Keep the lifecycle's decision on the run, as a stage's close would."""
    entering = decision.path is Path.FINALIZATION_ONLY and run.phase != "finalization"
    entry = decision_entry(
        decision, now, facts_before=len(run_facts(run).facts) if entering else None
    )
    run.decisions = [*run.decisions, entry]
    Run.objects.filter(id=run.id).update(decisions=run.decisions)
    if entering:
        Run.objects.filter(id=run.id).update(phase="finalization", status=Run.Status.FINALIZING)
        run.phase = "finalization"


def settle(
    run: Run, settlement: rules_settlement.Settlement, now: datetime
) -> tuple[Settlement, bool]:
    """R6.5: written once; a repeat returns the settlement that stands."""
    try:
        with transaction.atomic():
            events: list = []
            row, created = settlement_row(run, settlement, now, events)
            if created:
                RunEvent.objects.bulk_create(events)
                Run.objects.filter(id=run.id).update(status=Run.Status.SETTLED, phase="settled")
    except IntegrityError:
        return Settlement.objects.get(run=run), False
    return row, created
