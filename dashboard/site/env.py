"""Strict settings from the environment.

Every reader raises ``ImproperlyConfigured`` with the variable's name on a bad
value, so a typo stops the process at start instead of running on a default.
This module and ``dashboard/site/settings.py`` are the only readers of the process
environment (tests/test_settings_read_once.py); everything else reads
``settings.NAME``. The one run-time reader is ``named_secret``, for secrets
whose variable name an admin entered (exposed as
``settings.GOVERNANCE_NAMED_SECRET``, and called only through
``governance.services.secrets``, which refuses the names a configuration may
not point at).

The settings' readers note every name they read (``names_read``): those are
the system's own variables, which no configuration may name as a secret
(``governance/rules/secrets.py``).
"""

from __future__ import annotations

import math
import os
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

from governance.rules.refusal import REFUSAL_REPROBE_DELAYS, RefusalError, check_schedule
from governance.rules.secrets import DEFAULT_ALLOW, ENV_NAME, KeyEnvPolicy, key_env_policy

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_READ: set[str] = set()


def _noted(name: str) -> str:
    _READ.add(name)
    return name


def names_read() -> frozenset[str]:
    """Every variable the settings' readers were asked for so far (set or not)."""
    return frozenset(_READ)


def env_str(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(_noted(name))
    return default if value is None else value


def _flag(value: str, name: str) -> bool:
    folded = value.strip().lower()
    if folded in _TRUE:
        return True
    if folded in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be one of 1/0/true/false/yes/no/on/off, not {value!r}")


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(_noted(name))
    return default if value is None else _flag(value, name)


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    value = os.environ.get(_noted(name))
    if value is None or not value.strip():
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {value!r}") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {number}")
    return number


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    value = os.environ.get(_noted(name))
    if value is None or not value.strip():
        return default
    try:
        number = float(value.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {value!r}") from None
    if not math.isfinite(number):
        raise ImproperlyConfigured(f"{name} must be a finite number, not {value!r}")
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {number}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(_noted(name))
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``2d`` (a bare number is seconds)."""
    text = text.strip().lower()
    unit = text[-1:] if text[-1:] in _UNITS else "s"
    number = text[:-1] if text[-1:] in _UNITS else text
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (use e.g. 15m, 1h, 90s)") from None
    if not value > 0:
        raise ValueError(f"a duration must be positive: {text!r}")
    return timedelta(seconds=value * _UNITS[unit])


def env_durations(name: str, default: str) -> tuple[timedelta, ...]:
    raw = os.environ.get(_noted(name)) or default
    try:
        durations = tuple(parse_duration(part) for part in raw.split(",") if part.strip())
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None
    if not durations:
        raise ImproperlyConfigured(f"{name} must list at least one duration")
    return durations


def env_reprobe_schedule(name: str) -> tuple[timedelta, ...]:
    """R3.2's re-probe schedule: the rule's default, or one from the environment
    that passes the rule's own check (longer each time, the last within the
    refusal memory's reach), as a provider's own schedule must."""
    if not os.environ.get(_noted(name)):
        return REFUSAL_REPROBE_DELAYS
    try:
        return check_schedule(env_durations(name, ""))
    except RefusalError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def _secret_from(name: str) -> str | None:
    """``NAME`` or the contents of the file named by ``NAME_FILE`` (None when neither)."""
    direct = os.environ.get(name)
    file_name = os.environ.get(f"{name}_FILE")
    if direct and file_name:
        raise ImproperlyConfigured(f"set {name} or {name}_FILE, not both")
    if file_name:
        try:
            secret = Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc}") from None
        if not secret:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} is empty")
        return secret
    return direct or None


def env_secret(name: str, *, required: bool, dev_default: str | None = None) -> str | None:
    """A secret from ``NAME`` or from the file named by ``NAME_FILE``.

    Secrets have no production default: when ``required`` and neither is set,
    start-up fails. ``dev_default`` is only used when not required.
    """
    _noted(f"{name}_FILE")
    secret = _secret_from(_noted(name))
    if secret:
        return secret
    if required:
        raise ImproperlyConfigured(f"{name} (or {name}_FILE) must be set")
    return dev_default


def env_key_env_policy(name: str) -> KeyEnvPolicy:
    """The variables a configuration may name for a secret: ``name``'s glob
    patterns (comma-separated; the rule's default when unset), minus every
    variable the settings read. Read it last, once every other setting has
    been read (``names_read``)."""
    patterns = env_list(name, list(DEFAULT_ALLOW))
    try:
        return key_env_policy(patterns, names_read())
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: {exc}") from None


def named_secret(name: str) -> str | None:
    """A secret from the environment variable an admin named (a provider's
    ``api_key_env``, a tool's ``token_env``, a PagerDuty channel's
    ``routing_key_env``), read at call time.

    These names live in the database, so they cannot be fixed settings; this is
    their one reader (``settings.GOVERNANCE_NAMED_SECRET``), which
    ``governance.services.secrets.named_secret`` calls once the name passed
    the allow-list (not noted in ``names_read``: it is no setting). Like ``env_secret``
    it honours ``NAME_FILE``; surrounding whitespace is dropped. Returns None when
    neither is set (or the value is blank). A name that is not a valid
    environment variable name, both variants set, or an unreadable or empty
    file raise ``ImproperlyConfigured`` naming the variable.
    """
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise ImproperlyConfigured(f"{name!r} is not an environment variable name")
    return (_secret_from(name) or "").strip() or None


def _url_threshold(value: str) -> int | None:
    """psycopg's ``prepare_threshold``: uses before a statement is prepared; "none": never."""
    if value.lower() == "none":
        return None
    if not value.isdigit():
        raise ImproperlyConfigured(
            f"DATABASE_URL: prepare_threshold must be a whole number or none, not {value!r}"
        )
    return int(value)


def database_from_url(url: str, *, base_dir: Path, pool_max_size: int = 0) -> dict[str, Any]:
    """Django's DATABASES entry for ``postgres://`` or ``sqlite:///`` URLs.

    ``pool_max_size`` > 0: PostgreSQL connections come from a psycopg pool of
    that size per process (Django's built-in pool). Under ASGI each request's
    sync code runs in a thread of its own, so persistent per-thread connections
    would pile up until the server refuses more; a pool reuses a few.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    options = dict(parse_qsl(parts.query))
    if scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfigured(f"DATABASE_URL names no database: {url!r}")
        try:
            port = parts.port
        except ValueError:
            raise ImproperlyConfigured(f"DATABASE_URL has a bad port: {url!r}") from None
        # No JIT: its compile time (tens of ms) dwarfs the short statements of a stage
        # or a page, and the planner's estimates for JSON functions switch it on.
        # A URL's own ``options`` come after, so they can turn it back on.
        options["options"] = " ".join(filter(None, ("-c jit=off", options.get("options"))))
        # Parameters travel apart from the statement, so a statement's text is the
        # same on every call and psycopg prepares it on a connection after its second
        # use: PostgreSQL parses and plans it once per connection, not per call (a
        # stage's statements repeat on every turn). A URL may say otherwise.
        options["server_side_binding"] = _flag(
            options.get("server_side_binding", "true"), "DATABASE_URL: server_side_binding"
        )
        options["prepare_threshold"] = _url_threshold(options.get("prepare_threshold", "2"))
        return {
            "ENGINE": "dashboard.site.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(port or ""),
            "OPTIONS": (
                {**options, "pool": {"min_size": 1, "max_size": pool_max_size, "timeout": 10}}
                if pool_max_size
                else options
            ),
            # A pool holds the connections itself (Django requires CONN_MAX_AGE 0).
            "CONN_MAX_AGE": 0 if pool_max_size else 60,
            # With a pool, each connection is checked before it is handed out
            # (dashboard.site.postgresql: its socket, a query only when the server
            # spoke), so the idle ones a PostgreSQL restart broke are replaced
            # instead of failing one stage each.
            "CONN_HEALTH_CHECKS": True,
        }
    if scheme == "sqlite":
        path = unquote(parts.path)
        if path in {"", "/"}:
            raise ImproperlyConfigured(f"DATABASE_URL names no SQLite file: {url!r}")
        if path.startswith("//"):  # sqlite:////abs/path
            path = path[1:]
        elif path != "/:memory:":
            path = str(base_dir / path.lstrip("/"))
        else:
            path = ":memory:"
        return {
            # Django's SQLite backend; it makes the file's folder on first connect.
            "ENGINE": "dashboard.site.sqlite3",
            "NAME": path,
            # Workers and the web share the file; wait for locks instead of failing.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL must start with postgres:// or sqlite:///, not {scheme or url!r}"
    )
