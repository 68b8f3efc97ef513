"""The URL root: the pages, the API, the OpenAI-compatible door, sign-in and Django's admin."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponseRedirect
from django.templatetags.static import static
from django.urls import path

from dashboard.api.urls import api_patterns
from dashboard.openai.urls import openai_patterns
from dashboard.pages.urls import page_patterns
from dashboard.site import metrics, permissions


def favicon(request: HttpRequest) -> HttpResponseRedirect:
    """The dashboard's icon for pages that link none (Django's admin and error
    pages): the browser asks for /favicon.ico and would log its 404."""
    return HttpResponseRedirect(static("favicon.svg"))


urlpatterns = [
    *page_patterns,
    path("favicon.ico", permissions.requires(GET=permissions.ANYONE)(favicon)),
    path("metrics", metrics.metrics, name="metrics"),
    path(
        "login/",
        permissions.requires(GET=permissions.ANYONE, POST=permissions.ANYONE)(
            auth_views.LoginView.as_view()
        ),
        name="login",
    ),
    path(
        "logout/",
        permissions.requires(POST=permissions.SIGNED_IN)(auth_views.LogoutView.as_view()),
        name="logout",
    ),
    path("admin/", admin.site.urls),
    *api_patterns,
    *openai_patterns,
]

# Errors under /api/ answer JSON; elsewhere Django's plain pages (dashboard/site/errors.py).
handler400 = "dashboard.site.errors.bad_request"
handler403 = "dashboard.site.errors.permission_denied"
handler404 = "dashboard.site.errors.page_not_found"
handler500 = "dashboard.site.errors.server_error"
