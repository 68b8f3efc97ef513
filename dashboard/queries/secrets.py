"""Secrets named by their environment variable, as the API and the pages show
them: the *name*, whether the allow-list lets the worker read it
(``GOVERNANCE_KEY_ENV_ALLOW``), and whether it is set — never the value."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from governance.services.secrets import key_env_problem, named_secret


def secret_refused(name: str) -> str | None:
    """Why the worker will not read the variable ``name`` (None: it will, or no name)."""
    return key_env_problem(name) if name else None


def secret_present(name: str) -> bool:
    """The variable is allowed and set (a refused one is never read, so never present)."""
    if not name:
        return False
    try:
        return named_secret(name, "key_env") is not None
    except ImproperlyConfigured:
        return False  # not allowed, a bad name, or both NAME and NAME_FILE set: no usable key
