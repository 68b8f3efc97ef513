"""governance.rules.secrets (pure) and what supplies it: which environment
variables a configuration may name for a secret, URLs without credentials,
and the one masking of stored URLs (governance.services.secrets)."""

from __future__ import annotations

import ast

import pytest
from django.conf import settings

from governance.rules.secrets import (
    DEFAULT_ALLOW,
    SETTING,
    key_env_policy,
    key_env_problem,
    passed_env_problem,
    secret_query_name,
    url_credentials_problem,
)
from governance.services.secrets import mask_url
from governance.services.secrets import url_credentials_problem as url_problem
from tests.conftest import REPO_ROOT

OWN = ("DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY_FILE", "DATABASE_URL", "REDIS_URL",
       "GOVERNANCE_CALLBACK_SECRET", "GOVERNANCE_KEY_ENV_ALLOW", "OTEL_SERVICE_NAME")  # fmt: skip
POLICY = key_env_policy(DEFAULT_ALLOW, OWN)


@pytest.mark.parametrize("name", ["GOVERNANCE_KEY_FOO", "OPENAI_API_KEY", "ANTHROPIC_API_KEY"])
def test_r2_5_allowed_names(name):
    assert key_env_problem(name, POLICY) is None


@pytest.mark.parametrize(
    "name", ["DJANGO_SECRET_KEY", "DATABASE_URL", "GOVERNANCE_CALLBACK_SECRET"]
)
def test_r2_5_the_systems_own_settings_are_refused_naming_the_pattern(name):
    problem = key_env_problem(name, POLICY)
    assert problem is not None
    assert problem.startswith(f"{name!r} is not allowed (it is one of this system's own settings)")
    assert "name a variable matching GOVERNANCE_KEY_*, OPENAI_API_KEY" in problem
    assert problem.endswith(f"({SETTING})")


def test_r2_5_an_operators_pattern_cannot_open_the_systems_own_names():
    everything = key_env_policy(["*"], OWN)
    assert key_env_problem("SOME_VENDOR_TOKEN", everything) is None
    for name in OWN:
        assert key_env_problem(name, everything) is not None, name
    # The namespaces the system reads from: libraries read more of them than its settings.
    for name in ("DJANGO_SETTINGS_MODULE", "OTEL_EXPORTER_OTLP_HEADERS", "DATABASE_PASSWORD"):
        assert "this system's own settings" in key_env_problem(name, everything), name
    # GOVERNANCE_KEY_* is kept for keys; the one setting in it is still refused.
    assert key_env_problem("GOVERNANCE_KEY_ANYTHING", everything) is None
    assert key_env_problem("GOVERNANCE_KEY_ENV_ALLOW", everything) is not None
    assert key_env_problem("GOVERNANCE_OTHER", everything) is not None


@pytest.mark.parametrize("name", ["X_FILE", "GOVERNANCE_KEY_OPENAI_FILE", "OPENAI_API_KEY_FILE"])
def test_r2_5_file_names_are_refused_whatever_the_patterns_say(name):
    problem = key_env_problem(name, key_env_policy(["*"], OWN))
    assert problem is not None and "_FILE variable holds a file's path" in problem


@pytest.mark.parametrize("name", ["", "sk-abc-123", "A B", "1ABC", None, 7])
def test_r2_5_what_is_no_variable_name_is_refused_as_such(name):
    assert "NAME of an environment variable" in key_env_problem(name, POLICY)


def test_r2_5_names_match_case_sensitively_as_the_environment_does():
    assert key_env_problem("openai_api_key", POLICY) is not None


@pytest.mark.parametrize("name", ["TZ", "GIT_AUTHOR_NAME", "GITHUB_TOKEN", "GOVERNANCE_KEY_GIT"])
def test_r2_5_a_stdio_tool_server_may_be_handed_any_variable_but_the_systems_own(name):
    # The command runs on the worker, not at a URL: no key allow-list applies.
    assert passed_env_problem(name, POLICY) is None


@pytest.mark.parametrize("name", ["DATABASE_URL", "DJANGO_SECRET_KEY", "GOVERNANCE_DEBUG_X"])
def test_r2_5_the_systems_own_variables_are_never_handed_to_a_tool_server(name):
    assert "not passed to tool servers" in passed_env_problem(name, POLICY)


@pytest.mark.parametrize("name", ["", "A B", "1X", None])
def test_r2_5_a_passed_variable_is_named_never_given(name):
    assert "NAME of an environment variable" in passed_env_problem(name, POLICY)


def test_r2_5_an_empty_allow_list_allows_nothing_and_says_so():
    problem = key_env_problem("OPENAI_API_KEY", key_env_policy([], OWN))
    assert problem is not None and "(nothing: the list is empty)" in problem


@pytest.mark.parametrize("pattern", ["A B", "KEY/1", "KEY=1", "$HOME"])
def test_r2_5_a_bad_pattern_is_a_value_error_naming_it(pattern):
    with pytest.raises(ValueError, match="is not a pattern"):
        key_env_policy([pattern], OWN)


def test_r2_5_the_settings_deny_every_name_they_read():
    """The deny list is built where the settings read the environment
    (dashboard/site/env.py notes each name), not copied by hand."""
    policy = settings.GOVERNANCE_KEY_ENV_ALLOW
    assert policy.allow == DEFAULT_ALLOW
    assert {
        "DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY_FILE", "DATABASE_URL", "REDIS_URL",
        "CELERY_BROKER_URL", "GOVERNANCE_CALLBACK_SECRET", "GOVERNANCE_CALLBACK_SECRET_FILE",
        "DJANGO_EMAIL_HOST_PASSWORD", "GOVERNANCE_OUTBOUND_ALLOW", "GOVERNANCE_KEY_ENV_ALLOW",
    } <= policy.own  # fmt: skip
    assert {"DJANGO_", "GOVERNANCE_", "DATABASE_", "REDIS_", "CELERY_", "OTEL_"} <= set(
        policy.namespaces
    )


def test_r2_5_the_allow_list_is_read_after_every_other_setting():
    """Only the names read before it are known to be the system's own."""
    tree = ast.parse((REPO_ROOT / "dashboard" / "site" / "settings.py").read_text())
    reads = {
        node.lineno: node.func.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id.startswith("env_")
    }
    assert reads[max(reads)] == "env_key_env_policy"


# --------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    "name", ["key", "api_key", "apikey", "API-KEY", "token", "access_token", "Secret",
             "password", "sig", "signature", "X-Api-Key", "subscription-key", "auth_token"],
)  # fmt: skip
def test_r2_5_key_looking_query_parameters(name):
    assert secret_query_name(name)


@pytest.mark.parametrize("name", ["api-version", "model", "deployment", "keyword", "monkey"])
def test_r2_5_ordinary_query_parameters(name):
    assert not secret_query_name(name)


def test_r2_5_credentials_in_a_url_are_a_problem():
    assert "user name or password" in url_credentials_problem(userinfo=True, parameter_names=[])
    assert "'token'" in url_credentials_problem(userinfo=False, parameter_names=["a", "token"])
    assert url_credentials_problem(userinfo=False, parameter_names=["api-version"]) is None


@pytest.mark.parametrize(
    "url",
    [
        "https://user:pw@llm.example/v1",
        "https://user@llm.example/v1",
        "https://llm.example/v1?api_key=abc",
        "https://llm.example/v1?api-version=1&Token=abc",
        "https://llm.example/v1#access_token=abc",
    ],
)
def test_r2_5_urls_with_credentials_are_refused(url):
    assert url_problem(url) is not None


def test_r2_5_urls_without_credentials_pass():
    assert url_problem("https://llm.example/v1?api-version=2024-06-01") is None
    assert url_problem("http://127.0.0.1:8000/v1") is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:pw@llm.example/v1", "https://***@llm.example/v1"),
        ("https://user@llm.example:8443/v1", "https://***@llm.example:8443/v1"),
        ("https://llm.example/v1?api_key=abc&x=1", "https://llm.example/v1?api_key=***&x=1"),
        ("https://h/v1?api-version=2&X-Api-Key=s#sig=t", "https://h/v1?api-version=2&X-Api-Key=***#sig=***"),
        ("https://llm.example/v1", "https://llm.example/v1"),
        ("", ""),
        ("http://[broken@host", "***"),
    ],
)  # fmt: skip
def test_r2_5_a_stored_url_is_shown_masked(url, shown):
    assert mask_url(url) == shown


def test_r2_5_only_the_secrets_service_reads_a_named_secret():
    """Every reader of a named secret goes through the allow-list: the raw
    reader (settings.GOVERNANCE_NAMED_SECRET) has one caller."""
    callers = []
    for root in ("governance", "tasks", "dashboard"):
        for path in (REPO_ROOT / root).rglob("*.py"):
            tree = ast.parse(path.read_text())
            if any(
                isinstance(node, ast.Attribute) and node.attr == "GOVERNANCE_NAMED_SECRET"
                for node in ast.walk(tree)
            ):
                callers.append(path.relative_to(REPO_ROOT).as_posix())
    assert callers == ["governance/services/secrets.py"]
