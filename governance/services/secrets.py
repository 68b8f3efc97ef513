"""Secrets named by configuration, and URLs without credentials.

``governance.rules.secrets`` decides; this module supplies what it needs:
the setting ``GOVERNANCE_KEY_ENV_ALLOW`` (the operator's patterns and the
names the settings read) and URLs parsed with the standard library.

- ``key_env_problem`` / ``require_key_env``: input time, for the provider and
  tool services, the admin's forms and ``manage.py``.
- ``named_secret``: call time, the only way the worker reads a named secret
  (a row stored before the allow-list, or after it was narrowed, is refused
  here: nothing is read, so nothing can be sent).
- ``url_credentials_problem`` / ``require_url_without_credentials``: a URL
  with ``user:password@`` or a key-looking query parameter is refused.
- ``mask_url``: how every page, answer, table and error shows a stored URL
  (``https://***@host/v1``, ``?api_key=***``).
"""

from __future__ import annotations

from urllib.parse import SplitResult, unquote_plus, urlsplit, urlunsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from governance.rules import secrets as rules
from governance.services.errors import ServiceError

MASK = "***"


class KeyEnvRefused(ImproperlyConfigured):
    """The configuration names a variable it may not point at: nothing was read."""


def key_env_problem(name: object) -> str | None:
    """Why ``name`` may not be named as a secret's variable, or None."""
    return rules.key_env_problem(name, settings.GOVERNANCE_KEY_ENV_ALLOW)


def require_key_env(name: str, field: str) -> None:
    """Input time: ServiceError(field, why) unless ``name`` is empty or allowed."""
    if name and (problem := key_env_problem(name)):
        raise ServiceError(field, problem)


def passed_env_problem(name: object) -> str | None:
    """Why ``name`` may not be handed to a stdio tool server, or None."""
    return rules.passed_env_problem(name, settings.GOVERNANCE_KEY_ENV_ALLOW)


def passed_env(names) -> dict[str, str]:
    """The values of the variables a stdio tool server is handed (``env_names``),
    read from this process's environment at start; an unset one is left out.
    ``KeyEnvRefused`` when a name is one of the system's own (a row stored
    before that rule); ``ImproperlyConfigured`` when one cannot be read."""
    values = {}
    for name in names:
        if problem := passed_env_problem(name):
            raise KeyEnvRefused(f"env_names: {problem}")
        value = settings.GOVERNANCE_NAMED_SECRET(name)
        if value is not None:
            values[name] = value
    return values


def named_secret(name: str, field: str) -> str | None:
    """The secret in the variable ``name`` (or ``NAME_FILE``), None when unset.

    ``KeyEnvRefused`` (an ``ImproperlyConfigured``) when the allow-list refuses
    the name, saying which ``field`` named it; ``ImproperlyConfigured`` when the
    variable cannot be read (both forms set, an unreadable file)."""
    if problem := key_env_problem(name):
        raise KeyEnvRefused(f"{field}: {problem}")
    return settings.GOVERNANCE_NAMED_SECRET(name)


def _split(url: str) -> SplitResult | None:
    try:
        return urlsplit(url)
    except ValueError:  # e.g. an unclosed IPv6 bracket
        return None


def _has_userinfo(parts: SplitResult) -> bool:
    # Any "@" in the authority: whatever parser reads it, something would be userinfo.
    return "@" in parts.netloc


def _parameter_names(text: str) -> list[str]:
    return [unquote_plus(item.partition("=")[0]) for item in text.split("&") if item]


def url_credentials_problem(url: str) -> str | None:
    """Why ``url`` may not be stored because of credentials in it, or None."""
    parts = _split(url)
    if parts is None:
        return "not a valid URL"
    return rules.url_credentials_problem(
        userinfo=_has_userinfo(parts),
        parameter_names=_parameter_names(parts.query) + _parameter_names(parts.fragment),
    )


def require_url_without_credentials(url: str, field: str) -> None:
    """Input time: ServiceError(field, why) when ``url`` carries credentials."""
    if url and (problem := url_credentials_problem(url)):
        raise ServiceError(field, problem)


def _masked_parameters(text: str) -> str:
    items = []
    for item in text.split("&"):
        name, equals, _value = item.partition("=")
        hidden = equals and rules.secret_query_name(unquote_plus(name))
        items.append(f"{name}={MASK}" if hidden else item)
    return "&".join(items)


def mask_url(url: str) -> str:
    """``url`` as it may be shown: its user name and password, and the values
    of key-looking query (or fragment) parameters, replaced by ``***``."""
    if not url:
        return url
    parts = _split(url)
    if parts is None:
        return MASK if "@" in url or "=" in url else url
    netloc = parts.netloc
    if _has_userinfo(parts):
        netloc = f"{MASK}@{netloc.rpartition('@')[2]}"
    return urlunsplit(
        (
            parts.scheme,
            netloc,
            parts.path,
            _masked_parameters(parts.query),
            _masked_parameters(parts.fragment),
        )
    )
