"""The run's one ledger: atomic admissions by key (R5)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from governance.models import (
    BudgetAccount,
    BudgetEntry,
    Run,
    Stage,
)
from governance.rules import budget as budget_rules


def _ledger(account: BudgetAccount) -> budget_rules.Ledger:
    limits = budget_rules.BudgetLimits(**account.limits)
    entries = tuple(
        budget_rules.LedgerEntry(
            kind=row.kind,
            idempotency_key=row.idempotency_key,
            resource=row.resource,
            pool=row.pool,
            amount=row.amount,
            purpose=row.purpose,
            for_finalization=row.for_finalization,
        )
        for row in account.entries.order_by("id")
    )
    return budget_rules.Ledger(limits, entries)


def admit(
    run: Run,
    resource: str,
    amount: int,
    key: str,
    purpose: str = "original",
    *,
    for_finalization: bool = False,
    now: datetime,
    stage: Stage | None = None,
) -> budget_rules.Admission:
    """R5.1/R5.4: atomic admission against the run's one ledger (row lock).

    ``stage``: the stage drawing it, so a use whose holder died before it
    recorded the attempt can be marked as having no known outcome (R5.3)."""
    with transaction.atomic():
        account = BudgetAccount.objects.select_for_update().get(run=run)
        ledger = _ledger(account)
        new_ledger, admission = budget_rules.admit(
            ledger, resource, amount, key, purpose, for_finalization=for_finalization
        )
        if admission.admitted and not admission.duplicate:
            entry = new_ledger.entries[-1]
            BudgetEntry.objects.create(
                account=account,
                kind=entry.kind.value,
                idempotency_key=entry.idempotency_key,
                resource=entry.resource.value,
                pool=entry.pool.value,
                amount=entry.amount,
                purpose=entry.purpose.value,
                for_finalization=entry.for_finalization,
                created_at=now,
                stage=stage,
            )
        return admission


def budget_view(run: Run) -> dict[str, budget_rules.Balance]:
    """R5.1: the runtime reads this view; it never keeps a second ledger."""
    return {r.value: b for r, b in budget_rules.balance(_ledger(run.budget)).items()}
