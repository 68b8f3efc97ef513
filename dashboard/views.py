from __future__ import annotations

from datetime import UTC, datetime

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from dashboard.status import refusal_rule_summary, system_status


@require_GET
@login_required
def overview(request: HttpRequest) -> HttpResponse:
    components = system_status(datetime.now(UTC))
    template = "overview.html#system-status" if request.htmx else "overview.html"
    return render(
        request,
        template,
        {"components": components, "rule": refusal_rule_summary()},
    )


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness for load balancers: 200 when the database answers, else 503."""
    components = system_status(datetime.now(UTC))
    body = {
        component.name: {
            "ok": component.ok,
            "detail": component.detail,
            "age_seconds": component.age_seconds,
        }
        for component in components
        if component.name != "broker"  # never expose connection details unauthenticated
    }
    database_ok = body["database"]["ok"]
    body["ok"] = database_ok
    return JsonResponse(body, status=200 if database_ok else 503)
