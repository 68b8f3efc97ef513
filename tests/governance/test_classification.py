"""Tests for governance.rules.classification: R2.1, R2.4 (the evidence an adapter
read) and R6.2 (`interrupted`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.classification import (
    ERROR_KINDS,
    FAILURE_CLASSES,
    TIME_BASED_CLASSES,
    AttemptEvidence,
    Classification,
    classify_attempt,
)
from tests.governance.classifications import T0, classify, failure

# ---------------------------------------------------------------------------
# R2.1: classification table


@pytest.mark.parametrize("status", [500, 502, 503, 504, 529])
def test_r2_1_http_5xx_is_server_error(status: int) -> None:
    result = classify(status_code=status, headers_received=True)
    assert result.failure_class == "server_error"
    assert result.effect == "none"
    assert result.refusal_category is None


def test_r2_1_429_is_rate_limited() -> None:
    assert classify(status_code=429).failure_class == "rate_limited"


@pytest.mark.parametrize("status", [401, 403])
def test_r2_1_401_and_403_are_auth(status: int) -> None:
    assert classify(status_code=status).failure_class == "auth"


def test_r2_1_408_is_timeout() -> None:
    """R2.1: the server's own request clock fired."""
    assert classify(status_code=408).failure_class == "timeout"


@pytest.mark.parametrize(
    ("transport", "expected"),
    [
        ("connect_timeout", "timeout"),
        ("read_timeout", "timeout"),
        ("connect_error", "network"),
        ("connection_reset", "network"),
    ],
)
def test_r2_1_transport_errors_before_headers(transport: str, expected: str) -> None:
    result = classify(transport_error=transport)
    assert result.failure_class == expected
    assert result.effect == "none"


def test_r2_1_deadline_evidence_before_headers_is_timeout() -> None:
    assert classify(deadline_evidence=True).failure_class == "timeout"
    assert classify(deadline_evidence=True, transport_error="connection_reset").failure_class == (
        "timeout"
    )


# ---------------------------------------------------------------------------
# R2.1 / R2.4: the rules classify evidence, in no vendor's words (each adapter
# reads its vendor's answer into it: tests/tasks/test_adapter_evidence.py)


@pytest.mark.parametrize("status", [None, 200, 400, 403, 503])
def test_r2_1_a_quota_error_is_rate_limited_whatever_the_status(status: int | None) -> None:
    assert classify(status_code=status, error_kind="quota").failure_class == "rate_limited"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("server", "server_error"),
        ("auth", "auth"),
        ("timeout", "timeout"),
        ("bad_request", "bad_request"),
    ],
)
def test_r2_1_without_a_status_the_error_kind_names_the_class(kind: str, expected: str) -> None:
    assert classify(error_kind=kind).failure_class == expected
    broken_stream = classify(error_kind=kind, headers_received=True, body_complete=False)
    assert (broken_stream.failure_class, broken_stream.effect) == (expected, "none")


def test_r2_1_an_error_status_comes_before_the_error_kind() -> None:
    assert classify(status_code=503, error_kind="bad_request").failure_class == "server_error"
    assert classify(status_code=401, error_kind="server").failure_class == "auth"


def test_r2_4_a_refusal_the_adapter_read_wins_and_keeps_its_category() -> None:
    result = classify(status_code=400, error_kind="bad_request", refusal_category="self_harm")
    assert (result.failure_class, result.refusal_category) == ("refusal", "self_harm")
    assert not result.moves_breaker
    assert classify(status_code=200, refusal_category=None) == Classification(
        None, None, "none", None
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"error_kind": "overloaded_error"}, "error_kind"),
        ({"refusal_category": ""}, "refusal_category"),
        ({"refusal_category": 3}, "refusal_category"),
    ],
)
def test_r2_4_evidence_speaks_the_rules_words_only(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AttemptEvidence(**fields)


neutral_evidence = st.builds(
    AttemptEvidence,
    status_code=st.none() | st.integers(100, 599),
    error_kind=st.none() | st.sampled_from(ERROR_KINDS),
    refusal_category=st.none() | st.sampled_from(["policy", "content_filter", "refusal"]),
    transport_error=st.none() | st.sampled_from(["read_timeout", "connection_reset"]),
    headers_received=st.just(True),
    body_complete=st.booleans(),
    deadline_evidence=st.booleans(),
    retry_after=st.none() | st.sampled_from(["5", "garbage", 2.5]),
)


@settings(max_examples=200, deadline=None)
@given(evidence=neutral_evidence)
def test_r2_1_every_evidence_gets_exactly_one_consistent_class(evidence: AttemptEvidence) -> None:
    result = classify_attempt(evidence, T0)
    assert result.failure_class is None or result.failure_class in FAILURE_CLASSES
    assert (result.failure_class == "refusal") == (evidence.refusal_category is not None)
    assert result.refusal_category == evidence.refusal_category
    assert (result.effect == "unknown") == (result.failure_class == "interrupted")
    assert classify_attempt(evidence, T0) == result


# ---------------------------------------------------------------------------
# R6.2: interrupted is not timeout


def test_r6_2_body_broken_after_headers_without_deadline_is_interrupted() -> None:
    result = classify(status_code=200, headers_received=True, body_complete=False)
    assert result.failure_class == "interrupted"
    assert result.effect == "unknown"


def test_r6_2_connection_reset_after_headers_is_interrupted_not_network() -> None:
    result = classify(
        headers_received=True, body_complete=False, transport_error="connection_reset"
    )
    assert (result.failure_class, result.effect) == ("interrupted", "unknown")


def test_r6_2_body_broken_with_deadline_evidence_is_timeout() -> None:
    result = classify(
        status_code=200, headers_received=True, body_complete=False, deadline_evidence=True
    )
    assert (result.failure_class, result.effect) == ("timeout", "none")


def test_r6_2_read_timeout_after_headers_is_a_fired_clock() -> None:
    """R6.2: a read timeout is a timeout clock that fired, so it names a timeout."""
    result = classify(headers_received=True, body_complete=False, transport_error="read_timeout")
    assert result.failure_class == "timeout"


def test_r2_2_classification_carries_retry_after() -> None:
    result = classify(status_code=429, retry_after="Sat, 01 Mar 2025 12:00:30 GMT")
    assert result.retry_after_seconds == pytest.approx(30.0)
    assert classify(status_code=200).retry_after_seconds is None


# ---------------------------------------------------------------------------
# Bad input to the classification types (R2.1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"status_code": 99}, "status_code"),
        ({"status_code": 600}, "status_code"),
        ({"status_code": True}, "status_code"),
        ({"transport_error": "dns"}, "transport_error"),
        (
            {"headers_received": True, "transport_error": "connect_error"},
            "before any response",
        ),
        ({"status_code": 200, "transport_error": "connect_timeout"}, "before"),
        ({"body_complete": False}, "body_complete"),
    ],
)
def test_r2_1_contradictory_or_unknown_evidence_is_rejected(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AttemptEvidence(**fields)


@pytest.mark.parametrize(
    "args",
    [
        ("refusal", None, "none", None),
        ("server_error", "policy", "none", None),
        ("interrupted", None, "none", None),
        ("timeout", None, "unknown", None),
        ("rate_limited", None, "none", -1.0),
        ("rate_limited", None, "none", float("nan")),
        (None, None, "none", 3.0),
        ("gremlins", None, "none", None),
        ("server_error", None, "maybe", None),
    ],
)
def test_r2_1_inconsistent_classification_is_rejected(args: tuple) -> None:
    with pytest.raises(ValueError):
        Classification(*args)


def test_r2_1_classify_needs_evidence_and_aware_now() -> None:
    with pytest.raises(TypeError):
        classify_attempt({"adapter": "openai"}, T0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        classify_attempt(AttemptEvidence(), datetime(2025, 1, 1))


def test_r2_2_time_based_classes_are_exactly_the_four() -> None:
    assert frozenset({"server_error", "rate_limited", "timeout", "network"}) == TIME_BASED_CLASSES
    assert failure("server_error").moves_breaker
    assert not failure("refusal").moves_breaker


def test_r2_1_unexpected_redirect_is_a_bad_request_not_a_success():
    """An adapter never follows redirects; a 3xx answer is a configuration fault."""
    evidence = AttemptEvidence(status_code=302, headers_received=True)
    result = classify_attempt(evidence, datetime(2026, 1, 1, tzinfo=UTC))
    assert result.failure_class == "bad_request"
