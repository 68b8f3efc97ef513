"""The Approvals inbox: the exact call a person is asked about, one click to
approve, a reason to deny, and an answer that does not count says which one
stands and changes nothing. The run page tells who decided what."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse

from governance import services, time_source
from governance.models import AuditEntry, Provider, Stage, ToolApproval

pytestmark = pytest.mark.django_db


def body_of(response) -> str:
    return response.content.decode()


@pytest.fixture
def request_waiting(make_user):
    """A call of ``notify`` in a run of someone's, waiting for an operator."""
    now = time_source.now()
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model", script={})
    owner = make_user("agent", "agent-client")
    thread = services.create_thread(provider_chain=["p"], title="Deploys", user=owner, now=now)
    run, _stage, _ = services.submit_run(thread, input="tell ops", user=owner, now=now)
    asking = Stage.objects.create(
        run=run, seq=9, kind="tool_call", payload={}, enqueued_at=now, parked_at=now
    )
    return ToolApproval.objects.create(
        run=run, stage=asking, tool="notify", server="notify", effect_class="external_effect",
        annotations={"destructiveHint": True}, arguments={"to": "ops", "text": "<b>done</b>"},
        idempotency_key="run:k:1", reasoning="I will tell ops the deploy is done.",
        policy="side_effects", approver_role="operator", requested_at=now,
        expires_at=now + timedelta(hours=1),
    )  # fmt: skip


@pytest.fixture
def operator_user(make_user):
    return make_user("olga-operator", "operator")


def test_the_inbox_shows_the_exact_call_first(client, operator_user, request_waiting):
    client.force_login(operator_user)
    page = body_of(client.get(reverse("approvals")))
    assert "Waiting for a person (1)" in page
    # Written out for a person, every value escaped.
    assert "&quot;to&quot;: &quot;ops&quot;" in page and "&lt;b&gt;done&lt;/b&gt;" in page
    assert "I will tell ops the deploy is done." in page
    assert "run:k:1" in page and "external effect" in page
    assert "destructiveHint=True" in page and "Deploys" in page
    assert 'aria-label="Approve notify (request #' in page
    assert 'name="reason"' in page and "required" in page


def test_one_click_approves_and_the_answer_is_audited(client, operator_user, request_waiting):
    client.force_login(operator_user)
    response = client.post(
        reverse("approval-decide", args=[request_waiting.id]), {"decision": "approve"}
    )
    assert response.status_code == 302 and response["Location"] == reverse("approvals")
    request_waiting.refresh_from_db()
    assert request_waiting.state == "approved" and request_waiting.decided_by == "olga-operator"
    stage = Stage.objects.get(id=request_waiting.stage_id)
    assert stage.parked_at is None  # sent again
    assert AuditEntry.objects.filter(action="approval.approve").count() == 1
    page = body_of(client.get(reverse("approvals")))
    assert "approved: the call runs now, once" in page
    assert "Waiting for a person (0)" in page and "olga-operator" in page


def test_a_denial_needs_a_reason_and_without_one_nothing_changes(
    client, operator_user, request_waiting
):
    client.force_login(operator_user)
    url = reverse("approval-decide", args=[request_waiting.id])
    response = client.post(url, {"decision": "deny", "reason": ""}, follow=True)
    assert "say why" in body_of(response)
    request_waiting.refresh_from_db()
    assert request_waiting.state == "pending"
    client.post(url, {"decision": "deny", "reason": "not during the freeze"})
    request_waiting.refresh_from_db()
    assert request_waiting.state == "denied" and request_waiting.reason == "not during the freeze"


def test_a_second_answer_says_which_one_stands(client, operator_user, request_waiting, make_user):
    client.force_login(operator_user)
    url = reverse("approval-decide", args=[request_waiting.id])
    client.post(url, {"decision": "approve"})
    late = make_user("otto-operator", "operator")
    client.force_login(late)
    page = body_of(client.post(url, {"decision": "deny", "reason": "no"}, follow=True))
    assert "already approved by olga-operator; your answer changed nothing" in page
    request_waiting.refresh_from_db()
    assert request_waiting.state == "approved" and request_waiting.decided_by == "olga-operator"


def test_a_role_the_policy_does_not_name_gets_the_403_page(client, oncall, request_waiting):
    client.force_login(oncall)
    response = client.post(
        reverse("approval-decide", args=[request_waiting.id]), {"decision": "approve"}
    )
    assert response.status_code == 403
    assert "only the role the tool" in body_of(response)
    request_waiting.refresh_from_db()
    assert request_waiting.state == "pending"


def test_four_eyes_refuses_an_answer_in_ones_own_run(
    client, settings, request_waiting, django_user_model
):
    settings.GOVERNANCE_APPROVAL_FOUR_EYES = True
    owner = django_user_model.objects.get(username="agent")
    owner.groups.add(Group.objects.get(name="operator"))
    client.force_login(owner)
    response = client.post(
        reverse("approval-decide", args=[request_waiting.id]), {"decision": "approve"}
    )
    assert response.status_code == 403 and "four eyes" in body_of(response)
    request_waiting.refresh_from_db()
    assert request_waiting.state == "pending"


def test_the_nav_count_is_loaded_after_the_page(client, manager, request_waiting):
    client.force_login(manager)
    page = body_of(client.get(reverse("overview")))
    assert 'hx-get="/approvals/waiting"' in page and 'hx-trigger="load, every 15s' in page
    badge = body_of(client.get(reverse("approvals-waiting")))
    assert 'data-waiting="1"' in badge and "1<span" in badge
    # A manager reads the inbox, and is told their role cannot answer.
    assert "Your role cannot answer approval requests." in body_of(client.get(reverse("approvals")))


def test_the_run_page_says_who_decided_what(client, operator_user, request_waiting):
    client.force_login(operator_user)
    client.post(
        reverse("approval-decide", args=[request_waiting.id]),
        {"decision": "deny", "reason": "wrong channel"},
    )
    page = body_of(client.get(reverse("run", args=[request_waiting.run_id])))
    assert 'id="approvals-h">Approvals' in page
    assert "Denied by <strong>olga-operator</strong>" in page and "wrong channel" in page


def test_the_run_page_says_it_waits_and_draws_the_wait(client, operator_user, request_waiting):
    from governance.models import SpanRecord

    client.force_login(operator_user)
    page = body_of(client.get(reverse("run", args=[request_waiting.run_id])))
    assert "waiting for a person's approval" in page
    assert "Waits for someone in the operator role until" in page
    start = request_waiting.requested_at
    for name, kind, attrs, end in (
        ("governance.run", "run", {}, start + timedelta(minutes=5)),
        ("governance.approval.wait", "approval.wait",
         {"governance.stage_id": str(request_waiting.stage_id), "governance.tool": "notify",
          "governance.approval.answer": "approved", "governance.approval.decided_by": "olga"},
         start + timedelta(minutes=3)),
    ):  # fmt: skip
        SpanRecord.objects.create(
            trace_id="t" * 32, span_id=kind[:16].ljust(16, "0"), name=name, start=start, end=end,
            attributes={"governance.span.kind": kind, "governance.run_id": str(
                request_waiting.run_id), **attrs},
            run_id=request_waiting.run_id,
        )  # fmt: skip
    page = body_of(client.get(reverse("run", args=[request_waiting.run_id])))
    assert "stage 9 · tool call · waiting for a person (notify)" in page
    assert "approved by olga" in page and "wf-approval" in page


def test_the_api_answers_unknown_and_malformed_requests_with_404_and_400(
    client, operator_user, request_waiting
):
    from governance.models import ApiToken
    from governance.services.tokens import token_digest

    ApiToken.objects.create(user=operator_user, name="t", key_digest=token_digest("op-token-1"))
    auth = {"Authorization": "Bearer op-token-1"}
    for path in ("/api/v1/approvals/999999", "/api/v1/approvals/abc"):
        assert client.get(path, headers=auth).status_code == 404
        assert client.post(path, {"decision": "approve"}, content_type="application/json",
                           headers=auth).status_code == 404  # fmt: skip
    bad = client.post(f"/api/v1/approvals/{request_waiting.id}", {"decision": "maybe"},
                      content_type="application/json", headers=auth)  # fmt: skip
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "decision"
    request_waiting.refresh_from_db()
    assert request_waiting.state == "pending"
    listed = client.get("/api/v1/approvals?state=all", headers=auth).json()
    assert [item["id"] for item in listed["items"]] == [request_waiting.id]


def test_a_service_accounts_user_sees_its_own_runs_requests_only(
    client, request_waiting, make_user, django_user_model
):
    stranger = make_user("other-agent", "agent-client")
    client.force_login(stranger)
    page = body_of(client.get(reverse("approvals")))
    assert "Waiting for a person (0)" in page and "run:k:1" not in page
    assert 'data-waiting="0"' in body_of(client.get(reverse("approvals-waiting")))
    client.force_login(django_user_model.objects.get(username="agent"))
    assert "run:k:1" in body_of(client.get(reverse("approvals")))
