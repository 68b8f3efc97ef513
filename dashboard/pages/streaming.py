"""CSV exports streamed, the header first (first byte ≤ 200 ms, bench/scale.py).

Django's ASGI handler reads a *synchronous* streaming body to its end before it
sends a byte (it must consume it off the event loop), so an export streamed
with a plain generator reaches the client in one piece after the whole report
is read. These responses stream an asynchronous iterator instead: the header
line goes out at once, then the rows, read by ``rest`` in the request's
thread (``sync_to_async``, thread-sensitive: the same database connection).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable

from asgiref.sync import sync_to_async
from django.forms import Form
from django.http import HttpResponse, StreamingHttpResponse


def csv_response(
    first: Iterable[str], rest: Callable[[], list[str]], *, filename: str
) -> StreamingHttpResponse:
    """``first``: lines ready now (the header); ``rest``: reads and returns the others."""

    async def lines() -> AsyncIterator[str]:
        for line in first:
            yield line
        for line in await sync_to_async(rest, thread_sensitive=True)():
            yield line

    response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def bad_filters(form: Form, what: str) -> HttpResponse:
    """400 in plain text naming each filter that is wrong (an export has no page to show them)."""
    errors = "; ".join(
        f"{name}: {' '.join(messages)}" if name != "__all__" else " ".join(messages)
        for name, messages in form.errors.items()
    )
    return HttpResponse(f"Bad {what}: {errors}\n", status=400, content_type="text/plain")
