"""An action after the session expired says so and comes back where it was.

``login_required`` answers a signed-out request with a redirect to the login
page. For a page that is fine; for an htmx request htmx would follow it and
swap the login form into the page (inside the Overview board, under a header
that still shows the user), and a plain form POST would come back after
logging in to an address that only takes POST. So, for those two:

- htmx: the answer is ``HX-Redirect`` to the login page, a real navigation;
- both: ``next`` is the page the person was on (``HX-Current-URL``, or the
  same-origin Referer of a form), and ``expired=1`` makes the login page
  say "Your session expired — log in again".

Sync and async (``AnswerMiddleware``), like every middleware here.
"""

from __future__ import annotations

from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django.utils.http import url_has_allowed_host_and_scheme

from dashboard.site.answer_middleware import AnswerMiddleware


class SessionExpiryMiddleware(AnswerMiddleware):
    def _finish(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        htmx = request.headers.get("HX-Request") == "true"
        if response.status_code != 302 or not (htmx or request.method == "POST"):
            return response
        login = resolve_url(settings.LOGIN_URL)
        if urlsplit(response.get("Location", "")).path != login:
            return response
        came_from = request.headers.get("HX-Current-URL") or request.headers.get("Referer") or ""
        if not url_has_allowed_host_and_scheme(
            came_from, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            came_from = "/"
        parts = urlsplit(came_from)
        back = parts.path + (f"?{parts.query}" if parts.query else "")
        target = f"{login}?{urlencode({'next': back or '/', 'expired': '1'})}"
        if not htmx:
            response["Location"] = target
            return response
        answer = HttpResponse(status=200)
        answer["HX-Redirect"] = target
        return answer
