"""The viewer's own time zone: every absolute time on every page is shown in
it, labelled; "your browser's zone" until someone chooses one."""

from __future__ import annotations

from itertools import groupby

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.site import permissions
from dashboard.site.time_zones import chosen_time_zone, remember_time_zone
from governance.services.errors import ServiceError
from governance.services.preferences import known_time_zones, set_time_zone

BROWSER = ""


def zone_choices() -> list:
    """The browser's zone first, then every zone grouped by its region."""
    grouped = [
        (region, [(name, name.replace("_", " ")) for name in names])
        for region, names in groupby(known_time_zones(), key=lambda n: n.partition("/")[0])
    ]
    return [(BROWSER, "Your browser's zone"), *grouped]


class TimeZoneForm(forms.Form):
    time_zone = forms.ChoiceField(
        label="Show times in", required=False, choices=zone_choices,
        help_text="Every absolute time on every page, labelled with the zone.",
    )  # fmt: skip
    next = forms.CharField(required=False, widget=forms.HiddenInput)


def _safe_next(request: HttpRequest, target: str) -> str | None:
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return None


@login_required
# Personal: it changes how times are shown to this person, nothing else.
@permissions.requires(GET=None, POST=permissions.SIGNED_IN)
def time_zone(request: HttpRequest) -> HttpResponse:
    initial = {"time_zone": chosen_time_zone(request), "next": request.GET.get("next", "")}
    form = TimeZoneForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            kept = set_time_zone(request.user, form.cleaned_data["time_zone"])
        except ServiceError as exc:
            form.add_error("time_zone", exc.message)
        else:
            remember_time_zone(request, kept)
            messages.success(
                request, f"Times now show in {kept}." if kept else
                "Times now show in your browser's zone.",
            )  # fmt: skip
            return redirect(_safe_next(request, form.cleaned_data["next"]) or "time-zone")
    return render(
        request, "time_zone.html", {"form": form},
        status=400 if form.errors else 200,
    )  # fmt: skip
