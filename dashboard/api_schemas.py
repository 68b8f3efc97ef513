"""The request bodies of the JSON API, one pydantic model per endpoint.

The same models validate each request and describe it in the OpenAPI
document (``dashboard/openapi.py``), so the description cannot drift from what
is accepted. pydantic was chosen over django-ninja because the views, their
auth and their error shape already exist and are tested; only validation and
the description were hand-written, and pydantic's JSON parser also refuses
what ``json.loads`` let through (lone surrogates, nesting past its recursion
limit, NaN/Infinity with ``allow_inf_nan=False``).

Every string refuses NUL (PostgreSQL cannot store it) and lone surrogates;
every number has a range; unknown fields are refused by name.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from governance.rules.segments import BoundaryKind
from governance.services.runs import BUDGET_MAX, DURATION_MAX, DURATION_MIN
from governance.services.threads import TOOL_NAMES


def _plain_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def text(max_length: int, *, min_length: int = 0, strip: bool = False):
    """A string the database can store: no NUL, no lone surrogate, bounded."""
    return Annotated[
        str,
        StringConstraints(min_length=min_length, max_length=max_length, strip_whitespace=strip),
        AfterValidator(_plain_text),
    ]


ProviderId = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$")
]
ToolName = Literal[tuple(TOOL_NAMES)]  # type: ignore[valid-type]
Seconds = Annotated[
    float,
    Field(
        ge=DURATION_MIN.total_seconds(),
        le=DURATION_MAX.total_seconds(),
        description="seconds, from 1 to 604800 (7 days)",
    ),
]
Count = Annotated[int, Field(ge=0, le=BUDGET_MAX)]
CallbackUrl = Annotated[
    str,
    StringConstraints(max_length=200, pattern=r"^(https?://[^\s/?#]+\S*)?$"),
    Field(description="http(s) URL the worker POSTs the settlement to (outbound rules apply)"),
]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ThreadCreate(Body):
    provider_chain: Annotated[list[ProviderId], Field(min_length=1, max_length=20)] = Field(
        description="provider ids, tried in order"
    )
    title: text(200) = ""
    model: text(200) = Field("", description="default: the first provider's model")
    mode: text(50) = "default"
    tool_surface: Annotated[list[ToolName], Field(max_length=len(TOOL_NAMES))] = []
    system_prompt: text(20_000) = ""
    callback_url: CallbackUrl = ""


class BudgetLimits(Body):
    """Per-resource limits of the run's one ledger (R5.2); unset ones keep the default."""

    model_requests: Count = None  # type: ignore[assignment]  # absent: the default
    tool_calls: Count = None  # type: ignore[assignment]  # absent: the default
    web_searches: Count = None  # type: ignore[assignment]  # absent: the default
    provider_concurrency: Count = None  # type: ignore[assignment]  # absent: the default
    body_revisions: Count = None  # type: ignore[assignment]  # absent: the default
    output_reserve: Count = None  # type: ignore[assignment]  # absent: the default


class RunSubmit(Body):
    input: text(100_000, min_length=1) = Field(description="what the run should do")
    idempotency_key: text(200, min_length=1) | None = Field(
        None, description="a repeated key answers 200 with the run it made"
    )
    deadline_s: Seconds | None = None
    stage_budget_s: Seconds | None = None
    no_progress_s: Seconds | None = None
    budget: BudgetLimits | None = None


class BoundaryApply(Body):
    kind: BoundaryKind
    reason: text(2_000, min_length=1, strip=True)
    idempotency_key: text(290, min_length=1, strip=True) = Field(
        description="required: a double click must not make two boundaries (R8.3)"
    )
    model: text(200) | None = None
    mode: text(50) | None = None
    tool_surface: Annotated[list[ToolName], Field(max_length=len(TOOL_NAMES))] | None = None
    system_prompt: text(20_000) | None = None


class AckBody(Body):
    through: Annotated[int, Field(ge=0, le=2**31 - 1)] = Field(
        description="the highest contiguous chunk_no the client has shown (R7.2)"
    )


# --------------------------------------------------------------------------- answers
# What the API answers, for the description (the views build these dicts).


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    field: str | None = Field(description="the request field (or header) at fault, if any")
    message: str


class ErrorAnswer(BaseModel):
    error: ErrorDetail


class ProviderVerdict(Answer):
    provider_id: str
    refusals: int


class SegmentAnswer(Answer):
    key: str
    session_id: str
    segment_no: int
    model: str
    mode: str
    tool_surface: list[str]
    opened_at: str
    closed_at: str | None
    closed_kind: str | None
    providers: list[ProviderVerdict] = Field(description="each provider's verdict here (R8.1)")


class ThreadAnswer(Answer):
    id: str
    title: str
    provider_chain: list[str]
    model: str
    mode: str
    tool_surface: list[str]
    system_prompt: str
    callback_url: str | None
    created_at: str
    segment: SegmentAnswer


class RunAccepted(Answer):
    run_id: str
    status: str
    created: bool = Field(description="false: the idempotency key's run, answered again")
    url: str


class Balance(BaseModel):
    limit: int
    used: int
    remaining: int


class SettlementAnswer(Answer):
    outcome: Literal["completed", "partial", "failed", "cancelled"]
    reason_code: str
    reason: str
    unknown_effects: list[str]
    settled_at: str


class RunAnswer(Answer):
    id: str
    thread_id: str
    segment: str
    status: str
    phase: str
    input: str
    created_at: str
    deadline_at: str
    lifecycle: list[dict]
    stages: list[dict]
    attempts: list[dict]
    budget: dict[str, Balance]
    receipts: list[dict]
    chunks: list[dict]
    body: str
    settlement: SettlementAnswer | None


class CancelAnswer(Answer):
    run_id: str
    cancel_requested: bool


class AckAnswer(Answer):
    run_id: str
    through: int
    committed: int
    sent: int
    observed: int
    newly_observed: int
