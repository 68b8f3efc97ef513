"""Faults that must cost no answer, in one process: a broker that refuses the
publish, a run whose stored values make a rule raise, a stage whose facts
cannot be read. (tests/faults/ kills and restarts real servers.)"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
from django.urls import reverse

from governance import services
from governance.models import Run, RunEvent, Stage, Thread
from governance.services.broker import lane_keys
from tasks.celery import app as celery_app
from tasks.stages import run_stage, watchdog_pass
from tests.tasks.conftest import sent_stages

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42."}}}


@pytest.fixture
def thread(manual_clock, scripted_provider):
    scripted_provider("p", ANSWER)
    created = services.create_thread(provider_chain=["p"], now=manual_clock())
    return Thread.objects.get(id=created.id)


@pytest.fixture
def broker_down(settings):
    """The app's broker points at a port nobody listens on (a real refusal)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    saved = celery_app.conf.broker_url, celery_app.conf.broker_write_url
    celery_app.conf.broker_url = celery_app.conf.broker_write_url = f"redis://127.0.0.1:{port}/0"
    forget_connections()
    yield
    celery_app.conf.broker_url, celery_app.conf.broker_write_url = saved
    forget_connections()


def forget_connections() -> None:
    # The producers reconnect to the URL the app now names.
    celery_app._pool = None
    celery_app.amqp._producer_pool = None


def test_broker_outage_a_committed_submit_answers_202_and_healthz_names_the_broker(
    api, thread, broker_down, client
):
    accepted = api.post(f"/api/v1/threads/{thread.id}/runs", {"input": "Hello"}, expect=202)
    run = Run.objects.get(id=accepted.json()["run_id"])
    stage = Stage.objects.get(run=run)
    assert stage.deliveries == 0 and run.status == Run.Status.QUEUED
    health = client.get(reverse("healthz"))
    assert health.status_code == 503
    body = health.json()
    assert body["ok"] is False and body["down"] == ["broker"]
    assert body["broker"] == {"ok": False, "detail": "unreachable", "age_seconds": None}
    assert "redis://" not in health.content.decode()


def test_broker_back_the_watchdog_resends_a_lost_stage_once(
    thread, manual_clock, broker_queue, settings
):
    """The last resort: a send lost while the broker kept everything else (no
    loss to notice) goes again once the stage was unclaimed for
    GOVERNANCE_STAGE_RESEND_AFTER_SECONDS, and the broker is seen without it:
    ahead of new work. (A broker that lost its messages is noticed at once:
    tests/tasks/test_engine_recovery.py.)"""
    run, stage, _ = services.submit_run(thread, input="Hello", now=manual_clock())
    broker_queue.delete(*lane_keys("turns"))  # the publish was lost
    manual_clock.advance(seconds=settings.GOVERNANCE_STAGE_RESEND_AFTER_SECONDS - 1)
    assert watchdog_pass()["republished"] == 0  # maybe still queued: not yet
    manual_clock.advance(seconds=2)
    assert watchdog_pass()["republished"] == 1
    assert sent_stages(broker_queue, lane=0) == [stage.id]
    assert run_stage(stage.id) == "accepted"
    assert Run.objects.get(id=run.id).settlement.outcome == "completed"


def test_a_run_admitted_or_progressed_after_the_pass_read_the_clock_is_left_to_the_next(
    thread, manual_clock
):
    """R6.1: under load another process admits a run (or records its progress)
    a moment after a watchdog pass read the clock; that run was settled as
    unwatchable (its facts newer than the pass's time). It is not in breach:
    the pass leaves it alone and the run answers."""
    later = manual_clock() + timedelta(milliseconds=0.2)  # another process's reading
    _run, stage, _ = services.submit_run(thread, input="Hello", now=later)
    progressed, stage2, _ = services.submit_run(thread, input="Hi", now=manual_clock())
    Run.objects.filter(id=progressed.id).update(last_progress_at=later)
    assert watchdog_pass() == {"breached": 0, "republished": 0, "unwatchable": 0, "expired": 0}
    manual_clock.advance(seconds=0.001)  # the worker claims the stages afterwards
    assert run_stage(stage.id) == "accepted" and run_stage(stage2.id) == "accepted"
    outcomes = set(Run.objects.values_list("settlement__outcome", flat=True))
    assert outcomes == {"completed"}


def test_a_run_whose_stored_limits_break_the_clock_rule_does_not_stop_the_watchdog(
    thread, manual_clock
):
    """Finding 1: one bad row made every pass raise. Now that run is settled by
    the lifecycle on a guard fact, and the other run's deadline still fires."""
    bad, _s1, _ = services.submit_run(thread, input="bad", now=manual_clock())
    late, _s2, _ = services.submit_run(thread, input="late", now=manual_clock(), deadline_s=60)
    # Rows admitted before the bounds existed (timedelta(seconds=1e-320) is zero).
    Run.objects.filter(id=bad.id).update(no_progress_limit_s=1e-320)
    manual_clock.advance(seconds=61)
    assert watchdog_pass() == {"breached": 1, "republished": 0, "unwatchable": 1, "expired": 0}
    bad.refresh_from_db()
    late.refresh_from_db()
    assert bad.settlement.reason_code == "identity_invalid"
    assert "could not read this run's limits" in str(
        RunEvent.objects.filter(run=bad, kind="facts").values_list("metadata", flat=True).last()
    )
    assert late.settlement.reason_code == "deadline_exceeded"
    assert not Stage.objects.filter(run__in=[bad, late], finished_at__isnull=True).exists()


def test_r6_1_a_database_failure_under_one_run_is_not_that_runs_fact(
    thread, manual_clock, monkeypatch
):
    """A deadlock with a closing stage (or a lost connection) while the watchdog
    records a breach says nothing about the run's values: the run is not
    settled as unwatchable, the pass goes on, and the next pass decides it."""
    from django.db import OperationalError

    from governance.services import stages as stage_service

    first, _s1, _ = services.submit_run(thread, input="first", now=manual_clock(), deadline_s=60)
    second, _s2, _ = services.submit_run(thread, input="second", now=manual_clock(), deadline_s=60)
    manual_clock.advance(seconds=61)
    record_breach = stage_service.record_breach

    def deadlocked_once(run, conclusion, now):
        if run.id == first.id and not deadlocked_once.raised:
            deadlocked_once.raised = True
            raise OperationalError("deadlock detected")
        return record_breach(run, conclusion, now)

    deadlocked_once.raised = False
    monkeypatch.setattr(stage_service, "record_breach", deadlocked_once)
    assert watchdog_pass() == {"breached": 1, "republished": 0, "unwatchable": 0, "expired": 0}
    assert not Run.objects.filter(id=first.id, status=Run.Status.SETTLED).exists()
    assert Run.objects.get(id=second.id).settlement.reason_code == "deadline_exceeded"
    assert watchdog_pass()["breached"] == 1
    assert Run.objects.get(id=first.id).settlement.reason_code == "deadline_exceeded"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("no_progress_s", 1e-320),
        ("deadline_s", 1e-320),
        ("stage_budget_s", 0.5),
        ("deadline_s", 7 * 86400 + 1),
        ("no_progress_s", 1e300),
        ("deadline_s", 0),
        ("deadline_s", -5),
        ("stage_budget_s", True),
    ],
)
def test_durations_out_of_range_are_refused_and_write_nothing(api, thread, name, value):
    response = api.post(f"/api/v1/threads/{thread.id}/runs", {"input": "x", name: value})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == name
    assert not Run.objects.exists()


def test_durations_at_the_bounds_are_admitted(api, thread):
    body = {"input": "x", "deadline_s": 7 * 86400, "no_progress_s": 1, "stage_budget_s": 1.0}
    run_id = api.post(f"/api/v1/threads/{thread.id}/runs", body, expect=202).json()["run_id"]
    run = Run.objects.get(id=run_id)
    assert run.deadline_at - run.created_at == timedelta(days=7)
    assert run.no_progress_limit_s == 1 and run.stage_budget_s == 1


def test_budgets_have_a_maximum(api, thread):
    response = api.post(
        f"/api/v1/threads/{thread.id}/runs",
        {"input": "x", "budget": {"model_requests": 10**40}},
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "budget"
    assert not Run.objects.exists()


def test_a_stage_whose_facts_cannot_be_read_is_concluded_not_left_claimed(
    thread, manual_clock, monkeypatch
):
    """Reading the turn's facts raising rolls back with the claim; the claim is
    taken again alone and the failure is that stage's fact (R4.2)."""
    from governance.services import stages as stage_service

    run, stage, _ = services.submit_run(thread, input="Hello", now=manual_clock())

    def unreadable(*_args, **_kwargs):
        raise RuntimeError("history row unreadable")

    monkeypatch.setattr(stage_service, "_turn_reads", unreadable)
    assert run_stage(stage.id) == "error"
    row = Stage.objects.get(id=stage.id)
    assert row.finished_at is not None and row.outcome == "error"
    assert "history row unreadable" in row.detail
    assert Run.objects.get(id=run.id).decisions  # the lifecycle decided what follows
