"""R6.7: queues by kind, and new runs refused with 429 while the turns
queue is backed up — on the real Redis broker, with an injected clock."""

from __future__ import annotations

import json

import pytest

from governance.models import Run, Stage
from governance.services.broker import lane_keys, publish, queue_states
from tests.tasks.conftest import every_queue_key

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queues(settings):
    import redis

    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    client.delete(*every_queue_key(settings))
    yield client
    client.delete(*every_queue_key(settings))


def _thread(api, scripted_provider):
    scripted_provider("p", {"default": {"answer": {"text": "fine"}}})
    return api.post("/api/v1/threads", {"provider_chain": ["p"]}, expect=201).json()


def _submit(api, thread, key):
    return api.post(f"/api/v1/threads/{thread['id']}/runs", {"input": "hi", "idempotency_key": key})


def test_r6_7_stages_go_to_the_queue_of_their_kind(api, manual_clock, scripted_provider, queues):
    thread = _thread(api, scripted_provider)
    assert _submit(api, thread, "k-1").status_code == 202
    stage = Stage.objects.get()
    from django.db import transaction

    with transaction.atomic():
        tool = Stage.objects.create(
            run=stage.run, seq=2, kind=Stage.Kind.TOOL_CALL, payload={}, enqueued_at=manual_clock()
        )
        publish([tool])
    turns_ahead, turns_new = lane_keys("turns")
    tools_ahead, tools_new = lane_keys("tools")
    names = {name.decode() for name in queues.keys("*") if queues.type(name) == b"list"}
    assert {turns_new, tools_new} <= names  # new work: the second lane
    assert not {turns_ahead, tools_ahead} & names
    [turn] = queues.lrange(turns_new, 0, -1)
    [tool_message] = queues.lrange(tools_new, 0, -1)
    assert json.loads(turn)["headers"]["argsrepr"] == f"[{stage.id}]"
    assert json.loads(tool_message)["headers"]["argsrepr"] == f"[{tool.id}]"


def test_r6_6_r6_7_a_stage_sent_again_goes_ahead_of_new_work_and_still_counts(
    api, manual_clock, scripted_provider, queues
):
    """The first lane of a queue is taken before the second (kombu's Redis
    priorities); the queue's depth and oldest wait count both."""
    thread = _thread(api, scripted_provider)
    assert _submit(api, thread, "new").status_code == 202
    stage = Stage.objects.get()
    manual_clock.advance(seconds=5)
    publish([stage], ahead=True)
    ahead, new = lane_keys("turns")
    assert ahead == "turns" and queues.llen(ahead) == 1 and queues.llen(new) == 1
    [turns] = [q for q in queue_states() if q.name == "turns"]
    assert (turns.depth, turns.oldest_age_s) == (2, 5.0)
    from tasks.celery import app

    with app.connection_for_write() as conn:
        taken = conn.SimpleQueue("turns", no_ack=True).get(timeout=5)
    assert taken.properties["priority"] == 0 and queues.llen(ahead) == 0


def test_r6_7_a_backed_up_turns_queue_answers_429_with_retry_after_and_writes_nothing(
    api, manual_clock, scripted_provider, queues, settings
):
    settings.GOVERNANCE_ADMISSION_MAX_QUEUE_AGE_SECONDS = 120
    thread = _thread(api, scripted_provider)
    assert _submit(api, thread, "first").status_code == 202  # queued, no worker takes it
    manual_clock.advance(seconds=130)
    [turns] = [q for q in queue_states() if q.name == "turns"]
    assert (turns.depth, turns.oldest_age_s) == (1, 130.0)

    refused = _submit(api, thread, "second")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "10"  # 10 s over the bound
    body = refused.json()
    assert "not admitted now" in body["error"]["message"] and "130 s" in body["error"]["message"]
    assert Run.objects.count() == 1 and Stage.objects.count() == 1  # nothing written

    # A repeat of the admitted run is answered, not refused.
    assert _submit(api, thread, "first").status_code == 200

    queues.delete(*lane_keys("turns"))  # a worker took the backlog
    assert _submit(api, thread, "second").status_code == 202


def test_r6_7_a_long_turns_queue_answers_429(
    api, manual_clock, scripted_provider, queues, settings
):
    settings.GOVERNANCE_ADMISSION_MAX_QUEUED = 2
    thread = _thread(api, scripted_provider)
    for key in ("a", "b"):
        assert _submit(api, thread, key).status_code == 202
    assert _submit(api, thread, "c").status_code == 202  # two waiting: at the bound
    refused = _submit(api, thread, "d")
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert "3 waiting stages" in refused.json()["error"]["message"]


def test_r6_7_healthz_reports_each_queue_depth_and_oldest_wait(
    client, api, manual_clock, scripted_provider, queues
):
    thread = _thread(api, scripted_provider)
    assert _submit(api, thread, "h").status_code == 202
    manual_clock.advance(seconds=42)
    report = client.get("/healthz").json()["queues"]
    assert set(report) == {"alerts", "turns", "tools", "callbacks", "maintenance"}
    assert report["turns"] == {"depth": 1, "oldest_age_seconds": 42.0}
    assert report["alerts"] == {"depth": 0, "oldest_age_seconds": 0.0}


def test_r6_7_backpressure_is_on_by_default():
    import dashboard.site.settings as configured  # the module, not the suite's override

    assert configured.GOVERNANCE_ADMISSION_MAX_QUEUE_AGE_SECONDS == 120
    assert configured.GOVERNANCE_ADMISSION_MAX_QUEUED == 5000
