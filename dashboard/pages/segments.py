"""Segments (R8.1) and the operator's boundary actions on them (R8.3, R3.8).

Reads go through ``dashboard.queries.segments``; the only write is
``governance.services.apply_boundary``, which is idempotent by key and
writes the audit entry itself.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

from dashboard.pages import segment_html
from dashboard.queries import costs
from dashboard.queries import runs as run_queries
from dashboard.queries import segments as queries
from dashboard.site import permissions
from dashboard.site.status import human_duration
from dashboard.site.time_zones import zone_for
from governance import services, time_source
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT, max_sends
from governance.rules.segments import (
    OPERATOR_BOUNDARY_KINDS,
    BoundaryKind,
    boundary_words,
    history_policy,
    starts_new_session,
)

PAGE_SIZE = 25
TIMELINE_PAGE = 50
PERMISSION = permissions.APPLY_BOUNDARY

# Which boundaries an operator may force is the rule's (R1.3/R8.3); the page
# only names them. A kind the rule adds without a name here fails at import.
_KIND_NAMES = {
    BoundaryKind.COMPACT: "Compact",
    BoundaryKind.FRESH_START: "Fresh start",
    BoundaryKind.MODEL_SWITCH: "Switch model",
}
KINDS = {str(kind): _KIND_NAMES[kind] for kind in OPERATOR_BOUNDARY_KINDS}


def _rule(delays) -> dict[str, object]:
    """R3.7: the page's copy is the rule's own text, never retyped."""
    return {
        "text": RULE_TEXT,
        "delays": [human_duration(delay) for delay in delays],
        "max_sends": max_sends(delays),
        "actions": BOUNDARY_ACTIONS_TEXT,
    }


# --------------------------------------------------------------------------- the list


class SegmentFilters(forms.Form):
    status = forms.ChoiceField(
        label="Open or closed",
        required=False,
        choices=[("open", "Open"), ("closed", "Closed"), ("all", "Open and closed")],
    )
    state = forms.ChoiceField(
        label="State",
        required=False,
        choices=[
            ("", "Any state"),
            ("frozen", "Frozen"),
            ("cooling", "Cooling"),
            ("eligible", "Eligible"),
        ],
    )
    provider = forms.ChoiceField(label="Provider", required=False)
    thread = forms.CharField(label="Thread (title or id)", required=False, max_length=200)
    age = forms.ChoiceField(
        label="Opened",
        required=False,
        choices=[
            ("", "Any time"),
            ("1h", "Within 1 h"),
            ("24h", "Within 24 h"),
            ("7d", "Within 7 days"),
        ],
    )

    def __init__(self, *args, providers: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["provider"].choices = [("", "Any provider")] + [(p, p) for p in providers]


@login_required
@permissions.requires(GET=None)
def segments(request: HttpRequest) -> HttpResponse:
    now = time_source.now()
    delays = services.reprobe_delays()
    models = queries.provider_models()
    form = SegmentFilters(request.GET, providers=list(models))
    valid = form.is_valid()
    chosen = form.cleaned_data  # only the valid filters apply
    qs = queries.segment_list(
        now=now,
        delays=delays,
        status=chosen.get("status") or "open",
        state=chosen.get("state") or "",
        provider=chosen.get("provider") or "",
        thread=chosen.get("thread") or "",
        age=chosen.get("age") or "",
    )
    page_obj = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    rows = []
    for segment in page_obj:
        states = queries.provider_states(
            segment, segment.thread.provider_chain, models, now, delays
        )
        rows.append({"segment": segment, "states": states, "worst": queries.worst_state(states)})
    filtered = any(chosen.get(name) for name in ("state", "provider", "thread", "age")) or (
        chosen.get("status") not in (None, "", "open")
    )
    template = "segments/list.html#results" if request.htmx else "segments/list.html"
    return render(
        request,
        template,
        {
            "form": form,
            "page_obj": page_obj,
            "rows": rows,
            "filtered": filtered,
            "rule": _rule(delays),
        },
        status=200 if valid else 400,
    )


# --------------------------------------------------------------------------- one segment


def _parse_before(value: str | None) -> tuple[datetime | None, bool]:
    if not value:
        return None, True
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None, False
    if moment.tzinfo is None:
        return None, False
    return moment, True


def _providers_context(segment) -> dict:
    """What the providers' card shows: each provider's state in the segment (R8.1)."""
    now = time_source.now()
    delays = services.reprobe_delays()
    models, choices = queries.provider_models_and_schedules()
    states = queries.provider_states(
        segment, segment.thread.provider_chain, models, now, delays, choices=choices
    )
    return {
        "segment": segment,
        "states": states,
        "worst": queries.worst_state(states),
        "rule": _rule(delays),
        "previous": queries.previous_of(segment),
    }


@login_required
@permissions.requires(GET=None)
def segment_detail(request: HttpRequest, segment_id: int) -> HttpResponse:
    segment = queries.segment_for_page(segment_id)
    if request.htmx and request.GET.get("fragment") == "providers":
        # Polled while the segment is open: the page keeps its providers' states current.
        return render(request, "segments/detail.html#providers", _providers_context(segment))
    before, readable = _parse_before(request.GET.get("before"))
    timeline = queries.segment_timeline(segment, before=before, limit=TIMELINE_PAGE)
    segment_html.add_entries(timeline.items, zone_for(request))
    context = {
        "segment": segment,
        "timeline": timeline,
        "closed_words": boundary_words(segment.closed_kind),
        "opened_words": boundary_words(segment.session.opened_by),
    }
    if request.htmx and before is not None:
        # "Show older": only the next stretch of the timeline.
        return render(request, "segments/detail.html#timeline-page", context)
    context.update(_providers_context(segment))
    previous = context["previous"]
    can_act = segment.closed_at is None and request.user.has_perm(PERMISSION)
    context.update(
        previous_words=boundary_words(previous.closed_kind if previous else ""),
        open_segment=queries.open_segment_of(segment),
        can_act=can_act,
        models=queries.switchable_models(segment) if can_act else [],
        kinds=KINDS,
        bad_cursor=not readable,
        clients=run_queries.thread_clients(segment.thread_id),  # the API tokens that ran on it
        cost=costs.summary_view(costs.cost_summary(segment.attempts.all())),
    )
    return render(request, "segments/detail.html", context, status=200 if readable else 400)


# --------------------------------------------------------------------------- boundary


class BoundaryForm(forms.Form):
    kind = forms.ChoiceField(choices=list(KINDS.items()), widget=forms.HiddenInput)
    model = forms.ChoiceField(label="Switch to model", required=False)
    reason = forms.CharField(
        label="Reason (required; recorded in the audit log)",
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 3, "autofocus": True}),
        error_messages={"required": "Say why: the reason is required and goes to the audit log."},
    )
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=100)

    def __init__(self, *args, models: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = [("", "Choose a model")] + [(m, m) for m in models]

    def clean(self):
        data = super().clean()
        if data.get("kind") == "model_switch" and not data.get("model"):
            self.add_error("model", "Choose the model to switch to.")
        return data


def _boundary_page(
    request: HttpRequest, segment, form: BoundaryForm, kind: str, status: int = 200
) -> HttpResponse:
    states = queries.provider_states(
        segment,
        segment.thread.provider_chain,
        queries.provider_models(),
        time_source.now(),
        services.reprobe_delays(),
    )
    context = {
        "segment": segment,
        "form": form,
        "kind": kind if kind in KINDS else "",
        "kind_name": KINDS.get(kind, ""),
        # R1.2 as the rule states it: the confirmation says what this kind does.
        "history": history_policy(kind) if kind in KINDS else "",
        "new_session": starts_new_session(kind) if kind in KINDS else False,
        "kinds": KINDS,
        "history_count": queries.history_count(segment),
        "not_eligible": [s for s in states if s.state != "eligible"],
        "generation": segment.session.generation,
    }
    template = "segments/boundary.html#confirm" if request.htmx else "segments/boundary.html"
    return render(request, template, context, status=status)


def _closed(request: HttpRequest, segment) -> HttpResponse:
    return render(
        request,
        "segments/closed.html",
        {
            "segment": segment,
            "open_segment": queries.open_segment_of(segment),
            "closed_words": boundary_words(segment.closed_kind),
        },
        status=409,
    )


def _go(request: HttpRequest, url: str) -> HttpResponse:
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


def _forbidden(request: HttpRequest, segment_id: int) -> HttpResponse:
    segment = queries.segment_for_page(segment_id)  # 404 first: an unknown segment
    return render(request, "segments/forbidden.html", {"segment": segment}, status=403)


@login_required
@permissions.requires(_forbidden, GET=PERMISSION, POST=PERMISSION)
def apply_boundary(request: HttpRequest, segment_id: int) -> HttpResponse:
    """R8.3: GET is the confirm step (what will change, a required reason, a fresh
    idempotency key); POST applies it through the service, once per key."""
    segment = queries.segment_for_page(segment_id)
    if request.method == "GET":
        if segment.closed_at is not None:
            return _closed(request, segment)
        kind = request.GET.get("kind", "")
        form = BoundaryForm(
            initial={"kind": kind, "idempotency_key": uuid.uuid4().hex},
            models=queries.switchable_models(segment),
        )
        return _boundary_page(request, segment, form, kind, 200 if kind in KINDS else 400)

    if segment.closed_at is not None:
        # A double submit that lands after the first closed the segment: the
        # same key answers with the boundary it already made.
        opened = services.boundary_for_key(request.POST.get("idempotency_key", "").strip())
        if opened is not None and opened.thread_id == segment.thread_id:
            messages.info(request, f"That boundary was already applied: {opened.key} is open.")
            return _go(request, reverse("segment", args=[opened.id]))
        return _closed(request, segment)
    form = BoundaryForm(request.POST, models=queries.switchable_models(segment))
    kind = request.POST.get("kind", "")
    if not form.is_valid():
        return _boundary_page(request, segment, form, kind, 400)
    data = form.cleaned_data
    try:
        opened, created = services.apply_boundary(
            segment.thread,
            data["kind"],
            by=request.user.get_username(),
            reason=data["reason"],
            now=time_source.now(),
            idempotency_key=data["idempotency_key"],
            model=data["model"] if data["kind"] == "model_switch" else None,
            expected_segment=segment,
        )
    except services.BoundaryConflict:
        return _closed(request, queries.segment_for_page(segment_id))
    except services.ServiceError as error:
        form.add_error(error.field if error.field in form.fields else None, error.message)
        return _boundary_page(request, segment, form, kind, 400)
    if opened.thread_id != segment.thread_id:
        form.add_error(None, "This confirmation was already used for another thread.")
        return _boundary_page(request, segment, form, kind, 400)
    if created:
        messages.success(
            request,
            f"{KINDS[data['kind']]} applied: segment {opened.key} is open and every provider "
            "is eligible again. It takes effect on the thread's next turn.",
        )
    else:
        messages.info(request, f"That boundary was already applied: {opened.key} is open.")
    return _go(request, reverse("segment", args=[opened.id]))
