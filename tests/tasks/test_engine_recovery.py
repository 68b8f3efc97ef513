"""R6.6: a stage a dead worker had, or whose message the broker lost, runs
again as soon as that is known — not after a fixed timer — and ahead of new
work. On the real Redis broker, with an injected clock: nothing here sleeps.
(tests/faults/ does the same with real processes killed and a real Redis
stopped.)"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from governance import services
from governance.models import Run, Stage, Thread
from governance.rules.claims import LostProcess
from governance.services.broker import BROKER_EPOCH_KEY, lane_keys, publish
from tasks.stages import run_stage
from tasks.stages.lost_process import lost_from, send_again
from tasks.stages.watchdog import lost_messages_pass, watchdog_pass
from tests.tasks.conftest import sent_stages

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42."}}}


@pytest.fixture
def threads(manual_clock, scripted_provider):
    scripted_provider("p", ANSWER)

    def make(count: int) -> list[Thread]:
        made = [
            services.create_thread(provider_chain=["p"], now=manual_clock()) for _ in range(count)
        ]
        return [Thread.objects.get(id=thread.id) for thread in made]

    return make


def _submit(thread: Thread, clock) -> Stage:
    """A run admitted and its first stage sent, as the API does."""
    _run, stage, _ = services.submit_run(thread, input="Hello", now=clock())
    publish([stage])
    return stage


def _messages(client, key: str) -> list[dict]:
    return [json.loads(raw) for raw in reversed(client.lrange(key, 0, -1))]


def _flush(client) -> None:
    """What FLUSHALL, or a restart without persistence, leaves: no queue, no epoch."""
    client.delete(*lane_keys("turns"), *lane_keys("tools"), BROKER_EPOCH_KEY)


def test_r6_6_a_flushed_broker_is_noticed_by_the_next_pass_and_its_stages_go_ahead(
    threads, manual_clock, broker_queue
):
    first, second, third = threads(3)
    lost = [_submit(first, manual_clock).id, _submit(second, manual_clock).id]
    _flush(broker_queue)
    fresh = _submit(third, manual_clock).id  # sent after the loss: it is in the broker
    manual_clock.advance(seconds=2)  # nowhere near GOVERNANCE_STAGE_RESEND_AFTER_SECONDS
    assert watchdog_pass()["republished"] == 2
    assert sorted(sent_stages(broker_queue, lane=0)) == sorted(lost)  # taken first
    assert sent_stages(broker_queue, lane=1) == [fresh]
    # The loss was handled once: the next pass finds their messages.
    assert watchdog_pass()["republished"] == 0
    assert run_stage(lost[0]) == "accepted"


def test_r6_6_a_worker_back_on_the_broker_has_the_lost_stages_sent_again_ahead(
    threads, manual_clock, broker_queue
):
    """A worker's connection came back: what it had taken and not started went
    with the old connection, and a send made during the outage failed. The
    broker kept everything else, so only the stages it no longer holds go."""
    first, second = threads(2)
    taken = _submit(first, manual_clock)
    waiting = _submit(second, manual_clock)
    _new_lane = lane_keys("turns")[1]
    broker_queue.lrem(_new_lane, 1, broker_queue.lindex(_new_lane, -1))  # the older one: taken
    assert sent_stages(broker_queue) == [waiting.id]
    assert lost_messages_pass() == 1
    assert sent_stages(broker_queue, lane=0) == [taken.id]
    assert sent_stages(broker_queue, lane=1) == [waiting.id]  # not sent twice
    assert lost_messages_pass() == 0


def test_r6_6_the_last_resort_timer_does_not_send_a_backlog_twice(
    threads, manual_clock, broker_queue, settings
):
    """Unclaimed for GOVERNANCE_STAGE_RESEND_AFTER_SECONDS but still in the
    queue: it waits in a backlog, its message is not lost."""
    (thread,) = threads(1)
    stage = _submit(thread, manual_clock)
    manual_clock.advance(seconds=settings.GOVERNANCE_STAGE_RESEND_AFTER_SECONDS + 1)
    assert watchdog_pass()["republished"] == 0
    assert sent_stages(broker_queue) == [stage.id]


def test_r6_6_a_holder_gone_from_this_host_is_noticed_by_the_next_pass(
    threads, manual_clock, broker_queue
):
    """The holder's process is gone (same host, same pid namespace, no such
    pid) while its lease still runs: the next pass sends the stage again,
    ahead of new work, and that delivery takes it over — no wait for the lease."""
    (thread,) = threads(1)
    stage = _submit(thread, manual_clock)
    broker_queue.delete(*lane_keys("turns"))  # its message was taken
    held = services.claim_stage(stage.id, manual_clock(), lease=timedelta(seconds=30))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host, namespace, _pid, token = held.holder.split("/")
    Stage.objects.filter(id=stage.id).update(holder=f"{host}/{namespace}/{gone.pid}/{token}")
    manual_clock.advance(seconds=1)
    assert watchdog_pass()["republished"] == 1
    assert sent_stages(broker_queue, lane=0) == [stage.id]
    assert run_stage(stage.id) == "accepted"
    assert Stage.objects.get(id=stage.id).deliveries == 2


def test_r6_6_a_dead_pool_process_is_named_by_its_parent_and_taken_over_on_any_host(
    threads, manual_clock, broker_queue
):
    """The worker's parent saw its pool process die: it sends the stage again
    ahead of new work, naming the process and when it died. The delivery takes
    over that process's claim at once even where the OS cannot tell (another
    host), and only that process's claim."""
    (thread,) = threads(1)
    stage = _submit(thread, manual_clock)
    broker_queue.delete(*lane_keys("turns"))
    held = services.claim_stage(stage.id, manual_clock(), lease=timedelta(seconds=30))
    _host, namespace, _pid, token = held.holder.split("/")
    elsewhere = f"elsewhere/{namespace}/4242"
    Stage.objects.filter(id=stage.id).update(holder=f"{elsewhere}/{token}")
    assert run_stage(stage.id) == "already handled"  # its lease runs; this host cannot tell
    other = LostProcess(f"elsewhere/{namespace}/4243", manual_clock())
    assert run_stage(stage.id, lost=other) == "already handled"  # another process died
    assert run_stage(stage.id, lost=LostProcess(elsewhere, manual_clock())) == "accepted"
    assert Stage.objects.get(id=stage.id).deliveries == 2


def test_r6_6_the_parent_sends_the_stage_again_ahead_naming_the_process(
    threads, manual_clock, broker_queue
):
    (thread,) = threads(1)
    stage = _submit(thread, manual_clock)
    broker_queue.delete(*lane_keys("turns"))
    send_again([stage.id], "turns", 4242)
    [message] = _messages(broker_queue, lane_keys("turns")[0])
    assert message["properties"]["priority"] == 0
    args, kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert args == [stage.id]
    lost = lost_from(**kwargs)
    host, namespace = services.new_holder().split("/")[:2]
    assert lost == LostProcess(f"{host}/{namespace}/4242", manual_clock())
    assert lost_from("", "") is None and lost_from("h/n/1", "not a time") is None


def test_r6_6_a_lost_delayed_stage_keeps_what_is_left_of_its_delay(
    threads, manual_clock, broker_queue
):
    """A stage sent with a delay (a recovery wait) whose message the broker
    lost is sent again with what is left of the delay, not early."""
    (thread,) = threads(1)
    stage = _submit(thread, manual_clock)
    Stage.objects.filter(id=stage.id).update(due_at=manual_clock() + timedelta(seconds=40))
    broker_queue.delete(*lane_keys("turns"))
    manual_clock.advance(seconds=10)
    before = datetime.now(UTC)
    assert lost_messages_pass() == 1
    [message] = _messages(broker_queue, lane_keys("turns")[0])
    eta = datetime.fromisoformat(message["headers"]["eta"])
    assert before + timedelta(seconds=29) <= eta <= datetime.now(UTC) + timedelta(seconds=30)


def test_r6_6_a_delayed_follow_up_records_when_it_is_due(threads, manual_clock):
    (thread,) = threads(1)
    stage = _submit(thread, manual_clock)
    run = Run.objects.get(id=stage.run_id)
    from governance.rules.payloads import TurnPayload

    later = services.enqueue_stage(run, "model_turn", TurnPayload(), manual_clock(), delay_s=30)
    at_once = services.enqueue_stage(run, "model_turn", TurnPayload(), manual_clock())
    assert later.due_at == manual_clock() + timedelta(seconds=30)
    assert at_once.due_at is None


def test_r6_6_a_worker_connecting_to_the_broker_asks_for_the_lost_messages_pass(
    broker_queue,
):
    """At its start and after every outage, a worker's consumer asks for the
    pass, ahead of new work (tasks/celery.py's consumer step)."""
    from tasks.celery import BrokerConnected
    from tasks.jobs import LOST_MESSAGES_TASK

    BrokerConnected(parent=None).start(parent=None)
    [message] = _messages(broker_queue, lane_keys("maintenance")[0])
    assert message["headers"]["task"] == LOST_MESSAGES_TASK


def test_r6_6_a_pool_process_lost_under_a_task_is_the_pid_in_its_holder(threads, manual_clock):
    """The name the parent gives is the one the claim wrote (host/namespace/pid)."""
    (thread,) = threads(1)
    stage = _submit(thread, manual_clock)
    held = services.claim_stage(stage.id, manual_clock(), lease=timedelta(seconds=30))
    lost = services.lost_process(os.getpid(), manual_clock())
    assert held.holder.startswith(lost.process + "/")
