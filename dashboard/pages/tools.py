"""Tools page: the tool registry as the runtime governs it — each MCP server
(Streamable HTTP or stdio) or HTTP tool, its listed tools with their effect
class and wire name, the schema version and when it was last listed; for a
stdio server the command line, the names of the variables it gets, and each
worker process's copy of it (state, pid, uptime, restarts, its last stderr
lines). Read-only for every logged-in role.

Whoever may change tools (``change_toolserver``) also imports an
``mcpServers`` file here (a preview first, then Register); registering a stdio
server, by the form or in a file, also needs ``run_tool_command`` (no role
holds it: an admin's). Both register the way the API does
(``dashboard.api.tools.register``): judged, listed, audited with the reason;
bad input is said on the form and nothing is written.
"""

from __future__ import annotations

import re
import shlex
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from dashboard.api.tools import register
from dashboard.queries import tools as tools_query
from dashboard.queries.runs import duration_words
from dashboard.queries.tools import tool_detail_json
from dashboard.site import permissions
from dashboard.site.permissions import MANAGE_TOOLS, RUN_TOOL_COMMAND
from governance import time_source
from governance.models import ToolProcess, ToolServer
from governance.rules.approvals import wait_words
from governance.services import tool_import, tool_registry
from governance.services.errors import ServiceError
from tasks.tools import TOOL_SPECS

# A process's state in words and the badge colour that repeats them.
PROCESS_STATES = {
    ToolProcess.State.RUNNING: "ok",
    ToolProcess.State.STARTING: "cooling",
    ToolProcess.State.RESTARTING: "cooling",
    ToolProcess.State.FAILED: "bad",
    ToolProcess.State.STOPPED: "info",
}
TROUBLE = (ToolProcess.State.RESTARTING, ToolProcess.State.FAILED)


class StdioForm(forms.Form):
    """A stdio server as typed; the registry's service judges it (the API's checks)."""

    name = forms.CharField(
        max_length=40, label="Name", help_text="Its tools are called name.tool.",
    )  # fmt: skip
    command = forms.CharField(
        max_length=500, label="Command",
        help_text="What each worker runs: a path, or a program on the workers' PATH (uvx, npx).",
    )  # fmt: skip
    args = forms.CharField(
        required=False, max_length=20_000, label="Arguments (one a line)",
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false", "autocapitalize": "off"}),
        help_text="Shown on this page and in the audit log: never a secret.",
    )  # fmt: skip
    env_names = forms.CharField(
        required=False, max_length=2_000, label="Environment variables (names only)",
        help_text="Separated by spaces or commas; each worker passes its own value, which is "
        "never stored.",
    )  # fmt: skip
    cwd = forms.CharField(
        required=False, max_length=500, label="Working directory",
        help_text="An absolute path; empty: the worker's own.",
    )  # fmt: skip
    reason = forms.CharField(max_length=500, label="Why (kept in the audit log)")

    prefix = "stdio"

    def clean_args(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["args"].splitlines() if line.strip()]

    def clean_env_names(self) -> list[str]:
        return [name for name in re.split(r"[\s,]+", self.cleaned_data["env_names"]) if name]


class ImportForm(forms.Form):
    """An ``mcpServers`` file, uploaded or pasted (a phone has no such file at hand)."""

    file = forms.FileField(required=False, label="The file (JSON)")
    text = forms.CharField(
        required=False, label="Or paste it", max_length=tool_import.FILE_MAX,
        widget=forms.Textarea(attrs={"rows": 5, "spellcheck": "false", "autocapitalize": "off"}),
    )  # fmt: skip

    prefix = "import"

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        upload, text = data.get("file"), (data.get("text") or "").strip()
        if upload is not None and text:
            raise forms.ValidationError("Give the file or paste it, not both.")
        if upload is None and not text:
            raise forms.ValidationError("Choose an mcpServers file or paste its JSON.")
        if upload is not None:
            if upload.size > tool_import.FILE_MAX:
                raise forms.ValidationError(
                    f"The file is over {tool_import.FILE_MAX:,} bytes: a configuration is smaller."
                )
            try:
                text = upload.read().decode("utf-8-sig")
            except UnicodeDecodeError:
                raise forms.ValidationError("The file is not UTF-8 text.") from None
        data["content"] = text
        return data


def _moment(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def uptime_words(seconds: float | None) -> str:
    """An uptime as people read a stopwatch (the run pages' words)."""
    return duration_words(None if seconds is None else timedelta(seconds=seconds))


def _process_rows(processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            **p,
            "state_words": ToolProcess.State(p["state"]).label,
            "state_class": PROCESS_STATES.get(p["state"], "unknown"),
            "uptime": uptime_words(p["uptime_s"]),
            "started": _moment(p["started_at"]),
            "next_start": _moment(p["next_start_at"]),
            "updated": _moment(p["updated_at"]),
        }
        for p in processes
    ]


def _state_counts(processes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """How many worker processes are in each state, trouble first."""
    order = [*TROUBLE, *(s for s in ToolProcess.State if s not in TROUBLE)]
    return [
        {"words": ToolProcess.State(state).label, "class": PROCESS_STATES[state], "count": n}
        for state in order
        if (n := sum(p["state"] == state for p in processes))
    ]


def _rows() -> list[dict[str, Any]]:
    rows = []
    roles = _roles()
    for server in tools_query.servers():
        row = tool_detail_json(server)
        row["listed"] = _moment(row["listed_at"])
        row["approval_form"] = ApprovalForm(
            initial={"approval": row["approval"], "approver_role": row["approver_role"],
                     "wait_minutes": round(row["approval_wait_s"] / 60)},
            prefix=f"approval-{row['name']}", roles=roles,
        )  # fmt: skip
        row["approval_wait"] = wait_words(timedelta(seconds=row["approval_wait_s"]))
        if row["kind"] == ToolServer.Kind.MCP_STDIO:
            row["command_line"] = shlex.join([row["command"] or "", *row["args"]])
            row["process_rows"] = _process_rows(row["processes"])
            row["trouble"] = [p for p in row["process_rows"] if p["state"] in TROUBLE]
            row["state_counts"] = _state_counts(row["processes"])
        rows.append(row)
    return rows


def _may(request: HttpRequest) -> dict[str, bool]:
    """Which forms the viewer may use (and so sees)."""
    manage = permissions.allowed(request.user, MANAGE_TOOLS)
    return {
        "may_manage": manage,
        "may_run_commands": manage and permissions.allowed(request.user, RUN_TOOL_COMMAND),
    }


def _page(
    request: HttpRequest,
    *,
    stdio_form: StdioForm | None = None,
    import_form: ImportForm | None = None,
    status: int = 200,
) -> HttpResponse:
    rows = _rows()
    stdio_rows = [row for row in rows if row["kind"] == ToolServer.Kind.MCP_STDIO]
    return render(
        request,
        "tools/list.html",
        {
            "rows": rows,
            "builtins": sorted(TOOL_SPECS),
            "stdio_rows": stdio_rows,
            "stdio_trouble": [row for row in stdio_rows if row["trouble"]],
            "stdio_form": stdio_form or StdioForm(),
            "stdio_open": stdio_form is not None,
            "import_form": import_form or ImportForm(),
            "import_open": import_form is not None,
            **_may(request),
        },
        status=status,
    )


@login_required
@permissions.requires(GET=None)
def tools(request: HttpRequest) -> HttpResponse:
    return _page(request)


class ApprovalForm(forms.Form):
    """Who must say yes before a call of this server's tools runs."""

    approval = forms.ChoiceField(
        label="Ask a person", choices=[
            ("never", "never"), ("side_effects", "for side effects (calls not read-only)"),
            ("always", "always"),
        ],
    )  # fmt: skip
    approver_role = forms.ChoiceField(label="Who may answer", choices=())
    wait_minutes = forms.IntegerField(
        label="Wait (minutes)", min_value=1, max_value=7 * 24 * 60,
        help_text="without an answer by then, the call is not made",
    )  # fmt: skip
    reason = forms.CharField(label="Why this policy (audited)", required=False, max_length=500)

    def __init__(self, *args, roles: list[str], **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["approver_role"].choices = [(name, name) for name in roles]


def _roles() -> list[str]:
    return list(Group.objects.order_by("name").values_list("name", flat=True))


@login_required
@permissions.requires(POST=MANAGE_TOOLS)
def set_approval(request: HttpRequest, name: str) -> HttpResponse:
    """The server's approval policy, audited; a refusal is said on the page."""
    if not ToolServer.objects.filter(name=name).exists():
        raise Http404("No such tool.")
    form = ApprovalForm(request.POST, roles=_roles(), prefix=f"approval-{name}")
    if not form.is_valid():
        problems = "; ".join(
            f"{form.fields[f].label}: {' '.join(e)}" for f, e in form.errors.items()
        )
        messages.error(request, f"{name}: nothing changed ({problems}).")
        return redirect(f"{reverse('tools')}#tool-{name}")
    data = form.cleaned_data
    try:
        _server, changed, _opened = tool_registry.update_server(
            name, by=request.user.get_username(), now=time_source.now(), reason=data["reason"],
            approval=data["approval"], approver_role=data["approver_role"],
            approval_wait_s=float(data["wait_minutes"] * 60),
        )  # fmt: skip
    except ServiceError as exc:
        messages.error(request, f"{name}: nothing changed ({exc.field}: {exc.message}).")
    else:
        messages.success(
            request, f"{name}: approval policy saved." if changed else f"{name}: nothing changed."
        )
    return redirect(f"{reverse('tools')}#tool-{name}")


def _registered(request: HttpRequest, server: ToolServer) -> None:
    names = ", ".join(t["name"] for t in server.listed_tools) or "none"
    messages.success(request, f"Registered {server.name} ({server.kind}): tools {names}.")


@login_required
# Running a command on the workers is the stronger permission; the view also
# checks change_toolserver, which any registration needs.
@permissions.requires(POST=RUN_TOOL_COMMAND)
def register_stdio(request: HttpRequest) -> HttpResponse:
    """Register a stdio server: its command is started once to list its tools
    before anything is written; a refusal comes back on the open form (400)."""
    if not permissions.allowed(request.user, MANAGE_TOOLS):
        raise PermissionDenied(permissions.refusal(MANAGE_TOOLS))
    form = StdioForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            server, _opened = register(
                by=request.user.get_username(), name=data["name"],
                kind=ToolServer.Kind.MCP_STDIO, reason=data["reason"], command=data["command"],
                args=data["args"], env_names=data["env_names"], cwd=data["cwd"],
            )  # fmt: skip
        except ServiceError as exc:  # a taken name too
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            _registered(request, server)
            return redirect(f"{reverse('tools')}#tool-{server.name}")
    return _page(request, stdio_form=form, status=400)


def _stdio_refusal(request: HttpRequest) -> str:
    """Why this viewer may not register the file's stdio servers ("" when it may)."""
    if permissions.allowed(request.user, RUN_TOOL_COMMAND):
        return ""
    return "a stdio server runs a command on the workers: " + permissions.refusal(RUN_TOOL_COMMAND)


def _preview(
    request: HttpRequest,
    plan: tool_import.ImportPlan | None,
    *,
    problems: list[str] | None = None,
    reason_error: str = "",
    reason: str = "",
) -> HttpResponse:
    """What the file would register, its problems, and the Register button
    (only for a plan without problems: a refused file is never sent back)."""
    ready = plan is not None and plan.ok
    if problems is None:  # the plan's own: the file's listed on top, each entry's under it
        problems = plan.every_problem() if plan else []
        listed = list(plan.problems) if plan else []
    else:
        listed = problems
    return render(
        request,
        "tools/import.html",
        {
            "plan": plan,
            "problems": problems,
            "listed_problems": listed,
            "under_servers": len(problems) > len(listed),
            "content": tool_import.plan_text(plan) if ready else "",
            "ready": ready,
            "reason": reason,
            "reason_error": reason_error,
            "import_form": ImportForm(),
        },
        status=200 if ready and not problems and not reason_error else 400,
    )


@login_required
@permissions.requires(POST=MANAGE_TOOLS)
def import_preview(request: HttpRequest) -> HttpResponse:
    """An uploaded (or pasted) ``mcpServers`` file read into its plan; nothing
    is started or written."""
    form = ImportForm(request.POST, request.FILES)
    if not form.is_valid():
        # The form is drawn afresh, never with what was pasted (it may hold a secret).
        errors = [e for field_errors in form.errors.values() for e in field_errors]
        return _preview(request, None, problems=errors)
    plan = tool_import.read_plan(form.cleaned_data["content"], refuse_stdio=_stdio_refusal(request))
    return _preview(request, plan)


@login_required
@permissions.requires(POST=MANAGE_TOOLS)
def import_register(request: HttpRequest) -> HttpResponse:
    """Register the previewed plan, all or nothing. The plan is read and judged
    again from what the preview carried: the preview decided nothing."""
    plan = tool_import.read_plan(
        request.POST.get("content", ""), refuse_stdio=_stdio_refusal(request)
    )
    reason = request.POST.get("reason", "")
    try:
        servers = tool_import.register_plan(
            plan, by=request.user.get_username(), reason=reason, register=register
        )
    except tool_import.ImportRefused as exc:
        return _preview(request, plan, problems=exc.problems, reason=reason)
    except ServiceError as exc:
        return _preview(request, plan, reason_error=exc.message, reason=reason)
    for server in servers:
        _registered(request, server)
    return redirect(reverse("tools"))
