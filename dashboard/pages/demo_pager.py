"""The demo's pager: a local sink the demo's alert channel pages, so a fresh
``make run`` shows a page going out (on the incident page: delivered, HTTP
200; in the console: one line per page) without any outside service.

Only with ``GOVERNANCE_DEMO_PAGER`` (on under ``DJANGO_DEBUG=1``, off
otherwise): else this address does not exist (404). It takes the generic
webhook's JSON and keeps nothing.
"""

from __future__ import annotations

import json
import logging

from django.conf import settings
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from dashboard.site import permissions

log = logging.getLogger(__name__)


@csrf_exempt
@permissions.requires(POST=permissions.ANYONE)
def demo_pager(request: HttpRequest) -> JsonResponse:
    if not settings.GOVERNANCE_DEMO_PAGER:
        raise Http404("The demo pager is off (GOVERNANCE_DEMO_PAGER).")
    try:
        page = json.loads(request.body or b"null")
    except ValueError:
        return JsonResponse({"error": "send the webhook's JSON"}, status=400)
    if not isinstance(page, dict):
        return JsonResponse({"error": "send the webhook's JSON object"}, status=400)
    # WARNING: `manage.py up` shows warnings by default, so the page is seen going out.
    log.warning(
        "demo pager got a page: %s %s",
        str(page.get("headline", ""))[:200],
        str(page.get("url", ""))[:300],
    )
    return JsonResponse({"received": True})
