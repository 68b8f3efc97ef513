"""The shape of a middleware that only reads (and may replace) the answer.

Sync and async both: under ASGI a sync-only middleware would make Django run
the whole chain, event streams included, through a thread. A subclass writes
``_finish(request, response)``.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse


class AnswerMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if self.async_mode:
            return self.__acall__(request)
        return self._finish(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest):
        return self._finish(request, await self.get_response(request))

    def _finish(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        raise NotImplementedError
