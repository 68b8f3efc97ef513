"""Alerts inbox (R8.2, R3.6): critical freeze alerts first, one click to acknowledge.

Everyone logged in reads the inbox; acknowledging needs
``governance.acknowledge_notification`` (on-call, operator) and goes through
``governance.services.acknowledge_notification``, which records who and when
once and writes the audit entry.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers

from dashboard.queries import alerts as queries
from dashboard.site import permissions
from dashboard.site.time_zones import zone_for
from governance import services, time_source
from governance.models import Notification
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT

PER_PAGE = 25


class AlertFilters(forms.Form):
    state = forms.ChoiceField(choices=queries.STATE_CHOICES, required=False)
    severity = forms.ChoiceField(choices=queries.SEVERITY_CHOICES, required=False)


def _person(user) -> str:
    if user is None:
        return "a deleted user"
    return user.get_full_name() or user.get_username()


def _inbox_query(data: QueryDict) -> str:
    """The inbox filters and page from ``data``, re-encoded; anything else is dropped."""
    keep = {}
    state, severity, page = data.get("state", ""), data.get("severity", ""), data.get("page", "")
    if state in dict(queries.STATE_CHOICES) and state != "all":
        keep["state"] = state
    if severity in dict(queries.SEVERITY_CHOICES) and severity != "all":
        keep["severity"] = severity
    if page.isdigit() and page != "1":
        keep["page"] = page
    return urlencode(keep)


@login_required
@permissions.requires(GET=None)
def alerts(request: HttpRequest) -> HttpResponse:
    """The inbox. ``?fragment=critical`` answers only the live count of
    unacknowledged critical alerts (the overview polls it)."""
    if request.GET.get("fragment") == "critical":
        response = render(
            request,
            "alerts/inbox.html#critical-count",
            {"critical_unacked": queries.critical_unacknowledged_count()},
        )
        patch_vary_headers(response, ("HX-Request",))
        return response

    form = AlertFilters(request.GET)
    status = 200
    if form.is_valid():
        state = form.cleaned_data["state"] or "all"
        severity = form.cleaned_data["severity"] or "all"
    else:
        # Bad input is said on the page (400); the list falls back to everything.
        state = severity = "all"
        status = 400
    page_obj = Paginator(queries.inbox(state, severity), PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "form": form,
        "page_obj": page_obj,
        "filtered": state != "all" or severity != "all",
        "rule_text": RULE_TEXT,
        "boundary_actions": BOUNDARY_ACTIONS_TEXT,
    }
    fragment = request.htmx and not request.htmx.history_restore_request
    if fragment:
        template = "alerts/inbox.html#inbox"
    else:
        template = "alerts/inbox.html"
        context["critical_unacked"] = queries.critical_unacknowledged_count()
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


@login_required
@permissions.requires(POST=permissions.ACKNOWLEDGE)
def acknowledge(request: HttpRequest, notification_id: int) -> HttpResponse:
    """One click: record who and when (once). htmx gets the updated row back;
    a plain form POST is redirected to the inbox with its filters kept."""
    try:
        notification, changed = services.acknowledge_notification(
            notification_id, user=request.user, now=time_source.now()
        )
    except Notification.DoesNotExist:
        raise Http404("No such alert.") from None
    if request.htmx:
        response = render(
            request,
            "alerts/inbox.html#alert-row",
            {
                "n": queries.alert(notification.pk),
                "already_acked": not changed,
                "boundary_actions": BOUNDARY_ACTIONS_TEXT,
            },
        )
        # The live critical count on the page refreshes itself on this event.
        response["HX-Trigger"] = "alerts-changed"
        return response
    acked_at = notification.acked_at.astimezone(zone_for(request)).strftime("%Y-%m-%d %H:%M %Z")
    if changed:
        messages.success(request, f"Alert #{notification.pk} acknowledged by you at {acked_at}.")
    else:
        messages.info(
            request,
            f"Alert #{notification.pk} was already acknowledged by "
            f"{_person(notification.acked_by)} at {acked_at}; nothing changed.",
        )
    query = _inbox_query(request.POST)
    url = reverse("alerts") + (f"?{query}" if query else "")
    return redirect(f"{url}#alert-{notification.pk}")
