"""A person approves the exact call, end to end: API → Redis → a real Celery
worker → PostgreSQL, a tool-calling model on loopback and an HTTP tool that
counts its calls. A call whose policy asks a person is recorded and its stage
parked; yes runs exactly that call once (the recorded arguments and key), no
or no answer in time is the call's result the model reads and the run goes on
(R4.2); the wait is its own clock and the no-progress clock does not run
meanwhile, the deadline does (R6.1)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission

from governance.models import AuditEntry, Notification, Run, Stage, ToolApproval, ToolReceipt
from governance.roles import ensure_roles
from governance.services import approvals as approval_service
from governance.services.tokens import token_digest
from tasks import instrumentation
from tasks.stages.watchdog import watchdog_pass
from tests.tasks import test_engine_lifecycle as lifecycle
from tests.tasks import test_engine_registry_tools as registry_engine
from tests.tasks.conftest import Api
from tests.tool_servers import HttpToolServer

pytestmark = pytest.mark.django_db(transaction=True)
ToolModel = registry_engine.ToolModel
model = registry_engine.model  # its fixture: a tool-calling model on loopback
spans_memory = lifecycle.spans_memory  # its fixture: the spans, kept in memory

SEND_SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}


@pytest.fixture
def tool_server():
    with HttpToolServer() as running:
        yield running


def notify_thread(api, django_user_model, model, url: str, **policy) -> dict:
    """A thread offering the external-effect HTTP tool ``notify`` at ``url`` (its
    ``/send`` and ``/verify``), with ``policy`` (approval, timeout_s); the
    model calls it."""
    user = django_user_model.objects.get(username="engine")
    user.user_permissions.add(Permission.objects.get(codename="change_toolserver"))
    api.post(
        "/api/v1/tools",
        {"name": "notify", "kind": "http", "url": url + "/send", "method": "POST",
         "description": "Notify a team", "parameters": SEND_SCHEMA, "effect": "external_effect",
         "verify_url": url + "/verify", **policy},
        expect=201,
    )  # fmt: skip
    model.tool, model.arguments = "notify", {"to": "ops"}
    return api.post(
        "/api/v1/threads", {"provider_chain": ["oa"], "tool_surface": ["notify"]}, expect=201
    ).json()


@pytest.fixture
def notify(api, tool_server, model, django_user_model):
    """The tool ``notify``, approval asked for side effects."""
    return notify_thread(api, django_user_model, model, tool_server.url, approval="side_effects")


@pytest.fixture
def approver(client, django_user_model):
    """An operator with an API token."""
    ensure_roles()
    user = django_user_model.objects.create_user("olga-operator", password="unused-password-1")
    user.groups.add(Group.objects.get(name="operator"))
    token = "approver-token-" + "a" * 20
    from governance.models import ApiToken

    ApiToken.objects.create(user=user, name="approver", key_digest=token_digest(token))
    return Api(client, token)


def sends(tool_server) -> list[dict]:
    return [s for s in tool_server.handler.seen if s["method"] == "POST"]


def waiting_request(run_id: str, timeout: float = 30.0) -> ToolApproval:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ToolApproval.objects.filter(run_id=run_id).first()
        if found is not None:
            stage = Stage.objects.get(id=found.stage_id)
            if stage.parked_at is not None and not stage.holder:
                return found
        time.sleep(0.05)
    raise AssertionError("no approval request was recorded")


def submit(api, thread) -> str:
    return api.post(
        f"/api/v1/threads/{thread['id']}/runs", {"input": "Tell ops the deploy is done"},
        expect=202,
    ).json()["run_id"]  # fmt: skip


def test_yes_runs_exactly_the_recorded_call_once_and_the_run_completes(
    api, approver, worker, manual_clock, notify, tool_server, spans_memory
):
    run_id = submit(api, notify)
    request = waiting_request(run_id)
    assert sends(tool_server) == []  # nothing runs before a person's yes
    assert Run.objects.get(id=run_id).status == Run.Status.RUNNING
    assert api.get(f"/api/v1/runs/{run_id}").json()["awaiting_approval"] is True
    # The channels hear of it: one notice per recorded call (R3.6).
    notice = Notification.objects.get(dedupe_key=f"approval:{request.idempotency_key}")
    assert notice.severity == "normal" and "notify" in notice.text
    listed = approver.get("/api/v1/approvals").json()["items"]
    assert [item["id"] for item in listed] == [request.id]
    assert listed[0]["arguments"] == {"to": "ops"} and listed[0]["waiting"] is True
    assert listed[0]["effect_class"] == "external_effect"

    manual_clock.advance(timedelta(minutes=3))
    decided = approver.post(
        f"/api/v1/approvals/{request.id}", {"decision": "approve"}, expect=200
    ).json()
    assert decided["state"] == "approved" and decided["decided_by"] == "olga-operator"
    run = api.wait(run_id)
    assert run["settlement"]["outcome"] == "completed" and run["awaiting_approval"] is False
    (sent,) = sends(tool_server)
    assert sent["body"] == {"to": "ops"}
    assert sent["headers"]["Idempotency-Key"] == request.idempotency_key
    receipt = ToolReceipt.objects.get(run_id=run_id)
    assert receipt.idempotency_key == request.idempotency_key and receipt.effect == "succeeded"
    # The model read the tool's own answer, not a made-up one.
    assert '"sent": {"to": "ops"}' in ToolModel.requests[-1]["messages"][-1]["content"]
    assert AuditEntry.objects.filter(action="approval.approve", actor="olga-operator").exists()
    # The wait is a clock of its own (R6.1): its span, three minutes long, and
    # apart from the stage's queue and execution, which start at the answer.
    (wait,) = [s for s in spans_memory.get_finished_spans() if s.name == "governance.approval.wait"]
    assert wait.attributes["governance.clock.approval_wait_ms"] == 180_000
    assert wait.attributes["governance.approval.answer"] == "approved"
    assert wait.attributes["governance.run_id"] == run_id
    assert instrumentation.stored_in_span_store(wait.attributes)  # the run page has it
    executed = [
        s for s in spans_memory.get_finished_spans()
        if s.name == "governance.stage.execution"
        and s.attributes["governance.stage_id"] == str(request.stage_id)
    ]  # fmt: skip
    assert executed and all(s.attributes["governance.clock.queue_ms"] < 180_000 for s in executed)
    # A second answer changes nothing and says which one stands.
    again = approver.post(f"/api/v1/approvals/{request.id}", {"decision": "deny", "reason": "x"})
    assert again.status_code == 409
    assert again.json()["approval"]["state"] == "approved"
    assert len(sends(tool_server)) == 1


def test_no_is_the_calls_result_and_the_run_goes_on(
    api, approver, worker, manual_clock, notify, tool_server
):
    run_id = submit(api, notify)
    request = waiting_request(run_id)
    refused = approver.post(f"/api/v1/approvals/{request.id}", {"decision": "deny"})
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "reason"
    assert ToolApproval.objects.get(id=request.id).state == "pending"  # nothing changed
    approver.post(
        f"/api/v1/approvals/{request.id}",
        {"decision": "deny", "reason": "not during the freeze"}, expect=200,
    )  # fmt: skip
    run = api.wait(run_id)
    assert sends(tool_server) == []
    said = ToolModel.requests[-1]["messages"][-1]
    assert said["role"] == "tool"
    assert "not approved by olga-operator: not during the freeze" in said["content"]
    assert run["settlement"]["outcome"] == "completed"  # R4.2: a no is not a veto
    assert ToolReceipt.objects.get(run_id=run_id).effect == "refused"


def test_no_answer_in_time_is_a_no_in_the_expirys_words(
    api, approver, worker, manual_clock, notify, tool_server
):
    changed = api.client.patch(
        "/api/v1/tools/notify", data='{"approval_wait_s": 900, "reason": "a short wait"}',
        content_type="application/json", headers=api.headers,
    )  # fmt: skip
    assert changed.status_code == 200, changed.content
    run_id = submit(api, notify)
    request = waiting_request(run_id)
    assert request.expires_at - request.requested_at == timedelta(minutes=15)
    run = Run.objects.get(id=run_id)
    # Past the run's no-progress limit (5 min), short of the request's wait.
    manual_clock.advance(timedelta(minutes=14))
    assert manual_clock() - run.last_progress_at > timedelta(seconds=run.no_progress_limit_s)
    assert watchdog_pass()["expired"] == 0
    # Not the no-progress clock's business while a person is asked (R6.1).
    assert Run.objects.get(id=run_id).status != Run.Status.SETTLED
    manual_clock.advance(timedelta(minutes=1))
    assert watchdog_pass()["expired"] == 1
    run = api.wait(run_id)
    assert sends(tool_server) == []
    assert "no answer within 15 min" in ToolModel.requests[-1]["messages"][-1]["content"]
    assert run["settlement"]["outcome"] == "completed"
    late = approver.post(f"/api/v1/approvals/{request.id}", {"decision": "approve"})
    assert late.status_code == 409 and late.json()["approval"]["state"] == "expired"
    assert sends(tool_server) == []


def test_two_approvals_at_once_make_one_call(
    api, approver, worker, manual_clock, notify, tool_server, django_user_model
):
    run_id = submit(api, notify)
    request = waiting_request(run_id)
    second = django_user_model.objects.create_user("otto-operator")
    second.groups.add(Group.objects.get(name="operator"))
    people = [django_user_model.objects.get(username="olga-operator"), second]
    answers: list = []
    start = threading.Barrier(2)

    def approve(user):
        from django.db import connection

        start.wait()
        try:
            decided = approval_service.decide(
                request.id, decision="approve", reason="", user=user, now=manual_clock()
            )
            answers.append(decided)
        except approval_service.ApprovalRefused as exc:
            answers.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(user,)) for user in people]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    api.wait(run_id)
    assert len(sends(tool_server)) == 1
    assert sorted(type(a).__name__ for a in answers) == ["ApprovalRefused", "ToolApproval"]
    refused = next(a for a in answers if isinstance(a, approval_service.ApprovalRefused))
    assert refused.status == 409 and refused.approval.state == "approved"


def test_the_deadline_runs_while_a_person_is_asked(
    api, approver, worker, manual_clock, notify, tool_server
):
    run_id = submit(api, notify)
    request = waiting_request(run_id)
    run = Run.objects.get(id=run_id)
    manual_clock.advance(run.deadline_at - manual_clock() + timedelta(seconds=1))
    watchdog_pass()
    settled = api.wait(run_id)
    assert settled["settlement"]["outcome"] == "failed"
    assert settled["settlement"]["reason_code"] == "deadline_exceeded"
    seq = Stage.objects.get(id=request.stage_id).seq
    (asked,) = [s for s in settled["stages"] if s["seq"] == seq]
    assert asked["outcome"] == "abandoned"
    assert "while a call waited for a person's approval" in asked["detail"]
    assert ToolApproval.objects.get(id=request.id).state == "expired"
    assert (
        approver.post(f"/api/v1/approvals/{request.id}", {"decision": "approve"}).status_code == 409
    )
    assert sends(tool_server) == []


def test_a_stop_while_a_person_is_asked_settles_the_run_and_closes_the_request(
    api, approver, worker, manual_clock, notify, tool_server
):
    """R7.1: only an explicit stop cancels, and it does not wait for the person."""
    run_id = submit(api, notify)
    request = waiting_request(run_id)
    api.post(f"/api/v1/runs/{run_id}/cancel", expect=202)
    run = api.wait(run_id)
    assert run["settlement"]["outcome"] == "cancelled"
    assert approver.get("/api/v1/approvals").json()["items"] == []  # nothing waits
    late = approver.post(f"/api/v1/approvals/{request.id}", {"decision": "approve"})
    assert late.status_code == 409 and "settled" in late.json()["error"]["message"]
    assert sends(tool_server) == []
