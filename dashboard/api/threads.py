"""Threads over the API: ``GET``/``POST /api/v1/threads``, a thread, its open
segment, and the operator's boundaries (``POST …/boundaries``, R5.1)."""

from __future__ import annotations

import uuid
from typing import Any

from django.http import HttpRequest, JsonResponse

from dashboard.api.base import (
    ApiError,
    api_view,
    by_method,
    get_or_404,
    page,
    parse_body,
    parse_query,
    parse_uuid,
    require_visible,
)
from dashboard.api.schemas import BoundaryApply, ThreadCreate, ThreadQuery
from dashboard.api.segments import segment_json
from dashboard.site import permissions
from governance import services, time_source
from governance.models import Segment, Thread


def thread_json(thread: Thread) -> dict[str, Any]:
    return {
        "id": str(thread.id),
        "title": thread.title,
        "provider_chain": thread.provider_chain,
        "model": thread.model,
        "mode": thread.mode,
        "tool_surface": thread.tool_surface,
        "system_prompt": thread.system_prompt,
        "callback_url": thread.callback_url or None,
        "created_at": thread.created_at.isoformat(),
        # A conversation the OpenAI-compatible door keeps (its runs name the client).
        "door": (
            {"session_id": thread.client_session_key, "model": thread.client_model}
            if thread.client_model
            else None
        ),
    }


@api_view(("POST",), permission=permissions.SUBMIT_RUN)
def create_thread(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, ThreadCreate)
    thread = services.create_thread(
        **body.model_dump(), user=request.api_user, now=time_source.now()
    )
    answer = thread_json(thread)
    answer["segment"] = segment_json(services.open_segment(thread), time_source.now())
    return JsonResponse(answer, status=201)


def _thread(request: HttpRequest, thread_id: str) -> Thread:
    thread = get_or_404(Thread, id=parse_uuid(thread_id, "thread"))
    require_visible(request, thread.created_by_id, "thread")
    return thread


@api_view(("GET",))
def thread_detail(request: HttpRequest, thread_id: str) -> JsonResponse:
    thread = _thread(request, thread_id)
    body = thread_json(thread)
    body["segment"] = segment_json(services.open_segment(thread), time_source.now())
    return JsonResponse(body)


@api_view(("GET",))
def thread_segment(request: HttpRequest, thread_id: str) -> JsonResponse:
    thread = _thread(request, thread_id)
    return JsonResponse(segment_json(services.open_segment(thread), time_source.now()))


# R8.3: the permission of the dashboard's boundary buttons.
@api_view(("POST",), permission=permissions.APPLY_BOUNDARY)
def apply_boundary(request: HttpRequest, thread_id: str) -> JsonResponse:
    thread = _thread(request, thread_id)
    body = parse_body(request, BoundaryApply)
    segment, created = services.apply_boundary(
        thread,
        body.kind.value,
        by=request.api_user.get_username(),
        reason=body.reason,
        idempotency_key=body.idempotency_key,
        model=body.model,
        mode=body.mode,
        tool_surface=body.tool_surface,
        system_prompt=body.system_prompt,
        now=time_source.now(),
    )
    if not created and segment.thread_id != thread.id:
        # The key was spent on another thread's boundary: never answer with its segment.
        raise ApiError(400, "idempotency_key", "already used for another thread")
    return JsonResponse(segment_json(segment, time_source.now()), status=201 if created else 200)


def thread_list_json(thread: Thread, open_segments: dict) -> dict[str, Any]:
    answer = thread_json(thread)
    del answer["system_prompt"]  # can be long: GET /api/v1/threads/{id} has it
    answer["open_segment"] = open_segments.get(thread.id)
    return answer


@api_view(("GET",))
def list_threads(request: HttpRequest) -> JsonResponse:
    query = parse_query(request, ThreadQuery)
    threads = permissions.visible(
        Thread.objects.all(), request.api_user, request.api_scopes, owner="created_by"
    )
    items, next_cursor = page(threads, query, uuid.UUID)
    open_segments = dict(
        Segment.objects.filter(thread__in=items, closed_at__isnull=True).values_list(
            "thread_id", "key"
        )
    )
    return JsonResponse(
        {"items": [thread_list_json(t, open_segments) for t in items], "next_cursor": next_cursor}
    )


threads = by_method(GET=list_threads, POST=create_thread)
