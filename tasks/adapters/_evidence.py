"""What every adapter reads the same way: the error codes the vendors'
servers share (R2.1), in the rules' words, and the evidence of an answer
once its adapter has read the refusal in it (R2.4).

Each adapter (``openai.py``, ``anthropic.py``, ``scripted.py``) reads its own
vendor's refusal and calls ``evidence_from``; ``governance.rules.classification``
classifies the evidence and never reads a vendor's format.
"""

from __future__ import annotations

from governance.rules.classification import AttemptEvidence, ErrorKind
from tasks.adapters.base import WireAnswer

__all__ = ["error_kind", "evidence_from", "normalized_code"]

# R2.1 "429, quota errors" → rate_limited, whatever status carries them.
QUOTA_ERROR_CODES: frozenset[str] = frozenset(
    {
        "insufficient_quota",
        "quota_exceeded",
        "rate_limit_exceeded",
        "rate_limit_error",
        "resource_exhausted",
        "too_many_requests",
    }
)
# Read when no error status explains the failure (e.g. an Anthropic stream
# that sent 200 headers and then an `error` event of type overloaded_error).
SERVER_ERROR_CODES: frozenset[str] = frozenset(
    {
        "overloaded_error",
        "overloaded",
        "api_error",
        "server_error",
        "internal_server_error",
        "service_unavailable",
    }
)
AUTH_ERROR_CODES: frozenset[str] = frozenset(
    {
        "authentication_error",
        "permission_error",
        "invalid_api_key",
        "unauthorized",
        "permission_denied",
    }
)
TIMEOUT_ERROR_CODES: frozenset[str] = frozenset({"timeout_error", "request_timeout"})
BAD_REQUEST_ERROR_CODES: frozenset[str] = frozenset(
    {
        "invalid_request_error",
        "not_found_error",
        "request_too_large",
        "context_length_exceeded",
        "invalid_request",
    }
)
_ERROR_KIND_OF_CODES: tuple[tuple[frozenset[str], ErrorKind], ...] = (
    (QUOTA_ERROR_CODES, "quota"),
    (SERVER_ERROR_CODES, "server"),
    (AUTH_ERROR_CODES, "auth"),
    (TIMEOUT_ERROR_CODES, "timeout"),
    (BAD_REQUEST_ERROR_CODES, "bad_request"),
)


def normalized_code(code: str | None) -> str | None:
    """A provider's error code as the tables hold it: compared case-insensitively."""
    if code is None:
        return None
    return code.strip().lower() or None


def error_kind(code: str | None) -> ErrorKind | None:
    """R2.1: what a provider's error code says, in the rules' words; None for
    a code no table holds (then the HTTP status decides)."""
    code = normalized_code(code)
    for codes, kind in _ERROR_KIND_OF_CODES:
        if code in codes:
            return kind
    return None


def evidence_from(answer: WireAnswer, *, refusal_category: str | None) -> AttemptEvidence:
    """The evidence of ``answer`` with the refusal its adapter read (R2.4):
    the status, the error code's kind (R2.1), the transport and the clocks.
    A configuration this side refused before sending is the auth kind (R2.1:
    a bad key, which a configuration change cures)."""
    return AttemptEvidence(
        status_code=answer.status_code,
        error_kind="auth" if answer.config_refused else error_kind(answer.error_code),
        refusal_category=refusal_category,
        transport_error=answer.transport_error,
        headers_received=answer.headers_received,
        body_complete=answer.body_complete,
        deadline_evidence=answer.deadline_evidence,
        retry_after=answer.retry_after,
    )
