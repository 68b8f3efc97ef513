"""Tests for governance.rules.retry_after: R2.2's one reading of `Retry-After`."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.classification import (
    AttemptEvidence,
)
from governance.rules.retry_after import parse_retry_after

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


# ---------------------------------------------------------------------------
# R2.2: Retry-After parsing


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        (30, 30.0),
        (2.25, 2.25),
        ("0", 0.0),
        ("Sat, 01 Mar 2025 12:02:00 GMT", 120.0),
        ("Saturday, 01-Mar-25 12:00:45 GMT", 45.0),
        ("Sat Mar  1 12:10:00 2025", 600.0),
        ("Fri, 28 Feb 2025 12:00:00 GMT", 0.0),
    ],
)
def test_r2_2_retry_after_forms(raw: str | float, seconds: float) -> None:
    assert parse_retry_after(raw, T0) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "raw", ["soon", "-5", "", "Sat, 32 Mar 2025 12:00:00 GMT", "Sat, 01 Foo 2025 12:00:00 GMT",
            -1, float("inf"), float("nan")]
)  # fmt: skip
def test_r2_2_unusable_retry_after_is_treated_as_absent(raw: str | float) -> None:
    assert parse_retry_after(raw, T0) is None


def test_r2_2_retry_after_none_is_absent() -> None:
    assert parse_retry_after(None, T0) is None


def test_r2_2_retry_after_wrong_type_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="retry_after"):
        parse_retry_after(True, T0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="retry_after"):
        AttemptEvidence(retry_after=[1])  # type: ignore[arg-type]


def test_r2_2_retry_after_needs_an_aware_now() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_retry_after("5", datetime(2025, 3, 1, 12, 0))


def test_r2_2_retry_after_accepts_non_utc_aware_now() -> None:
    plus_two = T0.astimezone(timezone(timedelta(hours=2)))
    assert parse_retry_after("Sat, 01 Mar 2025 12:01:00 GMT", plus_two) == pytest.approx(60.0)


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(min_value=0, max_value=10 * 24 * 3600))
def test_r2_2_retry_after_http_date_round_trip(offset: int) -> None:
    moment = T0 + timedelta(seconds=offset)
    raw = moment.strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert parse_retry_after(raw, T0) == pytest.approx(offset)
    assert parse_retry_after(str(offset), T0) == offset
