"""LangChain's ``ChatOpenAI``, unchanged but for its base URL and key, against
the OpenAI-compatible door on the live server: each call one governed run
through the real Celery worker, the provider a loopback OpenAI-compatible
server that records what it was sent."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from governance.models import Run, Segment, Thread
from tests.tasks.openai_door import TOKEN, LoopbackProvider, history

pytestmark = pytest.mark.django_db(transaction=True)


def chat_model(live_server, **options) -> ChatOpenAI:
    return ChatOpenAI(
        model="chat", base_url=f"{live_server.url}/v1", api_key=TOKEN, max_retries=0,
        timeout=60, **options,
    )  # fmt: skip


def test_an_invoke_is_one_governed_run(live_server, worker, door):
    """R1.1: the thread's first turn; the provider is sent the system prompt and
    the user's message, and the answer comes back in LangChain's shape."""
    reply = chat_model(live_server).invoke([SystemMessage("Be brief."), HumanMessage("hi")])
    run = Run.objects.get()
    assert isinstance(reply, AIMessage) and reply.content == "Echo: hi"
    assert reply.response_metadata["id"] == f"chatcmpl-{run.id}"
    assert reply.response_metadata["finish_reason"] == "stop"
    assert reply.response_metadata["model_name"] == "echo-1"  # the model that answered
    assert reply.usage_metadata["input_tokens"] == 7
    assert reply.usage_metadata["output_tokens"] == 3
    assert run.status == Run.Status.SETTLED and run.settlement.outcome == "completed"
    assert run.owner == door and run.thread.system_prompt == "Be brief."
    assert history(run.thread) == [("user", "hi"), ("assistant", "Echo: hi")]
    assert LoopbackProvider.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


def test_a_stream_is_reassembled_from_the_runs_chunks(live_server, worker, door):
    """R7.2: the chunks LangChain adds up are the run's committed chunks, each
    recorded as sent to the owner's stream; the usage chunk comes last."""
    pieces = list(chat_model(live_server, stream_usage=True).stream("stream me"))
    assert all(isinstance(piece, AIMessageChunk) for piece in pieces)
    whole = pieces[0]
    for piece in pieces[1:]:
        whole += piece
    run = Run.objects.get()
    assert whole.content == "Echo: stream me"
    assert whole.response_metadata["finish_reason"] == "stop"
    assert whole.usage_metadata["input_tokens"] == 7
    assert whole.response_metadata["model_name"] == "echo-1"
    assert run.settlement.outcome == "completed"
    assert "".join(run.chunks.order_by("chunk_no").values_list("text", flat=True)) == whole.content
    assert not run.chunks.filter(sent_at__isnull=True).exists()
    assert LoopbackProvider.requests[-1]["messages"] == [{"role": "user", "content": "stream me"}]


def test_a_conversation_with_a_session_header_is_one_thread(live_server, worker, door):
    """R1.1, R1.3: three turns, the client resending its history each time with
    ``X-Session-Id`` in ``default_headers``: one thread, one segment, its
    accepted history the conversation, the provider sent that history."""
    llm = chat_model(live_server, default_headers={"X-Session-Id": "lc-conv-1"})
    said = [SystemMessage("Be brief."), HumanMessage("one")]
    for text in ("two", "three"):
        said += [llm.invoke(said), HumanMessage(text)]
    last = llm.invoke(said)
    assert last.content == "Echo: three"
    thread = Thread.objects.get()
    assert thread.client_session_key == "lc-conv-1" and thread.title == "one"
    assert Segment.objects.filter(thread=thread).count() == 1
    runs = Run.objects.filter(thread=thread)
    assert runs.count() == 3 and {r.settlement.outcome for r in runs} == {"completed"}
    role = {"human": "user", "ai": "assistant"}
    expected = [(role[m.type], m.content) for m in [*said[1:], last]]
    assert history(thread) == expected
    sent = LoopbackProvider.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": "Be brief."}
    assert [(m["role"], m["content"]) for m in sent[1:]] == expected[:-1]
