"""Completion callbacks (R7.3): POST the settlement to the run's callback URL.

The facts and rules live in ``governance.services.callbacks``; this module only
makes the HTTP call between "attempt recorded" and "result recorded":

    claim (sending, attempts+1) → POST → record (delivered / retry / failed)

Headers: ``Idempotency-Key`` (stable per run: receivers dedupe by it, delivery
is at least once), ``X-Governance-Timestamp`` (unix seconds of this attempt)
and ``X-Governance-Signature: sha256=<hex>`` = HMAC-SHA256 with
``GOVERNANCE_CALLBACK_SECRET`` over ``"<timestamp>.<raw body>"``.

The URL is checked again at send time and the POST connects to the checked
address (``tasks.outbound``): a URL that is refused — loopback,
private, metadata, plain http in production — fails the callback at once
with the reason (a permanent failure, like a 4xx: no further attempt).
"""

from __future__ import annotations

import logging

import httpx
from celery import shared_task
from django.conf import settings

from governance import time_source
from governance.rules.redelivery import Verdict, attempt_verdict
from governance.rules.retry_after import parse_retry_after
from governance.services import callbacks as callbacks
from governance.services.outbound import Resolver
from tasks import outbound, work_metrics

log = logging.getLogger(__name__)


def _timeout() -> httpx.Timeout:
    seconds = float(settings.GOVERNANCE_CALLBACK_TIMEOUT_SECONDS)
    return httpx.Timeout(seconds, connect=min(seconds, 5.0))


def post(
    url: str, body: bytes, headers: dict[str, str], *, resolver: Resolver | None = None
) -> callbacks.Result:
    """One POST; never raises for transport trouble (it becomes a retryable Result).

    A URL the outbound check refuses is a permanent failure, with no request made.
    """
    try:
        with httpx.Client(timeout=_timeout(), follow_redirects=False) as client:
            response = outbound.request(
                client, "POST", url, content=body, headers=headers, resolver=resolver
            )
    except outbound.OutboundRefused as exc:
        return callbacks.Result(
            error=f"refused before sending: {exc.reason}", request_sent=False, refused=True
        )
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return callbacks.Result(error=f"network: {exc!r}", request_sent=False)
    except httpx.TimeoutException as exc:
        # The request left: the receiver may have acted. Retried all the same,
        # with the same Idempotency-Key and body, so the receiver dedupes.
        return callbacks.Result(error=f"timeout: {exc!r}", request_sent=True)
    except httpx.HTTPError as exc:
        return callbacks.Result(error=f"network: {exc!r}", request_sent=True)
    retry_after = None
    if attempt_verdict(response.status_code) is Verdict.RETRY:
        retry_after = parse_retry_after(response.headers.get("Retry-After"), time_source.now())
    error = "" if response.is_success else f"HTTP {response.status_code}: {response.text[:500]}"
    return callbacks.Result(
        status=response.status_code, error=error, retry_after_s=retry_after, request_sent=True
    )


def deliver(callback_id: int) -> str:
    """Claim the next attempt, POST, record. Returns the new state, or why nothing was sent."""
    claim = callbacks.claim_attempt(callback_id, time_source.now())
    if claim is None:
        return "not claimed"  # not due, already final, or another worker got there first
    row = claim.callback
    body = callbacks.body_bytes(row)
    timestamp = str(int(time_source.now().timestamp()))
    headers = {
        "Content-Type": "application/json",
        callbacks.IDEMPOTENCY_HEADER: row.idempotency_key,
        callbacks.TIMESTAMP_HEADER: timestamp,
        callbacks.SIGNATURE_HEADER: callbacks.sign(callbacks.secret(), timestamp, body),
        "User-Agent": "agent-governance-callback/1",
    }
    result = post(row.url, body, headers)
    state = callbacks.record_result(claim, result, time_source.now())
    log.info("callback %s attempt %s → %s (%s)", row.id, claim.attempt, state, result.status or "-")
    work_metrics.delivery("callback", "", state or "")
    return state or "superseded"


@shared_task(name="tasks.callbacks.deliver_callback", ignore_result=True, acks_late=True)
def deliver_callback(callback_id: int) -> str:
    return deliver(callback_id)


def resend_due(*, inline: bool = False) -> int:
    """Publish (or, ``inline``, perform) every callback attempt that is due now.

    Due: pending or retry rows whose ``next_attempt_at`` has come (by the injected
    clock), and ``sending`` rows whose worker lost its lease. The claim makes a
    duplicate publish harmless.
    """
    ids = callbacks.due_ids(time_source.now())
    for callback_id in ids:
        if inline:
            deliver(callback_id)
        else:
            deliver_callback.delay(callback_id)
    return len(ids)


@shared_task(name="tasks.callbacks.resend_due_callbacks", ignore_result=True)
def resend_due_callbacks() -> int:
    """Beat job: re-send the callbacks whose retry is due."""
    return resend_due()
