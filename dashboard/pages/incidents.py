"""Incidents (R8.2): what on-call works from — a segment's critical alerts as
one, with its escalation, the pages sent, the why and the impact.

Everyone logged in reads them; acknowledging and resolving need
``governance.acknowledge_notification`` (on-call, operator) and go through
``governance.services.incidents``. The list and the incident page refresh
themselves (htmx polling) so a new incident shows up without a reload.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.cache import patch_vary_headers

from dashboard.queries import incidents as queries
from dashboard.site import permissions
from governance import services, time_source
from governance.models import Incident
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT

PER_PAGE = 25
NOTE_MAX = 2000


class IncidentFilters(forms.Form):
    state = forms.ChoiceField(choices=queries.STATE_CHOICES, required=False)


class NoteForm(forms.Form):
    note = forms.CharField(
        required=False,
        max_length=NOTE_MAX,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="optional: what you are doing about it",
    )


def _fragment(request: HttpRequest) -> bool:
    return bool(request.htmx and not request.htmx.history_restore_request)


@login_required
@permissions.requires(GET=None)
def incidents(request: HttpRequest) -> HttpResponse:
    """Open incidents, the ones needing a person first."""
    form = IncidentFilters(request.GET)
    status = 200
    state = "open"
    if form.is_valid():
        state = form.cleaned_data["state"] or "open"
    else:
        status = 400  # said on the page; the list falls back to the open ones
    page_obj = Paginator(queries.rows(state), PER_PAGE).get_page(request.GET.get("page"))
    context = {"form": form, "page_obj": page_obj, "state": state, "rule_text": RULE_TEXT}
    template = "incidents/list.html#incident-list" if _fragment(request) else "incidents/list.html"
    response = render(request, template, context, status=status)
    patch_vary_headers(response, ("HX-Request",))
    return response


EXCERPT_CHARS = 500


def _excerpt(view, user) -> str | None:
    """What was refused (the segment's latest run input), for operators only and
    only where ``GOVERNANCE_INCIDENT_EXCERPT`` allows it: it is customer content."""
    if not (settings.GOVERNANCE_INCIDENT_EXCERPT and view.runs):
        return None
    if not user.has_perm(permissions.APPLY_BOUNDARY):
        return None
    return view.runs[0].input[:EXCERPT_CHARS]


def _detail_context(incident_id: int, user, **extra) -> dict:
    try:
        view = queries.detail(incident_id)
    except Incident.DoesNotExist:
        raise Http404("No such incident.") from None
    return {
        "excerpt": _excerpt(view, user),
        "view": view,
        "incident": view.incident,
        "boundary_actions": BOUNDARY_ACTIONS_TEXT,
        "rule_text": RULE_TEXT,
        "note_form": NoteForm(),
        **extra,
    }


@login_required
@permissions.requires(GET=None)
def incident(request: HttpRequest, incident_id: int) -> HttpResponse:
    context = _detail_context(incident_id, request.user)
    template = "incidents/detail.html#incident" if _fragment(request) else "incidents/detail.html"
    response = render(request, template, context)
    patch_vary_headers(response, ("HX-Request",))
    return response


def _act(request: HttpRequest, incident_id: int, action, done: str, already: str) -> HttpResponse:
    form = NoteForm(request.POST)
    if not form.is_valid():
        context = _detail_context(incident_id, request.user, note_form=form)
        template = "incidents/detail.html#incident" if request.htmx else "incidents/detail.html"
        return render(request, template, context, status=400)
    try:
        found, changed = action(
            incident_id, user=request.user, now=time_source.now(), note=form.cleaned_data["note"]
        )
    except Incident.DoesNotExist:
        raise Http404("No such incident.") from None
    said = done if changed else already
    if request.htmx:
        context = _detail_context(incident_id, request.user, said=said, said_changed=changed)
        response = render(request, "incidents/detail.html#incident", context)
        # The nav count and the Overview refresh themselves on this event.
        response["HX-Trigger"] = "alerts-changed"
        return response
    (messages.success if changed else messages.info)(request, said)
    return redirect(reverse("incident", args=[found.pk]))


@login_required
@permissions.requires(POST=permissions.ACKNOWLEDGE)
def acknowledge(request: HttpRequest, incident_id: int) -> HttpResponse:
    """One click (a note is optional): every alert of the incident is acknowledged."""
    return _act(
        request,
        incident_id,
        services.acknowledge_incident,
        "Acknowledged by you: escalation stopped, the channels that were paged are told.",
        "Already acknowledged or resolved; your click changed nothing.",
    )


@login_required
@permissions.requires(POST=permissions.ACKNOWLEDGE)
def resolve(request: HttpRequest, incident_id: int) -> HttpResponse:
    return _act(
        request,
        incident_id,
        services.resolve_incident,
        "Resolved by you: nobody is paged for it any more.",
        "Already resolved; your click changed nothing.",
    )


@login_required
@permissions.requires(GET=None)
def needing_a_person(request: HttpRequest) -> HttpResponse:
    """The nav's live count (polled, and refreshed after any action)."""
    response = render(
        request, "incidents/_nav_count.html", {"needing": queries.needing_a_person_count()}
    )
    patch_vary_headers(response, ("HX-Request",))
    return response


def nav_count(request: HttpRequest) -> dict:
    """Context processor: the count of incidents needing a person, for the nav
    and the tab title of every page (one COUNT on an indexed column)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    if getattr(request, "htmx", False) and not request.htmx.history_restore_request:
        return {}  # a fragment draws no nav: polls do not pay for the count
    return {"incidents_needing": queries.needing_a_person_count()}
