"""Locks on a name rather than a row, for a fact whose row may not exist yet
(a name two tables share, a conversation's first request)."""

from __future__ import annotations

from django.db import connection


def hold_until_commit(name: str) -> None:
    """Inside a transaction, until it ends: no other transaction takes the lock
    on ``name`` meanwhile; it waits. PostgreSQL: an advisory transaction lock
    (no index spans what is being guarded); SQLite has one writer at a time
    anyway."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [name])
