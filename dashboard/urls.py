from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import (
    alert_views,
    api,
    audit_views,
    insights_api,
    insights_views,
    openapi,
    provider_views,
    report_views,
    run_views,
    segment_views,
    stream_views,
    token_views,
    tool_api,
    tool_views,
    views,
)

api_patterns = [
    path("api/v1/openapi.json", openapi.openapi_json, name="api-openapi"),
    path("api/v1/threads", api.threads, name="api-threads"),
    path("api/v1/threads/<str:thread_id>", api.thread_detail, name="api-thread"),
    path("api/v1/threads/<str:thread_id>/segment", api.thread_segment, name="api-segment"),
    path("api/v1/threads/<str:thread_id>/runs", api.submit_run, name="api-runs"),
    path("api/v1/threads/<str:thread_id>/boundaries", api.apply_boundary, name="api-boundaries"),
    path("api/v1/runs/<str:run_id>", api.run_detail, name="api-run"),
    path("api/v1/runs/<str:run_id>/cancel", api.cancel_run, name="api-run-cancel"),
    path("api/v1/runs/<str:run_id>/events", stream_views.run_events, name="api-run-events"),
    path("api/v1/runs/<str:run_id>/acks", stream_views.run_acks, name="api-run-acks"),
    path("api/v1/notifications", api.notifications, name="api-notifications"),
    path(
        "api/v1/notifications/<str:notification_id>/ack",
        api.acknowledge_notification,
        name="api-notification-ack",
    ),
    path("api/v1/providers", api.providers, name="api-providers"),
    path("api/v1/providers/<str:provider_id>", api.provider, name="api-provider"),
    path("api/v1/segments/<str:segment_key>", api.segment_detail, name="api-segment-detail"),
    path("api/v1/insights/reprobes", insights_api.reprobes, name="api-insights-reprobes"),
    path("api/v1/tools", tool_api.tools, name="api-tools"),
    path("api/v1/tools/<str:name>", tool_api.tool, name="api-tool"),
]

urlpatterns = [
    path("", views.overview, name="overview"),
    path("healthz", views.healthz, name="healthz"),
    path("alerts/", alert_views.alerts, name="alerts"),
    path("alerts/<int:notification_id>/ack", alert_views.acknowledge, name="alert-ack"),
    path("segments/", segment_views.segments, name="segments"),
    path("segments/<int:segment_id>/", segment_views.segment_detail, name="segment"),
    path(
        "segments/<int:segment_id>/boundary",
        segment_views.apply_boundary,
        name="segment-boundary",
    ),
    path("runs/", run_views.runs, name="runs"),
    path("runs/<uuid:run_id>/", run_views.run_detail, name="run"),
    path("runs/<uuid:run_id>/watch", stream_views.watch, name="run-watch"),
    path("runs/<uuid:run_id>/stop", stream_views.watch_stop, name="run-stop"),
    path("reports/delivery/", report_views.delivery_report, name="report"),
    path("reports/delivery.csv", report_views.delivery_report_csv, name="report-csv"),
    path("insights/", insights_views.insights, name="insights"),
    path("insights/reprobes.csv", insights_views.insights_csv, name="insights-csv"),
    path("providers/", provider_views.providers, name="providers"),
    path(
        "providers/<str:provider_id>/prices",
        provider_views.provider_prices,
        name="provider-prices",
    ),
    path(
        "providers/<str:provider_id>/schedule",
        provider_views.provider_schedule,
        name="provider-schedule",
    ),
    path("tools/", tool_views.tools, name="tools"),
    path("audit/", audit_views.audit_log, name="audit"),
    path("docs/api/", openapi.api_reference, name="api-reference"),
    path("tokens/", token_views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", token_views.revoke, name="token-revoke"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    *api_patterns,
]

# Errors under /api/ answer JSON; elsewhere Django's plain pages (dashboard/errors.py).
handler400 = "dashboard.errors.bad_request"
handler403 = "dashboard.errors.permission_denied"
handler404 = "dashboard.errors.page_not_found"
handler500 = "dashboard.errors.server_error"
