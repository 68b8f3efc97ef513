"""The door finds a conversation without a session id by its messages (R1.1):
a request whose history is what a run of the same user answered, and that
run's answer, continues the run's thread; found by an index lookup."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from governance.models import ApiToken, Run, Segment, Thread
from governance.services.conversations import Message, prefix_of
from governance.services.tokens import token_digest
from tests.tasks.openai_door import sdk

pytestmark = pytest.mark.django_db(transaction=True)

OTHER_TOKEN = "door-other-token-" + "d" * 24


def converse(client, opening: str, turns: list[str]) -> list[dict]:
    said = [{"role": "user", "content": opening}]
    for text in [*turns, None]:
        answer = client.chat.completions.create(model="chat", messages=said)
        said.append({"role": "assistant", "content": answer.choices[0].message.content})
        if text:
            said.append({"role": "user", "content": text})
    return said


def test_without_a_session_id_a_continued_history_is_the_same_thread(live_server, worker, door):
    client = sdk(live_server)
    first = converse(client, "one", ["two", "three"])
    other = converse(client, "uno", ["dos"])
    assert Thread.objects.count() == 2
    by_title = {t.title: t for t in Thread.objects.all()}
    assert Run.objects.filter(thread=by_title["one"]).count() == 3
    assert Run.objects.filter(thread=by_title["uno"]).count() == 2
    assert Segment.objects.count() == 2  # no boundary: each history extended the accepted one
    assert [m["content"] for m in first][-1] == "Echo: three"
    assert other[-1]["content"] == "Echo: dos"


def test_another_users_identical_history_is_not_their_conversation(
    live_server, worker, door, make_user
):
    someone = make_user("someone-else", "agent-client")
    ApiToken.objects.create(user=someone, name="other", key_digest=token_digest(OTHER_TOKEN))
    said = converse(sdk(live_server), "hello", [])
    said.append({"role": "user", "content": "and then?"})
    sdk(live_server, OTHER_TOKEN).chat.completions.create(model="chat", messages=said)
    mine, theirs = Thread.objects.get(created_by=door), Thread.objects.get(created_by=someone)
    assert Run.objects.filter(thread=mine).count() == 1
    assert Run.objects.filter(thread=theirs, owner=someone).count() == 1


def test_a_conversation_forked_from_an_earlier_answer_is_a_new_session_of_its_thread(
    live_server, worker, door
):
    client = sdk(live_server)
    said = converse(client, "one", ["two"])
    forked = [*said[:2], {"role": "user", "content": "two, asked otherwise"}]
    answer = client.chat.completions.create(model="chat", messages=forked)
    assert answer.choices[0].message.content == "Echo: two, asked otherwise"
    thread = Thread.objects.get()  # found by the first answer's prefix
    first, second = Segment.objects.filter(thread=thread).order_by("opened_at", "id")
    assert (first.closed_kind, first.closed_by) == ("fresh_start", "openai-door")
    assert first.session_id != second.session_id


def test_the_prefix_is_found_through_its_index(door):
    """Finding a conversation costs the same with ten threads or a million:
    the lookup can be served by the ``run_client_prefix`` index."""
    digest = prefix_of([Message.of("user", "one")])
    query = (
        Run.objects.filter(owner=door, client_prefix=digest)
        .order_by("-created_at")
        .values_list("thread_id", flat=True)[:1]
    )
    sql, params = query.query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "run_client_prefix" in plan, plan
