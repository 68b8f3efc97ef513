"""Registry tools end to end: API → Redis → a real Celery worker → PostgreSQL, with
an OpenAI-compatible model on loopback and a real MCP server (the SDK's
MCPServer under uvicorn). The model asks for ``files.read`` (on the wire
``files__read``), reads the result, then answers; an external-effect MCP tool
that times out is settled honestly with its effect unknown, never replayed
(R6.2, R6.4); the run page shows each call with its server, schema version,
latency, effect and receipt."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth.models import Permission

from governance.models import BudgetEntry, Provider, ProviderAttempt, Settlement, ToolReceipt
from tests.tool_servers import McpRecord, UvicornThread, files_server

pytestmark = pytest.mark.django_db(transaction=True)


class ToolModel(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat-completions server: calls ``tool`` (its wire
    name) with ``arguments`` until a tool result is in the request, then answers
    with what the tool said."""

    requests: list[dict] = []  # noqa: RUF012
    tool = "files__read"
    arguments: dict = {}  # noqa: RUF012

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        last = body["messages"][-1]
        if last["role"] != "tool":
            call = {
                "index": 0, "id": f"call_{len(type(self).requests)}", "type": "function",
                "function": {"name": type(self).tool,
                             "arguments": json.dumps(type(self).arguments)},
            }  # fmt: skip
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            ]
        else:
            answer = f"The tool said: {last['content']}"
            chunks = [
                {"choices": [{"index": 0, "delta": {"content": answer}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def model():
    ToolModel.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ToolModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Provider.objects.create(
        provider_id="oa", kind="openai", model="gpt-test",
        base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
    )  # fmt: skip
    yield ToolModel
    server.shutdown()
    server.server_close()


@pytest.fixture
def files():
    record = McpRecord()
    with UvicornThread(files_server(record, hang_s=4).streamable_http_app()) as running:
        yield f"http://127.0.0.1:{running.port}/mcp", record


@pytest.fixture
def registered(api, files, django_user_model):
    url, record = files
    user = django_user_model.objects.get(username="engine")
    user.user_permissions.add(Permission.objects.get(codename="change_toolserver"))
    api.post(
        "/api/v1/tools", {"name": "files", "kind": "mcp", "url": url, "timeout_s": 1.0},
        expect=201,
    )  # fmt: skip
    thread = api.post(
        "/api/v1/threads", {"provider_chain": ["oa"], "tool_surface": ["files.*"]}, expect=201
    ).json()
    return thread, record


def test_an_agent_loop_reads_a_file_over_mcp_and_answers(
    api, worker, manual_clock, model, registered, client, django_user_model
):
    thread, record = registered
    model.tool, model.arguments = "files__read", {"path": "notes.txt"}
    run = api.run_and_wait(thread["id"], "What is in notes.txt?")

    assert run["settlement"]["outcome"] == "completed"
    assert record.reads == ["notes.txt"]
    first, second = model.requests
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert {"files__read", "files__write", "files__slow_send"} <= set(offered)
    assert offered["files__read"]["parameters"]["required"] == ["path"]
    # The result entered the next request as a tool message, under the wire name.
    assert second["messages"][-2]["tool_calls"][0]["function"]["name"] == "files__read"
    assert second["messages"][-1]["role"] == "tool"
    assert "contents of notes.txt" in second["messages"][-1]["content"]

    (receipt,) = run["receipts"]
    assert receipt["tool"] == "files.read" and receipt["effect"] == "succeeded"
    assert receipt["server"] == "files" and receipt["schema_version"] == 1
    assert receipt["effect_class"] == "read_only" and receipt["latency_ms"] is not None
    row = ToolReceipt.objects.get(run_id=run["id"])
    assert row.result["content"] == "contents of notes.txt"
    # The budget admitted the call before it was made (R5.2).
    assert BudgetEntry.objects.filter(account__run_id=run["id"], resource="tool_calls").count() == 1
    # The wire-name mapping is recorded on the provider attempts.
    for attempt in ProviderAttempt.objects.filter(run_id=run["id"]):
        assert attempt.tool_names["files.read"] == "files__read"

    client.force_login(django_user_model.objects.get(username="engine"))
    page = client.get(f"/runs/{run['id']}/").content.decode()
    assert "files.read" in page and "schema v1" in page and "read-only" in page
    assert " ms</td>" in page and "succeeded" in page


def test_r6_4_an_external_mcp_tool_that_times_out_is_settled_unknown_not_replayed(
    api, worker, manual_clock, model, registered
):
    thread, record = registered
    model.tool, model.arguments = "files__slow_send", {"n": 7}
    run = api.run_and_wait(thread["id"], "Send it")

    assert record.hangs == [7]  # exactly one call reached the server: no blind replay
    (receipt,) = run["receipts"]
    assert receipt["tool"] == "files.slow_send" and receipt["effect"] == "unknown"
    assert receipt["effect_class"] == "external_effect"
    assert "not known" in receipt["error"]
    paths = [d["path"] for d in run["lifecycle"]]
    assert "verify_effect" in paths
    settlement = Settlement.objects.get(run_id=run["id"])
    assert settlement.outcome != "completed"
    assert receipt["idempotency_key"] in json.dumps(settlement.unknown_effects)
    assert len(model.requests) == 1  # the model was not asked to go on as if it had worked
    assert "stay unknown and were not replayed" in settlement.reason
    assert receipt["idempotency_key"] in settlement.reason


def test_r6_4_an_http_tool_whose_answer_was_lost_is_verified_by_key_not_replayed(
    api, worker, manual_clock, model, django_user_model
):
    from tests.tool_servers import HttpToolServer

    user = django_user_model.objects.get(username="engine")
    user.user_permissions.add(Permission.objects.get(codename="change_toolserver"))
    with HttpToolServer() as tools:
        tools.handler.drop_first_answer = True  # it acts, and the answer is lost
        api.post(
            "/api/v1/tools",
            {"name": "notify", "kind": "http", "url": tools.url + "/send", "method": "POST",
             "description": "Notify a team", "effect": "external_effect",
             "parameters": {"type": "object", "properties": {"to": {"type": "string"}},
                            "required": ["to"]},
             "verify_url": tools.url + "/verify"},
            expect=201,
        )  # fmt: skip
        thread = api.post(
            "/api/v1/threads", {"provider_chain": ["oa"], "tool_surface": ["notify"]}, expect=201
        ).json()
        model.tool, model.arguments = "notify", {"to": "ops"}
        run = api.run_and_wait(thread["id"], "Tell ops")
        posts = [s for s in tools.handler.seen if s["method"] == "POST"]
        gets = [s for s in tools.handler.seen if s["method"] == "GET"]

    (receipt,) = run["receipts"]
    assert len(posts) == 1  # never replayed: the verification proved it happened
    assert posts[0]["headers"]["Idempotency-Key"] == receipt["idempotency_key"]
    assert [g["query"]["idempotency_key"] for g in gets] == [receipt["idempotency_key"]]
    assert receipt["effect"] == "succeeded" and receipt["verified_at"]
    assert receipt["server"] == "notify" and receipt["effect_class"] == "external_effect"
    assert [d["path"] for d in run["lifecycle"]][:3] == ["continue", "verify_effect", "continue"]
    assert run["settlement"]["outcome"] == "completed"
