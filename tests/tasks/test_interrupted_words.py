"""R6.2: the words for a broken continuation, on every surface.

The seed's second counterexample, through a real worker against a loopback
OpenAI-compatible streaming server: the model asks for the calculator, the
receipt succeeds, and the continuation sends its headers and one role delta
and closes the connection (no finish_reason, no [DONE]). That is
``interrupted`` (effect unknown): not a timeout, not a network failure. The
silent variant (headers, then only ``: ping`` comments) is ``no_progress``
after exactly the no-progress limit. The API, the run page, the spans and the
metrics say the same words for the same fact.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from governance.models import Provider, ToolReceipt
from tasks import instrumentation

pytestmark = pytest.mark.django_db(transaction=True)

CALL = {
    "index": 0,
    "id": "call_calc",
    "type": "function",
    "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
}


class BrokenContinuation(BaseHTTPRequestHandler):
    """First request: a calculator call. Later requests (the continuation,
    with the tool's result): ``mode`` decides how the stream breaks."""

    mode = "close"  # or "ping": only SSE comments, each moving the test's clock
    clock = None
    ping_step_s = 0.0
    pings = 0
    requests: list[dict] = []  # noqa: RUF012 (reset per test)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        if body["messages"][-1]["role"] != "tool":
            for delta, finish in (
                ({"role": "assistant", "content": ""}, None),
                ({"tool_calls": [CALL]}, None),
                ({}, "tool_calls"),
            ):
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        role = {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
        if type(self).mode == "close":
            self.wfile.write(f"data: {json.dumps(role)}\n\n".encode())
            self.wfile.flush()
            self.close_connection = True
            return
        # Pings only, each after the run's clock moved on: the last one is sent
        # when the clock has moved by exactly the no-progress limit, and the
        # clock moves no further, so a cut names the limit exactly.
        for _ in range(type(self).pings):
            type(self).clock.advance(seconds=type(self).ping_step_s)
            self.wfile.write(b": ping\n\n")
            self.wfile.flush()
        self.connection.settimeout(30)
        with contextlib.suppress(OSError):
            self.connection.recv(1)  # held open until the client gives up

    def log_message(self, *args):
        pass


@pytest.fixture
def broken_model(manual_clock):
    BrokenContinuation.requests = []
    BrokenContinuation.clock = manual_clock
    server = ThreadingHTTPServer(("127.0.0.1", 0), BrokenContinuation)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Provider.objects.create(
        provider_id="broken", kind="openai", model="gpt-test",
        base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
    )  # fmt: skip
    yield BrokenContinuation
    server.shutdown()
    server.server_close()


@pytest.fixture
def surfaces():
    """The spans and metrics of what the worker does, in memory."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    instrumentation.use_tracer_provider(tracer_provider)
    instrumentation.use_meter_provider(MeterProvider(metric_readers=[reader]))
    yield exporter, reader
    instrumentation.use_tracer_provider(None)
    instrumentation.use_meter_provider(None)


def _thread(api):
    return api.post(
        "/api/v1/threads", {"provider_chain": ["broken"], "tool_surface": ["calculator"]},
        expect=201,
    ).json()  # fmt: skip


def _page_text(client, operator, run_id) -> str:
    client.force_login(operator)
    response = client.get(f"/runs/{run_id}/")
    assert response.status_code == 200
    text = re.sub(r"<[^>]+>", " ", response.content.decode())
    return re.sub(r"\s+", " ", html.unescape(text))


def _execution_spans(exporter, run_id: str) -> dict[int, dict]:
    return {
        span.attributes["governance.stage_id"]: dict(span.attributes)
        for span in exporter.get_finished_spans()
        if span.name == instrumentation.EXECUTION_SPAN_NAME
        and span.attributes.get("governance.run_id") == run_id
    }


def _clock_points(reader) -> list[dict]:
    points = []
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name == "governance.clock.execution":
                    points += [dict(p.attributes) for p in metric.data.data_points]
    return points


def _words(run: dict) -> str:
    return " ".join(d["reason"] for d in run["lifecycle"])


def test_r6_2_a_continuation_closed_after_its_headers_reads_interrupted_everywhere(
    api, worker, manual_clock, broken_model, surfaces, client, operator
):
    exporter, reader = surfaces
    broken_model.mode = "close"
    run = api.run_and_wait(_thread(api)["id"], "What is six times seven?", idempotency_key="i14")

    # The tool's fact stands; the run does not pretend it answered.
    receipt = ToolReceipt.objects.get(run_id=run["id"])
    assert (receipt.effect, receipt.result["result"]) == ("succeeded", 42)
    assert run["settlement"]["outcome"] != "completed"

    # API: outcome, failure class and clock are three fields; no clock ran out.
    broken = [s for s in run["stages"] if s["outcome"] == "interrupted"]
    assert broken and all(s["kind"] == "model_turn" for s in broken)
    assert {(s["failure_class"], s["timeout"]) for s in broken} == {("interrupted", None)}
    assert not [s for s in run["stages"] if s["timeout"]]
    retried = [a for a in run["attempts"] if a["failure_class"] == "interrupted"]
    assert len(retried) == len(broken)  # each retry is its own attempt
    requests = run["budget"]["model_requests"]
    assert requests["remaining"] == 0  # the retries drew from the run's one budget

    # Lifecycle: words from the facts, each retry counted, and why it stopped.
    recoveries = [d for d in run["lifecycle"] if d["path"] == "bounded_recovery"]
    assert len(recoveries) == len(broken) - 1
    assert all("interrupted" in d["reason"] and "effect unknown" in d["reason"] for d in recoveries)
    assert "retry 1, drawn from model_requests" in recoveries[0]["reason"]
    assert (
        f"retry {len(recoveries)}, drawn from model_requests (1 left)" in recoveries[-1]["reason"]
    )
    stopped = next(d for d in run["lifecycle"] if d["path"] == "finalization_only")
    assert f"not retried after {len(recoveries)} retries" in stopped["reason"]
    assert "the model_requests budget is used up" in stopped["reason"]
    words = _words(run).lower()
    assert "network" not in words and "timed out" not in words and "timeout" not in words

    # The run page: the same facts, the retries on one line, no timeout words.
    page = _page_text(client, operator, run["id"])
    assert "interrupted (effect unknown)" in page
    assert f"bounded recovery × {len(recoveries)}" in page
    assert page.count("retry 1, drawn from") == 0  # the line shows the latest retry
    assert "network" not in page.lower() and "timed out" not in page.lower()

    # Spans: the failure class is error.type; no stage timeout attribute.
    spans = _execution_spans(exporter, run["id"])
    interrupted = [a for a in spans.values() if a.get("governance.stage.outcome") == "interrupted"]
    assert len(interrupted) == len(broken)
    assert all(a["error.type"] == "interrupted" for a in interrupted)
    assert not [a for a in spans.values() if "governance.stage.timeout" in a]
    assert not [a for a in spans.values() if a.get("error.type") in ("network", "timeout")]

    # Metrics: the clocks of those stages carry the same words.
    points = [
        p for p in _clock_points(reader) if p.get("governance.stage.outcome") == "interrupted"
    ]
    assert points and all(p["error.type"] == "interrupted" for p in points)
    assert not [p for p in _clock_points(reader) if "governance.stage.timeout" in p]


def test_r6_1_a_continuation_that_only_pings_reads_no_progress_everywhere(
    api, worker, manual_clock, broken_model, surfaces, client, operator
):
    exporter, reader = surfaces
    broken_model.mode = "ping"
    broken_model.ping_step_s, broken_model.pings = 10, 3
    run = api.run_and_wait(
        _thread(api)["id"], "What is six times seven?", idempotency_key="i14-ping",
        no_progress_s=30,
    )  # fmt: skip
    receipt = ToolReceipt.objects.get(run_id=run["id"])
    assert (receipt.effect, receipt.result["result"]) == ("succeeded", 42)
    assert run["settlement"]["outcome"] != "completed"

    [cut] = [s for s in run["stages"] if s["timeout"]]
    assert (cut["outcome"], cut["timeout"], cut["failure_class"]) == (
        "timeout", "no_progress", "timeout",
    )  # fmt: skip
    # The pings never reset the no-progress clock: cut once it reached the limit.
    assert cut["clocks"]["execution_ms"] == 30_000
    assert not [s for s in run["stages"] if s["outcome"] == "interrupted"]
    words = _words(run).lower()
    assert "stopped making progress" in words
    assert "network" not in words and "interrupted" not in words

    page = _page_text(client, operator, run["id"])
    assert "timed out: no_progress" in page
    assert "interrupted" not in page and "network" not in page.lower()

    spans = _execution_spans(exporter, run["id"])
    [timed_out] = [a for a in spans.values() if "governance.stage.timeout" in a]
    assert timed_out["governance.stage.timeout"] == "no_progress"
    assert timed_out["error.type"] == "timeout"
    points = _clock_points(reader)
    assert [p for p in points if p.get("governance.stage.timeout") == "no_progress"]
