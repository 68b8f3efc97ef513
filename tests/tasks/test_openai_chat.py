"""``POST /v1/chat/completions`` called by OpenAI's own Python SDK against the
live server, each request one run through the real Celery worker, the
providers real OpenAI-compatible HTTP servers on loopback."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest

import dashboard.api.events as events
from governance import time_source
from governance.models import Provider, Run, Segment, Thread
from tests.tasks.openai_door import TOKEN, TRIGGER, LoopbackProvider, history, sdk

pytestmark = pytest.mark.django_db(transaction=True)


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


def test_a_streamed_completion_sends_the_runs_chunks_then_done(live_server, worker, door):
    client = sdk(live_server)
    with client.chat.completions.with_streaming_response.create(
        model="chat", messages=[{"role": "user", "content": "stream me"}], stream=True,
        stream_options={"include_usage": True},
    ) as raw:  # fmt: skip
        run = Run.objects.get()
        assert raw.headers["X-Governance-Run-Id"] == str(run.id)
        lines = [line for line in raw.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert all(c["id"] == f"chatcmpl-{run.id}" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Echo: stream me"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 7
    assert chunks[-1]["model"] == "echo-1"  # the provider's model that answered
    # The owner's stream is delivery evidence (R7.2): its chunks were sent.
    assert run.chunks.exists() and not run.chunks.filter(sent_at__isnull=True).exists()


def test_the_sdk_reassembles_a_streamed_answer(live_server, worker, door):
    parts = sdk(live_server).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "again"}], stream=True
    )
    pieces = list(parts)
    assert "".join(p.choices[0].delta.content or "" for p in pieces if p.choices) == "Echo: again"
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_a_changed_system_prompt_is_a_prompt_change_boundary(live_server, worker, door):
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "conv-4"})
    said = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "one"}]
    answer = client.chat.completions.create(model="chat", messages=said)
    said[0] = {"role": "system", "content": "Be thorough."}
    said += [{"role": "assistant", "content": answer.choices[0].message.content},
             {"role": "user", "content": "two"}]  # fmt: skip
    client.chat.completions.create(model="chat", messages=said)
    first, second = Segment.objects.order_by("opened_at", "id")
    assert (first.closed_kind, first.closed_by) == ("prompt_change", "openai-door")
    assert first.session_id == second.session_id and second.system_prompt == "Be thorough."
    assert LoopbackProvider.requests[-1]["messages"][0] == {
        "role": "system", "content": "Be thorough.",
    }  # fmt: skip


def test_bad_input_names_its_param_and_writes_nothing(live_server, door):
    client = sdk(live_server)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model="chat", messages=[{"role": "assistant", "content": "hi"}]
        )
    assert refused.value.body["param"] == "messages"
    assert refused.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="chat", messages=[])
    assert refused.value.body["param"] == "messages"
    assert not Thread.objects.exists() and not Run.objects.exists()


def test_the_door_under_asgi_answers_and_streams(asgi_server, worker, door):
    client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    answer = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "asgi"}]
    )
    assert answer.choices[0].message.content == "Echo: asgi"
    pieces = list(
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "flow"}], stream=True
        )
    )
    assert "".join(p.choices[0].delta.content or "" for p in pieces if p.choices) == "Echo: flow"
    assert pieces[-1].choices[0].finish_reason == "stop"


def test_a_streamed_answer_is_sent_when_its_run_settles_not_at_the_next_poll(
    asgi_server, worker, door, monkeypatch
):
    """The stream hears the settlement its last chunks commit with (R7.2): with
    the new-event poll slowed past the client's patience (and the stream's own
    15 s keep-alive wake with it), the answer still comes: before, it waited
    for one of them."""
    monkeypatch.setattr(events, "POLL_S", 120.0)
    client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=TOKEN, max_retries=0, timeout=8)
    pieces = list(
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "prompt"}], stream=True
        )
    )
    assert "".join(p.choices[0].delta.content or "" for p in pieces if p.choices) == "Echo: prompt"
    assert Run.objects.get().chunks.get(chunk_no=1).sent_at is not None  # R7.2 evidence


def test_a_backed_up_turns_queue_is_a_rate_limit_with_retry_after(
    live_server, door, settings, monkeypatch
):
    from governance.services import admission
    from governance.services.broker import QueueState

    settings.GOVERNANCE_ADMISSION_MAX_QUEUED = 2
    monkeypatch.setattr(admission, "turns_queue", lambda: QueueState("turns", 9, 0.0))
    with pytest.raises(openai.RateLimitError) as refused:
        sdk(live_server).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}]
        )
    assert int(refused.value.response.headers["Retry-After"]) >= 1
    assert "not admitted now" in refused.value.body["message"]
    assert not Thread.objects.exists() and not Run.objects.exists()


def test_a_session_that_names_another_model_is_a_model_switch(
    live_server, worker, door, provider_server
):
    Provider.objects.create(
        provider_id="echo2", kind="openai", model="echo-2", base_url=provider_server,
        api_key_env="GOVERNANCE_KEY_ECHO",
    )  # fmt: skip
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "conv-5"})
    said = [{"role": "user", "content": "one"}]
    answer = client.chat.completions.create(model="chat", messages=said)
    said += [{"role": "assistant", "content": answer.choices[0].message.content},
             {"role": "user", "content": "two"}]  # fmt: skip
    answer = client.chat.completions.create(model="echo2", messages=said)
    assert answer.choices[0].message.content == "Echo: two"
    assert answer.model_extra["governance"]["provider_id"] == "echo2"
    thread = Thread.objects.get()
    assert thread.provider_chain == ["echo2"]
    first, second = Segment.objects.order_by("opened_at", "id")
    assert (first.closed_kind, first.closed_by) == ("model_switch", "openai-door")
    assert first.session_id == second.session_id and second.model == "echo-2"
    assert history(thread)[-2:] == [("user", "two"), ("assistant", "Echo: two")]


def test_a_client_that_goes_away_mid_stream_detaches_and_the_run_settles(asgi_server, worker, door):
    from governance.models import RunViewer

    LoopbackProvider.gate = threading.Event()
    client = openai.OpenAI(base_url=f"{asgi_server}/v1", api_key=TOKEN, max_retries=0, timeout=60)
    with client.chat.completions.with_streaming_response.create(
        model="chat", messages=[{"role": "user", "content": "wait for me"}], stream=True
    ) as raw:
        next(raw.iter_lines())  # the role chunk, then the client leaves
    run = Run.objects.get()
    until(lambda: RunViewer.objects.filter(run=run, state="detached").exists())
    run.refresh_from_db()
    assert run.status != Run.Status.SETTLED  # detached while the provider still works
    LoopbackProvider.gate.set()
    until(lambda: Run.objects.filter(id=run.id, status=Run.Status.SETTLED).exists())
    run.refresh_from_db()
    assert run.settlement.outcome == "completed" and run.cancel_requested_at is None


def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def test_another_method_is_a_405_in_openais_shape(live_server, door):
    import httpx

    answer = httpx.get(
        f"{live_server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert answer.status_code == 405 and answer.headers["Allow"] == "POST"
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_two_first_requests_of_one_new_session_share_one_thread(django_user_model):
    """The second waits for the first's thread (a lock on the session's name)
    instead of making its own and failing on the unique key."""
    from django.db import connection, transaction

    from governance.services.conversations import conversation_for_turn

    Provider.objects.create(provider_id="solo", kind="scripted", model="m", script={})
    user = django_user_model.objects.create_user("racer")
    first_inside, release = threading.Event(), threading.Event()
    found: dict[str, object] = {}

    def turn(name: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                conversation = conversation_for_turn(
                    user, session_key="race-1", client_model="solo", provider_chain=["solo"],
                    system_prompt="", client_tools="", earlier=[], title="t",
                    now=time_source.now(),
                )  # fmt: skip
                found[name] = conversation.thread.id
                if hold:
                    first_inside.set()
                    release.wait(10)
        except Exception as exc:  # the test reads it below
            found[name] = exc
        finally:
            connection.close()

    first = threading.Thread(target=turn, args=("first", True))
    first.start()
    assert first_inside.wait(10)
    second = threading.Thread(target=turn, args=("second", False))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting for the first's commit, not racing it
    release.set()
    first.join(10)
    second.join(10)
    assert found["first"] == found["second"], found
    assert Thread.objects.filter(client_session_key="race-1").count() == 1
