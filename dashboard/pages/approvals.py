"""Approvals: the tool calls waiting for a person's yes or no.

Each request shows the exact call (the arguments as they will be sent, the
idempotency key), the tool's effect class and annotations, the run, the
thread and the model's words in the turn that asked. One click approves; a
denial needs a reason (the model reads it). Answering needs
``governance.decide_approval`` and the role the tool's policy names; the
inbox refreshes itself (htmx polling).
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers

from dashboard.queries import approvals as queries
from dashboard.site import permissions
from governance import time_source
from governance.models import ToolApproval
from governance.rules.approvals import REASON_MAX
from governance.services import approvals as service

PER_PAGE = 25


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])
    reason = forms.CharField(required=False, max_length=REASON_MAX, strip=True)


def _fragment(request: HttpRequest) -> bool:
    return bool(request.htmx and not request.htmx.history_restore_request)


def _cards(rows):
    """Each request with its arguments written out for a person to read."""
    for approval in rows:
        approval.arguments_text = json.dumps(approval.arguments, indent=2, ensure_ascii=False)
        yield approval


@login_required
@permissions.requires(GET=None)
def approvals(request: HttpRequest) -> HttpResponse:
    """What waits for a person first; the latest answers below. A service
    account's user sees its own runs' requests only, as on the runs pages."""
    rows = permissions.visible(queries.approvals(), request.user, owner="run__owner")
    waiting = list(_cards(queries.waiting(rows).order_by("expires_at", "id")))
    decided = Paginator(rows.exclude(id__in=[a.id for a in waiting]), PER_PAGE).get_page(
        request.GET.get("page")
    )
    context = {
        "waiting": waiting,
        "decided": decided,
        "may_decide": request.user.has_perm(permissions.DECIDE_APPROVAL),
        "now": time_source.now(),
    }
    template = (
        "approvals/inbox.html#approval-list" if _fragment(request) else "approvals/inbox.html"
    )
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@permissions.requires(POST=permissions.DECIDE_APPROVAL)
def decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    """Yes or no; the page says what counted (and, refused, the decision that stands)."""
    form = DecisionForm(request.POST)
    rows = permissions.visible(ToolApproval.objects.all(), request.user, owner="run__owner")
    if not rows.filter(id=approval_id).exists():
        raise Http404("No such approval request.")
    if not form.is_valid():
        messages.error(request, "Choose approve or deny.")
        return redirect(reverse("approvals") + f"#approval-{approval_id}")
    decision = form.cleaned_data["decision"]
    try:
        approval = service.decide(
            approval_id, decision=decision, reason=form.cleaned_data["reason"],
            user=request.user, now=time_source.now(),
        )  # fmt: skip
    except service.ApprovalRefused as exc:
        if exc.status == 403:  # not theirs to answer: the styled 403 page says why
            raise PermissionDenied(f"Request #{approval_id}: {exc.message}.") from None
        standing = exc.approval
        who = f" by {standing.decided_by}" if standing.decided_by else ""
        messages.error(
            request,
            f"Request #{approval_id} ({standing.tool}): {exc.message}{who}; "
            "your answer changed nothing.",
        )
        return redirect(reverse("approvals") + f"#approval-{approval_id}")
    except service.ServiceError as exc:
        messages.error(request, f"Request #{approval_id}: {exc.message}")
        return redirect(reverse("approvals") + f"#approval-{approval_id}")
    done = "approved: the call runs now, once" if decision == "approve" else "denied"
    messages.success(request, f"Request #{approval_id} ({approval.tool}) {done}.")
    return redirect("approvals")


@login_required
@permissions.requires(GET=None)
def waiting_count(request: HttpRequest) -> HttpResponse:
    """The nav's count of calls waiting for a person: loaded after the page and
    polled, so no page pays a query for it."""
    rows = permissions.visible(ToolApproval.objects.all(), request.user, owner="run__owner")
    count = queries.waiting(rows).count()
    response = render(request, "approvals/_nav_count.html", {"waiting": count, "loaded": True})
    patch_vary_headers(response, ("HX-Request",))
    return response
