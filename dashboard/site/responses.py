"""An answer type the ASGI entry (``dashboard.site.asgi``) sends its own way."""

from django.http import StreamingHttpResponse


class WaitedAnswer(StreamingHttpResponse):
    """A waiting request's answer: a body of exactly one part, sent when the
    run settles. The ASGI entry sends that part with the body's end, in one
    write (``dashboard.site.asgi``): the client has the whole answer with one read,
    not a chunk and then the chunked body's end in another packet."""


class Answered(bytes):
    """A waited answer's body that decides its own status and headers (the
    door's error for a run that did not answer, R6.5): the response's status
    line waits for it (``dashboard.site.asgi``)."""

    status: int = 200
    headers: dict[str, str]

    def __new__(cls, body: bytes, status: int = 200, headers: dict[str, str] | None = None):
        made = super().__new__(cls, body)
        made.status, made.headers = status, dict(headers or {})
        return made


def apply_answered(response, part: bytes) -> None:
    """Give ``response`` the status and headers its answer decided, if it did."""
    if isinstance(part, Answered):
        response.status_code = part.status
        for name, value in part.headers.items():
            response[name] = value
