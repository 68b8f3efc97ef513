"""An answer type the ASGI entry (``dashboard.site.asgi``) sends its own way."""

from django.http import StreamingHttpResponse


class WaitedAnswer(StreamingHttpResponse):
    """A waiting request's answer: a body of exactly one part, sent when the
    run settles. The ASGI entry sends that part with the body's end, in one
    write (``dashboard.site.asgi``): the client has the whole answer with one read,
    not a chunk and then the chunked body's end in another packet."""
