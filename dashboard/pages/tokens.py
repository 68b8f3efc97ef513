"""API tokens in the dashboard: yours (staff: everyone's), a new one shown
once, and one click to revoke. The same service as ``manage.py api_tokens``."""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from dashboard.site import permissions
from governance import time_source
from governance.models import ApiToken
from governance.roles import ACTIONS
from governance.services.errors import ServiceError
from governance.services.tokens import TOKEN_SCOPES, create_token, revoke_token

NEW_TOKEN_KEY = "new_api_token"


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. “billing agent”.")
    scopes = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="Leave all unticked for everything your role allows.",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        # Only what the role allows can be a scope (a scope narrows, never widens).
        self.fields["scopes"].choices = [
            (s, ACTIONS[s]) for s in TOKEN_SCOPES if user.has_perm(f"governance.{s}")
        ]


def _visible(request: HttpRequest):
    rows = ApiToken.objects.select_related("user").order_by("revoked_at", "-created_at", "-id")
    return rows if request.user.is_staff else rows.filter(user=request.user)


@login_required
# A token is its user's own, and never wider than its role (scopes narrow).
@permissions.requires(GET=None, POST=permissions.SIGNED_IN)
def tokens(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None, user=request.user)
    # Shown once: kept in the session across the redirect, so a reload neither
    # shows it again nor posts the form a second time.
    secret = request.session.pop(NEW_TOKEN_KEY, None)
    if request.method == "POST" and form.is_valid():
        try:
            _row, request.session[NEW_TOKEN_KEY] = create_token(
                request.user, name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"], by=request.user.get_username(),
                now=time_source.now(),
            )  # fmt: skip
            return redirect("tokens")
        except ServiceError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
    return render(
        request,
        "tokens.html",
        {"form": form, "secret": secret, "rows": _visible(request)[:200]},
        status=400 if form.errors else 200,
    )


@login_required
@permissions.requires(POST=permissions.SIGNED_IN)  # its own (staff: any)
def revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    row = _visible(request).filter(id=token_id).first()
    if row is None:
        raise Http404("No such token.")
    revoke_token(row, by=request.user.get_username(), now=time_source.now())
    return redirect("tokens")
