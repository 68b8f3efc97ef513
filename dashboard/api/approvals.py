"""Approvals over the API: the calls waiting for a person, one request, and a
yes or no with a reason (``POST /api/v1/approvals/{id}``). An answer that
does not count (decided, expired, not yours) is 409/403 with the request as
it stands, and changes nothing."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import reverse

from dashboard.api.base import ApiError, api_view, by_method, page, parse_body, parse_query
from dashboard.api.incidents import _incident_pk as _pk
from dashboard.api.schemas import ApprovalDecision, ApprovalQuery
from dashboard.queries import approvals as queries
from dashboard.site import permissions
from governance import time_source
from governance.models import ToolApproval
from governance.services import approvals as service


def _json(request: HttpRequest, approval: ToolApproval) -> dict:
    url = request.build_absolute_uri(reverse("approvals") + f"#approval-{approval.id}")
    return queries.approval_json(approval, url=url)


def _visible(request: HttpRequest):
    # A service account sees the requests of its own runs.
    return permissions.visible(
        queries.approvals(), request.api_user, request.api_scopes, owner="run__owner"
    )


def _found(request: HttpRequest, approval_id: str) -> ToolApproval:
    try:
        pk = _pk(approval_id)
    except ValueError:
        raise ApiError(404, None, "no such approval request") from None
    found = _visible(request).filter(pk=pk).first()
    if found is None:
        raise ApiError(404, None, "no such approval request")
    return found


@api_view(("GET",))
def approvals(request: HttpRequest) -> JsonResponse:
    query = parse_query(request, ApprovalQuery)
    rows = _visible(request)
    if query.state == "waiting":
        rows = queries.waiting(rows)
    elif query.state != "all":
        rows = rows.filter(state=query.state)
    items, next_cursor = page(rows, query, _pk, at="requested_at")
    return JsonResponse({"items": [_json(request, a) for a in items], "next_cursor": next_cursor})


@api_view(("GET",))
def read_approval(request: HttpRequest, approval_id: str) -> JsonResponse:
    return JsonResponse(_json(request, _found(request, approval_id)))


@api_view(("POST",), permission=permissions.DECIDE_APPROVAL)
def decide(request: HttpRequest, approval_id: str) -> JsonResponse:
    """``approve`` or ``deny`` (a reason required: the model reads it)."""
    body = parse_body(request, ApprovalDecision)
    found = _found(request, approval_id)
    try:
        decided = service.decide(
            found.pk, decision=body.decision, reason=body.reason, user=request.api_user,
            now=time_source.now(),
        )  # fmt: skip
    except service.ApprovalRefused as exc:
        return JsonResponse(
            {"error": {"field": "decision", "message": exc.message},
             "approval": _json(request, exc.approval)},
            status=exc.status,
        )  # fmt: skip
    return JsonResponse(_json(request, decided))


approval = by_method(GET=read_approval, POST=decide)
