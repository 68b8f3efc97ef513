"""ASGI entry point (served by uvicorn; streams need an async server)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
django_application = get_asgi_application()

from django.conf import settings  # noqa: E402  (needs settings loaded)

from tasks.telemetry import configure_telemetry  # noqa: E402

configure_telemetry(component="web")


async def application(scope, receive, send):
    """Django's ASGI handler spools a whole body to a temporary file before any
    middleware runs; a declared Content-Length over the limit is refused here,
    before the body is read (the same 413 JSON as dashboard/errors.py)."""
    if (
        scope["type"] == "http"
        and scope.get("path", "").startswith("/api/")
        and _declared_length(scope) > settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    ):
        from dashboard.errors import too_large

        response = too_large()
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
        headers.append((b"content-length", str(len(response.content)).encode()))
        headers.append((b"connection", b"close"))  # the unread body is not drained
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": response.content})
        return
    await django_application(scope, receive, send)


def _declared_length(scope) -> int:
    from dashboard.errors import declared_length

    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return declared_length(value.decode("latin-1")) or 0  # not a number: Django's 400
    return 0
