"""Who must say yes before a tool's calls run, set over the API, the CLI and
the Tools page, audited; bad input is a clear 4xx (or one CLI line) and
changes nothing (R4.1: the approval is its owner's, the policy says whose)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from governance.models import AuditEntry, ToolServer
from tests.dashboard.test_tool_api import SCHEMA, admin  # noqa: F401 (its fixture)

pytestmark = pytest.mark.django_db

HTTP_TOOL = {
    "name": "notify", "kind": "http", "url": "http://127.0.0.1:9/send", "method": "POST",
    "description": "Notify a team", "parameters": SCHEMA, "effect": "external_effect",
}  # fmt: skip


@pytest.fixture(autouse=True)
def roles():
    from governance.roles import ensure_roles

    ensure_roles()  # a transactional test before this one flushed the migration's groups


def test_the_api_sets_the_policy_at_registration_and_changes_it(admin):  # noqa: F811
    made = admin.send("POST", "/api/v1/tools", {**HTTP_TOOL, "approval": "side_effects"}, 201)
    assert made["approval"] == "side_effects" and made["approver_role"] == "operator"
    assert made["approval_wait_s"] == 3600.0
    changed = admin.send(
        "PATCH", "/api/v1/tools/notify",
        {"approval": "always", "approver_role": "on-call", "approval_wait_s": 600,
         "reason": "deploy week"},
    )  # fmt: skip
    assert (changed["approval"], changed["approver_role"], changed["approval_wait_s"]) == (
        "always", "on-call", 600.0,
    )  # fmt: skip
    entry = AuditEntry.objects.filter(action="tool.update", target_id="notify").get()
    assert entry.reason == "deploy week"
    assert entry.detail["after"]["approval"] == "always"
    (listed,) = admin.send("GET", "/api/v1/tools/notify")["tools"]
    assert listed["approval"] == "always" and listed["approval_needed"] is True


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"approval": "sometimes"}, "approval"),
        ({"approver_role": "nobody-has-this-role"}, "approver_role"),
        ({"approval_wait_s": 10}, "approval_wait_s"),
        ({"approval_overrides": {"x": "always"}}, "approval_overrides"),  # an http tool is one
    ],
)
def test_a_bad_policy_is_a_400_naming_the_field_and_changes_nothing(admin, change, field):  # noqa: F811
    admin.send("POST", "/api/v1/tools", HTTP_TOOL, 201)
    refused = admin.send("PATCH", "/api/v1/tools/notify", change, 400)
    assert refused["error"]["field"] == field
    server = ToolServer.objects.get(name="notify")
    assert (server.approval, server.approver_role, server.approval_wait_s) == (
        "never", "operator", 3600.0,
    )  # fmt: skip


def test_the_cli_sets_a_servers_policy_and_says_it_in_one_line(admin):  # noqa: F811
    admin.send("POST", "/api/v1/tools", HTTP_TOOL, 201)
    out = StringIO()
    call_command("tool", "approval", "notify", "side_effects", "--wait", "900",
                 "--reason", "audited", stdout=out)  # fmt: skip
    assert out.getvalue().strip() == (
        "notify: approval side_effects, answered by operator within 15 min"
    )
    assert ToolServer.objects.get(name="notify").approval == "side_effects"
    with pytest.raises(CommandError, match=r"^--role: the name of a role"):
        call_command("tool", "approval", "notify", "always", "--role", "ghosts")
    with pytest.raises(CommandError, match="no tool 'nope'"):
        call_command("tool", "approval", "nope", "always")
    assert ToolServer.objects.get(name="notify").approval == "side_effects"


def test_the_tools_page_shows_the_policy_and_an_admin_changes_it(client, admin, make_user):  # noqa: F811
    admin.send("POST", "/api/v1/tools", HTTP_TOOL, 201)
    boss = make_user("ada-admin", is_superuser=True, is_staff=True)
    client.force_login(boss)
    page = client.get(reverse("tools")).content.decode()
    assert 'data-testid="approval-notify">no person is asked' in page
    response = client.post(
        reverse("tool-approval", args=["notify"]),
        {"approval-notify-approval": "side_effects", "approval-notify-approver_role": "operator",
         "approval-notify-wait_minutes": "30", "approval-notify-reason": "side effects"},
        follow=True,
    )  # fmt: skip
    page = response.content.decode()
    assert "notify: approval policy saved." in page
    assert (
        "someone in the operator role approves every call that is not read-only, within 30 min"
        in page
    )
    assert 'data-testid="approval-notify">every call</td>' in page  # its one tool
    refused = client.post(
        reverse("tool-approval", args=["notify"]),
        {"approval-notify-approval": "maybe", "approval-notify-approver_role": "operator",
         "approval-notify-wait_minutes": "0"},
        follow=True,
    )  # fmt: skip
    assert "notify: nothing changed" in refused.content.decode()
    assert ToolServer.objects.get(name="notify").approval_wait_s == 1800.0


def test_a_reader_sees_the_policy_but_no_form(client, admin, oncall):  # noqa: F811
    admin.send("POST", "/api/v1/tools", {**HTTP_TOOL, "approval": "always"}, 201)
    client.force_login(oncall)
    page = client.get(reverse("tools")).content.decode()
    assert "someone in the operator role approves every call, within 1 h" in page
    assert "Change who approves" not in page
    assert client.post(reverse("tool-approval", args=["notify"]), {}).status_code == 403
