"""Completion callbacks (R7.3, R7.4): the transactions that change ``RunCallback``.

The HTTP call itself lives in ``tasks.callbacks``; this module owns the facts:

- ``create_for_settlement`` writes the callback row in the settling transaction.
  Its payload is built from the committed facts and the Settlement row, with the
  outcome from ``governance.rules.publication.settlement_from_facts``: a save that ended
  partial says ``partial``, never a ``completed`` computed before the save (R7.3).
- ``claim_attempt`` records the attempt BEFORE the call (state ``sending``,
  ``attempts + 1``) with a conditional update, so two workers never send the same
  attempt: the one whose update changed no row backs off.
- ``record_result`` records the answer AFTER the call, only for the attempt that
  was claimed, as ``governance.rules.redelivery`` reads it: delivered on 2xx;
  retry with capped exponential backoff (Retry-After a floor) on 408, 425, 429,
  5xx, network errors and timeouts; failed on any other status, when the
  outbound check refused the URL (loopback, private, metadata
  addresses, plain http in production) or when the attempts are used up.

Receiver contract: one run sends at most one settlement, identified by the
``Idempotency-Key`` header (stable per run). Delivery is at least once — a
timeout after the request left, or a worker that died mid-call, is retried with
the same key and the same body — so receivers must dedupe by that key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from governance.models import Run, RunCallback, Settlement
from governance.rules.publication import (
    Publication,
    PublicationError,
    SettlementOutcome,
    delivery_evidence,
    settlement_from_facts,
)
from governance.rules.redelivery import (
    RetryPolicy,
    Verdict,
    after_attempt,
    attempt_verdict,
    may_attempt,
)
from governance.services.broker import send_by_name
from governance.services.deliveries import run_publication

SIGNATURE_HEADER = "X-Governance-Signature"
TIMESTAMP_HEADER = "X-Governance-Timestamp"
IDEMPOTENCY_HEADER = "Idempotency-Key"
EVENT = "run.settled"


def _lease() -> timedelta:
    # A ``sending`` row older than this lost its worker; the next attempt may go.
    return timedelta(seconds=settings.GOVERNANCE_CALLBACK_LEASE_SECONDS)


# Retry-After above this is not honoured literally (a day): still a retry, just capped.
RETRY_AFTER_CAP_S = 24 * 3600.0


def retry_policy() -> RetryPolicy:
    """R7.3's sender: the settings' backoff and attempts (``rules.redelivery``)."""
    return RetryPolicy(
        base_s=settings.GOVERNANCE_CALLBACK_BACKOFF_SECONDS,
        cap_s=settings.GOVERNANCE_CALLBACK_BACKOFF_MAX_SECONDS,
        max_attempts=settings.GOVERNANCE_CALLBACK_MAX_ATTEMPTS,
        retry_after_cap_s=RETRY_AFTER_CAP_S,
    )


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 over ``"<timestamp>.<raw body>"``: the header value ``sha256=<hex>``."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def secret() -> str:
    value = settings.GOVERNANCE_CALLBACK_SECRET
    if not value:
        raise RuntimeError("GOVERNANCE_CALLBACK_SECRET is not configured")
    return value


def idempotency_key(run: Run) -> str:
    return f"run-settled:{run.id}"


# --------------------------------------------------------------------------- payload


def _publication(run: Run) -> Publication | None:
    """R7.2 facts of the run's body, read as the delivery judgement reads them
    (None when they break the rules)."""
    try:
        return run_publication(run.id)
    except PublicationError:
        return None


def settlement_payload(run: Run, row: Settlement) -> dict[str, Any]:
    """What the receiver is told: the settlement as the committed facts leave it."""
    recorded = SettlementOutcome(row.outcome)
    publication = _publication(run)
    # R7.3: the receiver is told what the committed facts leave (the rule narrows
    # a pre-save "completed"; unreadable facts prove no complete body).
    decision = settlement_from_facts(precomputed=recorded, publication=publication)
    chunks: dict[str, Any] = {}
    delivery: dict[str, Any] = {}
    if publication is not None:
        evidence = delivery_evidence(publication)
        chunks = {
            "generated": len(publication.generated_ids),
            "committed": evidence.committed,
            "sent": evidence.sent,
            "observed": evidence.observed,
            "final_chunk": publication.final_chunk_id,
            "body_complete": publication.body_complete,
        }
        delivery = {
            "verdict": evidence.verdict.value,
            "client_received_everything": evidence.client_received_everything,
            "text": evidence.text,
        }
    return {
        "event": EVENT,
        "run_id": str(run.id),
        "thread_id": str(run.thread_id),
        "outcome": decision.outcome.value,
        "settlement_outcome": recorded.value,
        "save": decision.save.value if decision.save else None,
        "reason_code": row.reason_code,
        "reason": row.reason,
        "outcome_reason": decision.reason,
        "unknown_effects": list(row.unknown_effects or []),
        "settled_at": row.settled_at.isoformat(),
        "chunks": chunks,
        "delivery": delivery,
        "facts_as_of": "settlement",
    }


def create_for_settlement(run: Run, row: Settlement, now: datetime) -> RunCallback | None:
    """Write the callback row with the settlement (call inside the settling transaction)."""
    url = run.callback_url or getattr(run.thread, "callback_url", "")
    if not url:
        return None
    callback, _created = RunCallback.objects.get_or_create(
        run=run,
        defaults={
            "url": url,
            "idempotency_key": idempotency_key(run),
            "payload": settlement_payload(run, row),
            "next_attempt_at": now,
            "created_at": now,
        },
    )
    return callback


def body_bytes(callback: RunCallback) -> bytes:
    """The raw body: the same bytes on every attempt (receivers dedupe by key)."""
    return json.dumps(callback.payload, sort_keys=True, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- attempts


@dataclass(frozen=True)
class Claim:
    callback: RunCallback
    attempt: int


def _due(now: datetime) -> Q:
    waiting = Q(state__in=[RunCallback.State.PENDING, RunCallback.State.RETRY]) & Q(
        next_attempt_at__lte=now
    )
    abandoned = Q(state=RunCallback.State.SENDING, claimed_at__lt=now - _lease())
    return waiting | abandoned


def due_ids(now: datetime, limit: int = 500) -> list[int]:
    return list(
        RunCallback.objects.filter(_due(now))
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )


def claim_attempt(callback_id: int, now: datetime) -> Claim | None:
    """Record the attempt before the call. None: not due, or another worker got it first."""
    row = RunCallback.objects.filter(id=callback_id).first()
    if row is None or row.state in (RunCallback.State.DELIVERED, RunCallback.State.FAILED):
        return None
    if not may_attempt(row.attempts, retry_policy()):
        RunCallback.objects.filter(id=row.id, attempts=row.attempts, state=row.state).update(
            state=RunCallback.State.FAILED,
            last_error=(row.last_error + "; " if row.last_error else "")
            + f"gave up after {row.attempts} attempt(s)",
        )
        return None
    # Conditional on the attempt count read above: of two workers, one changes the row.
    claimed = RunCallback.objects.filter(_due(now), id=row.id, attempts=row.attempts).update(
        state=RunCallback.State.SENDING, attempts=F("attempts") + 1, claimed_at=now
    )
    if claimed != 1:
        return None
    row.refresh_from_db()
    return Claim(row, row.attempts)


@dataclass(frozen=True)
class Result:
    """What came back from one attempt. ``status`` None: no HTTP answer."""

    status: int | None = None
    error: str = ""
    retry_after_s: float | None = None
    request_sent: bool = False  # a timeout after sending is retried all the same
    refused: bool = False  # the outbound check refused the URL: fails at once


def classify(result: Result) -> Verdict:
    """delivered / retry / failed, by ``rules.redelivery`` (a refused URL fails at once)."""
    return attempt_verdict(result.status, permanent=result.refused)


def record_result(claim: Claim, result: Result, now: datetime) -> str:
    """Record the answer of the claimed attempt; returns the new state ('' if superseded)."""
    step = after_attempt(classify(result), claim.attempt, result.retry_after_s, retry_policy())
    error = result.error[:4000]
    fields: dict[str, Any] = {"status_code": result.status, "last_error": error}
    if step.state is Verdict.DELIVERED:
        fields.update(state=RunCallback.State.DELIVERED, delivered_at=now, last_error="")
    elif step.state is Verdict.RETRY:
        fields.update(
            state=RunCallback.State.RETRY,
            next_attempt_at=now + timedelta(seconds=step.retry_in_s or 0.0),
        )
    else:
        if step.gave_up:
            error = f"{error or f'HTTP {result.status}'}; gave up after {claim.attempt} attempt(s)"
            fields["last_error"] = error[:4000]
        fields.update(state=RunCallback.State.FAILED)
    with transaction.atomic():
        # Only the attempt we claimed: a stale worker's late answer changes nothing.
        changed = RunCallback.objects.filter(
            id=claim.callback.id, state=RunCallback.State.SENDING, attempts=claim.attempt
        ).update(**fields)
    return fields["state"] if changed else ""


DELIVER_TASK = "tasks.callbacks.deliver_callback"


def publish(callback_id: int) -> None:
    """Send the callback once the settling transaction commits (by task name:
    governance never imports the execution layer). A lost send is found by
    the beat sweep (``due_ids``)."""

    def send() -> None:
        send_by_name(DELIVER_TASK, [callback_id])

    transaction.on_commit(send, robust=True)
