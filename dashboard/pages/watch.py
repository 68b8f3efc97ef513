"""The watch page (R7.1–R7.3): an end user's view of a run's answer as it streams,
with Stop (an explicit user stop) and acks; the stream itself is ``dashboard.api.events``."""

from __future__ import annotations

import uuid

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from dashboard.api.base import error_response
from dashboard.site import permissions
from governance import services, time_source
from governance.models import Run, Settlement
from governance.services import stream as stream
from governance.services.errors import RunSettled


def _visible_run(request: HttpRequest, run_id: uuid.UUID) -> Run:
    """The run if the user may see it; someone else's is a 404 (as over the API)."""
    return get_object_or_404(permissions.visible(Run.objects.all(), request.user), id=run_id)


@login_required
@permissions.requires(GET=None)
def watch(request: HttpRequest, run_id: uuid.UUID) -> HttpResponse:
    """/runs/{id}/watch — the end-user page: streams the answer, Stop, acks."""
    run = _visible_run(request, run_id)
    settlement = Settlement.objects.filter(run=run).first()
    context = {
        "run": run,
        "settlement": settlement,
        "can_stop": permissions.may_stop(request.user, run),
        # R7.2: only the run's owner's page acknowledges; anyone else is an onlooker.
        "records_delivery": permissions.records_delivery(request.user, run.owner_id),
    }
    return render(request, "watch.html", context)


@login_required
@permissions.requires(POST=(permissions.CANCEL_RUN, permissions.OWN_RUN))
def watch_stop(request: HttpRequest, run_id: uuid.UUID) -> JsonResponse:
    """POST /runs/{id}/stop — the Stop button: an explicit user stop (R7.1), like the API."""
    run = _visible_run(request, run_id)
    if not permissions.may_stop(request.user, run):
        return error_response(403, None, permissions.refusal(permissions.CANCEL_RUN))
    try:
        services.request_cancel(run, by=request.user.get_username(), now=time_source.now())
    except RunSettled as exc:
        return error_response(409, None, exc.message)
    return JsonResponse({"run_id": str(run.id), "cancel_requested": True}, status=202)
