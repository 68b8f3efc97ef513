"""The Approvals inbox in real Chromium: an operator on a phone reads the
exact call and approves it with one click; another request is denied with a
reason on a desktop. Screenshots in test-output/browser/."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import expect

from governance import services, time_source
from governance.models import Provider, Stage, ToolApproval

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1440, "height": 900}


def waiting_call(run, seq: int, tool: str, arguments: dict) -> ToolApproval:
    now = time_source.now()
    asking = Stage.objects.create(
        run=run, seq=seq, kind="tool_call", payload={}, enqueued_at=now, parked_at=now
    )
    return ToolApproval.objects.create(
        run=run, stage=asking, tool=tool, server=tool.split(".")[0],
        effect_class="external_effect", annotations={"destructiveHint": True},
        arguments=arguments, idempotency_key=f"run:{run.id}:{seq}",
        reasoning="The customer asked for a refund of order 1234; I will issue it.",
        policy="side_effects", approver_role="operator", requested_at=now,
        expires_at=now + timedelta(hours=1),
    )  # fmt: skip


def test_an_operator_approves_from_a_phone_and_denies_on_a_desktop(
    page_for, live_server, operator, make_user, shots
):
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model", script={})
    owner = make_user("support-bot", "agent-client")
    thread = services.create_thread(
        provider_chain=["p"], title="Refund for order 1234", user=owner, now=time_source.now()
    )
    run, _stage, _ = services.submit_run(
        thread, input="refund order 1234", user=owner, now=time_source.now()
    )
    refund = waiting_call(run, 5, "payments.refund", {"order": "1234", "amount_eur": 49.9})
    delete = waiting_call(run, 6, "crm.delete_customer", {"customer": "c-77"})

    page = page_for(operator.username, **PHONE)
    page.goto(f"{live_server.url}/approvals/")
    card = page.locator(f"#approval-{refund.id}")
    expect(card).to_contain_text('"amount_eur": 49.9')
    expect(card).to_contain_text("I will issue it")
    expect(page.locator("#nav-approvals")).to_have_text("2 waiting for a person")
    approve = card.get_by_role("button", name=f"Approve payments.refund (request #{refund.id})")
    assert approve.bounding_box()["x"] + approve.bounding_box()["width"] <= PHONE["width"]
    shots(page, "1-phone-inbox")
    approve.click()
    expect(page.get_by_role("status")).to_contain_text("approved: the call runs now, once")
    refund.refresh_from_db()
    assert refund.state == "approved" and refund.decided_by == operator.username
    shots(page, "2-phone-approved")

    desk = page_for(operator.username, **DESKTOP)
    desk.goto(f"{live_server.url}/approvals/")
    other = desk.locator(f"#approval-{delete.id}")
    other.get_by_label("Why not (the model reads it)").fill("deleting customers needs a ticket")
    other.get_by_role("button", name=f"Deny crm.delete_customer (request #{delete.id})").click()
    expect(desk.get_by_role("status")).to_contain_text("denied")
    expect(desk.locator("table.answered")).to_contain_text("deleting customers needs a ticket")
    delete.refresh_from_db()
    assert delete.state == "denied"
    shots(desk, "3-desktop-answered")
