"""The public API's addresses under ``/api/v1/``, one module per resource."""

from django.urls import path

from dashboard.api import (
    approvals,
    events,
    incidents,
    insights,
    notifications,
    openapi,
    providers,
    routes,
    runs,
    segments,
    threads,
    tools,
)

api_patterns = [
    path("api/v1/openapi.json", openapi.openapi_json, name="api-openapi"),
    path("api/v1/threads", threads.threads, name="api-threads"),
    path("api/v1/threads/<str:thread_id>", threads.thread_detail, name="api-thread"),
    path("api/v1/threads/<str:thread_id>/segment", threads.thread_segment, name="api-segment"),
    path("api/v1/threads/<str:thread_id>/runs", runs.submit_run, name="api-runs"),
    path(
        "api/v1/threads/<str:thread_id>/boundaries",
        threads.apply_boundary,
        name="api-boundaries",
    ),
    path("api/v1/runs/<str:run_id>", runs.run_detail, name="api-run"),
    path("api/v1/runs/<str:run_id>/cancel", runs.cancel_run, name="api-run-cancel"),
    path("api/v1/runs/<str:run_id>/events", events.run_events, name="api-run-events"),
    path("api/v1/runs/<str:run_id>/acks", events.run_acks, name="api-run-acks"),
    path("api/v1/notifications", notifications.notifications, name="api-notifications"),
    path(
        "api/v1/notifications/<str:notification_id>/ack",
        notifications.acknowledge_notification,
        name="api-notification-ack",
    ),
    path("api/v1/approvals", approvals.approvals, name="api-approvals"),
    path("api/v1/approvals/<str:approval_id>", approvals.approval, name="api-approval"),
    path("api/v1/incidents", incidents.incidents, name="api-incidents"),
    path("api/v1/incidents/<str:incident_id>", incidents.incident, name="api-incident"),
    path("api/v1/incidents/<str:incident_id>/ack", incidents.acknowledge, name="api-incident-ack"),
    path(
        "api/v1/incidents/<str:incident_id>/resolve",
        incidents.resolve,
        name="api-incident-resolve",
    ),
    path("api/v1/providers", providers.providers, name="api-providers"),
    path("api/v1/providers/<str:provider_id>", providers.provider, name="api-provider"),
    path("api/v1/routes", routes.routes, name="api-routes"),
    path("api/v1/routes/<str:name>", routes.route, name="api-route"),
    path("api/v1/segments/<str:segment_key>", segments.segment_detail, name="api-segment-detail"),
    path("api/v1/insights/reprobes", insights.reprobes, name="api-insights-reprobes"),
    path("api/v1/tools", tools.tools, name="api-tools"),
    path("api/v1/tools/<str:name>", tools.tool, name="api-tool"),
]
