"""Completion callbacks (R7.3, R7.4) against real loopback receivers.

PostgreSQL and Redis are real; the runs that settle go through a real Celery
worker; time moves only by the injected ManualClock (no sleeping for retries).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.urls import reverse

from governance import services, time_source
from governance.models import BodyChunk, Provider, Run, RunCallback
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from governance.services import callbacks as cb
from tasks import callbacks as delivery
from tasks.callbacks import resend_due_callbacks
from tests import facts as written

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42.", "chunks": 2}}}


# --------------------------------------------------------------------------- receiver


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 that records every POST and answers from a script."""

    responses: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    delay_s: float = 0.0
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def answer(self) -> tuple[int, dict[str, str]]:
        with self.lock:
            return self.responses.pop(0) if self.responses else (200, {})


@pytest.fixture
def receiver():
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with state.lock:
                state.received.append(Received(dict(self.headers.items()), body))
            if state.delay_s:
                time.sleep(state.delay_s)  # the receiver is slow, not our clock
            status, headers = state.answer()
            payload = b'{"ok": true}' if status < 300 else b'{"error": "no"}'
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/settled"
    yield state
    server.shutdown()
    server.server_close()


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def verify_signature(request: Received) -> dict:
    """What a receiver does: recompute the HMAC over "<timestamp>.<raw body>"."""
    timestamp = request.headers["X-Governance-Timestamp"]
    expected = hmac.new(
        django_settings.GOVERNANCE_CALLBACK_SECRET.encode(),
        timestamp.encode() + b"." + request.body,
        hashlib.sha256,
    ).hexdigest()
    assert hmac.compare_digest(request.headers["X-Governance-Signature"], f"sha256={expected}")
    return json.loads(request.body)


# --------------------------------------------------------------------------- runs


def settled_run(
    url: str,
    *,
    outcome: str = "completed",
    chunks: tuple[str, ...] = ("The answer ", "is 42."),
    final: bool = True,
) -> RunCallback:
    """A run settled through the services, its callback row written with the settlement."""
    now = time_source.now()
    Provider.objects.get_or_create(provider_id="p", defaults={"kind": "scripted", "model": "m"})
    thread = services.create_thread(provider_chain=["p"], now=now, callback_url=url)
    run, _stage, _ = services.submit_run(thread, input="what is 6 x 7?", now=now)
    if chunks:
        services.commit_chunks(run, chunks, now)
        if not final:
            BodyChunk.objects.filter(run=run).update(final=False)
    code = {
        "completed": ReasonCode.ANSWERED,
        "partial": ReasonCode.BODY_SAVE_PARTIAL,
        "failed": ReasonCode.NO_ANSWER_PRODUCED,
    }[outcome]
    row, created = written.settle(run, Settlement(Outcome(outcome), code, "test"), now)
    assert created
    callback = cb.create_for_settlement(run, row, now)
    assert callback is not None
    return callback


def make_thread(api, chain, url, tools=()):
    return api.post(
        "/api/v1/threads",
        {"provider_chain": chain, "tool_surface": list(tools), "callback_url": url},
        expect=201,
    ).json()


# --------------------------------------------------------------------------- R7.3


def test_r7_3_settled_run_posts_signed_callback_with_idempotency_key(
    api, worker, manual_clock, scripted_provider, receiver
):
    """R7.3: a real run settles; the worker POSTs the settlement, HMAC-signed, keyed per run."""
    scripted_provider("p", ANSWER)
    thread = make_thread(api, ["p"], receiver.url)
    run = api.run_and_wait(thread["id"], "What is six times seven?")
    assert run["settlement"]["outcome"] == "completed"
    row = wait_for(
        lambda: RunCallback.objects.filter(
            run_id=run["id"], state=RunCallback.State.DELIVERED
        ).first()
    )
    assert row.attempts == 1 and row.status_code == 200
    (request,) = receiver.received
    assert request.headers["Idempotency-Key"] == f"run-settled:{run['id']}"
    body = verify_signature(request)
    committed = BodyChunk.objects.filter(run_id=run["id"], version__isnull=False).count()
    assert body["run_id"] == run["id"] and body["thread_id"] == thread["id"]
    assert body["outcome"] == "completed" and body["reason_code"] == "answered"
    assert body["chunks"]["committed"] == committed >= 1
    assert body["chunks"]["body_complete"] is True
    assert body["delivery"]["verdict"] == "no_client_evidence"  # R7.3: says so when no acks
    assert body["unknown_effects"] == []


def test_r7_3_tampered_body_fails_signature_check(manual_clock, receiver):
    """R7.3: the signature covers the timestamp and the raw body."""
    callback = settled_run(receiver.url)
    assert delivery.deliver(callback.id) == RunCallback.State.DELIVERED
    (request,) = receiver.received
    verify_signature(request)
    forged = Received(request.headers, request.body.replace(b"completed", b"cancelled"))
    with pytest.raises(AssertionError):
        verify_signature(forged)
    later = Received(
        {**request.headers, "X-Governance-Timestamp": str(int(request.headers[
            "X-Governance-Timestamp"]) + 1)},
        request.body,
    )  # fmt: skip
    with pytest.raises(AssertionError):
        verify_signature(later)


def test_r7_3_partial_save_makes_the_callback_say_partial(
    api, worker, manual_clock, scripted_provider, receiver
):
    """R7.3: the finalization-only path settles partial → the callback says ``partial``."""
    scripted_provider(
        "p",
        {
            "rules": [
                {
                    "when": {"last_role_not": "tool", "has_tool": "calculator"},
                    "tool_call": {"name": "calculator", "arguments": {"expression": "2+2"}},
                }
            ],
            "default": {"answer": {"text": "Answer after the tool.", "chunks": 1}},
        },
    )
    thread = make_thread(api, ["p"], receiver.url, ["calculator"])
    run = api.run_and_wait(
        thread["id"], "Add two and two", budget={"model_requests": 1, "output_reserve": 1}
    )
    assert run["settlement"]["outcome"] == "partial"
    wait_for(
        lambda: RunCallback.objects.filter(
            run_id=run["id"], state=RunCallback.State.DELIVERED
        ).exists()
    )
    (request,) = receiver.received
    body = verify_signature(request)
    assert body["outcome"] == "partial" and body["settlement_outcome"] == "partial"
    assert body["outcome"] != "completed"


def test_r7_3_completed_computed_before_an_incomplete_save_is_sent_as_partial(
    manual_clock, receiver
):
    """R7.3: a 'completed' whose committed body lacks its final chunk is told as partial."""
    callback = settled_run(receiver.url, outcome="completed", final=False)
    assert callback.payload["settlement_outcome"] == "completed"
    assert callback.payload["outcome"] == "partial"
    assert callback.payload["save"] == "partial"
    assert delivery.deliver(callback.id) == RunCallback.State.DELIVERED
    assert verify_signature(receiver.received[0])["outcome"] == "partial"


def test_r7_3_the_callback_says_what_the_rule_says_when_nothing_was_saved(manual_clock, receiver):
    """One copy of R7.3: a recorded 'partial' with no committed chunk is told as the
    rule tells it (failed: nothing saved), not kept as recorded."""
    callback = settled_run(receiver.url, outcome="partial", chunks=())
    assert callback.payload["settlement_outcome"] == "partial"
    assert callback.payload["outcome"] == "failed"
    assert callback.payload["save"] == "nothing_saved"
    assert "no chunk committed" in callback.payload["outcome_reason"]


def test_r7_3_unreadable_chunk_facts_are_told_as_the_rule_tells_them(manual_clock, receiver):
    """Chunk rows that break R7.2 (committed chunks that are no prefix) prove no complete body."""
    callback = settled_run(receiver.url, outcome="completed")
    run = callback.run
    BodyChunk.objects.filter(run=run, chunk_no=1).update(version=None)  # 2 without 1
    payload = cb.settlement_payload(run, run.settlement)
    assert payload["settlement_outcome"] == "completed"
    assert payload["outcome"] == "partial" and payload["save"] is None
    assert payload["outcome_reason"] == "body chunk facts are unreadable"
    assert payload["chunks"] == {} and payload["delivery"] == {}


def test_r7_3_no_callback_url_means_no_callback_row(manual_clock):
    """R7.3: a callback is sent only when the thread (or run) names a URL."""
    now = time_source.now()
    Provider.objects.create(provider_id="p", kind="scripted", model="m")
    thread = services.create_thread(provider_chain=["p"], now=now)
    run, _s, _ = services.submit_run(thread, input="hi", now=now)
    row, _ = written.settle(
        run, Settlement(Outcome.FAILED, ReasonCode.NO_ANSWER_PRODUCED, "x"), now
    )
    assert cb.create_for_settlement(run, row, now) is None
    assert not RunCallback.objects.exists()


def test_r7_3_retry_on_503_then_success_scheduled_by_the_clock(worker, manual_clock, receiver):
    """R7.3: 503 → retry at now + backoff (injected clock); the beat job re-sends it."""
    receiver.responses = [(503, {})]
    callback = settled_run(receiver.url)
    start = time_source.now()
    assert delivery.deliver(callback.id) == RunCallback.State.RETRY
    callback.refresh_from_db()
    assert callback.attempts == 1 and callback.status_code == 503
    backoff = timedelta(seconds=django_settings.GOVERNANCE_CALLBACK_BACKOFF_SECONDS)
    assert callback.next_attempt_at == start + backoff
    assert resend_due_callbacks() == 0  # not due yet: nothing re-sent
    manual_clock.advance(backoff - timedelta(seconds=1))
    assert resend_due_callbacks() == 0
    manual_clock.advance(1)
    assert resend_due_callbacks() == 1  # published to the real worker
    wait_for(
        lambda: RunCallback.objects.filter(
            id=callback.id, state=RunCallback.State.DELIVERED
        ).exists()
    )
    callback.refresh_from_db()
    assert callback.attempts == 2 and callback.delivered_at == start + backoff
    first, second = receiver.received
    assert first.body == second.body  # the same settlement, the same key: receivers dedupe
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    verify_signature(second)


def test_r7_3_backoff_is_exponential_and_capped_then_failed_at_max_attempts(
    manual_clock, receiver, settings
):
    """R7.3: 5xx each time → base·2^(n-1) up to the cap; failed after max attempts."""
    settings.GOVERNANCE_CALLBACK_MAX_ATTEMPTS = 4
    settings.GOVERNANCE_CALLBACK_BACKOFF_SECONDS = 10
    settings.GOVERNANCE_CALLBACK_BACKOFF_MAX_SECONDS = 25
    receiver.responses = [(500, {})] * 4
    callback = settled_run(receiver.url)
    delays = []
    for _ in range(3):
        before = time_source.now()
        assert delivery.deliver(callback.id) == RunCallback.State.RETRY
        callback.refresh_from_db()
        delays.append((callback.next_attempt_at - before).total_seconds())
        manual_clock.set(callback.next_attempt_at)
    assert delays == [10, 20, 25]
    assert delivery.resend_due(inline=True) == 1
    callback.refresh_from_db()
    assert callback.state == RunCallback.State.FAILED and callback.attempts == 4
    assert "gave up after 4" in callback.last_error
    manual_clock.advance(hours=2)
    assert delivery.resend_due(inline=True) == 0 and len(receiver.received) == 4


def test_r7_3_network_error_and_timeout_after_send_are_retried(manual_clock, receiver, settings):
    """R7.3: nothing listening → retry; a read timeout after the request left → retry too."""
    callback = settled_run("http://127.0.0.1:9/unreachable")
    assert delivery.deliver(callback.id) == RunCallback.State.RETRY
    callback.refresh_from_db()
    assert callback.status_code is None and callback.last_error.startswith("network")

    settings.GOVERNANCE_CALLBACK_TIMEOUT_SECONDS = 1
    receiver.delay_s = 1.5
    slow = settled_run(receiver.url)
    assert delivery.deliver(slow.id) == RunCallback.State.RETRY
    slow.refresh_from_db()
    assert slow.last_error.startswith("timeout") and len(receiver.received) == 1
    receiver.delay_s = 0
    manual_clock.set(slow.next_attempt_at)
    assert delivery.deliver(slow.id) == RunCallback.State.DELIVERED
    keys = {r.headers["Idempotency-Key"] for r in receiver.received}
    assert len(receiver.received) == 2 and keys == {slow.idempotency_key}


def test_r7_3_no_retry_on_400(manual_clock, receiver):
    """R7.3: another 4xx is permanent: failed after one attempt, never re-sent."""
    receiver.responses = [(400, {})]
    callback = settled_run(receiver.url)
    assert delivery.deliver(callback.id) == RunCallback.State.FAILED
    callback.refresh_from_db()
    assert callback.attempts == 1 and callback.status_code == 400
    manual_clock.advance(hours=5)
    assert delivery.resend_due(inline=True) == 0
    assert delivery.deliver(callback.id) == "not claimed"
    assert len(receiver.received) == 1


def test_r7_3_429_retry_after_is_respected(manual_clock, receiver):
    """R7.3: 429 with Retry-After: 120 → next attempt exactly 120 s later, not the backoff."""
    receiver.responses = [(429, {"Retry-After": "120"})]
    callback = settled_run(receiver.url)
    start = time_source.now()
    assert delivery.deliver(callback.id) == RunCallback.State.RETRY
    callback.refresh_from_db()
    assert callback.next_attempt_at == start + timedelta(seconds=120)
    manual_clock.advance(119)
    assert delivery.resend_due(inline=True) == 0
    manual_clock.advance(1)
    assert delivery.resend_due(inline=True) == 1
    callback.refresh_from_db()
    assert callback.state == RunCallback.State.DELIVERED and callback.attempts == 2
    assert len(receiver.received) == 2


@pytest.mark.parametrize("status", [408, 425])
def test_r7_3_request_timeout_and_too_early_are_retried_like_alerts(manual_clock, receiver, status):
    """One copy of the redelivery rule: 408 and 425 mean "not now" for a callback
    as for an alert channel (the callback sender used to give up on them)."""
    receiver.responses = [(status, {})]
    callback = settled_run(receiver.url)
    start = time_source.now()
    assert delivery.deliver(callback.id) == RunCallback.State.RETRY
    callback.refresh_from_db()
    backoff = timedelta(seconds=django_settings.GOVERNANCE_CALLBACK_BACKOFF_SECONDS)
    assert callback.status_code == status and callback.next_attempt_at == start + backoff


def test_r7_3_a_retry_after_sooner_than_the_backoff_does_not_shorten_it(manual_clock, receiver):
    """Retry-After is a floor: "come back in 1 s" after the third failure still waits
    the backoff of the third attempt (base·4)."""
    receiver.responses = [(503, {}), (503, {}), (503, {"Retry-After": "1"})]
    callback = settled_run(receiver.url)
    for _ in range(2):
        assert delivery.deliver(callback.id) == RunCallback.State.RETRY
        callback.refresh_from_db()
        manual_clock.set(callback.next_attempt_at)
    at = time_source.now()
    assert delivery.deliver(callback.id) == RunCallback.State.RETRY
    callback.refresh_from_db()
    base = django_settings.GOVERNANCE_CALLBACK_BACKOFF_SECONDS
    assert callback.attempts == 3
    cap = django_settings.GOVERNANCE_CALLBACK_BACKOFF_MAX_SECONDS
    assert callback.next_attempt_at == at + timedelta(seconds=min(4 * base, cap))


def test_r7_3_concurrent_deliveries_of_the_same_attempt_send_once(manual_clock, receiver):
    """R7.3: eight workers race for one attempt; the conditional claim lets one send."""
    receiver.delay_s = 0.3
    callback = settled_run(receiver.url)
    barrier = threading.Barrier(8)
    results: list[str] = []

    def worker_thread():
        try:
            barrier.wait()
            results.append(delivery.deliver(callback.id))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker_thread) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["delivered"] + ["not claimed"] * 7
    callback.refresh_from_db()
    assert callback.attempts == 1 and len(receiver.received) == 1


def test_r7_3_attempt_is_recorded_before_the_call(manual_clock, receiver):
    """R7.3: while the receiver holds the request, the row already says sending, attempt 1."""
    receiver.delay_s = 0.5
    callback = settled_run(receiver.url)
    done = threading.Thread(target=lambda: (delivery.deliver(callback.id), connection.close()))
    done.start()
    wait_for(lambda: receiver.received)
    seen = RunCallback.objects.get(id=callback.id)
    assert seen.state == RunCallback.State.SENDING and seen.attempts == 1
    done.join(30)
    callback.refresh_from_db()
    assert callback.state == RunCallback.State.DELIVERED


def test_r7_3_a_lost_worker_is_superseded_and_its_late_answer_ignored(manual_clock, receiver):
    """R7.3: a 'sending' row past its lease is claimed again (attempt 2, same key);
    the first worker's late result does not overwrite it."""
    callback = settled_run(receiver.url)
    stale = cb.claim_attempt(callback.id, time_source.now())  # a worker claimed, then died
    assert stale is not None and stale.attempt == 1
    assert delivery.resend_due(inline=True) == 0  # its lease still holds
    manual_clock.advance(seconds=301)
    assert delivery.resend_due(inline=True) == 1
    callback.refresh_from_db()
    assert callback.state == RunCallback.State.DELIVERED and callback.attempts == 2
    assert cb.record_result(stale, cb.Result(status=500, error="late"), time_source.now()) == ""
    callback.refresh_from_db()
    assert callback.state == RunCallback.State.DELIVERED


def test_r7_3_a_worker_lost_on_the_last_attempt_makes_no_attempt_beyond_the_limit(
    manual_clock, receiver, settings
):
    """rules.redelivery.may_attempt, as for alert channels."""
    settings.GOVERNANCE_CALLBACK_MAX_ATTEMPTS = 1
    callback = settled_run(receiver.url)
    assert cb.claim_attempt(callback.id, time_source.now()) is not None  # then it died
    manual_clock.advance(seconds=301)
    assert cb.claim_attempt(callback.id, time_source.now()) is None
    callback.refresh_from_db()
    assert callback.state == RunCallback.State.FAILED and callback.attempts == 1
    assert "gave up after 1 attempt" in callback.last_error
    assert receiver.received == []


# --------------------------------------------------------------------------- R7.4


def test_r7_4_report_shows_callback_delivered_failed_pending(
    client, manager, manual_clock, receiver
):
    """R7.4: the report's callback column comes from the delivery records."""
    receiver.responses = [(200, {}), (400, {}), (503, {})]
    delivered = settled_run(receiver.url, outcome="partial", final=False)
    failed = settled_run(receiver.url)
    pending = settled_run(receiver.url)
    queued = settled_run(receiver.url)
    assert delivery.deliver(delivered.id) == RunCallback.State.DELIVERED
    assert delivery.deliver(failed.id) == RunCallback.State.FAILED
    assert delivery.deliver(pending.id) == RunCallback.State.RETRY
    client.force_login(manager)
    response = client.get(reverse("report"))
    assert response.status_code == 200
    from tests.dashboard.test_report_views import discrepancy_rows

    rows = discrepancy_rows(response)
    shown = {row[0]: (row[3], row[7]) for row in rows}
    assert shown[str(delivered.run_id)] == ("partial", "delivered: partial")
    assert shown[str(failed.run_id)] == ("completed", "failed")
    assert shown[str(pending.run_id)] == ("completed", "pending (retrying)")
    assert shown[str(queued.run_id)] == ("completed", "pending")
    codes = {(row[0], row[8]) for row in rows}
    assert (str(failed.run_id), "callback_delivery_failed") in codes
    assert not any(code.startswith("callback_") for run, code in codes if run != str(failed.run_id))
    run_ids = {str(c.run_id) for c in (delivered, failed, pending, queued)}
    assert run_ids <= {row[0] for row in rows}
    assert Run.objects.count() == 4
