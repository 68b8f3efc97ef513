from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path

from dashboard import api, views

api_patterns = [
    path("api/v1/threads", api.create_thread, name="api-threads"),
    path("api/v1/threads/<str:thread_id>", api.thread_detail, name="api-thread"),
    path("api/v1/threads/<str:thread_id>/segment", api.thread_segment, name="api-segment"),
    path("api/v1/threads/<str:thread_id>/runs", api.submit_run, name="api-runs"),
    path("api/v1/threads/<str:thread_id>/boundaries", api.apply_boundary, name="api-boundaries"),
    path("api/v1/runs/<str:run_id>", api.run_detail, name="api-run"),
    path("api/v1/runs/<str:run_id>/cancel", api.cancel_run, name="api-run-cancel"),
]

urlpatterns = [
    path("", views.overview, name="overview"),
    path("healthz", views.healthz, name="healthz"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    *api_patterns,
]
