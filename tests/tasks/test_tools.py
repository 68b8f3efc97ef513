"""Built-in tools are executors: each reports only the fact of its own
operation (R4.1). Webhooks run against a real loopback HTTP server."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from governance.models import KnowledgeDocument
from tasks import tools
from tasks.adapters.base import ToolSpec
from tasks.tools import (
    EXTERNAL_TOOLS,
    TOOL_SPECS,
    VERIFIERS,
    ToolResult,
    calculator,
    kb_search,
    run_tool,
    verify_webhook,
    webhook,
)

KEY = "run-7:turn-2:call-1"


# ---------------------------------------------------------------------------
# a real receiver on 127.0.0.1


@dataclass
class Receiver:
    url: str
    port: int
    mode: str = (
        "ok"  # ok | bad | unavailable | gateway | hangup | slow | big | verify_error | bare404
    )
    requests: list[dict[str, Any]] = field(default_factory=list)
    processed: dict[str, Any] = field(default_factory=dict)
    release: threading.Event = field(default_factory=threading.Event)


def _make_handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _record(self, body: bytes) -> None:
            receiver.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": body,
                }
            )

        def _answer(self, status: int, body: bytes, content_type: str = "application/json"):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._record(body)
            key = self.headers.get("Idempotency-Key")
            mode = receiver.mode
            if mode == "hangup":
                # The receiver acts, then the connection drops before any answer.
                receiver.processed[key] = json.loads(body)
                self.close_connection = True
                return
            if mode == "slow":
                receiver.release.wait(10)
                self.close_connection = True
                return
            if mode == "bad":
                return self._answer(400, b'{"error": "bad payload"}')
            if mode == "unavailable":
                return self._answer(503, b'{"error": "down"}')
            if mode == "gateway":
                return self._answer(504, b"upstream timed out", "text/plain")
            receiver.processed[key] = json.loads(body)
            if mode == "big":
                return self._answer(200, b"x" * 10_000, "text/plain")
            return self._answer(200, json.dumps({"ok": True, "key": key}).encode())

        def do_GET(self) -> None:
            self._record(b"")
            if receiver.mode == "verify_error":
                return self._answer(500, b'{"error": "db down"}')
            if receiver.mode == "bare404":
                return self._answer(404, b"<h1>Not Found</h1>", "text/html")
            key = parse_qs(urlsplit(self.path).query).get("idempotency_key", [None])[0]
            if key in receiver.processed:
                return self._answer(200, json.dumps({"status": "processed", "key": key}).encode())
            return self._answer(404, b'{"status": "unseen"}')

    return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(None))  # type: ignore[arg-type]
    port = server.server_address[1]
    rec = Receiver(url=f"http://127.0.0.1:{port}/hook", port=port)
    server.RequestHandlerClass = _make_handler(rec)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield rec
    rec.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A bound port nobody listens on: connecting is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    yield sock.getsockname()[1]
    sock.close()


# ---------------------------------------------------------------------------
# calculator


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("1 + 2", 3),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("2 ** 3 ** 2", 512),
        ("-2 ** 2", -4),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 % 3", 2),
        ("+1.5 * -(2 - 4)", 3.0),
        ("2 ** -1", 0.5),
        ("1_000 * 3", 3000),
        ("2 ** 1000", 2**1000),
    ],
)
def test_r4_1_calculator_evaluates_arithmetic_with_precedence(expression, expected):
    """R4.1: the calculator reports success with the value of its own operation."""
    result = calculator({"expression": expression}, idempotency_key=KEY)
    assert result == ToolResult("succeeded", {"expression": expression, "result": expected})
    assert json.loads(json.dumps(result.output)) == result.output


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("x + 1", "names are not allowed"),
        ("__import__('os')", "function calls are not allowed"),
        ("abs(-1)", "function calls are not allowed"),
        ("(1).real", "attribute access is not allowed"),
        ("'a' * 3", "only numbers"),
        ("True + 1", "only numbers"),
        ("1j * 2", "only numbers"),
        ("1 < 2", "Compare is not allowed"),
        ("1 << 10", "operator LShift is not allowed"),
        ("~1", "unary operator Invert is not allowed"),
        ("[1, 2]", "List is not allowed"),
        ("2 ** 1001", "exponent 1001 exceeds"),
        ("2 ** 2 ** 20", "exceeds the limit"),
        ("9 ** 999 * 9 ** 999 * 9 ** 999", "too large"),
        ("99 ** 999", "too large"),
        ("10.0 ** 400", "too large"),
        ("1e308 * 10", "too large"),
        ("1e999", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 +", "not a valid arithmetic expression"),
        ("", "non-empty"),
        ("1 + " * 60 + "1", "the limit is 200"),
    ],
)
def test_r4_1_calculator_refuses_unsafe_or_bad_input_as_failed_not_exception(expression, reason):
    """R4.1, R4.2: bad input is this operation's failure, with words — never an exception."""
    result = calculator({"expression": expression}, idempotency_key=KEY)
    assert result.effect == "failed"
    assert reason in result.error
    assert result.external is False


@pytest.mark.parametrize("expression", ["1 / 0", "1 // 0", "5 % 0", "1.5 / 0.0", "0 ** -1"])
def test_r4_1_calculator_division_by_zero_is_failed(expression):
    """R4.1: division by zero is a failed calculation, not a crash of the run."""
    result = calculator({"expression": expression}, idempotency_key=KEY)
    assert result.effect == "failed"
    assert result.error == "division by zero"


def test_r4_1_calculator_without_expression_fails():
    """R4.1: a missing or non-string expression is reported as failed."""
    assert calculator({}, idempotency_key=KEY).effect == "failed"
    assert calculator({"expression": 42}, idempotency_key=KEY).effect == "failed"


# ---------------------------------------------------------------------------
# kb_search


def _doc(title: str, body: str = "", tags: list[str] | None = None) -> KnowledgeDocument:
    return KnowledgeDocument.objects.create(title=title, body=body, tags=tags or [])


@pytest.mark.django_db
def test_r4_1_kb_search_ranks_by_distinct_terms_then_occurrences():
    """R4.1: results are ranked by how many query terms match, then how often."""
    _doc("Unrelated", "nothing to see here")
    once = _doc("Alpha", "The provider was frozen once.")
    many = _doc("Beta", "frozen frozen frozen: a frozen provider stays frozen")
    both = _doc("Gamma", "A segment is frozen after refusals.", ["segment"])

    result = kb_search({"query": "frozen segment"}, idempotency_key=KEY)

    assert result.effect == "succeeded"
    assert [r["id"] for r in result.output["results"]] == [both.pk, many.pk, once.pk]
    assert result.output["results"][0]["matched_terms"] == ["frozen", "segment"]
    assert result.output["terms"] == ["frozen", "segment"]
    assert result.external is False


@pytest.mark.django_db
def test_r4_1_kb_search_title_match_outranks_single_body_match():
    """R4.1: with the same terms matched, a title hit weighs more than a body hit."""
    body_hit = _doc("Aaa", "about escalation")
    title_hit = _doc("Escalation policy", "who is paged")
    result = kb_search({"query": "escalation"}, idempotency_key=KEY)
    assert [r["id"] for r in result.output["results"]] == [title_hit.pk, body_hit.pk]


@pytest.mark.django_db
def test_r4_1_kb_search_is_case_insensitive_in_title_body_and_tags():
    """R4.1: terms match regardless of case, in title, body or tags."""
    title = _doc("PostgreSQL Row Locks", "select for update")
    body = _doc("Ledger", "Admission uses a ROW LOCK in postgresql.")
    tag = _doc("Paging", "who gets woken up", ["On-Call", "Escalation"])

    assert {
        r["id"] for r in kb_search({"query": "postgresql"}, idempotency_key=KEY).output["results"]
    } == {title.pk, body.pk}
    found = kb_search({"query": "ESCALATION"}, idempotency_key=KEY).output["results"]
    assert [r["id"] for r in found] == [tag.pk]
    assert found[0]["title"] == "Paging"


@pytest.mark.django_db
def test_r4_1_kb_search_returns_title_and_snippet_around_the_match():
    """R4.1: each hit carries its title and a snippet of the body near the match."""
    body = "Lorem ipsum " * 40 + "the output reserve is kept for finalization " + "dolor " * 40
    _doc("Reserve", body)
    hit = kb_search({"query": "reserve"}, idempotency_key=KEY).output["results"][0]
    assert hit["title"] == "Reserve"
    assert "output reserve" in hit["snippet"]
    assert hit["snippet"].startswith("…") and hit["snippet"].endswith("…")
    assert len(hit["snippet"]) <= tools.SNIPPET_CHARS + 2


@pytest.mark.django_db
def test_r4_1_kb_search_limit_defaults_to_5_and_is_capped_at_20():
    """R4.1: the limit bounds the answer: default 5, never more than 20."""
    for i in range(25):
        _doc(f"Runbook {i:02d}", "restart the worker")

    default = kb_search({"query": "worker"}, idempotency_key=KEY)
    assert len(default.output["results"]) == 5
    assert (
        len(kb_search({"query": "worker", "limit": 3}, idempotency_key=KEY).output["results"]) == 3
    )
    capped = kb_search({"query": "worker", "limit": 500}, idempotency_key=KEY)
    assert len(capped.output["results"]) == 20
    assert capped.output["limit"] == 20
    for bad in (0, -1, "5", True):
        assert kb_search({"query": "worker", "limit": bad}, idempotency_key=KEY).effect == "failed"


@pytest.mark.django_db
@pytest.mark.parametrize("query", ["", "   ", "?!", None])
def test_r4_1_kb_search_empty_query_is_failed(query):
    """R4.1: a query with nothing to search for is this operation's failure."""
    _doc("Anything", "at all")
    result = kb_search({"query": query}, idempotency_key=KEY)
    assert result.effect == "failed"
    assert result.error


@pytest.mark.django_db
def test_r4_1_kb_search_no_match_is_an_honest_empty_success():
    """R4.1: finding nothing is a successful search with no results, not a failure."""
    _doc("Budgets", "one ledger per fact")
    result = kb_search({"query": "kubernetes"}, idempotency_key=KEY)
    assert result.effect == "succeeded"
    assert result.output["results"] == []


@pytest.mark.django_db
def test_r5_2_kb_search_reads_only_and_admits_no_quota(django_assert_num_queries):
    """R5.2: the search quota is its own resource, admitted by the runner's ledger;
    the executor neither admits nor consumes — one read query, no writes."""
    _doc("Quota", "searches have their own quota")
    with django_assert_num_queries(1) as ctx:
        result = kb_search({"query": "quota searches"}, idempotency_key=KEY)
    assert result.effect == "succeeded"
    assert ctx.captured_queries[0]["sql"].lstrip().upper().startswith("SELECT")
    assert KnowledgeDocument.objects.count() == 1


# ---------------------------------------------------------------------------
# webhook


def test_r4_1_webhook_2xx_succeeded_and_idempotency_key_arrives(receiver):
    """R4.1: a 2xx answer is the receiver's success; the key travels with the request."""
    payload = {"event": "run.settled", "run": 7}
    result = webhook({"url": receiver.url, "payload": payload}, idempotency_key=KEY)

    assert result.effect == "succeeded"
    assert result.external is True
    assert result.output["status"] == 200
    assert json.loads(result.output["body"]) == {"ok": True, "key": KEY}
    [request] = receiver.requests
    assert request["method"] == "POST"
    assert request["headers"]["Idempotency-Key"] == KEY
    assert request["headers"]["Content-Type"] == "application/json"
    assert json.loads(request["body"]) == payload


def test_r4_1_webhook_response_body_is_truncated(receiver):
    """R4.1: what the model sees is bounded: a long answer is cut and marked."""
    receiver.mode = "big"
    result = webhook({"url": receiver.url, "payload": {}}, idempotency_key=KEY)
    assert result.effect == "succeeded"
    assert result.output["truncated"] is True
    assert len(result.output["body"]) == tools.MAX_RESPONSE_BYTES


def test_r4_1_webhook_4xx_is_failed_the_receiver_refused(receiver):
    """R4.1: a 4xx is the receiver refusing this request: failed, not the run."""
    receiver.mode = "bad"
    result = webhook({"url": receiver.url, "payload": {"a": 1}}, idempotency_key=KEY)
    assert result.effect == "failed"
    assert result.output["status"] == 400
    assert "refused" in result.error
    assert len(receiver.requests) == 1


def test_r4_1_webhook_503_is_failed_the_receiver_reports_failure(receiver):
    """R4.1: a 5xx from the receiver is its own report of failure."""
    receiver.mode = "unavailable"
    result = webhook({"url": receiver.url, "payload": {}}, idempotency_key=KEY)
    assert result.effect == "failed"
    assert result.output["status"] == 503
    assert "HTTP 503" in result.error


def test_r6_2_webhook_gateway_timeout_504_is_unknown(receiver):
    """R6.2: a 504 is a gateway speaking for an origin that may have acted: unknown."""
    receiver.mode = "gateway"
    result = webhook({"url": receiver.url, "payload": {}}, idempotency_key=KEY)
    assert result.effect == "unknown"
    assert result.output["status"] == 504


def test_r6_2_webhook_connection_closed_after_request_is_unknown(receiver):
    """R6.2: the request was sent and the connection closed with no answer — the
    receiver may have acted, so the effect is unknown, never "failed"."""
    receiver.mode = "hangup"
    result = webhook({"url": receiver.url, "payload": {"n": 1}}, idempotency_key=KEY)
    assert result.effect == "unknown"
    assert result.output["request_sent"] is True
    assert "verified by idempotency key" in result.error
    assert len(receiver.requests) == 1


def test_r6_2_webhook_timeout_after_request_sent_is_unknown_not_failed(receiver):
    """R6.2: a timeout after the request left is not proof of anything: unknown."""
    receiver.mode = "slow"
    result = webhook({"url": receiver.url, "payload": {}}, idempotency_key=KEY, timeout_s=0.3)
    assert result.effect == "unknown"
    assert "ReadTimeout" in result.error
    assert len(receiver.requests) == 1


def test_r4_1_webhook_connection_refused_is_failed_nothing_sent(refused_port):
    """R4.1: a connect error means nothing left the machine: failed, not unknown."""
    url = f"http://127.0.0.1:{refused_port}/hook"
    result = webhook({"url": url, "payload": {}}, idempotency_key=KEY, timeout_s=2)
    assert result.effect == "failed"
    assert result.output["request_sent"] is False
    assert "nothing was sent" in result.error


@pytest.mark.parametrize(
    "template",
    ["ftp://127.0.0.1:{port}/hook", "file:///etc/passwd", "javascript:alert(1)", "http://", ""],
)
def test_r4_1_webhook_non_http_url_is_failed_without_a_request(receiver, template):
    """R4.1: only http(s) URLs are called; anything else fails before any request."""
    url = template.format(port=receiver.port)
    result = webhook({"url": url, "payload": {}}, idempotency_key=KEY)
    assert result.effect == "failed"
    assert result.output["request_sent"] is False
    assert result.error
    assert receiver.requests == []


def test_r4_1_webhook_host_outside_allow_list_is_refused_without_a_request(receiver):
    """R4.1: the allow-list owner refuses this one operation; no request is made."""
    args = {"url": receiver.url, "payload": {}}
    refused = webhook(args, idempotency_key=KEY, allowed_hosts=["hooks.example.com"])
    assert refused.effect == "refused"
    assert "allow-list" in refused.error
    assert receiver.requests == []

    allowed = webhook(args, idempotency_key=KEY, allowed_hosts=["hooks.example.com", "127.0.0.1"])
    assert allowed.effect == "succeeded"
    assert len(receiver.requests) == 1


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        ({"payload": {}}, KEY),
        ({"url": "URL", "payload": {1, 2}}, KEY),
        ({"url": "URL", "payload": {"x": float("nan")}}, KEY),
        ({"url": "URL"}, KEY),
        ({"url": "URL", "payload": {}}, ""),
        ({"url": "URL", "payload": {}}, "bad\r\nX-Injected: 1"),
        ({"url": "URL", "payload": {}}, "k" * 301),
    ],
)
def test_r4_1_webhook_bad_payload_or_key_is_failed_without_a_request(receiver, arguments, key):
    """R4.1: an unusable payload or idempotency key fails before anything is sent."""
    if "url" in arguments:
        arguments = {**arguments, "url": receiver.url}
    result = webhook(arguments, idempotency_key=key)
    assert result.effect == "failed"
    assert result.output["request_sent"] is False
    assert receiver.requests == []


# ---------------------------------------------------------------------------
# verify_webhook


def test_r6_4_verify_processed_key_is_succeeded(receiver):
    """R6.4: the executor verifies by idempotency key: a processed key means the
    effect happened."""
    receiver.processed[KEY] = {"event": "x"}
    result = verify_webhook({"url": receiver.url}, idempotency_key=KEY)
    assert result.effect == "succeeded"
    assert result.output["seen"] is True
    assert result.output["receipt"] == {"status": "processed", "key": KEY}
    [request] = receiver.requests
    assert request["method"] == "GET"
    assert request["headers"]["Idempotency-Key"] == KEY
    assert parse_qs(urlsplit(request["path"]).query)["idempotency_key"] == [KEY]


def test_r6_4_verify_unknown_key_is_failed_with_seen_false(receiver):
    """R6.4: the receiver says it never saw the key: the effect did not happen, so
    the runner may replay with the same key. Verification itself sends nothing."""
    receiver.processed["some-other-key"] = {}
    result = verify_webhook({"url": receiver.url, "payload": {"a": 1}}, idempotency_key=KEY)
    assert result.effect == "failed"
    assert result.output["seen"] is False
    assert [r["method"] for r in receiver.requests] == ["GET"]


@pytest.mark.parametrize("mode", ["verify_error", "bare404"])
def test_r6_4_verify_without_a_contract_answer_stays_unknown(receiver, mode):
    """R6.4: a server error, or a 404 without the "unseen" body (an endpoint that
    does not implement verification), is not proof: the effect stays unknown."""
    receiver.mode = mode
    result = verify_webhook({"url": receiver.url}, idempotency_key=KEY)
    assert result.effect == "unknown"
    assert result.output["seen"] is None
    assert [r["method"] for r in receiver.requests] == ["GET"]


def test_r6_4_verify_network_error_stays_unknown(refused_port):
    """R6.4: when verification cannot reach the receiver, nothing is proven."""
    url = f"http://127.0.0.1:{refused_port}/hook"
    result = verify_webhook({"url": url}, idempotency_key=KEY, timeout_s=2)
    assert result.effect == "unknown"


@pytest.mark.parametrize("url", ["ftp://example.com/hook", "", None])
def test_r6_4_verify_with_unusable_url_stays_unknown(url):
    """R6.4: a verification that cannot be made proves nothing: never "failed"."""
    assert verify_webhook({"url": url}, idempotency_key=KEY).effect == "unknown"


def test_r6_4_lost_answer_is_verified_not_replayed(receiver):
    """R6.4, R6.2: the receiver acted but the answer was lost (unknown); verification
    by the same key proves the effect, and no second POST was ever made."""
    receiver.mode = "hangup"
    args = {"url": receiver.url, "payload": {"event": "run.settled"}}
    assert webhook(args, idempotency_key=KEY).effect == "unknown"

    receiver.mode = "ok"
    verified = VERIFIERS["webhook"](args, idempotency_key=KEY)
    assert verified.effect == "succeeded"
    assert [r["method"] for r in receiver.requests] == ["POST", "GET"]


# ---------------------------------------------------------------------------
# registry and dispatch


def test_r4_1_tool_specs_describe_each_built_in_tool():
    """R4.1: every built-in tool has a spec the model can call by name."""
    assert set(TOOL_SPECS) == {"calculator", "kb_search", "webhook"} == set(tools.TOOLS)
    for name, spec in TOOL_SPECS.items():
        assert isinstance(spec, ToolSpec)
        assert spec.name == name
        assert spec.parameters["type"] == "object"
        assert set(spec.parameters["required"]) <= set(spec.parameters["properties"])
    assert {"webhook"} == EXTERNAL_TOOLS
    assert set(VERIFIERS) == EXTERNAL_TOOLS


def test_r4_1_run_tool_unknown_name_is_refused():
    """R4.1: a tool that does not exist is refused by the dispatcher, not a crash."""
    result = run_tool("rm_rf", {"path": "/"}, idempotency_key=KEY)
    assert result.effect == "refused"
    assert "rm_rf" in result.error


def test_r4_1_run_tool_dispatches_and_drops_options_a_tool_does_not_take(receiver):
    """R4.1: the runner passes one set of options; each tool takes what it uses."""
    calc = run_tool("calculator", {"expression": "6 * 7"}, idempotency_key=KEY, timeout_s=1.0)
    assert calc.output["result"] == 42
    hook = run_tool(
        "webhook",
        {"url": receiver.url, "payload": {}},
        idempotency_key=KEY,
        timeout_s=5.0,
        allowed_hosts=["localhost"],
    )
    assert hook.effect == "refused"
    assert receiver.requests == []
    assert run_tool("calculator", "1+1", idempotency_key=KEY).effect == "failed"  # type: ignore[arg-type]


def test_r4_1_run_tool_turns_an_unexpected_exception_into_the_tools_own_fact(monkeypatch):
    """R4.1, R4.2: an exception is the tool's failure — and for an external tool an
    unknown effect, since it may have acted first — never the run's end."""

    def boom(arguments, *, idempotency_key, **options):
        raise RuntimeError("bug")

    monkeypatch.setitem(tools.TOOLS, "calculator", boom)
    monkeypatch.setitem(tools.TOOLS, "webhook", boom)
    local = run_tool("calculator", {"expression": "1"}, idempotency_key=KEY)
    external = run_tool("webhook", {"url": "http://x", "payload": {}}, idempotency_key=KEY)
    assert (local.effect, local.external) == ("failed", False)
    assert (external.effect, external.external) == ("unknown", True)
    assert "RuntimeError: bug" in external.error
