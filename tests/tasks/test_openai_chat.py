"""``POST /v1/chat/completions`` called by OpenAI's own Python SDK against the
live server, each request one run through the real Celery worker, the
providers real OpenAI-compatible HTTP servers on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest

from governance import time_source
from governance.models import ApiToken, HistoryItem, Provider, Run, Segment, Thread
from governance.services import routes as route_services
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "door-chat-token-" + "c" * 24
TRIGGER = "FORBIDDEN-WORD"


class LoopbackProvider(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat-completions server: answers with the last user
    message echoed in two chunks, refuses (``content_filter``) any request
    carrying the trigger word."""

    requests: list[dict] = []  # noqa: RUF012 (reset per test)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        last_user = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        if TRIGGER in json.dumps(body["messages"]):
            chunks = [{"choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}]
        else:
            chunks = [
                {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Echo: "}}]},
                {"choices": [{"index": 0, "delta": {"content": last_user}}]},
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
            ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps({'model': 'echo-1', **chunk})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def provider_server():
    LoopbackProvider.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), LoopbackProvider)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


@pytest.fixture
def door(provider_server, make_user, monkeypatch):
    """A provider ``echo`` behind the route ``chat``; a client's token."""
    monkeypatch.setenv("GOVERNANCE_KEY_ECHO", "unused-key")
    Provider.objects.create(
        provider_id="echo", kind="openai", model="echo-1", base_url=provider_server,
        api_key_env="GOVERNANCE_KEY_ECHO",
    )  # fmt: skip
    route_services.create_route(
        name="chat", provider_chain=["echo"], by="tests", now=time_source.now()
    )
    user = make_user("door-client", "agent-client")
    ApiToken.objects.create(user=user, name="door", key_digest=token_digest(TOKEN))
    return user


def sdk(live_server, api_key: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{live_server.url}/v1", api_key=api_key, max_retries=0, timeout=60
    )


def history(thread: Thread) -> list[tuple[str, str]]:
    segment = Segment.objects.get(thread=thread, closed_at__isnull=True)
    return list(
        HistoryItem.objects.filter(session=segment.session)
        .order_by("seq")
        .values_list("role", "content")
    )


def test_a_plain_completion_is_one_governed_run(live_server, worker, door):
    raw = sdk(live_server).chat.completions.with_raw_response.create(
        model="chat",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        temperature=0.2,
    )
    answer = raw.parse()
    run = Run.objects.get()
    assert answer.id == f"chatcmpl-{run.id}"
    assert answer.object == "chat.completion"
    assert answer.model == "echo-1"
    assert answer.choices[0].message.content == "Echo: hi"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.prompt_tokens == 7 and answer.usage.completion_tokens == 3
    assert raw.headers["X-Governance-Run-Id"] == str(run.id)
    assert raw.headers["X-Governance-Thread-Id"] == str(run.thread_id)
    assert raw.headers["X-Governance-Segment"] == run.segment.key
    assert raw.headers["X-Governance-Run-Url"].endswith(f"/runs/{run.id}/")
    assert run.owner == door and run.thread.created_by == door
    assert run.thread.system_prompt == "Be brief." and run.thread.title == "hi"
    sent = LoopbackProvider.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "Be brief."}


def test_a_conversation_with_a_session_id_is_one_thread(live_server, worker, door):
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "conv-1"})
    said = [{"role": "user", "content": "one"}]
    for text in ("two", "three", None):
        answer = client.chat.completions.create(model="chat", messages=said)
        said.append({"role": "assistant", "content": answer.choices[0].message.content})
        if text:
            said.append({"role": "user", "content": text})
    thread = Thread.objects.get()
    assert thread.client_session_key == "conv-1"
    assert Run.objects.filter(thread=thread).count() == 3
    assert history(thread) == [(m["role"], m["content"]) for m in said]
    assert Segment.objects.filter(thread=thread).count() == 1
    # The provider was sent the accepted history, not the client's copy.
    assert LoopbackProvider.requests[-1]["messages"][-1] == {"role": "user", "content": "three"}


def test_an_edited_history_opens_a_new_session_from_the_clients_messages(live_server, worker, door):
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "conv-2"})
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "one"}])
    edited = [
        {"role": "user", "content": "one, edited"},
        {"role": "assistant", "content": "Echo: one"},
        {"role": "user", "content": "two"},
    ]
    answer = client.chat.completions.create(model="chat", messages=edited)
    assert answer.choices[0].message.content == "Echo: two"
    thread = Thread.objects.get()
    first, second = Segment.objects.filter(thread=thread).order_by("opened_at", "id")
    assert first.session_id != second.session_id
    assert (first.closed_kind, first.closed_by) == ("fresh_start", "openai-door")
    assert first.close_reason == "the client's history diverged at message 1"
    assert history(thread) == [(m["role"], m["content"]) for m in edited] + [
        ("assistant", "Echo: two")
    ]


def test_an_unknown_model_is_not_found_and_writes_nothing(live_server, door):
    with pytest.raises(openai.NotFoundError) as refused:
        sdk(live_server).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.body["code"] == "model_not_found"
    assert refused.value.body["param"] == "model"
    assert not Thread.objects.exists() and not Run.objects.exists()


def test_client_tools_are_refused_by_name_not_dropped(live_server, door):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        sdk(live_server).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], tools=[tool]
        )
    assert refused.value.body["param"] == "tools"
    assert "client tools are not governed by the door yet" in refused.value.body["message"]
    assert not Thread.objects.exists()


def test_a_bad_token_is_an_authentication_error(live_server, door):
    with pytest.raises(openai.AuthenticationError):
        sdk(live_server, "not-a-token").chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )


def test_a_refusal_of_the_only_provider_is_a_content_filter_naming_it(live_server, worker, door):
    answer = sdk(live_server).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": f"say {TRIGGER}"}]
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "content_filter"
    assert choice.message.content == ""
    assert "by echo" in choice.message.refusal
    assert "echo: cooling until" in choice.message.refusal
    assert "compact, fresh start or switch model" in choice.message.refusal


def test_a_repeated_idempotency_key_answers_the_first_run(live_server, worker, door):
    client = sdk(live_server).with_options(
        default_headers={"X-Session-Id": "conv-3", "Idempotency-Key": "k-1"}
    )
    messages = [{"role": "user", "content": "once"}]
    first = client.chat.completions.create(model="chat", messages=messages)
    again = client.chat.completions.create(model="chat", messages=messages)
    assert again.id == first.id and Run.objects.count() == 1
