"""Runs: the list with filters, and one run's whole story (R6.1–R6.5, R5, R7.2, R4).

Read-only pages for every logged-in role: there are no actions here.
"""

from __future__ import annotations

import uuid

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.pages import run_html
from dashboard.queries import costs
from dashboard.queries import runs as queries
from dashboard.site import permissions
from governance import time_source
from governance.models import Provider, Run, Thread

PAGE_SIZE = 25


class RunFilterForm(forms.Form):
    status = forms.ChoiceField(
        required=False, choices=[("", "Any status"), *Run.Status.choices], label="Status"
    )
    settlement = forms.ChoiceField(
        required=False,
        label="Settlement",
        choices=[
            ("", "Any settlement"),
            *((outcome, outcome.capitalize()) for outcome in queries.SETTLEMENT_OUTCOMES),
            (queries.NO_SETTLEMENT, "Not settled yet"),
        ],
    )
    provider = forms.ChoiceField(required=False, label="Provider tried")
    thread = forms.UUIDField(
        required=False,
        label="Thread id",
        widget=forms.TextInput(attrs={"placeholder": "thread UUID", "spellcheck": "false"}),
    )
    date_from = forms.DateField(
        required=False, label="Created from", widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = forms.DateField(
        required=False, label="Created to", widget=forms.DateInput(attrs={"type": "date"})
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["provider"].choices = [
            ("", "Any provider"),
            *((pid, pid) for pid in Provider.objects.values_list("provider_id", flat=True)),
        ]

    def clean(self):
        data = super().clean()
        start, end = data.get("date_from"), data.get("date_to")
        if start and end and start > end:
            self.add_error("date_to", "The end date is before the start date.")
        return data

    def filters(self) -> queries.RunFilters:
        # Valid fields still filter when another one is wrong: the page shows
        # the error and what it can, rather than nothing.
        data = getattr(self, "cleaned_data", {}) if self.is_bound else {}
        return queries.RunFilters(
            status=data.get("status") or "",
            settlement=data.get("settlement") or "",
            provider=data.get("provider") or "",
            thread=data.get("thread"),
            date_from=data.get("date_from"),
            date_to=data.get("date_to"),
        )


@login_required
@permissions.requires(GET=None)
def runs(request: HttpRequest) -> HttpResponse:
    params = request.GET.copy()
    params.pop("page", None)
    form = RunFilterForm(params or None)
    valid = form.is_valid() if form.is_bound else True
    filters = form.filters()
    listed = permissions.visible(queries.run_list(filters), request.user)
    page = Paginator(listed, PAGE_SIZE).get_page(request.GET.get("page"))
    context = {
        "form": form,
        "filters": filters,
        "page_obj": page,
        "rows": queries.run_rows(list(page.object_list), time_source.now()),
    }
    if filters.thread:
        # One thread's runs: the thread, with its door session and clients.
        thread = (
            Thread.objects.filter(id=filters.thread)
            .only("id", "title", "client_session_key", "created_by")
            .first()
        )
        if thread is not None and permissions.may_see(request.user, thread.created_by_id):
            context.update(thread=thread, clients=queries.thread_clients(thread.id))
    template = "runs/list.html#run-list" if request.htmx else "runs/list.html"
    return render(request, template, context, status=200 if valid else 400)


@login_required
@permissions.requires(GET=None)
def run_detail(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    page = queries.run_page(run_id, time_source.now())
    if not permissions.may_see(request.user, page.run.owner_id):
        raise Http404("no such run")  # someone else's, as over the API
    template = "runs/detail.html#run-body" if request.htmx else "runs/detail.html"
    cost = costs.summary_view(costs.loaded_costs(page.attempts))  # sets each one's cost_words
    context = {
        "page": page,
        "run": page.run,
        "cost": cost,
        "attempt_rows": run_html.attempt_rows(page.attempts),
    }
    return render(request, template, context)
