"""``GET /v1/models``: the names a request's ``model`` may give — the enabled
routes, then the enabled providers — in OpenAI's list shape. Any valid API
token may read it."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from dashboard.api.base import ApiError, authenticate
from dashboard.openai.errors import method_not_allowed, openai_error
from dashboard.queries.routes import offered_models
from dashboard.site import permissions

METHODS = ("GET",)


@csrf_exempt
def list_models(request: HttpRequest) -> JsonResponse:
    if request.method not in METHODS:
        return method_not_allowed(METHODS)
    try:
        authenticate(request)
    except ApiError as exc:
        return openai_error(401, exc.message, code="invalid_api_key")
    return JsonResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": model.id,
                    "object": "model",
                    "created": int(model.created.timestamp()),
                    "owned_by": model.owned_by,
                }
                for model in offered_models()
            ],
        }
    )


# A read any token may make (as an API view declares ``permission=None``).
permissions.declare(list_models, {"GET": None})
