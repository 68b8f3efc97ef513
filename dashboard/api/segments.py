"""Segments over the API: ``GET /api/v1/segments/{key}`` and the segment a thread answers with."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, JsonResponse

from dashboard.api.base import ApiError, api_view, require_visible
from governance import services, time_source
from governance.models import Segment
from governance.rules.refusal import RefusalError, parse_segment_key


def segment_json(segment: Segment, now) -> dict[str, Any]:
    return {
        "key": segment.key,
        "session_id": segment.session_id,
        "segment_no": segment.segment_no,
        "model": segment.model,
        "mode": segment.mode,
        "tool_surface": segment.tool_surface,
        "opened_at": segment.opened_at.isoformat(),
        "closed_at": segment.closed_at.isoformat() if segment.closed_at else None,
        "closed_kind": segment.closed_kind or None,
        "closed_by": segment.closed_by or None,
        "close_reason": segment.close_reason or None,
        "providers": services.refusal_rows_view(segment, now),
    }


@api_view(("GET",))
def segment_detail(request: HttpRequest, segment_key: str) -> JsonResponse:
    """Any segment (open or closed) by its key, ``session#number`` (``%23`` in the path)."""
    try:
        parse_segment_key(segment_key)  # its shape, before the database sees it
        if "\x00" in segment_key or len(segment_key) > Segment._meta.get_field("key").max_length:
            raise RefusalError(segment_key)
        segment = Segment.objects.select_related("thread").get(key=segment_key)
    except (RefusalError, Segment.DoesNotExist):
        raise ApiError(404, None, "no such segment") from None
    require_visible(request, segment.thread.created_by_id, "segment")
    answer = segment_json(segment, time_source.now())
    answer["thread_id"] = str(segment.thread_id)
    return JsonResponse(answer)
