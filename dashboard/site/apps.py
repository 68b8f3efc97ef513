from django.apps import AppConfig


class SiteConfig(AppConfig):
    """The platform (settings, entry points, database backends, broker transport,
    the supervisor): an app only so that Django finds ``manage.py up``."""

    name = "dashboard.site"
    label = "site"
    verbose_name = "Platform"
