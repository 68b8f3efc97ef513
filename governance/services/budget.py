"""The run's one ledger: atomic admissions by key (R5)."""

from __future__ import annotations

from datetime import datetime
from functools import cache

from django.db import transaction

from governance.models import (
    BudgetAccount,
    BudgetEntry,
    Run,
    Stage,
)
from governance.rules import budget as budget_rules
from governance.services import statements as sql

ENTRY_FIELDS = (
    "kind", "idempotency_key", "resource", "pool", "amount", "purpose", "for_finalization",
)  # fmt: skip


def _ledger(account: BudgetAccount) -> budget_rules.Ledger:
    entry = _entry_columns()
    rows = sql.fetch(
        f"SELECT {entry.sql} FROM {sql.table(BudgetEntry)} e WHERE e.account_id = %s ORDER BY e.id",
        [account.id],
    )
    return _ledger_of(account.limits, [entry.values(row) for row in rows])


@cache
def _entry_columns() -> sql.Columns:
    return sql.Columns(BudgetEntry, "e", only=ENTRY_FIELDS)


def _ledger_of(limits: dict, entries) -> budget_rules.Ledger:
    return budget_rules.Ledger(
        budget_rules.BudgetLimits(**limits),
        tuple(budget_rules.LedgerEntry(*entry) for entry in entries),
    )


@cache
def _locked_ledger_sql() -> tuple[str, sql.Columns, sql.Columns]:
    account, entry = sql.Columns(BudgetAccount, "a", only=("id", "limits")), _entry_columns()
    text = (
        f"SELECT {account.sql}, {entry.sql} FROM {sql.table(BudgetAccount)} a"
        f" LEFT JOIN {sql.table(BudgetEntry)} e ON e.account_id = a.id"
        f" WHERE a.run_id = %s ORDER BY e.id{sql.lock_clause('a')}"
    )
    return text, account, entry


def _locked_ledger(run: Run) -> tuple[int, budget_rules.Ledger]:
    """The run's account row locked (the admission lock) and its ledger, in one read."""
    text, account, entry = _locked_ledger_sql()
    rows = sql.fetch(text, [sql.value(BudgetAccount, "run", run.id)])
    if not rows:
        raise BudgetAccount.DoesNotExist(f"run {run.id} has no budget account")
    account_id, limits = account.values(rows[0])
    entries = [entry.values(row, account.width) for row in rows if row[account.width] is not None]
    return account_id, _ledger_of(limits, entries)


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
        account_id, ledger = _locked_ledger(run)
        new_ledger, admission = budget_rules.admit(
            ledger, resource, amount, key, purpose, for_finalization=for_finalization
        )
        if admission.admitted and not admission.duplicate:
            entry = new_ledger.entries[-1]
            row = BudgetEntry(
                account_id=account_id,
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
            sql.insert([row])
        return admission


def budget_view(run: Run) -> dict[str, budget_rules.Balance]:
    """R5.1: the runtime reads this view; it never keeps a second ledger."""
    return {r.value: b for r, b in budget_rules.balance(_ledger(run.budget)).items()}
