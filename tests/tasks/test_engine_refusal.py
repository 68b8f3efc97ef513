"""R3.9 end to end: API → Redis → a real Celery worker → PostgreSQL, with an
injected clock. The refusing provider is either the scripted provider or the
OpenAI-compatible adapter talking to a loopback server that answers
``finish_reason: "content_filter"`` (its requests are counted at the server).
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from governance.models import Notification, Provider, ProviderAttempt, RunEvent, SegmentRefusal

pytestmark = pytest.mark.django_db(transaction=True)

TRIGGER = "TRIGGER-XYZ"

# Accepts the first turn with a tool call whose preface puts the trigger into the
# accepted history; from then on every request carries it and is refused.
REFUSER_SCRIPT = {
    "rules": [
        {"when": {"contains": TRIGGER}, "refuse": {"category": "policy"}},
        {
            "when": {"last_role_not": "tool", "has_tool": "calculator"},
            "tool_call": {
                "name": "calculator",
                "arguments": {"expression": "6*7"},
                "text": f"Checking the {TRIGGER} figures.",
            },
        },
    ],
    "default": {"answer": {"text": "refuser answered"}},
}
BACKUP_SCRIPT = {"default": {"answer": {"text": "Backup answer to: {last_user}", "chunks": 2}}}


class OpenAIRefuser(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat-completions server with the refuser's behaviour."""

    requests: list[dict] = []  # noqa: RUF012 (reset per test)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        text = json.dumps(body["messages"])
        last_role = body["messages"][-1]["role"]
        if TRIGGER in text:
            chunks = [{"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}]
        elif last_role != "tool":
            call = {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
            }
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant",
                              "content": f"Checking the {TRIGGER} figures."}}]},
                {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            ]  # fmt: skip
        else:
            chunks = [
                {"choices": [{"index": 0, "delta": {"content": "done"}}]},
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
def openai_server():
    OpenAIRefuser.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), OpenAIRefuser)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", OpenAIRefuser.requests
    server.shutdown()
    server.server_close()


@pytest.fixture(params=["scripted", "openai"])
def refuser(request, scripted_provider):
    """(provider, count of requests it received)."""
    if request.param == "scripted":
        provider = scripted_provider("refuser", REFUSER_SCRIPT)

        def count():
            return ProviderAttempt.objects.filter(provider=provider).count()

        return provider, count
    base_url, received = request.getfixturevalue("openai_server")
    provider = Provider.objects.create(
        provider_id="refuser", kind="openai", model="gpt-test", base_url=base_url,
        api_key_env="GOVERNANCE_KEY_REFUSER",
    )  # fmt: skip
    return provider, lambda: len(received)


def test_r3_9_acceptance_scenario_end_to_end(api, worker, manual_clock, refuser, scripted_provider):
    """R3.9 on the real turn path: 4, 4+3, still 4+3 after 100 h, two keys, +1."""
    _provider, requests_at_refuser = refuser
    scripted_provider("backup", BACKUP_SCRIPT)
    thread = api.post(
        "/api/v1/threads",
        {"provider_chain": ["refuser", "backup"], "tool_surface": ["calculator"],
         "title": "R3.9"},
        expect=201,
    ).json()  # fmt: skip
    segment_key = thread["segment"]["key"]

    first = api.run_and_wait(thread["id"], "Please check the figures.")
    assert first["settlement"]["outcome"] == "completed", first["settlement"]
    refused_turn = [
        a for a in first["attempts"] if a["provider_id"] == "refuser" and a["stage"] > 1
    ]
    assert [a["kind"] for a in refused_turn] == [
        "original",
        "re_render",
        "re_render",
        "history_only",
    ]
    baseline = requests_at_refuser() - 4  # the accepted first turn before the refusal
    assert requests_at_refuser() - baseline == 4
    assert first["body"].startswith("Backup answer")

    for step in (timedelta(minutes=15), timedelta(hours=1), timedelta(hours=6)):
        manual_clock.advance(step)
        run = api.run_and_wait(thread["id"], "And now?")
        assert run["settlement"]["outcome"] == "completed"
        assert [a["kind"] for a in run["attempts"] if a["provider_id"] == "refuser"] == ["re_probe"]
    assert requests_at_refuser() - baseline == 4 + 3
    state = SegmentRefusal.objects.get(segment__key=segment_key, provider_id="refuser")
    assert state.refusals == 4

    manual_clock.advance(hours=100)
    for _ in range(3):
        run = api.run_and_wait(thread["id"], "Still there?")
        assert run["settlement"]["outcome"] == "completed"
    assert requests_at_refuser() - baseline == 4 + 3  # not one more byte

    keys = sorted(
        Notification.objects.filter(dedupe_key__startswith="provider-refusal:").values_list(
            "dedupe_key", flat=True
        )
    )
    assert keys == [
        f"provider-refusal:{segment_key}:0:refuser",
        f"provider-refusal:{segment_key}:3:refuser",
    ]
    severities = dict(Notification.objects.values_list("dedupe_key", "severity"))
    assert severities[keys[1]] == "critical" and severities[keys[0]] == "normal"
    view = api.get(f"/api/v1/threads/{thread['id']}/segment").json()
    assert {p["provider_id"]: p["state"] for p in view["providers"]} == {
        "refuser": "frozen",
        "backup": "eligible",
    }

    boundary = api.post(
        f"/api/v1/threads/{thread['id']}/boundaries",
        {"kind": "tool_surface_change", "tool_surface": ["calculator", "kb_search"],
         "reason": "new tools", "idempotency_key": "r39-boundary"},
        expect=201,
    ).json()  # fmt: skip
    assert boundary["key"] != segment_key
    assert {p["state"] for p in boundary["providers"]} == {"eligible"}  # R3.8
    run = api.run_and_wait(thread["id"], "After the change?")
    assert run["segment"] == boundary["key"]
    assert requests_at_refuser() - baseline == 4 + 3 + 1
    assert run["settlement"]["outcome"] == "completed"


def test_r2_3_the_same_turn_is_not_sent_again_to_a_provider_that_refused_it(
    api, worker, manual_clock, scripted_provider
):
    """R2.3 on the real turn path: a re-probe refused 1 h ago is not sent the same
    turn again when the next re-probe falls due; a different turn is re-probed."""
    provider = scripted_provider(
        "refuser",
        {
            "rules": [{"when": {"contains": "TOXIC"}, "refuse": {"category": "policy"}}],
            "default": {"answer": {"text": "fine"}},
        },
    )
    thread = api.post(
        "/api/v1/threads", {"provider_chain": ["refuser"], "title": "R2.3"}, expect=201
    ).json()

    def sent() -> int:
        return ProviderAttempt.objects.filter(provider=provider).count()

    first = api.run_and_wait(thread["id"], "A TOXIC question.")
    assert first["settlement"]["outcome"] == "failed" and sent() == 1
    manual_clock.advance(minutes=15)
    probe = api.run_and_wait(thread["id"], "A TOXIC question.")  # the re-probe: refused
    assert [a["kind"] for a in probe["attempts"]] == ["re_probe"] and sent() == 2
    manual_clock.advance(hours=1)  # the next re-probe is due (R3.2) …
    same = api.run_and_wait(thread["id"], "A TOXIC question.")
    assert same["attempts"] == [] and sent() == 2  # … but not with the bytes just refused
    assert same["settlement"]["outcome"] == "failed"
    card = RunEvent.objects.get(run_id=same["id"], kind="llm-fallback").metadata
    assert [(h["provider_id"], h["state"]) for h in card["health"]] == [("refuser", "turn_refused")]
    refusal = SegmentRefusal.objects.get(provider_id="refuser")
    assert refusal.refusals == 2  # a skipped turn moves no clock (R3.3)
    other = api.run_and_wait(thread["id"], "A different TOXIC question.")
    assert [a["kind"] for a in other["attempts"]] == ["re_probe"] and sent() == 3
