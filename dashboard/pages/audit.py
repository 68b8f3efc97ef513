"""The audit log: every action, who did it, to what, why and when (R8.3, R1.4).

Every logged-in role may read it; nothing here writes.
"""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard.queries import audit as queries
from dashboard.site import permissions

PAGE_SIZE = 25


class AuditFilters(forms.Form):
    actor = forms.ChoiceField(label="Who", required=False)
    action = forms.ChoiceField(label="Action", required=False)
    target_type = forms.ChoiceField(label="Target type", required=False)
    date_from = forms.DateField(
        label="From (UTC)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )
    date_to = forms.DateField(
        label="To (UTC)", required=False, widget=forms.DateInput(attrs={"type": "date"})
    )

    def __init__(self, *args, choices: dict[str, list[str]], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["actor"].choices = [("", "Anyone")] + [(a, a) for a in choices["actors"]]
        self.fields["action"].choices = [("", "Any action")] + [
            (a, queries.action_words(a)) for a in choices["actions"]
        ]
        self.fields["target_type"].choices = [("", "Any target")] + [
            (t, t) for t in choices["target_types"]
        ]

    def clean(self):
        data = super().clean()
        start, end = data.get("date_from"), data.get("date_to")
        if start and end and start > end:
            self.add_error("date_to", "The end date is before the start date.")
        return data


@login_required
@permissions.requires(GET=None)
def audit_log(request: HttpRequest) -> HttpResponse:
    form = AuditFilters(request.GET, choices=queries.filter_choices())
    valid = form.is_valid()
    chosen = form.cleaned_data  # only the valid filters apply
    qs = queries.audit_entries(
        actor=chosen.get("actor") or "",
        action=chosen.get("action") or "",
        target_type=chosen.get("target_type") or "",
        date_from=chosen.get("date_from"),
        date_to=chosen.get("date_to"),
        tz=timezone.get_current_timezone(),
    )
    page_obj = Paginator(qs, PAGE_SIZE).get_page(request.GET.get("page"))
    template = "audit/log.html#results" if request.htmx else "audit/log.html"
    return render(
        request,
        template,
        {
            "form": form,
            "page_obj": page_obj,
            "rows": queries.audit_rows(page_obj),
            "filtered": any(chosen.get(name) for name in form.fields),
        },
        status=200 if valid else 400,
    )
