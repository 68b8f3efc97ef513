"""The request bodies of the JSON API, one pydantic model per endpoint.

The same models validate each request and describe it in the OpenAPI
document (``dashboard/api/openapi.py``), so the description cannot drift from what
is accepted. pydantic was chosen over django-ninja because the views, their
auth and their error shape already exist and are tested; only validation and
the description were hand-written, and pydantic's JSON parser also refuses
what ``json.loads`` let through (lone surrogates, nesting past its recursion
limit, NaN/Infinity with ``allow_inf_nan=False``).

Every string refuses NUL (PostgreSQL cannot store it) and lone surrogates;
every number has a range; unknown fields are refused by name.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
)

from governance import provider_kinds
from governance.rules.refusal import MAX_SCHEDULE_TIERS, REFUSAL_SCOPE_TTL
from governance.rules.secrets import DEFAULT_ALLOW as DEFAULT_KEY_ENV_ALLOW
from governance.rules.segments import BoundaryKind
from governance.services import providers as provider_rules
from governance.services import routes as route_rules
from governance.services import tool_servers as tool_rules
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
# A built-in, an HTTP tool "name", an MCP server's "name.*" or "name.tool"; the
# registry decides which exist (governance/services/tool_servers.py).
ToolName = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=tool_rules.TOOL_NAME_MAX,
        pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,39}(\.[^\s\x00]{1,128})?$",
    ),
    Field(description=f"a built-in ({', '.join(TOOL_NAMES)}), a registry tool, or 'server.*'"),
]
ToolSurface = Annotated[list[ToolName], Field(max_length=tool_rules.SURFACE_MAX)]
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


ProviderChain = Annotated[
    list[ProviderId],
    Field(
        min_length=1, max_length=route_rules.CHAIN_MAX, description="provider ids, tried in order"
    ),
]


class ThreadCreate(Body):
    provider_chain: ProviderChain
    title: text(200) = ""
    model: text(200) = Field("", description="default: the first provider's model")
    mode: text(50) = "default"
    tool_surface: ToolSurface = []
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
    tool_surface: ToolSurface | None = None
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


class DoorConversation(Answer):
    session_id: str | None = Field(
        description="the client's X-Session-Id; null: found by its messages' prefix"
    )
    model: str = Field(description="the route or provider the client last named as `model`")


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
    door: DoorConversation | None = Field(
        description="set for a conversation of the OpenAI-compatible door; null otherwise"
    )
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


class CostAnswer(Answer):
    """What a run's provider requests cost. Amounts are decimal strings by
    currency; requests without reported usage or without a price have no known cost
    and are counted here, never as 0."""

    total: dict[str, str] = Field(description="known cost by currency, e.g. {'USD': '0.0105'}")
    refused_sends: dict[str, str] = Field(description="the refused sends' share, by currency")
    requests: int
    refused_requests: int
    without_usage: int = Field(description="requests whose provider reported no usage")
    not_priced: int = Field(description="requests whose provider has no price for them")
    refused_without_known_cost: int


class RunAnswer(Answer):
    id: str
    thread_id: str
    segment: str
    status: str
    phase: str
    awaiting_approval: bool = Field(
        description="one of its calls waits for a person's yes or no (GET /api/v1/approvals)"
    )
    input: str
    client: str | None = Field(
        description="the name of the API token that submitted the run (the run API or the"
        " OpenAI door), as it was then; null: not submitted with a token"
    )
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
    cost: CostAnswer


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


# --------------------------------------------------------------------------- client endpoints
# What a client needs: notifications, providers, thread and segment reads.
# Query strings are validated by a model too (``Query``): their values arrive as
# text, so numbers and times are parsed from it, strictly (ASCII digits, ISO 8601
# with an offset); unknown parameters are refused by name like unknown fields.

PAGE_LIMIT_MAX = 200
PAGE_LIMIT_DEFAULT = 50


def _ascii_whole_number(value: Any) -> Any:
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 6):
        raise ValueError("must be a whole number (ASCII digits)")
    return value


RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})"
)


def _rfc3339(value: Any) -> Any:
    """A time in a query string: RFC 3339 (ISO 8601 with an offset), nothing looser."""
    if not isinstance(value, str):
        return value
    if not RFC3339.fullmatch(value.upper()):
        raise ValueError("must be an ISO 8601 time with an offset, e.g. 2026-01-31T12:00:00Z")
    try:
        return datetime.fromisoformat(value.upper())
    except ValueError:
        raise ValueError("is not a valid time") from None


def _utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range once converted to UTC") from None


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False)


class PageQuery(Query):
    cursor: text(400, min_length=1) | None = Field(
        None, description="the `next_cursor` of the previous page (opaque)"
    )
    limit: Annotated[int, Field(ge=1, le=PAGE_LIMIT_MAX), BeforeValidator(_ascii_whole_number)] = (
        Field(PAGE_LIMIT_DEFAULT, description=f"items per page, 1 to {PAGE_LIMIT_MAX}")
    )


class NotificationQuery(PageQuery):
    state: Literal["all", "unacknowledged", "acknowledged"] = Field(
        "all", description="acknowledged by someone or not"
    )
    severity: Literal["all", "critical", "normal"] = Field(
        "all", description="critical: a provider is frozen in a segment; normal: a first refusal"
    )
    segment: text(64, min_length=1) | None = Field(
        None, description="a segment key, `session#number` (URL-encode `#` as `%23`)"
    )
    since: Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_utc)] | None = Field(
        None, description="only notifications created at or after this time (ISO 8601, offset)"
    )


class IncidentQuery(PageQuery):
    state: Literal["open", "triggered", "acknowledged", "resolved", "all"] = Field(
        "open",
        description="open: triggered or acknowledged; triggered: needing a person",
    )


class IncidentAction(Body):
    note: text(2_000, strip=True) = Field("", description="kept on the incident's step")


class ApprovalQuery(PageQuery):
    state: Literal["waiting", "pending", "approved", "denied", "expired", "all"] = Field(
        "waiting",
        description="waiting: pending and its run not settled (what needs a person)",
    )


class ApprovalDecision(Body):
    decision: Literal["approve", "deny"]
    reason: text(500, strip=True) = Field(
        "", description="required to deny: the model reads it as the call's result"
    )


class ApprovalAnswer(Answer):
    id: int
    state: Literal["pending", "approved", "denied", "expired"]
    waiting: bool = Field(description="pending and its run not settled: it needs a person")
    tool: str
    server: str | None
    effect_class: str | None
    annotations: dict[str, Any]
    arguments: dict[str, Any] = Field(description="exactly as the call will be sent")
    idempotency_key: str = Field(description="the key the call carries (R5.4)")
    reasoning: str = Field(description="the model's words in the turn that asked for the call")
    policy: str
    approver_role: str
    run_id: str
    thread_id: str
    thread_title: str
    requested_at: str
    expires_at: str
    decided_by: str | None
    decided_at: str | None
    reason: str | None
    url: str = Field(description="the request in the dashboard's Approvals inbox")


class ApprovalPage(Answer):
    items: list[ApprovalAnswer]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: last")


class ThreadQuery(PageQuery):
    pass


RUN_WAIT_MAX_S = 60  # the longest a request may wait (proxies commonly cut at 60 s)


class RunQuery(Query):
    wait: Annotated[float, Field(ge=0, le=RUN_WAIT_MAX_S)] | None = Field(
        None,
        description=f"seconds, 0 to {RUN_WAIT_MAX_S}: if the run is not settled yet, answer"
        " when it settles or when this time has passed, whichever is first (one request"
        " instead of polling);"
        " the answer is the run as it is then",
    )


_QueryTime = Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_utc)]


class InsightsQuery(Query):
    since: _QueryTime | None = Field(
        None, description="start of the period (ISO 8601, offset); default: `until` minus 7 days"
    )
    until: _QueryTime | None = Field(
        None, description="end of the period, exclusive (ISO 8601, offset); default: now"
    )
    provider: ProviderId | None = Field(None, description="only this provider's sends")


def _plain_json(value: Any, depth: int = 0) -> Any:
    """A script the database can store (jsonb refuses NUL in strings and keys)."""
    if depth > 64:
        raise ValueError("is nested too deeply")
    if isinstance(value, str):
        _plain_text(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _plain_text(key)
            _plain_json(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _plain_json(item, depth + 1)
    return value


def _range(name: str, kind: type = float):
    low, high = provider_rules.RANGES[name]
    return Annotated[kind, Field(ge=low, le=high)]


def _known_kind(value: str) -> str:
    """A kind of the one list (``governance.provider_kinds``), read when asked."""
    if provider_kinds.kind(value) is None:
        raise ValueError(f"must be one of {', '.join(provider_kinds.names())}")
    return value


def _kinds_enum(schema: dict[str, Any]) -> None:
    schema["enum"] = list(provider_kinds.names())


def kinds_taking(takes: str, form: str = "{}") -> str:
    """The kinds whose configuration takes a server or a script, for the descriptions."""
    return " and ".join(
        form.format(k.name) for k in provider_kinds.KINDS.values() if k.takes == takes
    )


ProviderKind = Annotated[
    str,
    AfterValidator(_known_kind),
    Field(description="the provider's kind (its wire protocol)", json_schema_extra=_kinds_enum),
]
BaseUrl = Annotated[
    str,
    StringConstraints(
        max_length=provider_rules.BASE_URL_MAX, pattern=r"^(https?://[^\s/?#]+\S*)?$"
    ),
    AfterValidator(_plain_text),
    Field(
        description=f"http(s) base URL of the server ({kinds_taking('server')} kinds only), "
        "where requests and the key go: no user:password@ and no key-looking query "
        "parameter (api_key, token, sig …); a loopback, link-local, private or other "
        "non-public address only when GOVERNANCE_OUTBOUND_ALLOW lists it (checked when "
        "given and again at every call)"
    ),
]
KeyEnv = Annotated[
    str,
    StringConstraints(
        max_length=provider_rules.ENV_NAME_MAX, pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$"
    ),
    Field(
        description="the NAME of the environment variable holding the key, never the key; "
        "'' for none. It must match GOVERNANCE_KEY_ENV_ALLOW (default: GOVERNANCE_KEY_* "
        f"and {', '.join(DEFAULT_KEY_ENV_ALLOW[1:])}); the system's own settings "
        "(DJANGO_*, DATABASE_URL, GOVERNANCE_* but GOVERNANCE_KEY_* …) and *_FILE names "
        "are refused whatever it says"
    ),
]
Script = Annotated[
    dict[str, Any],
    AfterValidator(_plain_json),
    Field(
        description=f"{kinds_taking('script')} kind only: the script (format in "
        f"{kinds_taking('script', 'tasks/adapters/{}.py')})"
    ),
]


Price = Annotated[
    float,
    Field(ge=0, le=1_000_000, description="price per million tokens, in `currency`"),
]
Currency = Annotated[
    str,
    StringConstraints(pattern=r"^([A-Z]{3})?$"),
    Field(description="ISO 4217 code of the prices, e.g. USD (required with a price)"),
]


Delays = Annotated[
    list[Annotated[float, Field(gt=0)]],
    Field(
        min_length=1, max_length=MAX_SCHEDULE_TIERS,
        description=f"re-probe delays in seconds: 1 to {MAX_SCHEDULE_TIERS}, each longer than "
        f"the last, the last at most REFUSAL_SCOPE_TTL "
        f"({REFUSAL_SCOPE_TTL.total_seconds():.0f} s)",
    ),
]  # fmt: skip


class RefusalSchedule(Body):
    """A provider's own re-probe schedule (R3.2); {} is R3.2's default.
    A refusal keeps the schedule it started under: a change applies to new refusals."""

    delays_s: Delays | None = None
    categories: dict[str, Delays] | None = Field(
        None, description="by refusal category (R2.4), e.g. {'policy': [600, 1800]}"
    )


class ProviderCreate(Body):
    provider_id: ProviderId
    kind: ProviderKind
    model: text(provider_rules.MODEL_MAX, min_length=1, strip=True)
    base_url: BaseUrl = ""
    key_env: KeyEnv = ""
    script: Script | None = None
    connect_timeout_s: _range("connect_timeout_s") = 10.0
    read_timeout_s: _range("read_timeout_s") = 120.0
    failure_threshold: _range("failure_threshold", int) = 3
    base_cooldown_s: _range("base_cooldown_s") = 30.0
    max_cooldown_s: _range("max_cooldown_s") = 600.0
    enabled: bool = True
    price_input_per_mtok: Price | None = None
    price_output_per_mtok: Price | None = None
    price_cached_per_mtok: Price | None = None
    currency: Currency = ""
    refusal_schedule: RefusalSchedule | None = None


class ProviderUpdate(Body):
    """Only the fields sent change (null: unchanged); kind and provider_id stay."""

    enabled: bool | None = None
    model: text(provider_rules.MODEL_MAX, min_length=1, strip=True) | None = None
    base_url: BaseUrl | None = None
    key_env: KeyEnv | None = None
    script: Script | None = None
    connect_timeout_s: _range("connect_timeout_s") | None = None
    read_timeout_s: _range("read_timeout_s") | None = None
    failure_threshold: _range("failure_threshold", int) | None = None
    base_cooldown_s: _range("base_cooldown_s") | None = None
    max_cooldown_s: _range("max_cooldown_s") | None = None
    price_input_per_mtok: Price | None = None
    price_output_per_mtok: Price | None = None
    price_cached_per_mtok: Price | None = None
    currency: Currency | None = None
    refusal_schedule: RefusalSchedule | None = None
    reason: text(2_000) = Field(
        "", description="kept in the audit log with the change; required for mcp_stdio"
    )


class NotificationAnswer(Answer):
    id: int
    dedupe_key: str
    severity: Literal["normal", "critical"]
    text: str
    segment: str | None = Field(description="the segment key, if the notice is about one")
    provider_ids: list[str]
    reprobes: int
    escalation_level: int
    created_at: str
    acknowledged_by: str | None
    acknowledged_at: str | None
    resolved_at: str | None


class NotificationPage(Answer):
    items: list[NotificationAnswer]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: last")


class InsightsInterval(Answer):
    low: float = Field(description="lower bound of the 95 % Wilson interval (0 to 1)")
    high: float = Field(description="upper bound of the 95 % Wilson interval (0 to 1)")


class ReprobeRow(Answer):
    tier: Literal["original", "re_render", "history_only", "re_probe", "after_boundary"]
    step: int = Field(description="the re-probe's number (1, 2, 3 …); 0 for the other tiers")
    boundary_kind: str | None = Field(description="after_boundary: the boundary's kind")
    label: str = Field(description="the tier in words, as on the Insights page")
    provider_id: str | None = Field(description="null in a total over every provider")
    model: str | None
    category: str | None = Field(description="the refusal category the send followed")
    sends: int
    accepted: int
    refused: int
    failed: int = Field(description="sends without an answer (time-based failures, R2.1)")
    acceptance_rate: float | None = Field(
        description="accepted / (accepted + refused); null when nothing was answered"
    )
    interval: InsightsInterval | None
    median_seconds_since_refusal: float | None = Field(
        description="median time from the latest refusal to this send, in seconds"
    )


class ReprobeInsights(Answer):
    since: str
    until: str
    provider: str | None
    rows: list[ReprobeRow] = Field(description="per tier, provider, model and category")
    totals: list[ReprobeRow] = Field(description="per tier over every provider")


class IncidentStepAnswer(Answer):
    kind: Literal["triggered", "joined", "escalated", "acknowledged", "resolved"]
    at: str = Field(description="when its fact happened")
    actor: str = Field(description="a username, or system")
    note: str
    notification_id: int | None
    escalation_level: int | None


class IncidentPageAnswer(Answer):
    channel: str
    channel_kind: str
    event: str = Field(description="trigger, escalate-N, acknowledge or resolve")
    state: Literal["pending", "sending", "delivered", "retry", "failed", "dropped"]
    attempts: int
    status_code: int | None
    delivered_at: str | None
    last_error: str


class IncidentAnswer(Answer):
    id: int
    key: str = Field(description="the incident's identity outside (PagerDuty's dedup_key)")
    state: Literal["triggered", "acknowledged", "resolved"]
    needs_a_person: bool
    segment: str
    thread_id: str
    thread_title: str
    opened_at: str
    acknowledged_by: str | None
    acknowledged_at: str | None
    resolved_at: str | None
    resolved_by: str | None
    resolved_how: str | None
    notification_ids: list[int]
    url: str = Field(description="the incident's page on the dashboard")


class IncidentDetail(IncidentAnswer):
    steps: list[IncidentStepAnswer]
    pages: list[IncidentPageAnswer] = Field(description="what each channel was told")
    escalation_level: int
    next_escalation_at: str | None


class IncidentList(Answer):
    items: list[IncidentAnswer]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: last")


class IncidentChanged(IncidentDetail):
    changed: bool = Field(
        description="false: nothing changed (acknowledged or resolved before; the first stays)"
    )


class NotificationAcked(NotificationAnswer):
    acknowledged_now: bool = Field(
        description="false: it was acknowledged before (acknowledged_by/at are the first's)"
    )


class ProviderAnswer(Answer):
    provider_id: str
    kind: ProviderKind
    model: str
    base_url: str = Field(
        description="as stored, with a user name, password or key-looking query parameter "
        "(stored before they were refused) shown as ***"
    )
    key_env: str | None = Field(description="the environment variable's name (never the key)")
    key_env_refused: str | None = Field(
        description="why the worker will not read that variable (GOVERNANCE_KEY_ENV_ALLOW: "
        "a provider stored before the allow-list, or since narrowed); null: it may"
    )
    key_present: bool = Field(description="whether that variable is allowed and set on this server")
    has_script: bool
    connect_timeout_s: float
    read_timeout_s: float
    failure_threshold: int
    base_cooldown_s: float
    max_cooldown_s: float
    enabled: bool
    breaker: str
    price_input_per_mtok: str | None = Field(description="decimal, per million tokens")
    price_output_per_mtok: str | None
    price_cached_per_mtok: str | None
    currency: str | None
    refusal_schedule: dict[str, Any] = Field(
        description="its own re-probe schedule in seconds ({} = R3.2's default)"
    )
    created_at: str
    updated_at: str


class ProviderList(Answer):
    items: list[ProviderAnswer]


class ThreadListItem(Answer):
    id: str
    title: str
    provider_chain: list[str]
    model: str
    mode: str
    tool_surface: list[str]
    callback_url: str | None
    created_at: str
    door: DoorConversation | None = Field(
        description="set for a conversation of the OpenAI-compatible door; null otherwise"
    )
    open_segment: str | None = Field(description="the key of the thread's open segment")


class ThreadPage(Answer):
    items: list[ThreadListItem]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: last")


class SegmentDetail(SegmentAnswer):
    thread_id: str


# --------------------------------------------------------------------------- tool registry

ToolServerName = Annotated[
    str, StringConstraints(min_length=1, max_length=40, pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_-]*$")
]
ToolKind = Literal["mcp", "mcp_stdio", "http"]
ToolArgs = Annotated[
    list[Annotated[str, StringConstraints(max_length=2_000)]],
    Field(max_length=100, description="mcp_stdio: the command's arguments"),
]
EnvNames = Annotated[
    list[Annotated[str, StringConstraints(max_length=100, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]],
    Field(
        max_length=50,
        description="mcp_stdio: the NAMES of the variables the server gets from the worker's "
        "environment (their values are never stored, shown or logged)",
    ),
]
ToolEffect = Literal["read_only", "external_effect"]
ToolUrl = Annotated[
    str,
    StringConstraints(max_length=tool_rules.URL_MAX, pattern=r"^(https?://[^\s/?#]+\S*)?$"),
    AfterValidator(_plain_text),
]
TokenEnv = Annotated[
    str,
    StringConstraints(max_length=tool_rules.ENV_NAME_MAX, pattern=r"^([A-Za-z_][A-Za-z0-9_]*)?$"),
    Field(
        description="the NAME of the environment variable holding the bearer token; '' none. "
        "It must match GOVERNANCE_KEY_ENV_ALLOW, as a provider's `key_env` must"
    ),
]
JsonSchema = Annotated[
    dict[str, Any],
    AfterValidator(_plain_json),
    Field(description="http kind: the JSON Schema of the arguments (an object schema)"),
]
EffectOverrides = Annotated[
    dict[Annotated[str, StringConstraints(min_length=1, max_length=128)], ToolEffect],
    Field(description="mcp kind: tool name -> effect class, over the server's annotations"),
]


ApprovalPolicyField = Literal["never", "side_effects", "always"]
ApprovalOverrides = Annotated[
    dict[Annotated[str, StringConstraints(min_length=1, max_length=128)], ApprovalPolicyField],
    Field(description="mcp kinds: tool name -> approval policy, over the server's"),
]
ApproverRole = Annotated[
    str,
    StringConstraints(min_length=1, max_length=80),
    Field(description="the role (group) whose members may approve or deny its calls"),
]
ApprovalWait = Annotated[
    float,
    Field(ge=60.0, le=7 * 24 * 3600.0, description="how long a request waits for a person (s)"),
]


class ToolCreate(Body):
    name: ToolServerName = Field(
        description="its tools are 'name.tool' (mcp, mcp_stdio) or 'name' (http)"
    )
    kind: ToolKind
    url: ToolUrl = Field(
        "", description="mcp: the Streamable HTTP endpoint; http: the tool's URL; mcp_stdio: none"
    )
    command: text(500) = Field(
        "", description="mcp_stdio: the executable each worker process starts (admins only)"
    )
    args: ToolArgs = []
    env_names: EnvNames = []
    cwd: text(500) = Field("", description="mcp_stdio: its working directory (absolute)")
    reason: text(500) = Field(
        "", description="kept in the audit log; required for mcp_stdio (why the workers run it)"
    )
    token_env: TokenEnv = ""
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] | None = None
    description: text(tool_rules.DESCRIPTION_MAX) = ""
    parameters: JsonSchema | None = None
    effect: ToolEffect | None = Field(None, description="http kind: the effect class")
    verify_url: ToolUrl = Field(
        "", description="http external_effect: GET ?idempotency_key= answers processed/unseen"
    )
    timeout_s: Annotated[float, Field(ge=0.1, le=600.0)] = 30.0
    enabled: bool = True
    effect_overrides: EffectOverrides = {}
    approval: ApprovalPolicyField | None = Field(
        None,
        description="who must say yes before a call runs: never (the default), side_effects "
        "(every call not read-only) or always",
    )
    approval_overrides: ApprovalOverrides | None = None
    approver_role: ApproverRole | None = Field(
        None, description="the role (group) whose members may answer; default operator"
    )
    approval_wait_s: ApprovalWait | None = Field(
        None, description="how long a request waits for a person (s); default 3600"
    )


class ToolUpdate(Body):
    """Only the fields sent change (null: unchanged); name, kind and url stay."""

    enabled: bool | None = None
    effect_overrides: EffectOverrides | None = None
    description: text(tool_rules.DESCRIPTION_MAX) | None = None
    timeout_s: Annotated[float, Field(ge=0.1, le=600.0)] | None = None
    token_env: TokenEnv | None = None
    verify_url: ToolUrl | None = None
    command: text(500) | None = None
    args: ToolArgs | None = None
    env_names: EnvNames | None = None
    cwd: text(500) | None = None
    approval: ApprovalPolicyField | None = None
    approval_overrides: ApprovalOverrides | None = None
    approver_role: ApproverRole | None = None
    approval_wait_s: ApprovalWait | None = None
    refresh: bool = Field(False, description="mcp: list the server's tools again now")
    reason: text(2_000) = Field("", description="kept in the audit log with the change")


class ToolListed(Answer):
    name: str = Field(description="as a tool surface names it: 'server.tool' or 'server'")
    tool: str = Field(description="the server's own name for it")
    description: str
    parameters: dict[str, Any]
    annotations: dict[str, Any]
    effect: ToolEffect = Field(description="the effect class the runtime governs it by")
    approval: ApprovalPolicyField = Field(
        description="its approval policy (its own, or the server's)"
    )
    approval_needed: bool = Field(description="whether its calls wait for a person's yes")
    wire_name: str = Field(description="the name a provider sees (OpenAI/Anthropic rules)")


class ToolProcessAnswer(Answer):
    worker: str = Field(description="hostname:pid of the worker process")
    state: Literal["starting", "running", "restarting", "failed", "stopped"]
    pid: int | None = Field(description="the server's own process id, while it runs")
    started_at: str | None
    uptime_s: float | None
    restarts: int
    next_start_at: str | None
    last_error: str | None
    stderr_tail: str = Field(description="the last lines the server wrote to stderr")
    updated_at: str


class ToolAnswer(Answer):
    name: str
    kind: ToolKind
    url: str = Field(description="as stored, with any credentials in it shown as ***")
    token_env: str | None
    token_env_refused: str | None = Field(
        description="why the worker will not read that variable (GOVERNANCE_KEY_ENV_ALLOW); "
        "null: it may"
    )
    token_present: bool = Field(description="whether that variable is allowed and set")
    method: str | None
    effect: ToolEffect | None
    verify_url: str | None = Field(description="as stored, with any credentials shown as ***")
    timeout_s: float
    enabled: bool
    effect_overrides: dict[str, ToolEffect]
    approval: ApprovalPolicyField
    approval_overrides: dict[str, ApprovalPolicyField]
    approver_role: str
    approval_wait_s: float
    schema_version: int
    listed_at: str | None
    list_error: str | None
    tool_count: int
    command: str | None = Field(description="mcp_stdio: what each worker process runs")
    args: list[str]
    env_names: list[str] = Field(description="names only: values are never stored")
    cwd: str | None
    processes: list[ToolProcessAnswer] = Field(
        description="mcp_stdio: each worker process's copy, as it last reported it"
    )
    created_at: str
    updated_at: str


class ToolDetail(ToolAnswer):
    tools: list[ToolListed] = Field(description="what the server exposes (its cached listing)")
    boundaries: list[str] = Field(
        [], description="segments a schema change opened (tool-surface boundaries, R1.3)"
    )


class ToolList(Answer):
    items: list[ToolAnswer]


# --------------------------------------------------------------------------- routes

RouteName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[-a-zA-Z0-9_]+$"),
    Field(
        description="what the OpenAI-compatible door's `model` names: a slug, never a "
        "provider's id (route names and provider ids are one namespace)"
    ),
]
RouteDescription = Annotated[
    text(route_rules.DESCRIPTION_MAX), Field(description="what the route is for, in words")
]


class RouteCreate(Body):
    name: RouteName
    provider_chain: ProviderChain
    description: RouteDescription = ""
    enabled: bool = True


class RouteUpdate(Body):
    """Only the fields sent change (null: unchanged); the name stays."""

    provider_chain: ProviderChain | None = None
    description: RouteDescription | None = None
    enabled: bool | None = None
    reason: text(2_000) = Field("", description="kept in the audit log with the change")


class RouteAnswer(Answer):
    name: str
    provider_chain: list[str] = Field(description="provider ids, tried in order")
    description: str
    enabled: bool
    created_at: str
    updated_at: str


class RouteList(Answer):
    items: list[RouteAnswer]
