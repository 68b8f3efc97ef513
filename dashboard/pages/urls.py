"""The dashboard's pages: on-call, operators and managers."""

from django.urls import path

from dashboard.pages import (
    alerts,
    api_reference,
    audit,
    insights,
    overview,
    providers,
    reports,
    runs,
    segments,
    tokens,
    tools,
    watch,
)

page_patterns = [
    path("", overview.overview, name="overview"),
    path("healthz", overview.healthz, name="healthz"),
    path("alerts/", alerts.alerts, name="alerts"),
    path("alerts/<int:notification_id>/ack", alerts.acknowledge, name="alert-ack"),
    path("segments/", segments.segments, name="segments"),
    path("segments/<int:segment_id>/", segments.segment_detail, name="segment"),
    path("segments/<int:segment_id>/boundary", segments.apply_boundary, name="segment-boundary"),
    path("runs/", runs.runs, name="runs"),
    path("runs/<uuid:run_id>/", runs.run_detail, name="run"),
    path("runs/<uuid:run_id>/watch", watch.watch, name="run-watch"),
    path("runs/<uuid:run_id>/stop", watch.watch_stop, name="run-stop"),
    path("reports/delivery/", reports.delivery_report, name="report"),
    path("reports/delivery.csv", reports.delivery_report_csv, name="report-csv"),
    path("insights/", insights.insights, name="insights"),
    path("insights/reprobes.csv", insights.insights_csv, name="insights-csv"),
    path("providers/", providers.providers, name="providers"),
    path("providers/<str:provider_id>/prices", providers.provider_prices, name="provider-prices"),
    path(
        "providers/<str:provider_id>/schedule",
        providers.provider_schedule,
        name="provider-schedule",
    ),
    path("tools/", tools.tools, name="tools"),
    path("tools/stdio", tools.register_stdio, name="tool-stdio"),
    path("tools/import", tools.import_preview, name="tool-import"),
    path("tools/import/register", tools.import_register, name="tool-import-register"),
    path("audit/", audit.audit_log, name="audit"),
    path("docs/api/", api_reference.api_reference, name="api-reference"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke", tokens.revoke, name="token-revoke"),
]
