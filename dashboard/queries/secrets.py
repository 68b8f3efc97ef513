"""Whether a secret named by its environment variable is set: the API and the
pages show the *name* and this, never the value."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def secret_present(name: str) -> bool:
    if not name:
        return False
    try:
        return settings.GOVERNANCE_NAMED_SECRET(name) is not None
    except ImproperlyConfigured:
        return False  # a bad name, or both NAME and NAME_FILE set: no usable key
