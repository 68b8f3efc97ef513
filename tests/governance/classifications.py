"""What the R2 rule tests build: an attempt classified from neutral evidence,
and a classification of a given failure class."""

from __future__ import annotations

from datetime import UTC, datetime

from governance.rules.classification import AttemptEvidence, Classification, classify_attempt

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def classify(**fields: object) -> Classification:
    return classify_attempt(AttemptEvidence(**fields), T0)  # type: ignore[arg-type]


def failure(failure_class: str, retry_after_seconds: float | None = None) -> Classification:
    return Classification(
        failure_class=failure_class,  # type: ignore[arg-type]
        refusal_category="policy" if failure_class == "refusal" else None,
        effect="unknown" if failure_class == "interrupted" else "none",
        retry_after_seconds=retry_after_seconds,
    )
