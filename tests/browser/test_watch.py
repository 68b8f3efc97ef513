"""The end-user watch page in real Chromium (R7.1–R7.3): a network drop loses and
duplicates nothing and cancels nothing; Stop is the only cancel."""

from __future__ import annotations

import time

import pytest

from dashboard.api import events as stream_views
from governance import services, time_source
from governance.models import BodyChunk, Provider, Run, RunViewer, Stage
from tests.tasks.conftest import worker  # noqa: F401  (a real Celery worker on Redis)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick_stream(monkeypatch):
    # The live server runs in this process: shorter polls and keep-alives make a
    # dead transport show up within the test's patience.
    monkeypatch.setattr(stream_views, "POLL_S", 0.1)
    monkeypatch.setattr(stream_views, "KEEPALIVE_S", 0.3)


@pytest.fixture
def run(outsider):
    Provider.objects.create(
        provider_id="scripted-primary", kind="scripted", model="m",
        script={"default": {"answer": {"text": "never used"}}},
    )  # fmt: skip
    thread = services.create_thread(provider_chain=["scripted-primary"], now=time_source.now())
    # The end user who asked (R7.1: they may stop their own run, whatever their role).
    the_run, _stage, _ = services.submit_run(
        thread, input="Explain the plan", now=time_source.now(), user=outsider
    )
    return the_run


def test_r7_1_a_manager_watching_cannot_stop_and_is_told_why(page_for, manager, run, client):
    page = page_for(manager.username)
    page.goto(page.url.rstrip("/") + f"/runs/{run.id}/watch")
    stop = page.get_by_role("button", name="Stop")
    assert stop.is_disabled()
    assert "can stop this run" in page.locator("#stop-why").inner_text()
    client.force_login(manager)
    response = client.post(f"/runs/{run.id}/stop")
    assert response.status_code == 403 and "cancel_run" in response.json()["error"]["message"]
    assert Run.objects.get(id=run.id).cancel_requested_at is None


def wait_until(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def committed_body(run) -> str:
    return "".join(
        BodyChunk.objects.filter(run=run, version__isnull=False).values_list("text", flat=True)
    )


def test_r7_1_r7_3_network_drop_mid_answer_loses_and_duplicates_nothing(
    page_for, outsider, run, shots, live_server
):
    parts = ["The plan has four parts. ", "First, gather the facts. ", "Second, decide. ",
             "Third, act. ", "Fourth, report back."]  # fmt: skip
    stages_before = Stage.objects.filter(run=run).count()
    services.commit_chunks(run, parts[:2], time_source.now())
    page = page_for(outsider.username)
    page.goto(f"{live_server.url}/runs/{run.id}/watch")
    answer = page.locator("#answer")
    # A locator, not wait_for_function: the eval that needs is refused by the page's CSP.
    page.locator("#answer", has_text="gather").wait_for()
    page.get_by_text("streaming").wait_for()
    shots(page, "1-streaming")

    page.context.set_offline(True)  # the network drops mid-answer
    page.get_by_text("detached, reconnecting…").wait_for()
    wait_until(
        lambda: RunViewer.objects.filter(run=run, state="detached").exists(), what="detached viewer"
    )
    services.commit_chunks(run, parts[2:4], time_source.now())  # committed while the page is away
    shots(page, "2-offline")
    time.sleep(1.0)
    page.context.set_offline(False)
    services.commit_chunks(run, parts[4:], time_source.now())
    page.locator("#answer", has_text="report back").wait_for()
    assert answer.text_content() == committed_body(run) == "".join(parts)  # no dup, no gap
    wait_until(
        lambda: BodyChunk.objects.filter(run=run, observed_at__isnull=False).count() == 5,
        what="observed acks for every committed chunk",
    )
    shots(page, "3-reconnected")
    observed = set(
        BodyChunk.objects.filter(run=run, observed_at__isnull=False).values_list(
            "chunk_no", flat=True
        )
    )
    committed = set(
        BodyChunk.objects.filter(run=run, version__isnull=False).values_list("chunk_no", flat=True)
    )
    assert observed == committed == {1, 2, 3, 4, 5}
    run.refresh_from_db()
    assert run.cancel_requested_at is None and run.status != Run.Status.SETTLED  # never cancelled
    assert Stage.objects.filter(run=run).count() == stages_before  # reconnect started no work
    assert RunViewer.objects.filter(run=run).count() >= 2  # it really reconnected


def test_r7_1_stop_button_settles_cancelled_and_keeps_committed_chunks(
    page_for,
    outsider,
    run,
    shots,
    live_server,
    worker,  # noqa: F811
):
    services.commit_chunks(run, ["Partial answer, ", "still going"], time_source.now())
    page = page_for(outsider.username)
    page.goto(f"{live_server.url}/runs/{run.id}/watch")
    page.locator("#answer", has_text="still going").wait_for()
    shots(page, "1-before-stop")
    page.get_by_role("button", name="Stop").click()
    page.get_by_text("settled: cancelled").wait_for(timeout=30_000)
    shots(page, "2-cancelled")
    run.refresh_from_db()
    assert run.settlement.outcome == "cancelled"
    assert run.cancel_requested_by == outsider.username
    assert committed_body(run) == "Partial answer, still going"
    assert page.locator("#answer").text_content() == "Partial answer, still going"


def test_r7_2_an_operator_watching_a_clients_run_is_an_onlooker(
    page_for, operator, run, shots, live_server
):
    """The answer streams to staff too, but nothing they see is the client's
    evidence: no chunk becomes sent or observed, no viewer is recorded, and
    the page asks no acks (it would be refused, not retried)."""
    services.commit_chunks(run, ["Seen by staff, ", "not by the client"], time_source.now())
    page = page_for(operator.username)
    acks = []
    page.on("request", lambda request: acks.append(request.url) if "/acks" in request.url else None)
    page.goto(f"{live_server.url}/runs/{run.id}/watch")
    page.locator("#answer", has_text="not by the client").wait_for()
    assert "someone else's run" in page.locator("#onlooker").inner_text()
    assert page.get_by_role("heading", name=f"Watching {run.owner.username}'s answer").is_visible()
    shots(page, "onlooker")
    # The page counts the parts it renders, and an owner's page asks its ack in
    # that same step: a quiet moment after the count shows no ack was asked.
    page.locator("#chunk-count", has_text="2").wait_for()
    page.wait_for_timeout(500)
    assert acks == []
    assert not RunViewer.objects.filter(run=run).exists()
    assert list(BodyChunk.objects.filter(run=run).values_list("sent_at", "observed_at")) == [
        (None, None),
        (None, None),
    ]
