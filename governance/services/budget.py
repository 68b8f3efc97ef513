"""The run's one ledger: atomic admissions by key (R5)."""

from __future__ import annotations

from datetime import datetime
from functools import cache
from typing import Any

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
def _run_ledger_sql(locked: bool) -> tuple[str, sql.Columns, sql.Columns]:
    account, entry = sql.Columns(BudgetAccount, "a", only=("id", "limits")), _entry_columns()
    text = (
        f"SELECT {account.sql}, {entry.sql} FROM {sql.table(BudgetAccount)} a"
        f" LEFT JOIN {sql.table(BudgetEntry)} e ON e.account_id = a.id"
        f" WHERE a.run_id = %s ORDER BY e.id{sql.lock_clause('a') if locked else ''}"
    )
    return text, account, entry


def _run_ledger(run_id: Any, *, locked: bool) -> tuple[int, budget_rules.Ledger] | None:
    """The run's account id and ledger (``locked``: its row locked, the
    admission lock), read in one statement; None without an account."""
    text, account, entry = _run_ledger_sql(locked)
    rows = sql.fetch(text, [sql.value(BudgetAccount, "run", run_id)])
    return _ledger_from_rows(rows, account, entry) if rows else None


def _ledger_from_rows(
    rows: list, account: sql.Columns, entry: sql.Columns
) -> tuple[int, budget_rules.Ledger]:
    account_id, limits = account.values(rows[0])
    entries = [entry.values(row, account.width) for row in rows if row[account.width] is not None]
    return account_id, _ledger_of(limits, entries)


def _locked_ledger(run: Run) -> tuple[int, budget_rules.Ledger]:
    """The run's account row locked (the admission lock) and its ledger, in one read."""
    found = _run_ledger(run.id, locked=True)
    if found is None:
        raise BudgetAccount.DoesNotExist(f"run {run.id} has no budget account")
    return found


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
    recorded the attempt can be marked as having no known outcome (R5.3).

    One of the run's hot paths, in fixed SQL (``services.statements``): every
    model request is admitted here before it is sent, the ledger's rows read with
    their lock in one statement; the claim admits a turn's first request with
    its own reads (:func:`locked_ledger_later`, :func:`admit_locked`)."""
    with transaction.atomic():
        return _admit_on(
            _locked_ledger(run), resource, amount, key, purpose,
            for_finalization=for_finalization, now=now, stage=stage,
        )  # fmt: skip


def locked_ledger_later(run_id: Any) -> sql.Later[tuple[int, budget_rules.Ledger] | None]:
    """The run's account row locked (the admission lock) and its ledger, the
    read sent now (inside ``statements.together``: with the reads around it);
    None without an account. For :func:`admit_locked` in the same transaction."""
    text, account, entry = _run_ledger_sql(True)
    return sql.Later(
        text,
        [sql.value(BudgetAccount, "run", run_id)],
        lambda rows: _ledger_from_rows(rows, account, entry) if rows else None,
    )


def admit_locked(
    locked: tuple[int, budget_rules.Ledger] | None,
    draw: budget_rules.Draw,
    *,
    now: datetime,
    stage: Stage | None = None,
) -> budget_rules.Admission | None:
    """:func:`admit` in the caller's transaction, on the ledger it read with
    :func:`locked_ledger_later` (None: the run has no account, nothing admitted)."""
    if locked is None:
        return None
    return _admit_on(
        locked, draw.resource, draw.amount, draw.key, draw.purpose,
        for_finalization=draw.for_finalization, now=now, stage=stage,
    )  # fmt: skip


def _admit_on(
    locked: tuple[int, budget_rules.Ledger],
    resource: str,
    amount: int,
    key: str,
    purpose: str,
    *,
    for_finalization: bool,
    now: datetime,
    stage: Stage | None,
) -> budget_rules.Admission:
    account_id, ledger = locked
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
    return _balances(_ledger(run.budget))


def run_budget_view(run_id: Any) -> dict[str, budget_rules.Balance] | None:
    """:func:`budget_view` of a run known by its id: the account and its
    entries in one read; None for a run without an account."""
    return run_budget_view_later(run_id).value()


def run_budget_view_later(run_id: Any) -> sql.Later[dict[str, budget_rules.Balance] | None]:
    """:func:`run_budget_view`, its read sent now (inside ``statements.together``:
    with the reads around it) and its answer built when asked for."""
    text, account, entry = _run_ledger_sql(False)

    def build(rows: list) -> dict[str, budget_rules.Balance] | None:
        return None if not rows else _balances(_ledger_from_rows(rows, account, entry)[1])

    return sql.Later(text, [sql.value(BudgetAccount, "run", run_id)], build)


def _balances(ledger: budget_rules.Ledger) -> dict[str, budget_rules.Balance]:
    return {r.value: b for r, b in budget_rules.balance(ledger).items()}
