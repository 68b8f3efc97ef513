"""The Content-Security-Policy header on every answer: django-csp's middleware,
with a policy of its own for the API.

Pages get ``settings.CONTENT_SECURITY_POLICY``. An answer under ``/api/`` (JSON,
the event stream) is never a document that loads anything, so it gets
``settings.API_CONTENT_SECURITY_POLICY``: nothing may load, nothing may frame
it. A view's own policy (django-csp's decorators) still wins over both.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

from dashboard.site.errors import answers_json


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    def get_policy_parts(
        self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        if not report_only and parts.config is None and answers_json(request):
            parts.config = settings.API_CONTENT_SECURITY_POLICY["DIRECTIVES"]
        return parts
