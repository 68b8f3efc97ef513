"""WSGI entry point."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.site.settings")
application = get_wsgi_application()

from tasks.telemetry import configure_telemetry  # noqa: E402  (needs settings loaded)

configure_telemetry(component="web")
