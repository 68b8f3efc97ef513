"""The dashboard's roles as Django groups with their permissions (R8).

Migrations 0004 and 0009 create them; ``ensure_roles`` restores them where a database
was flushed (transactional tests) or set up without migrations.
"""

from __future__ import annotations

# The actions a role grants (and a token's scopes may narrow), by permission
# codename, with what each lets a user do. dashboard/site/permissions.py names them.
ACTIONS: dict[str, str] = {
    "submit_run": "submit runs",
    # The door (/v1/chat/completions) submits runs too: it also needs the
    # role's submit_run, but a token's scope may name the door alone.
    "use_openai_door": "call the OpenAI-compatible door (/v1/chat/completions)",
    "cancel_run": "stop runs",
    "see_all_runs": "see every thread and run (without it: only their own)",
    "apply_boundary": "force boundaries",
    "acknowledge_notification": "acknowledge alerts",
    # The tool's approval policy names which role's members may answer.
    "decide_approval": "approve or deny a paused tool call",
    "view_delivery_report": "read the delivery report",
    "view_insights": "read the re-probe statistics and refusal costs (Insights)",
    "change_provider": "add or change providers",
    "change_toolserver": "add or change registry tools (MCP servers, HTTP tools)",
    # No role holds it: the commands the workers run are an admin's decision.
    "run_tool_command": "register or change a stdio tool server (a command the workers run)",
}

ROLES: dict[str, tuple[str, ...]] = {
    # Acknowledges critical freeze alerts; may stop a run that is doing harm.
    "on-call": ("acknowledge_notification", "decide_approval", "cancel_run", "see_all_runs"),
    # Forces new segments (compact, fresh start, switch model) and runs work.
    "operator": (
        "acknowledge_notification",
        "decide_approval",
        "apply_boundary",
        "submit_run",
        "use_openai_door",
        "cancel_run",
        "view_insights",
        "see_all_runs",
    ),
    # Reads everything, changes nothing (no Stop either).
    "manager": ("view_delivery_report", "view_insights", "see_all_runs"),
    # Service accounts of the agent products: submit runs, watch and stop them,
    # their own only (no see_all_runs); through the API or the OpenAI door.
    "agent-client": ("submit_run", "use_openai_door", "cancel_run"),
}


def ensure_roles() -> None:
    from django.contrib.auth.models import Group, Permission

    for name, codenames in ROLES.items():
        group, _ = Group.objects.get_or_create(name=name)
        group.permissions.set(
            Permission.objects.filter(content_type__app_label="governance", codename__in=codenames)
        )
