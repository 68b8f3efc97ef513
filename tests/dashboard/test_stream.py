"""The run stream (R7.1–R7.3): SSE events, Last-Event-ID replay, sent/observed facts, viewers."""

from __future__ import annotations

import json
import threading

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient

from dashboard.api import events as stream_views
from governance import services, time_source
from governance.models import BodyChunk, Run, RunEvent, RunViewer, Stage
from governance.rules.settlement import Outcome, ReasonCode, Settlement
from tests import facts as written
from tests.dashboard.conftest import CLIENT_AUTH

pytestmark = pytest.mark.django_db(transaction=True)
AUTH = CLIENT_AUTH


@pytest.fixture(autouse=True)
def fast_stream(monkeypatch):
    monkeypatch.setattr(stream_views, "POLL_S", 0.05)
    monkeypatch.setattr(stream_views, "KEEPALIVE_S", 0.3)


def settle(run, outcome=Outcome.COMPLETED, code=ReasonCode.ANSWERED):
    written.settle(run, Settlement(outcome, code, "done for the test"), time_source.now())


def parse(raw: bytes) -> list[tuple[int, dict]]:
    events = []
    for block in raw.decode().split("\n\n"):
        lines = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if "id" in lines:
            data = json.loads(lines["data"])
            events.append((int(lines["id"]), {**data["metadata"], "kind": data["kind"]}))
    return events


def read_all(client, run, **headers) -> list[tuple[int, dict]]:
    response = client.get(f"/api/v1/runs/{run.id}/events", headers={**AUTH, **headers})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    return parse(b"".join(response.streaming_content))


def test_r7_1_settled_run_replays_events_in_order_with_ids_and_closes(client, token_user, run):
    services.commit_chunks(run, ["Hello, ", "world", "!"], time_source.now())
    settle(run)
    events = read_all(client, run)  # returns: the stream closed by itself
    expected = list(RunEvent.objects.filter(run=run).order_by("id").values_list("id", "kind"))
    assert [(i, e["kind"]) for i, e in events] == expected
    assert [e["chunk_no"] for _i, e in events if e["kind"] == "chunk"] == [1, 2, 3]
    assert [e["version"] for _i, e in events if e["kind"] == "chunk"] == [1, 2, 3]
    assert events[-1][1]["kind"] == "settlement" and events[-1][1]["outcome"] == "completed"
    viewer = RunViewer.objects.get(run=run)
    assert viewer.state == "settled" and viewer.disconnected_at is not None  # replay ended


def test_r7_1_last_event_id_replays_exactly_the_missed_events(client, token_user, run):
    services.commit_chunks(run, ["a", "b", "c", "d"], time_source.now())
    settle(run)
    ids = list(RunEvent.objects.filter(run=run).order_by("id").values_list("id", flat=True))
    seen = ids[1]
    by_header = read_all(client, run, **{"Last-Event-ID": str(seen)})
    assert [i for i, _e in by_header] == ids[2:]
    by_query = parse(
        b"".join(
            client.get(
                f"/api/v1/runs/{run.id}/events?last_event_id={ids[3]}", headers=AUTH
            ).streaming_content
        )
    )
    assert [i for i, _e in by_query] == ids[4:]


def test_r7_1_async_path_streams_a_settled_run_and_closes(token_user, run):
    services.commit_chunks(run, ["one ", "two"], time_source.now())
    settle(run, Outcome.PARTIAL, ReasonCode.ANSWERED)

    async def fetch():
        response = await AsyncClient().get(f"/api/v1/runs/{run.id}/events", headers=AUTH)
        assert response.status_code == 200
        return b"".join([part async for part in response.streaming_content])

    events = parse(async_to_sync(fetch)())
    assert [e["kind"] for _i, e in events][-1] == "settlement"
    assert [e["text"] for _i, e in events if e["kind"] == "chunk"] == ["one ", "two"]
    assert BodyChunk.objects.filter(run=run, sent_at__isnull=False).count() == 2


def test_r7_2_sent_is_recorded_once_per_chunk(client, token_user, run):
    services.commit_chunks(run, ["x", "y"], time_source.now())
    settle(run)
    read_all(client, run)
    first = dict(BodyChunk.objects.filter(run=run).values_list("chunk_no", "sent_at"))
    assert all(first.values())
    read_all(client, run)  # a replay writes again but does not move the fact
    assert dict(BodyChunk.objects.filter(run=run).values_list("chunk_no", "sent_at")) == first


def test_r7_2_uncommitted_chunk_is_never_marked_sent(run):
    from governance.services import stream as services_stream

    BodyChunk.objects.create(run=run, chunk_no=1, text="draft", generated_at=time_source.now())
    assert services_stream.mark_chunks_sent(run.id, [1], now=time_source.now()) == 0


def ack(client, run, through, **headers):
    return client.post(
        f"/api/v1/runs/{run.id}/acks", data=json.dumps({"through": through}),
        content_type="application/json", headers={**AUTH, **headers},
    )  # fmt: skip


def test_r7_3_acks_are_idempotent_and_observed_stays_within_committed(client, token_user, run):
    services.commit_chunks(run, ["a", "b", "c"], time_source.now())
    first = ack(client, run, 2)
    assert first.status_code == 200, first.content
    assert first.json()["observed"] == 2 and first.json()["newly_observed"] == 2
    stamps = dict(BodyChunk.objects.filter(run=run).values_list("chunk_no", "observed_at"))
    again = ack(client, run, 2).json()
    assert again["observed"] == 2 and again["newly_observed"] == 0
    assert ack(client, run, 1).json()["observed"] == 2  # a stale, lower ack changes nothing
    assert dict(BodyChunk.objects.filter(run=run).values_list("chunk_no", "observed_at")) == stamps
    beyond = ack(client, run, 5)
    assert beyond.status_code == 400 and beyond.json()["error"]["field"] == "through"
    observed = set(
        BodyChunk.objects.filter(run=run, observed_at__isnull=False).values_list(
            "chunk_no", flat=True
        )
    )
    committed = set(
        BodyChunk.objects.filter(run=run, version__isnull=False).values_list("chunk_no", flat=True)
    )
    assert observed == {1, 2} and observed <= committed
    assert ack(client, run, 3).json()["observed"] == 3
    for bad in ("3", -1, True):
        assert ack(client, run, bad).status_code == 400


def test_r7_1_disconnect_detaches_the_viewer_and_never_cancels_or_starts_work(
    client, token_user, run
):
    services.commit_chunks(run, ["first part "], time_source.now())
    stages_before = list(Stage.objects.filter(run=run).values_list("id", "started_at"))
    response = client.get(f"/api/v1/runs/{run.id}/events", headers=AUTH)
    parts = iter(response.streaming_content)
    got = b""
    while b"first part" not in got:
        got += next(parts)
    viewer = RunViewer.objects.get(run=run)
    assert viewer.state == "running" and viewer.disconnected_at is None
    seen = max(i for i, _e in parse(got))  # what the client saw
    response.close()  # the transport went away
    viewer.refresh_from_db()
    assert viewer.state == "detached" and viewer.disconnected_at is not None
    run.refresh_from_db()
    assert run.cancel_requested_at is None and run.status != Run.Status.SETTLED
    # Reconnect: replays only what was missed, starts no new work.
    services.commit_chunks(run, ["second part"], time_source.now())
    response = client.get(
        f"/api/v1/runs/{run.id}/events",
        headers={**AUTH, "Last-Event-ID": str(seen)},
    )
    parts = iter(response.streaming_content)
    got = b""
    while b"second part" not in got:
        got += next(parts)
    assert b"first part" not in got
    response.close()
    assert list(Stage.objects.filter(run=run).values_list("id", "started_at")) == stages_before
    assert run.attempts.count() == 0
    assert RunViewer.objects.filter(run=run, state="detached").count() == 2
    run.refresh_from_db()
    assert run.cancel_requested_at is None


def test_r7_1_live_stream_delivers_chunks_committed_while_watching(client, token_user, run):
    response = client.get(f"/api/v1/runs/{run.id}/events", headers=AUTH)
    parts = iter(response.streaming_content)
    next(parts)  # connected
    timer = threading.Timer(0.2, lambda: services.commit_chunks(run, ["late"], time_source.now()))
    timer.start()
    got = b""
    while b"late" not in got:
        got += next(parts)
    timer.join()
    next(parts)  # the server resumes once the write is done: that records sent
    response.close()
    assert BodyChunk.objects.get(run=run, chunk_no=1).sent_at is not None


def test_r7_1_stream_and_acks_need_a_token_or_a_session(client, run, make_user):
    assert client.get(f"/api/v1/runs/{run.id}/events").status_code == 401
    assert (
        client.get(
            f"/api/v1/runs/{run.id}/events", headers={"Authorization": "Bearer nope"}
        ).status_code
        == 401
    )
    assert (
        client.post(
            f"/api/v1/runs/{run.id}/acks", data="{}", content_type="application/json"
        ).status_code
        == 401
    )
    assert not RunViewer.objects.exists()
    services.commit_chunks(run, ["a"], time_source.now())
    settle(run)
    client.login(username="client", password="unused-password-1")  # the run's owner
    response = client.get(f"/api/v1/runs/{run.id}/events")
    assert response.status_code == 200
    assert b"settlement" in b"".join(response.streaming_content)
    assert client.get(f"/runs/{run.id}/watch").status_code == 200


def test_r7_3_session_acks_need_the_csrf_header(run):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.login(username="client", password="unused-password-1")  # the run's owner
    services.commit_chunks(run, ["a"], time_source.now())
    page = browser.get(f"/runs/{run.id}/watch")
    token = page.context["csrf_token"]
    body = json.dumps({"through": 1})
    url = f"/api/v1/runs/{run.id}/acks"
    assert browser.post(url, data=body, content_type="application/json").status_code == 403
    ok = browser.post(
        url, data=body, content_type="application/json", headers={"X-CSRFToken": str(token)}
    )
    assert ok.status_code == 200 and ok.json()["observed"] == 1
