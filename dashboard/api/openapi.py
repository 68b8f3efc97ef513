"""The API's OpenAPI 3.1 description, built from the same pydantic models that
validate the requests (``dashboard/api/schemas.py``): ``GET /api/v1/openapi.json``,
and the browsable page ``/docs/api/`` in the dashboard.

pydantic writes JSON Schema 2020-12, which is OpenAPI 3.1's schema dialect, so
the models' schemas go into ``components.schemas`` unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.urls import resolve
from django.views.decorators.csrf import csrf_exempt
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from dashboard.api import schemas as s
from dashboard.api.base import error_response
from dashboard.site import permissions
from governance.roles import ACTIONS

REF = "#/components/schemas/{model}"

ERRORS = {
    400: "bad input: the field and why (nothing was written)",
    401: "no token, or an unknown or revoked one",
    403: "the token's user lacks the permission",
    404: "no such object",
    405: "another method is used on this address",
    409: "the request conflicts with the object's state",
    413: f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes",
    415: "the body is not Content-Type: application/json",
    429: "the turns queue is backed up: the run was not admitted; retry after Retry-After seconds",
    500: "an internal error (logged with the reference it names)",
    503: "the database is unavailable for a moment: nothing was written; retry (Retry-After)",
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    answers: dict[int, tuple[str, type[BaseModel] | None]]
    body: type[BaseModel] | None = None
    errors: tuple[int, ...] = (401, 405, 500)
    tags: tuple[str, ...] = ()
    parameters: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    description: str = ""
    media_type: str = "application/json"


def _path_id(name: str, what: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": f"the {what}'s id (a UUID)",
        "schema": {"type": "string", "format": "uuid"},
    }


THREAD_ID = _path_id("thread_id", "thread")
RUN_ID = _path_id("run_id", "run")
WRITE = (400, 401, 404, 405, 413, 415, 500)


def _query(model: type[BaseModel]) -> tuple[dict[str, Any], ...]:
    """A query model's fields as OpenAPI query parameters (``null`` means absent)."""
    schema = model.model_json_schema(ref_template=REF)
    required = set(schema.get("required", []))
    parameters = []
    for name, spec in schema["properties"].items():
        spec = {k: v for k, v in spec.items() if k != "title"}
        options = [o for o in spec.pop("anyOf", []) if o.get("type") != "null"]
        if options:
            spec = {**spec, **options[0]}
        if spec.get("default", "") is None:
            del spec["default"]
        parameters.append(
            {
                "name": name,
                "in": "query",
                "required": name in required,
                "description": spec.pop("description", ""),
                "schema": spec,
            }
        )
    return tuple(parameters)


NOTIFICATION_ID = {
    "name": "notification_id",
    "in": "path",
    "required": True,
    "description": "the notification's id",
    "schema": {"type": "integer", "minimum": 1},
}
INCIDENT_ID = {
    "name": "incident_id",
    "in": "path",
    "required": True,
    "description": "the incident's id",
    "schema": {"type": "integer", "minimum": 1},
}
APPROVAL_ID = {
    "name": "approval_id",
    "in": "path",
    "required": True,
    "description": "the approval request's id",
    "schema": {"type": "integer", "minimum": 1},
}
PROVIDER_ID = {
    "name": "provider_id",
    "in": "path",
    "required": True,
    "description": "the provider's id (a slug)",
    "schema": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[-a-zA-Z0-9_]+$"},
}
ROUTE_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "the route's name (a slug)",
    "schema": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[-a-zA-Z0-9_]+$"},
}
TOOL_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "description": "the registry entry's name (a slug)",
    "schema": {"type": "string", "minLength": 1, "maxLength": 40, "pattern": "^[-a-zA-Z0-9_]+$"},
}
SEGMENT_KEY = {
    "name": "segment_key",
    "in": "path",
    "required": True,
    "description": "the segment's key, `session#number`: send `#` as `%23`",
    "schema": {"type": "string", "maxLength": 64, "pattern": "^[^#/]+#[1-9][0-9]*$"},
}
READ = (400, 401, 405, 500)

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "post", "/api/v1/threads", "Create a thread (its first session and segment, R1.2)",
        {201: ("the thread, with its open segment", s.ThreadAnswer)},
        body=s.ThreadCreate, errors=(400, 401, 405, 413, 415, 500), tags=("threads",),
    ),
    Operation(
        "get", "/api/v1/threads/{thread_id}", "A thread and its open segment",
        {200: ("the thread", s.ThreadAnswer)}, errors=(401, 404, 405, 500),
        tags=("threads",), parameters=(THREAD_ID,),
    ),
    Operation(
        "get", "/api/v1/threads/{thread_id}/segment",
        "The thread's open segment with each provider's verdict (R8.1)",
        {200: ("the open segment", s.SegmentAnswer)}, errors=(401, 404, 405, 500),
        tags=("threads",), parameters=(THREAD_ID,),
    ),
    Operation(
        "post", "/api/v1/threads/{thread_id}/runs", "Submit a run on the thread's open segment",
        {
            202: ("admitted; its first stage is queued", s.RunAccepted),
            200: ("the idempotency key's run, made earlier", s.RunAccepted),
        },
        body=s.RunSubmit, errors=(*WRITE, 429), tags=("runs",), parameters=(THREAD_ID,),
    ),
    Operation(
        "post", "/api/v1/threads/{thread_id}/boundaries",
        "Force a new segment: compact, fresh start, model switch … (R1.3, R8.3)",
        {
            201: ("the new open segment", s.SegmentAnswer),
            200: ("the idempotency key's boundary, made earlier", s.SegmentAnswer),
        },
        body=s.BoundaryApply, errors=(*WRITE, 403, 409), tags=("threads",),
        parameters=(THREAD_ID,),
        description="Needs the `apply_boundary` permission, like the dashboard's button.",
    ),
    Operation(
        "get", "/api/v1/runs/{run_id}", "A run: lifecycle, stages and clocks, attempts, "
        "budget, receipts, body and settlement",
        {200: ("the run", s.RunAnswer)}, errors=(400, 401, 404, 405, 500), tags=("runs",),
        parameters=(RUN_ID, *_query(s.RunQuery)),
    ),
    Operation(
        "post", "/api/v1/runs/{run_id}/cancel", "Stop a run (R7.1: only an explicit stop cancels)",
        {202: ("the stop is recorded; the run settles as cancelled", s.CancelAnswer)},
        errors=(401, 404, 405, 409, 500), tags=("runs",), parameters=(RUN_ID,),
    ),
    Operation(
        "get", "/api/v1/runs/{run_id}/events", "The run's events as Server-Sent Events (R7.1)",
        {200: ("an event stream; each event's id is its RunEvent id", None)},
        errors=(400, 401, 404, 405, 500), tags=("runs",),
        parameters=(
            RUN_ID,
            {
                "name": "last_event_id", "in": "query", "required": False,
                "description": "resume after this event id (or the Last-Event-ID header)",
                "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
            },
        ),
        media_type="text/event-stream",
    ),
    Operation(
        "post", "/api/v1/runs/{run_id}/acks",
        "Acknowledge the chunks the client has shown (R7.2, R7.3)",
        {200: ("what is committed, sent and observed now", s.AckAnswer)},
        body=s.AckBody, errors=(*WRITE, 403), tags=("runs",), parameters=(RUN_ID,),
        description="Only the run's owner: what its client was shown is its evidence, "
        "never an onlooker's (R7.2).",
    ),
    Operation(
        "get", "/api/v1/threads", "Threads, newest first (cursor-paged)",
        {200: ("one page of threads and the next cursor", s.ThreadPage)},
        errors=READ, tags=("threads",), parameters=_query(s.ThreadQuery),
    ),
    Operation(
        "get", "/api/v1/segments/{segment_key}",
        "Any segment (open or closed) by key, with each provider's verdict (R8.1)",
        {200: ("the segment", s.SegmentDetail)}, errors=(401, 404, 405, 500),
        tags=("threads",), parameters=(SEGMENT_KEY,),
    ),
    Operation(
        "get", "/api/v1/notifications",
        "Notifications (refusal and freeze alerts, R3.6, R8.2), newest first (cursor-paged)",
        {200: ("one page of notifications and the next cursor", s.NotificationPage)},
        errors=READ, tags=("notifications",), parameters=_query(s.NotificationQuery),
    ),
    Operation(
        "post", "/api/v1/notifications/{notification_id}/ack",
        "Acknowledge a notification (R8.2): once; again answers who was first",
        {200: ("the notification, acknowledged", s.NotificationAcked)},
        errors=(401, 403, 404, 405, 500), tags=("notifications",),
        parameters=(NOTIFICATION_ID,),
        description="Needs the `acknowledge_notification` permission, like the inbox's "
        "button. No body.",
    ),
    Operation(
        "get", "/api/v1/approvals",
        "Tool calls waiting for a person's approval, newest first (cursor-paged)",
        {200: ("one page of approval requests and the next cursor", s.ApprovalPage)},
        errors=READ, tags=("approvals",), parameters=_query(s.ApprovalQuery),
    ),
    Operation(
        "get", "/api/v1/approvals/{approval_id}",
        "One approval request: the exact call, who may answer, until when, the answer",
        {200: ("the request", s.ApprovalAnswer)}, errors=(401, 404, 405, 500),
        tags=("approvals",), parameters=(APPROVAL_ID,),
    ),
    Operation(
        "post", "/api/v1/approvals/{approval_id}",
        "Approve or deny a paused call: yes runs exactly the recorded call, once",
        {200: ("the request, decided", s.ApprovalAnswer)},
        body=s.ApprovalDecision, errors=(*WRITE, 403, 409), tags=("approvals",),
        parameters=(APPROVAL_ID,),
        description="Needs the `decide_approval` permission and the role the tool's policy "
        "names. A request already decided, past its wait, or whose run settled answers 409 "
        "with the decision that stands in `approval`; nothing changes. A denial needs a "
        "reason: the model reads it as the call's result, and the run goes on.",
    ),
    Operation(
        "get", "/api/v1/incidents",
        "Incidents (a segment's critical alerts as one, R8.2), newest first (cursor-paged)",
        {200: ("one page of incidents and the next cursor", s.IncidentList)},
        errors=READ, tags=("incidents",), parameters=_query(s.IncidentQuery),
    ),
    Operation(
        "get", "/api/v1/incidents/{incident_id}",
        "One incident: its steps, what each channel was told, the next escalation",
        {200: ("the incident", s.IncidentDetail)}, errors=(401, 404, 405, 500),
        tags=("incidents",), parameters=(INCIDENT_ID,),
    ),
    Operation(
        "post", "/api/v1/incidents/{incident_id}/ack",
        "Acknowledge an incident (R8.2): once, with an optional note; again answers who was first",
        {200: ("the incident, acknowledged", s.IncidentChanged)},
        body=s.IncidentAction, errors=(*WRITE, 403), tags=("incidents",),
        parameters=(INCIDENT_ID,),
        description="Needs the `acknowledge_notification` permission. Acknowledges every "
        "alert of the incident; escalation stops and the channels that were paged hear it.",
    ),
    Operation(
        "post", "/api/v1/incidents/{incident_id}/resolve",
        "Resolve an incident by hand (R8.2), with an optional note",
        {200: ("the incident, resolved", s.IncidentChanged)},
        body=s.IncidentAction, errors=(*WRITE, 403), tags=("incidents",),
        parameters=(INCIDENT_ID,),
        description="Needs the `acknowledge_notification` permission. A boundary that "
        "closes the segment resolves its incident by itself and says which one.",
    ),
    Operation(
        "get", "/api/v1/providers", "Providers: configuration and breaker state",
        {200: ("every provider", s.ProviderList)}, errors=(401, 405, 500),
        tags=("providers",),
    ),
    Operation(
        "post", "/api/v1/providers", "Add a provider",
        {201: ("the new provider", s.ProviderAnswer)},
        body=s.ProviderCreate, errors=(400, 401, 403, 405, 409, 413, 415, 500),
        tags=("providers",),
        description="Needs the `change_provider` permission. The key is named by its "
        "environment variable (`key_env`), never sent: a field such as `api_key` is "
        "refused as unknown. Only a variable matching `GOVERNANCE_KEY_ENV_ALLOW` may be "
        "named (default `GOVERNANCE_KEY_*` and the conventional provider names such as "
        "`OPENAI_API_KEY`); the system's own settings (`DJANGO_SECRET_KEY`, `DATABASE_URL`, "
        "the callback secret …) and `*_FILE` names are refused whatever it says. "
        f"{s.kinds_taking('server')} kinds need `base_url`: it may carry no credentials "
        "(`user:password@`, `?api_key=`), and a loopback, link-local (169.254.169.254), "
        "private or other non-public address is refused unless `GOVERNANCE_OUTBOUND_ALLOW` "
        "lists it (a local vLLM or Ollama: list its host or address). Both are checked "
        "again at every call: a provider stored before that the rules refuse is sent "
        "nothing, and its attempts fail as `auth` (a configuration change, or a change of "
        f"those settings, re-enables it). {s.kinds_taking('script')} needs `script`.",
    ),
    Operation(
        "get", "/api/v1/providers/{provider_id}", "A provider",
        {200: ("the provider", s.ProviderAnswer)}, errors=(401, 404, 405, 500),
        tags=("providers",), parameters=(PROVIDER_ID,),
    ),
    Operation(
        "patch", "/api/v1/providers/{provider_id}",
        "Change a provider: enable/disable, model, base URL, key variable, timeouts",
        {200: ("the provider as changed", s.ProviderAnswer)},
        body=s.ProviderUpdate, errors=(*WRITE, 403), tags=("providers",),
        parameters=(PROVIDER_ID,),
        description="Needs the `change_provider` permission. Only the fields sent change; "
        "a disabled provider is skipped by routing. A `key_env` or `base_url` given is "
        "checked as when adding one.",
    ),
    Operation(
        "get", "/api/v1/routes", "Routes: named provider chains a request's `model` may name",
        {200: ("every route", s.RouteList)}, errors=(401, 405, 500), tags=("routes",),
    ),
    Operation(
        "post", "/api/v1/routes", "Add a route",
        {201: ("the new route", s.RouteAnswer)},
        body=s.RouteCreate, errors=(400, 401, 403, 405, 409, 413, 415, 500), tags=("routes",),
        description="A route is provider configuration. `provider_chain` names existing "
        "providers, each once. The name is never a provider's id (route names and provider "
        "ids are one namespace: the OpenAI-compatible door's `model` names either): a name "
        "taken by a route or a provider answers 409.",
    ),
    Operation(
        "get", "/api/v1/routes/{name}", "A route",
        {200: ("the route", s.RouteAnswer)}, errors=(401, 404, 405, 500), tags=("routes",),
        parameters=(ROUTE_NAME,),
    ),
    Operation(
        "patch", "/api/v1/routes/{name}", "Change a route: its chain, description, enabled",
        {200: ("the route as changed", s.RouteAnswer)},
        body=s.RouteUpdate, errors=(*WRITE, 403), tags=("routes",), parameters=(ROUTE_NAME,),
        description="Only the fields sent change; the name stays.",
    ),
    Operation(
        "get", "/api/v1/insights/reprobes",
        "Re-probe outcomes: how often refused requests flip to accepted, per tier (R3)",
        {200: ("per tier (original refused send, re-render, history-only, re-probe n, first "
               "send after a boundary) and per provider, model and category", s.ReprobeInsights)},
        errors=(400, 401, 403, 405, 500), tags=("insights",),
        parameters=_query(s.InsightsQuery),
        description="Needs the `view_insights` permission (operators and managers). The "
        "acceptance rate is accepted / (accepted + refused) with its 95 % Wilson interval; "
        "failed sends (time-based failures) gave no answer and are counted apart. Default "
        "period: the 7 days before now; at most 366 days.",
    ),
    Operation(
        "get", "/api/v1/tools", "The tool registry: MCP servers and HTTP tools",
        {200: ("every registry entry", s.ToolList)}, errors=(401, 405, 500), tags=("tools",),
    ),
    Operation(
        "post", "/api/v1/tools", "Register an MCP server or an HTTP tool",
        {201: ("the entry, with the tools it exposes", s.ToolDetail)},
        body=s.ToolCreate, errors=(400, 401, 403, 405, 409, 413, 415, 500), tags=("tools",),
        description="Needs the `change_toolserver` permission. An mcp server is listed at "
        "once (`tools/list` over Streamable HTTP); its tools are `name.tool`, and a thread's "
        "`tool_surface` may name them or `name.*`. An http tool needs `method`, "
        "`description`, `parameters` (JSON Schema) and `effect`. A bearer token is named by "
        "its environment variable (`token_env`), never sent; the variable must match "
        "`GOVERNANCE_KEY_ENV_ALLOW`, as a provider's `key_env` must. The URLs carry no "
        "credentials (`user:password@`, `?token=`) and obey `GOVERNANCE_OUTBOUND_ALLOW`.",
    ),
    Operation(
        "get", "/api/v1/tools/{name}", "A registry entry and the tools it exposes",
        {200: ("the entry and its cached listing", s.ToolDetail)},
        errors=(401, 404, 405, 500), tags=("tools",), parameters=(TOOL_NAME,),
    ),
    Operation(
        "patch", "/api/v1/tools/{name}",
        "Change a registry entry: enable/disable, effect overrides, list again",
        {200: ("the entry as changed", s.ToolDetail)},
        body=s.ToolUpdate, errors=(*WRITE, 403), tags=("tools",), parameters=(TOOL_NAME,),
        description="Needs the `change_toolserver` permission. A change of the schemas a "
        "thread sees (a new listing, enabling or disabling) is a tool-surface boundary for "
        "that thread (R1.3); `boundaries` names the segments it opened.",
    ),
)  # fmt: skip

# OpenAPI links: where an answer's values lead (a client generator's next
# calls, and schemathesis's stateful phase). (method, path, status) → name →
# (the operation it leads to, its parameters from the answer).
RUN_LINK = {"run_id": "$response.body#/run_id"}
LINKS: dict[tuple[str, str, int], dict[str, tuple[tuple[str, str], dict[str, str]]]] = {
    ("post", "/api/v1/threads", 201): {
        "GetThread": (("get", "/api/v1/threads/{thread_id}"), {"thread_id": "$response.body#/id"}),
        "GetOpenSegment": (
            ("get", "/api/v1/threads/{thread_id}/segment"), {"thread_id": "$response.body#/id"}
        ),
        "SubmitRun": (
            ("post", "/api/v1/threads/{thread_id}/runs"), {"thread_id": "$response.body#/id"}
        ),
        "ForceBoundary": (
            ("post", "/api/v1/threads/{thread_id}/boundaries"), {"thread_id": "$response.body#/id"}
        ),
        "GetSegment": (
            ("get", "/api/v1/segments/{segment_key}"),
            {"segment_key": "$response.body#/segment/key"},
        ),
    },
    ("post", "/api/v1/threads/{thread_id}/runs", 202): {
        "GetRun": (("get", "/api/v1/runs/{run_id}"), RUN_LINK),
        "CancelRun": (("post", "/api/v1/runs/{run_id}/cancel"), RUN_LINK),
        "AckChunks": (("post", "/api/v1/runs/{run_id}/acks"), RUN_LINK),
    },
    ("post", "/api/v1/providers", 201): {
        "GetProvider": (
            ("get", "/api/v1/providers/{provider_id}"),
            {"provider_id": "$response.body#/provider_id"},
        ),
        "ChangeProvider": (
            ("patch", "/api/v1/providers/{provider_id}"),
            {"provider_id": "$response.body#/provider_id"},
        ),
    },
    ("post", "/api/v1/routes", 201): {
        "GetRoute": (("get", "/api/v1/routes/{name}"), {"name": "$response.body#/name"}),
        "ChangeRoute": (("patch", "/api/v1/routes/{name}"), {"name": "$response.body#/name"}),
    },
    ("post", "/api/v1/tools", 201): {
        "GetTool": (("get", "/api/v1/tools/{name}"), {"name": "$response.body#/name"}),
        "ChangeTool": (("patch", "/api/v1/tools/{name}"), {"name": "$response.body#/name"}),
    },
    ("get", "/api/v1/incidents", 200): {
        "GetIncident": (
            ("get", "/api/v1/incidents/{incident_id}"),
            {"incident_id": "$response.body#/items/0/id"},
        ),
        "AckIncident": (
            ("post", "/api/v1/incidents/{incident_id}/ack"),
            {"incident_id": "$response.body#/items/0/id"},
        ),
    },
    ("get", "/api/v1/notifications", 200): {
        "AckNotification": (
            ("post", "/api/v1/notifications/{notification_id}/ack"),
            {"notification_id": "$response.body#/items/0/id"},
        ),
    },
}  # fmt: skip


def operation_id(method: str, path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", f"{method} {path}").strip("_")


_DESCRIBED = {
    model: None
    for op in OPERATIONS
    for model in (op.body, *(m for _, m in op.answers.values()))
    if model is not None
}
MODELS: tuple[type[BaseModel], ...] = (*_DESCRIBED, s.ErrorAnswer)


def _content(model: type[BaseModel] | None, media_type: str) -> dict[str, Any]:
    if model is None:
        return {media_type: {"schema": {"type": "string"}}}
    return {media_type: {"schema": {"$ref": REF.format(model=model.__name__)}}}


def declared_permission(op: Operation) -> str | None:
    """The codename the operation's view declares it checks (None: a read any token may make)."""
    view = resolve(re.sub(r"\{[^}]+\}", "x", op.path)).func
    needed = view.required_permissions[op.method.upper()]
    if isinstance(needed, tuple):  # (a permission, OWN_RUN): the permission, or the owner
        needed = needed[0]
    return needed.split(".", 1)[1] if needed and needed.startswith("governance.") else None


def _operation(op: Operation) -> dict[str, Any]:
    responses: dict[str, Any] = {
        str(status): {"description": words, "content": _content(model, op.media_type)}
        for status, (words, model) in op.answers.items()
    }
    errors, description = op.errors, op.description
    needed = declared_permission(op)
    if needed is not None:
        # What the view checks, said once: its 403 and the permission's name.
        errors = tuple(sorted({*errors, 403}))
        if f"`{needed}`" not in description:
            description = f"Needs the `{needed}` permission (to {ACTIONS[needed]}). {description}"
    for status in (*errors, 503) if 500 in errors else errors:
        responses[str(status)] = {
            "description": ERRORS[status],
            "content": _content(s.ErrorAnswer, "application/json"),
        }
    for (method, path, status), links in LINKS.items():
        if (method, path) == (op.method, op.path):
            responses[str(status)]["links"] = {
                name: {"operationId": operation_id(*target), "parameters": parameters}
                for name, (target, parameters) in links.items()
            }
    responses = dict(sorted(responses.items()))
    described: dict[str, Any] = {
        "operationId": operation_id(op.method, op.path),
        "summary": op.summary,
        "tags": list(op.tags),
        "parameters": list(op.parameters),
        "responses": responses,
    }
    if description.strip():
        described["description"] = description.strip()
    if op.body is not None:
        described["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model=op.body.__name__)}}
            },
        }
    return described


@cache
def openapi_document() -> dict[str, Any]:
    _, schemas = models_json_schema([(model, "validation") for model in MODELS], ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Agent governance API",
            "version": "1",
            "description": (
                "Runs of LLM agents under governance rules (docs/rules.md). Every request "
                "sends `Authorization: Bearer <token>` (`manage.py create_api_token`). Bad "
                'input answers 4xx with `{"error": {"field": …, "message": …}}` and writes '
                "nothing; bodies are JSON objects of at most "
                f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes, and unknown fields are "
                "refused by name. Threads and runs belong to the user who created them: "
                "without `see_all_runs` (a service account) a token sees and acts on its "
                "user's own only, and someone else's answers 404."
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


@csrf_exempt
@permissions.declared(GET=permissions.ANYONE)
def openapi_json(request: HttpRequest) -> JsonResponse:
    """GET /api/v1/openapi.json — public: a client generator needs no token."""
    if request.method != "GET":
        response = error_response(405, None, "use GET on this address")
        response["Allow"] = "GET"
        return response
    return JsonResponse(openapi_document(), json_dumps_params={"indent": 1})
