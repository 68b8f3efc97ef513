"""ASGI entry point (served by uvicorn; streams need an async server)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
application = get_asgi_application()

from tasks.telemetry import configure_telemetry  # noqa: E402  (needs settings loaded)

configure_telemetry(component="web")
