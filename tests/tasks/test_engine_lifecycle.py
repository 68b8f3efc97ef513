"""R6.3 decision table, R6.1/R6.2 clocks and the spans, on the real path:
API → Redis → a real Celery worker → PostgreSQL, with an injected clock."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from governance import services
from governance.models import (
    Notification,
    ProviderAttempt,
    ProviderHealthState,
    Run,
    SegmentRefusal,
    Stage,
    Thread,
    ToolReceipt,
)
from tasks import instrumentation
from tasks.instrumentation import CLOCK_ATTRIBUTES
from tasks.stages import publish, watchdog_pass

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42.", "chunks": 2}}}


def calls_then_answers(tool: str, arguments: dict) -> dict:
    return {
        "rules": [
            {
                "when": {"last_role_not": "tool", "has_tool": tool},
                "tool_call": {"name": tool, "arguments": arguments},
            }
        ],
        "default": {"answer": {"text": "Answer after the tool.", "chunks": 1}},
    }


def make_thread(api, chain, tools=()):
    return api.post(
        "/api/v1/threads", {"provider_chain": chain, "tool_surface": list(tools)}, expect=201
    ).json()


def facts_of(run_id) -> list[str]:
    run = Run.objects.get(id=run_id)
    return [f.kind.value for f in services.run_facts(run).facts]


# --- R6.3 rows ----------------------------------------------------------------------


def test_r6_3_one_tool_failed_the_run_continues(api, worker, manual_clock, scripted_provider):
    """A failed tool is kept as a failure; the run continues and answers."""
    scripted_provider("p", calls_then_answers("calculator", {"expression": "1/0"}))
    thread = make_thread(api, ["p"], ["calculator"])
    run = api.run_and_wait(thread["id"], "Divide one by zero")
    assert run["settlement"]["outcome"] == "completed"
    (receipt,) = run["receipts"]
    assert receipt["effect"] == "failed" and "division by zero" in receipt["error"]
    assert "operation_failed" in facts_of(run["id"])
    assert [d["path"] for d in run["lifecycle"]][:1] == ["continue"]


def test_r6_3_transient_failure_recovers_inside_the_same_run(
    api, worker, manual_clock, scripted_provider
):
    """503 once → bounded recovery (same run, same ledger) → completed."""
    scripted_provider(
        "p",
        {"rules": [{"times": 1, "fail": {"status": 503, "code": "overloaded"}}], **ANSWER},
    )
    thread = make_thread(api, ["p"])
    run = api.run_and_wait(thread["id"], "Hello")
    assert run["settlement"]["outcome"] == "completed"
    assert [d["path"] for d in run["lifecycle"]] == ["bounded_recovery", "settle"]
    assert [a["failure_class"] for a in run["attempts"]] == ["server_error", None]
    assert run["budget"]["model_requests"]["used"] == 2  # R5.3: from the same balance


def test_r6_3_budget_exhausted_goes_to_finalization_only(
    api, worker, manual_clock, scripted_provider
):
    """Ordinary requests used up, reserve holds → one finalization, settled partial."""
    scripted_provider("p", calls_then_answers("calculator", {"expression": "2+2"}))
    thread = make_thread(api, ["p"], ["calculator"])
    run = api.run_and_wait(
        thread["id"], "Add two and two", budget={"model_requests": 1, "output_reserve": 1}
    )
    assert [d["path"] for d in run["lifecycle"]] == [
        "continue",  # the turn called a tool
        "continue",  # the tool answered
        "finalization_only",  # the continuation found no request budget left
        "settle",
    ]
    assert run["settlement"]["outcome"] == "partial"
    assert run["budget"]["output_reserve"]["used"] == 1
    assert [s["kind"] for s in run["stages"]] == [
        "model_turn",
        "tool_call",
        "model_turn",
        "finalization",
    ]


def test_r6_3_user_cancel_settles_without_new_dispatch(
    api, worker, manual_clock, scripted_provider
):
    scripted_provider("p", ANSWER)
    thread = Thread.objects.get(id=make_thread(api, ["p"])["id"])
    # Admit without publishing, so the cancel lands before any stage runs.
    run, _stage, _ = services.submit_run(thread, input="Hello", now=manual_clock())
    api.post(f"/api/v1/runs/{run.id}/cancel", expect=202)
    body = api.wait(str(run.id))
    assert body["settlement"]["outcome"] == "cancelled"
    assert body["attempts"] == []  # no new dispatch "to be graceful"
    again = api.post(f"/api/v1/runs/{run.id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["message"]


class Receiver(BaseHTTPRequestHandler):
    """A webhook receiver: drops the first POST's answer; answers verification."""

    posts: list[str] = []  # noqa: RUF012
    gets: list[str] = []  # noqa: RUF012
    processed: set[str] = set()  # noqa: RUF012
    drop_first_answer = True
    remember = True

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        key = self.headers["Idempotency-Key"]
        type(self).posts.append(key)
        if type(self).remember:
            type(self).processed.add(key)
        if type(self).drop_first_answer and len(type(self).posts) == 1:
            self.close_connection = True
            self.connection.close()  # effect done, answer lost: unknown
            return
        self._json(200, {"status": "processed"})

    def do_GET(self):
        key = self.headers["Idempotency-Key"]
        type(self).gets.append(key)
        if key in type(self).processed:
            self._json(200, {"status": "processed"})
        else:
            self._json(404, {"status": "unseen"})

    def _json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def receiver():
    Receiver.posts, Receiver.gets, Receiver.processed = [], [], set()
    Receiver.drop_first_answer, Receiver.remember = True, True
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", Receiver
    server.shutdown()
    server.server_close()


def test_r6_4_unknown_effect_is_verified_not_replayed(
    api, worker, manual_clock, scripted_provider, receiver
):
    url, seen = receiver
    scripted_provider("p", calls_then_answers("webhook", {"url": url, "payload": {"a": 1}}))
    thread = make_thread(api, ["p"], ["webhook"])
    run = api.run_and_wait(thread["id"], "Notify the partner")
    assert seen.posts == [seen.posts[0]]  # exactly one POST: no blind replay
    assert seen.gets == [seen.posts[0]]  # verified by the same key
    assert [d["path"] for d in run["lifecycle"]][:3] == ["continue", "verify_effect", "continue"]
    (receipt,) = run["receipts"]
    assert receipt["effect"] == "succeeded" and receipt["verified_at"]
    assert run["settlement"]["outcome"] == "completed"


def test_r6_4_verified_not_performed_replays_with_the_same_key(
    api, worker, manual_clock, scripted_provider, receiver
):
    url, seen = receiver
    seen.remember = False  # the receiver never acted on the lost request
    scripted_provider("p", calls_then_answers("webhook", {"url": url, "payload": {"a": 1}}))
    thread = make_thread(api, ["p"], ["webhook"])
    run = api.run_and_wait(thread["id"], "Notify the partner")
    assert len(seen.posts) == 2 and seen.posts[0] == seen.posts[1]
    assert ToolReceipt.objects.get(run_id=run["id"]).effect == "succeeded"
    assert run["settlement"]["outcome"] == "completed"


def test_r6_3_no_eligible_provider_settles_with_a_critical_alert(
    api, worker, manual_clock, scripted_provider
):
    scripted_provider("a", ANSWER)
    scripted_provider("b", ANSWER)
    thread = make_thread(api, ["a", "b"])
    segment = services.open_segment(Thread.objects.get(id=thread["id"]))
    for provider_id in ("a", "b"):
        SegmentRefusal.objects.create(
            segment=segment, provider_id=provider_id, refusals=4, refused_at=manual_clock()
        )
    run = api.run_and_wait(thread["id"], "Hello")
    assert run["settlement"]["reason_code"] == "no_eligible_provider"
    assert run["settlement"]["outcome"] == "failed"
    assert ProviderAttempt.objects.filter(run_id=run["id"]).count() == 0
    alert = Notification.objects.get(dedupe_key=f"no-eligible-provider:{segment.key}")
    assert alert.severity == "critical"
    assert "compact, fresh start or switch model" in alert.text


# --- R6.1 / R6.2 clocks ---------------------------------------------------------------


def test_r6_1_queued_then_fast_stage_has_large_queue_small_execution(
    api, worker, manual_clock, scripted_provider
):
    scripted_provider("p", ANSWER)
    thread = Thread.objects.get(id=make_thread(api, ["p"])["id"])
    run, stage, _ = services.submit_run(thread, input="Hello", now=manual_clock())
    manual_clock.advance(seconds=347)  # waited in the queue (the seed's example)
    publish([stage])
    api.wait(str(run.id))
    clocks = Stage.objects.get(id=stage.id).clocks
    assert clocks["queue_ms"] == 347_000
    assert clocks["execution_ms"] < 1_000
    assert Stage.objects.get(id=stage.id).timeout_name == ""  # not a stage timeout


def test_r6_1_heartbeats_are_not_progress_and_trip_no_progress(
    api, worker, manual_clock, scripted_provider
):
    scripted_provider("p", {"default": {"heartbeat": {"every_s": 30}}})
    thread = make_thread(api, ["p"])
    run = api.run_and_wait(thread["id"], "Hello", no_progress_s=120, stage_budget_s=600)
    first = run["stages"][0]
    assert first["timeout"] == "no_progress"
    assert (
        Run.objects.get(id=run["id"]).last_progress_at == Run.objects.get(id=run["id"]).created_at
    )  # heartbeats never moved the no-progress clock
    assert run["settlement"]["outcome"] in ("partial", "failed")
    assert run["settlement"]["outcome"] != "completed"


def test_r6_1_stage_budget_never_outlives_the_run_deadline(
    api, worker, manual_clock, scripted_provider
):
    scripted_provider(
        "p", {"default": {"answer": {"text": "x" * 400, "chunks": 10, "chunk_interval_s": 30}}}
    )
    scripted_provider("spare", ANSWER)
    thread = make_thread(api, ["p", "spare"])
    run = api.run_and_wait(thread["id"], "Hello", deadline_s=60, stage_budget_s=600)
    assert run["stages"][0]["timeout"] == "deadline_exceeded"
    # The run's own clock is nobody's breaker fault, and no other provider can fix it.
    assert [a["provider_id"] for a in run["attempts"]] == ["p"]
    assert not ProviderHealthState.objects.filter(consecutive_failures__gt=0).exists()
    row = Run.objects.get(id=run["id"])
    assert Stage.objects.get(run=row, seq=1).finished_at <= row.deadline_at
    assert run["settlement"]["reason_code"] == "deadline_exceeded"


def test_r6_1_watchdog_settles_a_run_past_its_deadline(
    api, worker, manual_clock, scripted_provider
):
    scripted_provider("p", ANSWER)
    thread = Thread.objects.get(id=make_thread(api, ["p"])["id"])
    run, _stage, _ = services.submit_run(thread, input="Hello", now=manual_clock(), deadline_s=60)
    manual_clock.advance(seconds=61)
    assert watchdog_pass()["breached"] == 1
    row = Run.objects.get(id=run.id)
    assert row.status == "settled" and row.settlement.reason_code == "deadline_exceeded"
    assert watchdog_pass()["breached"] == 0  # settled runs are left alone


# --- spans -------------------------------------------------------------------------------


@pytest.fixture
def spans_memory(span_exporter):
    return span_exporter


def test_r6_1_spans_carry_the_four_clocks_and_genai_attributes(
    api, worker, manual_clock, scripted_provider, spans_memory
):
    scripted_provider("p", ANSWER)
    thread = make_thread(api, ["p"])
    run = api.run_and_wait(thread["id"], "Hello")
    spans = spans_memory.get_finished_spans()
    by_name = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (root,) = by_name["governance.run"]
    assert root.attributes["governance.settlement"] == "completed"
    for name in ("governance.stage.queue", "governance.stage.execution"):
        (stage_span,) = by_name[name]
        assert stage_span.parent.span_id == root.context.span_id
        assert set(CLOCK_ATTRIBUTES) <= set(stage_span.attributes)
    attempt = next(s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat")
    assert attempt.parent.span_id == by_name["governance.stage.execution"][0].context.span_id
    assert attempt.attributes["gen_ai.provider.name"] == "p"
    assert attempt.attributes["gen_ai.request.model"] == "p-model"
    assert attempt.attributes["governance.refusal.verdict"] == "eligible"
    assert run["id"] == root.attributes["governance.run_id"]


def test_r6_1_trace_continues_from_the_api_request_and_lands_in_the_span_store(
    api, worker, manual_clock, scripted_provider, spans_memory
):
    """The API request's trace goes through Celery to the worker; the embedded
    store keeps the run's spans for the dashboard."""
    from governance.models import SpanRecord
    from tasks.span_store import DatabaseSpanExporter

    provider = instrumentation._tracer_provider
    provider.add_span_processor(SimpleSpanProcessor(DatabaseSpanExporter()))
    scripted_provider("p", ANSWER)
    thread = make_thread(api, ["p"])
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("POST /api/v1/threads/{id}/runs") as request_span:
        accepted = api.post(
            f"/api/v1/threads/{thread['id']}/runs", {"input": "Hello"}, expect=202
        ).json()
    api.wait(accepted["run_id"])
    trace_id = request_span.get_span_context().trace_id
    finished = spans_memory.get_finished_spans()
    run_spans = [s for s in finished if s.name.startswith("governance.")]
    assert run_spans and {s.context.trace_id for s in run_spans} == {trace_id}
    stored = SpanRecord.objects.filter(run_id=accepted["run_id"])
    names = set(stored.values_list("name", flat=True))
    assert {"governance.run", "governance.stage.queue", "governance.stage.execution"} <= names
    assert all(set(CLOCK_ATTRIBUTES) <= set(s.attributes) for s in stored if "stage" in s.name)


def test_r3_6_metrics_count_refusals_fallbacks_notifications_and_clocks(
    api, worker, manual_clock, scripted_provider
):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    instrumentation.use_meter_provider(MeterProvider(metric_readers=[reader]))
    try:
        scripted_provider("no", {"default": {"refuse": {"category": "policy"}}})
        scripted_provider("yes", ANSWER)
        thread = make_thread(api, ["no", "yes"])
        run = api.run_and_wait(thread["id"], "Hello")
        assert run["settlement"]["outcome"] == "completed"
        totals = {}
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points = metric.data.data_points
                    totals[metric.name] = sum(
                        getattr(p, "value", None) or getattr(p, "count", 0) for p in points
                    )
    finally:
        instrumentation.use_meter_provider(None)
    assert totals["governance.refusals"] == 1
    assert totals["governance.fallbacks"] == 1
    assert totals["governance.notifications"] == 1
    assert totals["governance.clock.queue"] >= 1  # one histogram point per stage
    assert totals["governance.clock.execution"] >= 1


def test_r3_6_all_providers_only_cooling_settles_without_paging_anyone(
    api, worker, manual_clock, scripted_provider
):
    scripted_provider("a", ANSWER)
    scripted_provider("b", ANSWER)
    thread = make_thread(api, ["a", "b"])
    segment = services.open_segment(Thread.objects.get(id=thread["id"]))
    for provider_id in ("a", "b"):
        SegmentRefusal.objects.create(
            segment=segment, provider_id=provider_id, refusals=1, refused_at=manual_clock()
        )
    run = api.run_and_wait(thread["id"], "Hello")
    assert run["settlement"]["reason_code"] == "no_eligible_provider"
    assert not Notification.objects.filter(dedupe_key__startswith="no-eligible-provider:").exists()


def test_r6_4_two_calls_with_the_same_id_get_their_own_receipts(
    api, worker, manual_clock, scripted_provider
):
    """Call ids are not unique (a server may omit them): each call is executed."""
    scripted_provider(
        "p",
        {
            "rules": [
                {
                    "when": {"last_role_not": "tool", "has_tool": "calculator"},
                    "tool_call": [
                        {"name": "calculator", "arguments": {"expression": "1+1"}, "id": "same"},
                        {"name": "calculator", "arguments": {"expression": "2+5"}, "id": "same"},
                    ],
                }
            ],
            "default": {"answer": {"text": "{last_message}"}},
        },
    )
    thread = make_thread(api, ["p"], ["calculator"])
    run = api.run_and_wait(thread["id"], "Add twice")
    receipts = ToolReceipt.objects.filter(run_id=run["id"]).order_by("id")
    assert [r.result["result"] for r in receipts] == [2, 7]
    assert run["settlement"]["outcome"] == "completed"


def test_r4_2_an_unexpected_error_in_a_stage_is_a_fact_not_a_hang(
    api, worker, manual_clock, scripted_provider
):
    """The thread's only provider was deleted: the turn fails locally, the lifecycle settles."""
    scripted_provider("p", ANSWER)
    thread = make_thread(api, ["p"])
    Thread.objects.filter(id=thread["id"]).update(provider_chain=["p", "gone"])
    from governance.models import Provider

    Provider.objects.filter(provider_id="p").delete()
    run = api.run_and_wait(thread["id"], "Hello")
    assert run["stages"][0]["outcome"] == "error"
    assert run["settlement"]["reason_code"] == "no_answer_produced"
    assert run["settlement"]["outcome"] == "failed"


def test_r6_5_a_worker_that_lost_its_claim_cannot_close_the_stage(
    api, worker, manual_clock, scripted_provider
):
    """Fencing: a stage taken over after the lease ran out ignores the old worker."""
    from datetime import timedelta as td

    from tasks.stages import StaleClaim, model_turn

    scripted_provider("p", ANSWER)
    thread = Thread.objects.get(id=make_thread(api, ["p"])["id"])
    run, stage, _ = services.submit_run(thread, input="Hello", now=manual_clock())
    first = services.claim_stage(stage.id, manual_clock(), lease=td(minutes=10))
    manual_clock.advance(minutes=11)
    services.claim_stage(stage.id, manual_clock(), lease=td(minutes=10))  # the new holder
    with pytest.raises(StaleClaim):
        model_turn.execute(Run.objects.get(id=run.id), first)
    assert Stage.objects.get(id=stage.id).finished_at is None
    assert ProviderAttempt.objects.filter(run=run).count() == 0  # nothing recorded
