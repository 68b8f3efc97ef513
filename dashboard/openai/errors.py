"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``:
OpenAI's clients read these fields (its Python SDK raises
``AuthenticationError`` on a 401, and shows ``message``), not the API's
``{"error": {"field", "message"}}``."""

from __future__ import annotations

from django.http import JsonResponse

# The ``type`` OpenAI gives each status (its SDKs pick their exception by status).
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


def openai_error(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> JsonResponse:
    response = JsonResponse(
        {
            "error": {
                "message": message,
                "type": TYPES.get(status, "invalid_request_error"),
                "param": param,
                "code": code,
            }
        },
        status=status,
    )
    if status == 401:
        # RFC 9110 §15.5.2: a 401 names the scheme the client should use.
        response["WWW-Authenticate"] = 'Bearer realm="v1"'
    return response


def method_not_allowed(methods: tuple[str, ...]) -> JsonResponse:
    response = openai_error(
        405, f"use {' or '.join(methods)} on this address", code="method_not_allowed"
    )
    response["Allow"] = ", ".join(methods)
    return response
