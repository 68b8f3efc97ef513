"""Each adapter reads its vendor's answer into evidence (R2.1, R2.4, R6.2).

The rules (``governance.rules.classification``) classify evidence and never look at a
vendor's format; these tests give each adapter's ``read_evidence`` what its
vendor's wire says (a ``WireAnswer``) and classify what it read.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.classification import (
    FAILURE_CLASSES,
    AttemptEvidence,
    Classification,
    classify_attempt,
)
from tasks.adapters import REGISTRY, read_evidence
from tasks.adapters.base import WireAnswer

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def read(adapter: str, **fields: object) -> AttemptEvidence:
    return read_evidence(adapter, WireAnswer(**fields))  # type: ignore[arg-type]


def classify(adapter: str = "openai", **fields: object) -> Classification:
    return classify_attempt(read(adapter, **fields), T0)


def test_r2_1_evidence_of_an_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown adapter"):
        read_evidence("gemini", WireAnswer())


def test_r2_1_anthropic_529_overloaded_error_is_server_error() -> None:
    assert (
        classify(adapter="anthropic", status_code=529, error_code="overloaded_error").failure_class
        == "server_error"
    )


def test_r2_1_overloaded_error_event_mid_stream_is_server_error_not_interrupted() -> None:
    """R2.1: an explicit overloaded error after 200 headers is server evidence, not R6.2."""
    result = classify(
        adapter="anthropic",
        status_code=200,
        headers_received=True,
        body_complete=False,
        error_code="overloaded_error",
    )
    assert result.failure_class == "server_error"
    assert result.effect == "none"


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (429, "insufficient_quota"),
        (403, "insufficient_quota"),
        (None, "rate_limit_error"),
        (400, "RESOURCE_EXHAUSTED"),
        (402, None),
    ],
)
def test_r2_1_quota_errors_are_rate_limited(status: int | None, code: str | None) -> None:
    assert classify(status_code=status, error_code=code).failure_class == "rate_limited"


@pytest.mark.parametrize("code", ["authentication_error", "permission_error", "invalid_api_key"])
def test_r2_1_auth_error_codes_without_status_are_auth(code: str) -> None:
    assert classify(adapter="anthropic", error_code=code).failure_class == "auth"


@pytest.mark.parametrize("status", [400, 404, 409, 413, 422])
def test_r2_1_other_4xx_are_bad_request(status: int) -> None:
    result = classify(status_code=status, error_code="invalid_request_error")
    assert result.failure_class == "bad_request"


@pytest.mark.parametrize(
    "fields",
    [
        {"adapter": "openai", "status_code": 200, "finish_reason": "stop"},
        {"adapter": "openai", "status_code": 200, "finish_reason": "length"},
        {"adapter": "anthropic", "headers_received": True, "stop_reason": "end_turn"},
        {"adapter": "scripted"},
        {"adapter": "openai", "status_code": 200, "message_refusal": "   "},
    ],
)
def test_r2_1_a_complete_normal_answer_is_not_a_failure(fields: dict) -> None:
    assert classify(**fields) == Classification(None, None, "none", None)


def test_r2_1_unknown_error_code_with_error_status_falls_back_to_status() -> None:
    assert classify(status_code=503, error_code="weird_thing").failure_class == "server_error"
    assert classify(status_code=418, error_code="weird_thing").failure_class == "bad_request"


evidence_strategy = st.builds(
    read,
    adapter=st.sampled_from(sorted(REGISTRY)),
    status_code=st.none() | st.integers(100, 599),
    error_code=st.none()
    | st.sampled_from(
        [
            "content_policy_violation",
            "content_filter",
            "insufficient_quota",
            "overloaded_error",
            "authentication_error",
            "invalid_request_error",
            "timeout_error",
            "other",
        ]
    ),
    finish_reason=st.none() | st.sampled_from(["stop", "length", "content_filter"]),
    message_refusal=st.none() | st.sampled_from(["", "I can't help with that."]),
    stop_reason=st.none() | st.sampled_from(["end_turn", "refusal"]),
    scripted_refusal_category=st.none() | st.sampled_from(["policy", "content_filter"]),
    transport_error=st.none() | st.sampled_from(["read_timeout", "connection_reset"]),
    headers_received=st.just(True),
    body_complete=st.booleans(),
    deadline_evidence=st.booleans(),
    retry_after=st.none() | st.sampled_from(["5", "garbage", 2.5]),
)


@settings(max_examples=200, deadline=None)
@given(evidence=evidence_strategy)
def test_r2_1_every_attempt_gets_exactly_one_consistent_class(evidence: AttemptEvidence) -> None:
    result = classify_attempt(evidence, T0)
    assert result.failure_class is None or result.failure_class in FAILURE_CLASSES
    assert (result.failure_class == "refusal") == (result.refusal_category is not None)
    assert (result.effect == "unknown") == (result.failure_class == "interrupted")
    # Deterministic: the same evidence always gets the same class.
    assert classify_attempt(evidence, T0) == result


# ---------------------------------------------------------------------------
# R2.4: refusal detection per adapter


def test_r2_4_openai_finish_reason_content_filter_is_refusal() -> None:
    result = classify(status_code=200, finish_reason="content_filter")
    assert (result.failure_class, result.refusal_category) == ("refusal", "content_filter")


def test_r2_4_openai_non_empty_message_refusal_is_refusal() -> None:
    result = classify(status_code=200, finish_reason="stop", message_refusal="I can't help.")
    assert (result.failure_class, result.refusal_category) == ("refusal", "refusal")


@pytest.mark.parametrize(
    ("code", "category"),
    [
        ("content_policy_violation", "policy"),
        ("Content_Policy_Violation", "policy"),
        ("content_filter", "content_filter"),
        ("ResponsibleAIPolicyViolation", "policy"),
    ],
)
def test_r2_4_openai_http_400_with_content_policy_code_is_refusal(code: str, category: str) -> None:
    result = classify(status_code=400, error_code=code)
    assert (result.failure_class, result.refusal_category) == ("refusal", category)
    assert result.effect == "none"


def test_r2_4_openai_400_not_about_content_is_bad_request() -> None:
    assert classify(status_code=400, error_code="context_length_exceeded").failure_class == (
        "bad_request"
    )


def test_r2_4_content_policy_code_on_other_status_follows_the_status() -> None:
    """R2.4 names an HTTP 400; a 403 carrying such a code stays auth."""
    assert classify(status_code=403, error_code="content_policy_violation").failure_class == "auth"


def test_r2_4_anthropic_stop_reason_refusal_is_refusal() -> None:
    result = classify(adapter="anthropic", status_code=200, stop_reason="refusal")
    assert (result.failure_class, result.refusal_category) == ("refusal", "refusal")


def test_r2_4_detection_is_per_adapter() -> None:
    """R2.4: each adapter's refusal signal is read only for that adapter."""
    assert classify(adapter="anthropic", status_code=200, finish_reason="content_filter") == (
        Classification(None, None, "none", None)
    )
    assert classify(adapter="openai", status_code=200, stop_reason="refusal").failure_class is None
    assert classify(adapter="scripted", status_code=200, message_refusal="no").failure_class is None
    assert (
        classify(adapter="anthropic", status_code=400, error_code="content_policy_violation")
    ).failure_class == "bad_request"


def test_r2_4_scripted_refusal_keeps_declared_category() -> None:
    result = classify(adapter="scripted", scripted_refusal_category="self_harm")
    assert (result.failure_class, result.refusal_category) == ("refusal", "self_harm")


def test_r2_4_scripted_refusal_must_name_a_category() -> None:
    with pytest.raises(ValueError, match="refusal_category"):
        read_evidence("scripted", WireAnswer(scripted_refusal_category=""))


def test_r2_4_refusal_signal_wins_over_other_evidence() -> None:
    result = classify(
        status_code=200, finish_reason="content_filter", headers_received=True, retry_after="9"
    )
    assert result.failure_class == "refusal"


@settings(max_examples=200, deadline=None)
@given(
    adapter=st.sampled_from(["openai", "anthropic", "scripted"]),
    status=st.none() | st.integers(200, 299),
    reset=st.booleans(),
)
def test_r6_2_broken_body_without_clock_is_always_interrupted(
    adapter: str, status: int | None, reset: bool
) -> None:
    evidence = read_evidence(
        adapter,
        WireAnswer(
            status_code=status,
            headers_received=True,
            body_complete=False,
            transport_error="connection_reset" if reset else None,
        ),
    )
    result = classify_attempt(evidence, T0)
    assert result.failure_class == "interrupted"
    assert result.effect == "unknown"
