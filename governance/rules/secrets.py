"""R2.5: secrets a configuration may point at, and URLs that carry none.

A provider's key (``api_key_env``), a registry tool's bearer token
(``token_env``) and a PagerDuty channel's routing key (``routing_key_env``)
are named by an environment variable: the worker reads it when it calls out
and sends its value to the URL the same configuration names. A name is
therefore a pointer into the process environment, and only variables meant
to hold such keys may be named:

- the name matches a pattern of ``GOVERNANCE_KEY_ENV_ALLOW`` (glob patterns;
  default ``GOVERNANCE_KEY_*`` and the conventional provider names such as
  ``OPENAI_API_KEY``);
- and it is none of the system's own: not a name its settings read
  (``DJANGO_SECRET_KEY``, ``DATABASE_URL``, the callback secret …), not in the
  namespace of one (the first word of each: ``DJANGO_``, ``GOVERNANCE_``,
  ``DATABASE_``, ``OTEL_`` …, whose other variables Django, Celery and the
  OpenTelemetry SDK read), with ``GOVERNANCE_KEY_`` kept for keys, and not a
  ``*_FILE`` name (a file's path; ``NAME_FILE`` is read for ``NAME`` anyway).
  An operator's pattern cannot open these.

A URL given for a provider or a tool carries no credentials: no
``user:password@`` and no key-looking query parameter (``api_key=``,
``token=``, ``sig=`` …). Keys go in the environment, where the rule above
governs them; a URL is shown on pages, in API answers and in errors.

Pure: the settings and the names the system reads are parameters
(``governance/services/secrets.py`` supplies them); URLs arrive parsed.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

SETTING = "GOVERNANCE_KEY_ENV_ALLOW"
KEY_NAMESPACE = "GOVERNANCE_KEY_"
FILE_SUFFIX = "_FILE"
DEFAULT_ALLOW: tuple[str, ...] = (
    f"{KEY_NAMESPACE}*",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "TOGETHER_API_KEY",
    "OPENROUTER_API_KEY",
    "DEEPSEEK_API_KEY",
    "GEMINI_API_KEY",
    "XAI_API_KEY",
    "FIREWORKS_API_KEY",
)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A glob over environment variable names: the name's characters and fnmatch's
# wildcards (*, ?, [seq], [!seq]).
_PATTERN = re.compile(r"[A-Za-z0-9_*?\[\]!-]+")

# Query parameter names (compared lower-case, "-" read as "_") that carry a
# credential, and the endings that do ("subscription_key", "auth_token" …).
SECRET_QUERY_NAMES = frozenset(
    {
        "key", "apikey", "api_key", "token", "access_token", "auth", "authorization",
        "secret", "client_secret", "password", "passwd", "pwd", "sig", "signature",
        "credential", "credentials", "code",
    }
)  # fmt: skip
SECRET_QUERY_ENDINGS = ("_key", "_token", "_secret", "_password", "_sig", "_signature")


@dataclass(frozen=True)
class KeyEnvPolicy:
    """Which environment variables a configuration may name for a secret."""

    allow: tuple[str, ...]  # the operator's glob patterns
    own: frozenset[str]  # the names the system's settings read
    namespaces: tuple[str, ...]  # the first word of each, with its "_"

    @cached_property
    def canonical(self) -> str:
        """The policy as text that is the same in every process (for fingerprints)."""
        return ",".join(sorted(set(self.allow)))

    @property
    def described(self) -> str:
        return ", ".join(self.allow) if self.allow else "(nothing: the list is empty)"


def key_env_policy(patterns: Iterable[str], own_names: Iterable[str]) -> KeyEnvPolicy:
    """``GOVERNANCE_KEY_ENV_ALLOW``'s patterns with the system's own names.
    ValueError names a pattern that is not a glob over variable names."""
    allow = []
    for raw in patterns:
        pattern = raw.strip()
        if not pattern:
            continue
        if not _PATTERN.fullmatch(pattern):
            raise ValueError(
                f"{pattern!r} is not a pattern of variable names (letters, digits, _ and "
                "the wildcards * ? [ ])"
            )
        allow.append(pattern)
    own = frozenset(own_names)
    namespaces = sorted({name.split("_", 1)[0] + "_" for name in own if "_" in name.strip("_")})
    return KeyEnvPolicy(tuple(allow), own, tuple(namespaces))


def _own(name: str, policy: KeyEnvPolicy) -> str:
    """Why ``name`` is the system's own ("" when it is not)."""
    if name in policy.own:
        return "it is one of this system's own settings"
    if name.startswith(KEY_NAMESPACE):
        return ""  # the namespace kept for keys, apart from the names read above
    for namespace in policy.namespaces:
        if name.startswith(namespace):
            return f"{namespace}* variables are this system's own settings"
    return ""


def key_env_problem(name: object, policy: KeyEnvPolicy) -> str | None:
    """Why ``name`` may not be named as a secret's variable, or None when it may."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return "the NAME of an environment variable (letters, digits, _), never the secret itself"
    why = ""
    if name.endswith(FILE_SUFFIX):
        why = (
            f" (a {FILE_SUFFIX} variable holds a file's path: name the variable without "
            f"{FILE_SUFFIX}, whose {FILE_SUFFIX} form is read too)"
        )
    elif own := _own(name, policy):
        why = f" ({own})"
    elif any(fnmatch.fnmatchcase(name, pattern) for pattern in policy.allow):
        return None
    return f"{name!r} is not allowed{why}: name a variable matching {policy.described} ({SETTING})"


def passed_env_problem(name: object, policy: KeyEnvPolicy) -> str | None:
    """Why a variable may not be handed to a command the workers start (a
    stdio tool server's ``env_names``), or None when it may. Any valid name
    that is not one of the system's own: the command runs on the worker, so
    the allow-list of keys sent to URLs does not apply, but the database, the
    broker and Django's secret never leave the system."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return "the NAME of an environment variable (letters, digits, _), never its value"
    if own := _own(name, policy):
        return f"{name!r} is not passed to tool servers ({own})"
    return None


def secret_query_name(name: str) -> bool:
    """A query parameter that carries a credential (``api_key``, ``X-Api-Key``, ``sig`` …)."""
    folded = name.strip().lower().replace("-", "_")
    return folded in SECRET_QUERY_NAMES or folded.endswith(SECRET_QUERY_ENDINGS)


def url_credentials_problem(*, userinfo: bool, parameter_names: Iterable[str]) -> str | None:
    """Why a URL with (or without) ``user:password@`` and these query (or
    fragment) parameter names may not be stored, or None."""
    if userinfo:
        return (
            "a URL may not carry a user name or password (user:password@host): name the "
            "key by its environment variable instead"
        )
    for name in parameter_names:
        if secret_query_name(name):
            return (
                f"a URL may not carry a credential: the query parameter {name!r} looks like "
                "one; name the key by its environment variable instead"
            )
    return None
