"""Logging filters ``LOGGING`` names (imported while logging is configured,
before the apps are ready: nothing here may import Django's models)."""

from __future__ import annotations

import logging


class QuietRefusals(logging.Filter):
    """A refused permission (403) is one log line, never a traceback: it is an
    answer, not a failure (``LOGGING`` puts this on ``django.request``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) == 403:
            record.exc_info = None
            record.exc_text = None
        return True
