"""Providers page (R2.1–R2.3, R8.1): breaker state in words, recent failures by
class, the open segments where a provider is frozen or cooling, and the routes
(named provider chains a request's ``model`` may name). Read-only
for every logged-in role; providers are configured in the Django admin, the API
or ``manage.py provider`` — except their prices, which whoever may
change providers also sets here, through the same service as the API."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from dashboard.queries import providers as queries
from dashboard.queries import routes as queries_routes
from dashboard.queries import segments as queries_segments
from dashboard.site import permissions
from dashboard.site.env import parse_duration
from dashboard.site.permissions import MANAGE_PROVIDERS
from dashboard.site.status import human_duration
from governance import services, time_source
from governance.models import Provider
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT, delays_seconds
from governance.services.alerts import channel_target_problem
from governance.services.errors import ServiceError
from governance.services.providers import update_provider

PER_PAGE = 25


def _no_dns(host: str, port: int) -> list[str]:
    """The page never waits on DNS: only ``localhost`` names (RFC 6761) are
    known without asking; other names are judged on their scheme here and
    resolved at send time, which decides."""
    if host == "localhost" or host.endswith(".localhost"):
        return ["127.0.0.1"]
    raise OSError("not resolved on this page")


def _alert_channel_rows(now):
    """The channel rows, each with the refusal its target would meet when
    sending (the send would fail permanently and disable it)."""
    rows = queries.alert_channel_rows(now)
    for row in rows:
        channel = row.channel
        row.outbound_problem = (
            channel_target_problem(channel.kind, channel.target, resolver=_no_dns)
            if channel.enabled
            else None
        )
    return rows


PRICE_FIELDS = {
    "price_input_per_mtok": "Input, per million tokens",
    "price_output_per_mtok": "Output, per million tokens",
    "price_cached_per_mtok": "Cached input, per million tokens",
}


class PriceForm(forms.Form):
    """A provider's prices as typed; the service checks them (the API's checks)."""

    price_input_per_mtok = forms.CharField(required=False, max_length=30)
    price_output_per_mtok = forms.CharField(required=False, max_length=30)
    price_cached_per_mtok = forms.CharField(required=False, max_length=30)
    currency = forms.CharField(required=False, max_length=10)
    reason = forms.CharField(required=False, max_length=500)

    def __init__(self, *args: Any, provider: Provider, **kwargs: Any) -> None:
        super().__init__(*args, prefix=f"prices-{provider.provider_id}", **kwargs)
        self.provider = provider
        for name, label in PRICE_FIELDS.items():
            self.fields[name].label = label
            self.fields[name].initial = getattr(provider, name)
        self.fields["currency"].label = "Currency (ISO 4217, e.g. USD)"
        self.fields["currency"].initial = provider.currency
        self.fields["reason"].label = "Why (kept in the audit log)"

    def changes(self) -> dict[str, Any]:
        data = self.cleaned_data
        changes: dict[str, Any] = {name: data[name].strip() or None for name in PRICE_FIELDS}
        changes["currency"] = data["currency"].strip().upper()
        return changes


class ScheduleForm(forms.Form):
    """A provider's own re-probe schedule (R3.2) as typed; the service checks
    it with the rule (1–5 re-probes, each longer than the last, the last ≤ 6 h)."""

    delays = forms.CharField(
        required=False, max_length=200, label="Delays after each refusal",
        help_text="e.g. 10m, 30m, 2h — empty: R3.2's default",
    )  # fmt: skip
    categories = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2}),
        label="By refusal category (one a line)", help_text="e.g. policy: 5m, 1h",
    )  # fmt: skip
    reason = forms.CharField(required=False, max_length=500, label="Why (kept in the audit log)")

    def __init__(self, *args: Any, provider: Provider, **kwargs: Any) -> None:
        super().__init__(*args, prefix=f"schedule-{provider.provider_id}", **kwargs)
        self.provider = provider
        choice = services.schedule_choice(provider)
        if choice is not None:
            if choice.delays:
                self.fields["delays"].initial = _typed(choice.delays)
            self.fields["categories"].initial = "\n".join(
                f"{category}: {_typed(delays)}"
                for category, delays in sorted(choice.by_category.items())
            )

    @staticmethod
    def _seconds(text: str) -> list[float]:
        return delays_seconds([parse_duration(part) for part in text.split(",") if part.strip()])

    def clean_delays(self) -> list[float] | None:
        try:
            return self._seconds(self.cleaned_data["delays"]) or None
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_categories(self) -> dict[str, list[float]]:
        found: dict[str, list[float]] = {}
        for line in self.cleaned_data["categories"].splitlines():
            if not line.strip():
                continue
            category, colon, delays = line.partition(":")
            if not colon or not category.strip():
                raise forms.ValidationError(f"“{line.strip()}”: write it as category: 10m, 1h")
            try:
                found[category.strip()] = self._seconds(delays)
            except ValueError as exc:
                raise forms.ValidationError(f"{category.strip()}: {exc}") from None
        return found

    def schedule(self) -> dict[str, Any]:
        schedule: dict[str, Any] = {}
        if self.cleaned_data["delays"]:
            schedule["delays_s"] = self.cleaned_data["delays"]
        if self.cleaned_data["categories"]:
            schedule["categories"] = self.cleaned_data["categories"]
        return schedule


def _typed(delays: Any) -> str:
    return ", ".join(
        human_duration(d).replace(" min", "m").replace(" h", "h").replace(" s", "s") for d in delays
    )


def _page(
    request: HttpRequest,
    *,
    bad: PriceForm | None = None,
    bad_schedule: ScheduleForm | None = None,
    status: int = 200,
):
    now = time_source.now()
    rows = queries.provider_rows(now)
    page_obj = Paginator(rows, PER_PAGE).get_page(request.GET.get("page"))
    queries.add_details(list(page_obj.object_list), now)
    may_price = request.user.has_perm(MANAGE_PROVIDERS)
    default = services.reprobe_delays()
    for row in page_obj.object_list:
        provider = row.provider
        # A form is drawn when it is opened (``provider_form``): two forms per provider
        # were most of the page's rendering (bench/scale.py). Only a refused one is
        # drawn here, open, with what was typed and why it was refused.
        row.price_form = bad if bad is not None and bad.provider.pk == provider.pk else None
        row.schedule_form = (
            bad_schedule
            if bad_schedule is not None and bad_schedule.provider.pk == provider.pk
            else None
        )
        row.schedule_words = queries_segments.schedule_words(
            provider.provider_id, None, services.schedule_choice(provider), default
        )
    unavailable = [row for row in rows if not row.available]
    return render(
        request,
        "providers/list.html",
        {
            "may_price": may_price,
            "page_obj": page_obj,
            "total": len(rows),
            "unavailable": unavailable,
            "recent_hours": int(queries.RECENT.total_seconds() // 3600),
            "rule_text": RULE_TEXT,
            "boundary_actions": BOUNDARY_ACTIONS_TEXT,
            "alert_channels": _alert_channel_rows(now),
            "routes": queries_routes.routes(),
        },
        status=status,
    )


@login_required
@permissions.requires(GET=None)
def providers(request: HttpRequest) -> HttpResponse:
    return _page(request)


@login_required
@permissions.requires(GET=MANAGE_PROVIDERS, POST=MANAGE_PROVIDERS)
def provider_prices(request: HttpRequest, provider_id: str) -> HttpResponse:
    """Set a provider's prices per million tokens and their currency.
    Empty means "no price": its requests then say so instead of costing 0.
    GET: the form, filled with the prices as they stand."""
    if request.method == "GET":
        return _form(request, provider_id, PriceForm, "prices")
    return _change(request, provider_id, PriceForm, "prices", "bad", lambda f: f.changes())


@login_required
@permissions.requires(GET=MANAGE_PROVIDERS, POST=MANAGE_PROVIDERS)
def provider_schedule(request: HttpRequest, provider_id: str) -> HttpResponse:
    """A provider's own re-probe schedule (R3.2). A refusal under way keeps
    the schedule it started under; the new one applies to refusals that start later.
    GET: the form, filled with the schedule as it stands."""
    if request.method == "GET":
        return _form(request, provider_id, ScheduleForm, "schedule")
    return _change(
        request, provider_id, ScheduleForm, "schedule", "bad_schedule",
        lambda f: {"refusal_schedule": f.schedule()},
    )  # fmt: skip


def _provider_for_change(request: HttpRequest, provider_id: str, what: str) -> Provider:
    provider = Provider.objects.filter(provider_id=provider_id).first()
    if provider is None:
        raise Http404("no such provider")
    return provider


def _form(request: HttpRequest, provider_id: str, form_class, what: str) -> HttpResponse:
    """A provider form as it opens on the providers page (htmx: the form alone), or on
    a page of its own (a link, without JavaScript)."""
    provider = _provider_for_change(request, provider_id, what)
    template = "providers/_form.html" if request.htmx else "providers/form.html"
    return render(
        request, template, {"p": provider, "f": form_class(provider=provider), "kind": what}
    )


def _change(request, provider_id: str, form_class, what: str, bad: str, changes) -> HttpResponse:
    """One provider form posted: checked, written through the provider service
    (audited), back to the providers page; a refusal shows on the form (400)."""
    provider = _provider_for_change(request, provider_id, what)
    form = form_class(request.POST, provider=provider)
    if form.is_valid():
        try:
            update_provider(
                provider_id,
                by=request.user.get_username(),
                now=time_source.now(),
                reason=form.cleaned_data["reason"],
                **changes(form),
            )
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, str(exc.message))
        else:
            return redirect(f"{reverse('providers')}#provider-{provider_id}")
    return _page(request, status=400, **{bad: form})
