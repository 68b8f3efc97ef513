"""The facts. Rows change only through ``governance.services``.

Append-only where the spec says so: boundaries close segments instead of
editing them (R1.4), the budget ledger only gains entries (R5.1), the
settlement is written once (R6.5), notifications are unique by dedupe key
(R3.6).
"""

from __future__ import annotations

import hashlib
import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from governance import provider_kinds
from governance.rules.breaker import BreakerPolicy
from governance.rules.payloads import StagePayload, load_payload

# R2.2's breaker defaults are the rule's own (a provider row may set its own).
_BREAKER = BreakerPolicy()


class Provider(models.Model):
    provider_id = models.SlugField(max_length=64, unique=True)
    # The kinds come from their one list (read when asked, so a new kind needs
    # no migration); ``governance.services.providers`` checks a kind on write.
    kind = models.CharField(max_length=16, choices=provider_kinds.choices)
    model = models.CharField(max_length=200)
    base_url = models.URLField(blank=True)
    # The *name* of the environment variable that holds the key, never the key.
    api_key_env = models.CharField(max_length=100, blank=True)
    script = models.JSONField(null=True, blank=True)
    connect_timeout_s = models.FloatField(default=10.0)
    read_timeout_s = models.FloatField(default=120.0)
    failure_threshold = models.PositiveSmallIntegerField(default=_BREAKER.failure_threshold)
    base_cooldown_s = models.FloatField(default=_BREAKER.base_cooldown.total_seconds())
    max_cooldown_s = models.FloatField(default=_BREAKER.max_cooldown.total_seconds())
    enabled = models.BooleanField(default=True)
    # Prices per million tokens, in ``currency``; None = not priced.
    price_input_per_mtok = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True
    )
    price_output_per_mtok = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True
    )
    price_cached_per_mtok = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True
    )
    currency = models.CharField(max_length=3, blank=True, default="")
    # Its own re-probe schedule (R3.2), in seconds:
    # {"delays_s": [...], "categories": {"policy": [...]}}; {} = R3.2's default.
    refusal_schedule = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["provider_id"]

    def __str__(self) -> str:
        return f"{self.provider_id} ({self.kind}: {self.model})"

    def config_fingerprint(self) -> str:
        """Changes whenever the configuration an auth failure depends on changes (R2.1):
        the provider's own, and the settings that decide whether the worker may read
        its key and reach its base URL (an attempt they refuse is an auth failure, so
        widening them must re-enable the provider as fixing its key would)."""
        payload = "|".join(
            [
                self.kind,
                self.model,
                self.base_url,
                self.api_key_env,
                settings.GOVERNANCE_KEY_ENV_ALLOW.canonical,
                settings.GOVERNANCE_OUTBOUND_ALLOW.canonical,
                str(settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS),
            ]
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


class Route(models.Model):
    """A named provider chain: what the OpenAI-compatible door's ``model`` may
    name besides a single provider id. Route names and provider ids are one
    namespace (``governance.services.routes``), so a name is never ambiguous."""

    name = models.SlugField(max_length=64, unique=True)
    provider_chain = models.JSONField(help_text="provider ids, tried in order")
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    # Written from governance.time_source (a rehearsal's shifted clock), not auto_now.
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} → {' → '.join(self.provider_chain)}"


class ToolServer(models.Model):
    """A registered tool: an MCP server whose tools are listed from
    it (``"{name}.{tool}"``), or one HTTP endpoint with a JSON Schema (``"{name}"``).

    A bearer token is named by its environment variable (``token_env``), never
    stored. ``listed_tools`` caches the server's last ``tools/list``; every
    change of it bumps ``schema_version`` (a tool-surface boundary for the
    threads that see it, R1.3).
    """

    class Kind(models.TextChoices):
        MCP = "mcp", "MCP server (Streamable HTTP)"
        MCP_STDIO = "mcp_stdio", "MCP server (stdio: a command the workers run)"
        HTTP = "http", "HTTP endpoint with a JSON Schema"

    name = models.SlugField(max_length=40, unique=True)
    kind = models.CharField(max_length=12, choices=Kind.choices)
    url = models.CharField(max_length=500, blank=True)
    # mcp_stdio kind: what each worker process starts (tasks.mcp_stdio). The
    # environment is named, never stored: values come from the worker's own.
    command = models.CharField(max_length=500, blank=True)
    args = models.JSONField(default=list, blank=True)
    env_names = models.JSONField(default=list, blank=True)
    cwd = models.CharField(max_length=500, blank=True)
    token_env = models.CharField(max_length=100, blank=True)
    # http kind only
    method = models.CharField(max_length=8, blank=True)
    description = models.TextField(blank=True)
    parameters = models.JSONField(default=dict, blank=True)
    effect = models.CharField(max_length=16, blank=True)  # read_only / external_effect
    verify_url = models.CharField(max_length=500, blank=True)
    timeout_s = models.FloatField(default=30.0)
    enabled = models.BooleanField(default=True)
    # mcp kinds: {tool: effect class} over the annotations' default
    effect_overrides = models.JSONField(default=dict, blank=True)
    # Who must say yes before a call runs (rules.approvals): never, side_effects
    # (every call not read-only) or always; per tool over the server's; the
    # role (a group) whose members may answer, and how long a request waits.
    approval = models.CharField(max_length=16, default="never")
    approval_overrides = models.JSONField(default=dict, blank=True)
    approver_role = models.CharField(max_length=80, default="operator")
    approval_wait_s = models.FloatField(default=3600.0)
    listed_tools = models.JSONField(default=list, blank=True)
    schema_version = models.PositiveIntegerField(default=0)
    schema_fingerprint = models.CharField(max_length=64, blank=True)
    listed_at = models.DateTimeField(null=True, blank=True)
    list_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        # Held by no role: only an admin (superuser) decides what the workers run.
        permissions = [
            ("run_tool_command", "Can register or change a stdio tool server (a command)")
        ]

    def __str__(self) -> str:
        # Not the URL: a row stored with credentials in it is shown masked, by the
        # services (governance.services.secrets.mask_url), never through this.
        return f"{self.name} ({self.kind})"


class ToolProcess(models.Model):
    """One worker process's running copy of a stdio tool server, as that
    worker last reported it (``tasks.mcp_stdio``): the Tools page's state,
    pid, uptime and the last lines the server wrote to stderr."""

    class State(models.TextChoices):
        STARTING = "starting", "starting"
        RUNNING = "running", "running"
        RESTARTING = "restarting", "restarting"
        FAILED = "failed", "failed to start"
        STOPPED = "stopped", "stopped"

    server = models.ForeignKey(ToolServer, on_delete=models.CASCADE, related_name="processes")
    worker = models.CharField(max_length=200)  # "{hostname}:{worker pid}"
    state = models.CharField(max_length=12, choices=State.choices)
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    next_start_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    stderr_tail = models.TextField(blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        ordering = ["server", "worker"]
        constraints = [
            models.UniqueConstraint(fields=["server", "worker"], name="tool_process_per_worker")
        ]


class ProviderHealthState(models.Model):
    """The breaker of one provider (R2.2). Refusals never touch it (R2.3)."""

    provider = models.OneToOneField(
        Provider, on_delete=models.CASCADE, primary_key=True, related_name="health"
    )
    breaker = models.CharField(max_length=16, default="closed")
    consecutive_failures = models.PositiveIntegerField(default=0)
    trips = models.PositiveIntegerField(default=0)
    open_until = models.DateTimeField(null=True, blank=True)
    last_failure_class = models.CharField(max_length=32, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    disabled_config = models.CharField(max_length=64, blank=True)
    probe_lease_until = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class TurnRefusalMemo(models.Model):
    """Turn-level refusal memory (R2.3): this exact request was refused here."""

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE)
    request_digest = models.CharField(max_length=64)
    refused_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "request_digest"], name="turn_refusal_unique"
            )
        ]


class Thread(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    title = models.CharField(max_length=200, blank=True)
    provider_chain = models.JSONField(help_text="provider ids, tried in order")
    model = models.CharField(max_length=200, blank=True)
    mode = models.CharField(max_length=50, default="default")
    tool_surface = models.JSONField(default=list)
    system_prompt = models.TextField(blank=True)
    callback_url = models.URLField(blank=True)
    # Its owner: a service account sees and uses its own threads only
    # (dashboard/site/permissions.py); None: its user was deleted.
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField()  # from governance.time_source, like every other fact
    # The OpenAI-compatible door's conversation: the client's session id
    # (``X-Session-Id``), unique per owner; None for threads made otherwise.
    # NULL, not "": threads without a key never collide under the unique constraint.
    client_session_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # The client's own tools (the door's ``tools``), canonical JSON: offered to
    # the model, their calls handed back to the client; "" for none.
    client_tools = models.TextField(blank=True)
    # The door's ``model`` the client last named: when it names another, the
    # client switched routes; while it names the same, an operator's model
    # switch stands.
    client_model = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # Also the index the door finds a conversation by (owner, key).
            models.UniqueConstraint(
                fields=["created_by", "client_session_key"], name="thread_client_session"
            )
        ]

    def __str__(self) -> str:
        return self.title or str(self.id)


class ThreadSession(models.Model):
    """One generation of a thread (R1.2); compact and fresh start open a new one."""

    id = models.CharField(max_length=40, primary_key=True)
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="sessions")
    generation = models.PositiveIntegerField()
    opened_by = models.CharField(max_length=32, blank=True)  # boundary kind, or "" for the first
    summary = models.TextField(blank=True)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["thread", "generation"], name="session_generation")
        ]


class Segment(models.Model):
    """R1.2: model, mode, tool surface and system prompt stay the same inside."""

    key = models.CharField(max_length=64, unique=True)
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="segments")
    session = models.ForeignKey(ThreadSession, on_delete=models.CASCADE, related_name="segments")
    segment_no = models.PositiveIntegerField()
    model = models.CharField(max_length=200)
    mode = models.CharField(max_length=50)
    tool_surface = models.JSONField(default=list)
    # The fingerprint of the registry schemas the surface sees (R1.3): a
    # change of them is a tool-surface boundary (R1.3).
    tool_schemas = models.CharField(max_length=64, blank=True)
    # The client's tools the segment offers (canonical JSON, "" for none):
    # another list is a tool-surface change (R1.3).
    client_tools = models.TextField(blank=True)
    system_prompt = models.TextField(blank=True)
    opened_at = models.DateTimeField()
    # R1.4: closing records who/why/when; nothing else about the segment changes.
    closed_at = models.DateTimeField(null=True, blank=True)
    closed_kind = models.CharField(max_length=32, blank=True)
    closed_by = models.CharField(max_length=150, blank=True)
    close_reason = models.TextField(blank=True)
    next_segment = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="previous_segment"
    )

    class Meta:
        ordering = ["-opened_at"]
        permissions = [
            ("apply_boundary", "Can force a boundary (compact, fresh start, switch model)"),
        ]
        constraints = [
            models.UniqueConstraint(fields=["session", "segment_no"], name="segment_number"),
            models.UniqueConstraint(
                fields=["thread"], condition=Q(closed_at__isnull=True), name="one_open_segment"
            ),
        ]
        indexes = [
            # The segments page, newest first: open ones (its default), and all or closed.
            models.Index(
                fields=["-opened_at", "-id"],
                name="segment_open_newest",
                condition=Q(closed_at__isnull=True),
            ),
            models.Index(fields=["-opened_at", "-id"], name="segment_newest"),
        ]

    def __str__(self) -> str:
        return self.key


class HistoryItem(models.Model):
    """Accepted history of a session: replayed verbatim every turn (R1.1)."""

    session = models.ForeignKey(ThreadSession, on_delete=models.CASCADE, related_name="history")
    seq = models.PositiveIntegerField()
    role = models.CharField(max_length=16)
    content = models.TextField()
    tool_call_id = models.CharField(max_length=100, blank=True)
    tool_calls = models.JSONField(default=list, blank=True)
    # The OpenAI-compatible door: the digest of the message as its client sent
    # it, when what was accepted differs (an increment re-rendered or withheld,
    # R3.1): the client keeps sending its own bytes, and they still match.
    client_digest = models.CharField(max_length=64, blank=True)
    run = models.ForeignKey("Run", null=True, blank=True, on_delete=models.SET_NULL)
    accepted_at = models.DateTimeField()

    class Meta:
        ordering = ["session", "seq"]
        constraints = [models.UniqueConstraint(fields=["session", "seq"], name="history_seq")]


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        FINALIZING = "finalizing"
        VERIFYING = "verifying"
        SETTLED = "settled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    thread = models.ForeignKey(Thread, on_delete=models.CASCADE, related_name="runs")
    segment = models.ForeignKey(Segment, on_delete=models.PROTECT, related_name="runs")
    input = models.TextField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    phase = models.CharField(max_length=16, default="research")
    decisions = models.JSONField(default=list)  # [{at, path, reason}] — R6.3 with reasons
    created_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    last_progress_at = models.DateTimeField()
    no_progress_limit_s = models.FloatField(default=300.0)
    stage_budget_s = models.FloatField(default=120.0)
    authorization = models.JSONField(default=dict)  # recorded at admission (R6.4)
    idempotency_key = models.CharField(max_length=200, null=True, blank=True, unique=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=150, blank=True)
    previous_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="successors"
    )
    trace_context = models.JSONField(default=dict, blank=True)
    # What the client asked of each request's reply (the door's sampling
    # parameters, ``max_tokens``, ``tool_choice``), sent as given to the provider.
    request_options = models.JSONField(default=dict, blank=True)
    # The door: the digest of the client's messages this run answers (its
    # history and the turn's increment). A request without a session id whose
    # history is those messages and this run's answer continues its thread.
    client_prefix = models.CharField(max_length=64, blank=True)
    callback_url = models.URLField(blank=True)
    # Who submitted it: a service account sees and acts on its own runs only
    # (dashboard/site/permissions.py); None: its user was deleted.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )  # fmt: skip
    # The API token that submitted it (the run API or the OpenAI door), and its
    # name copied at submit: the name is the record (it stays readable when the
    # token is revoked or deleted, as ``authorization`` keeps who asked); the
    # link tells tokens of the same name apart while the token exists.
    api_token = models.ForeignKey(
        "ApiToken", null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    client_name = models.CharField(max_length=100, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["status", "created_at"]),
            # The runs page, newest first (bench/scale.py).
            models.Index(fields=["-created_at", "-id"], name="run_newest_first"),
            # The door finds a conversation without a session id by its prefix.
            models.Index(
                fields=["owner", "client_prefix"],
                name="run_client_prefix",
                condition=~Q(client_prefix=""),
            ),
        ]
        permissions = [
            ("submit_run", "Can submit runs"),
            ("cancel_run", "Can stop runs"),
            ("see_all_runs", "Can see every thread and run, not only their own"),
            ("use_openai_door", "Can call the OpenAI-compatible door"),
        ]


class Stage(models.Model):
    class Kind(models.TextChoices):
        MODEL_TURN = "model_turn"
        TOOL_CALL = "tool_call"
        FINALIZATION = "finalization"
        VERIFY_EFFECT = "verify_effect"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="stages")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    payload = models.JSONField(default=dict, blank=True)
    enqueued_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=32, blank=True)
    # R6.2: the clock that ran out, if one did, and apart from it the failure
    # class of what the stage called (an interrupted stream is not a timeout).
    timeout_name = models.CharField(max_length=32, blank=True)
    failure_class = models.CharField(max_length=32, blank=True, default="")
    detail = models.TextField(blank=True)
    clocks = models.JSONField(default=dict, blank=True)  # the four clocks in ms (R6.1)
    deliveries = models.PositiveIntegerField(default=0)  # how often a worker picked it up
    claimed_at = models.DateTimeField(null=True, blank=True)  # when the current holder took it
    # Who holds the stage ("host/pid-namespace/pid/token", services.claims) and
    # until when: the holder's heartbeat renews the lease while the stage runs.
    holder = models.CharField(max_length=200, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    # Waiting behind the thread's turn in flight; woken by that turn's close.
    parked_at = models.DateTimeField(null=True, blank=True)
    # Its message was sent with a delay (a recovery wait, a verification delay):
    # not due before then. A message sent again keeps what is left of the delay.
    due_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="stage_seq")]
        indexes = [
            # The overview's clocks: the stages finished in the last hour, newest first.
            models.Index(
                fields=["-finished_at"],
                name="stage_finished",
                condition=Q(finished_at__isnull=False),
            ),
            # /metrics: the stages waiting for a worker, by kind, and the oldest.
            models.Index(
                fields=["kind", "enqueued_at"],
                name="stage_waiting",
                condition=Q(finished_at__isnull=True, started_at__isnull=True),
            ),
        ]

    @property
    def typed_payload(self) -> StagePayload:
        """``payload`` as its kind's type (``rules.payloads.load_payload``: what
        this code writes, and the unversioned shape older code wrote). Parsed on
        each read (a few microseconds): a caller that reads it twice keeps it."""
        return load_payload(self.kind, self.payload)


class ProviderAttempt(models.Model):
    class Kind(models.TextChoices):
        ORIGINAL = "original"
        RE_RENDER = "re_render"
        HISTORY_ONLY = "history_only"
        RE_PROBE = "re_probe"
        FALLBACK = "fallback"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    stage = models.ForeignKey(Stage, on_delete=models.CASCADE, related_name="attempts")
    segment = models.ForeignKey(Segment, on_delete=models.CASCADE, related_name="attempts")
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="attempts")
    model = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    request_digest = models.CharField(max_length=64)
    started_at = models.DateTimeField()
    latency_ms = models.PositiveIntegerField(default=0)
    result = models.CharField(max_length=16)  # accepted / refused / failed
    failure_class = models.CharField(max_length=32, blank=True)
    refusal_category = models.CharField(max_length=64, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    finish_reason = models.CharField(max_length=64, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    # {tool name: wire name} offered in this request (OpenAI/Anthropic name rules).
    tool_names = models.JSONField(default=dict, blank=True)
    # Its Insights tier, decided once by governance.rules.insights.tier_sends
    # when its turn is over and kept by services.insight_tiers; the Insights page sums
    # these. ``tiered`` says it was decided ("" tier: the send is in no tier). The
    # database defaults too: rows written by COPY (bench/scale.py) start untiered.
    tiered = models.BooleanField(default=False, db_default=False)
    insight_tier = models.CharField(max_length=16, blank=True, default="", db_default="")
    insight_step = models.PositiveSmallIntegerField(default=0, db_default=0)  # re-probe n
    insight_boundary_kind = models.CharField(max_length=32, blank=True, default="", db_default="")
    insight_category = models.CharField(max_length=64, blank=True, default="", db_default="")
    # Seconds since the latest refusal before it; None: no refusal before it.
    insight_since_refusal_s = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["started_at", "id"]
        permissions = [("view_insights", "Can see re-probe statistics and refusal costs")]
        indexes = [
            models.Index(fields=["started_at"], name="attempt_started"),
            models.Index(fields=["segment", "provider", "started_at"], name="attempt_seg_provider"),
            # A segment's requests in time order (its page's timeline, a page at a time).
            # On PostgreSQL it also carries what the cost summary reads (migration 0014),
            # so a long segment's cost is summed from the index alone.
            models.Index(fields=["segment", "started_at", "id"], name="attempt_segment_time"),
            # The Insights query's first step: refusal-related sends of a period.
            models.Index(
                fields=["started_at"],
                name="attempt_refusal_related",
                condition=Q(result="refused")
                | Q(kind__in=["re_render", "history_only", "re_probe"]),
            ),
            # What is left to tier, by segment (services.insight_tiers); empty at rest.
            models.Index(
                fields=["segment", "started_at"],
                name="attempt_untiered",
                condition=Q(tiered=False),
            ),
            # The Insights page's sums over a period: the sends that are in a tier.
            models.Index(
                fields=["started_at"], name="attempt_tier_time", condition=~Q(insight_tier="")
            ),
        ]


class SegmentRefusal(models.Model):
    """Fast-read copy of the R3.2 state per (segment, provider).

    Written only by the runner on an actual refusal, in the same transaction
    as the fallback card that stores the same state (R3.3, R3.5).
    """

    segment = models.ForeignKey(Segment, on_delete=models.CASCADE, related_name="refusals")
    provider_id = models.CharField(max_length=64)
    model = models.CharField(max_length=200, blank=True)
    category = models.CharField(max_length=64, blank=True)
    refusals = models.PositiveIntegerField(null=True, blank=True)  # None = legacy
    refused_at = models.DateTimeField(null=True, blank=True)
    # The schedule the refusal started under, in seconds; None = R3.2's default.
    delays_s = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["segment", "provider_id"], name="refusal_per_provider")
        ]


class RunEvent(models.Model):
    """What happened, in order: stage changes, llm-fallback cards, chunks, settlement."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    segment = models.ForeignKey(Segment, on_delete=models.CASCADE, related_name="events")
    stage = models.ForeignKey(Stage, null=True, blank=True, on_delete=models.SET_NULL)
    kind = models.CharField(max_length=32)  # "llm-fallback", "stage", "decision", …
    at = models.DateTimeField()
    metadata = models.JSONField(default=dict)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["segment", "kind"])]


class Incident(models.Model):
    """One segment's trouble as on-call works it (R8.2): its critical
    notifications grouped, one lifecycle (``governance.rules.incidents``).
    Each step, with who, when and an optional note, is an ``IncidentStep``;
    what each channel was told is in the notifications' deliveries."""

    class State(models.TextChoices):
        TRIGGERED = "triggered"
        ACKNOWLEDGED = "acknowledged"
        RESOLVED = "resolved"

    key = models.CharField(max_length=120, unique=True)  # PagerDuty's dedup_key
    segment = models.ForeignKey(Segment, on_delete=models.CASCADE, related_name="incidents")
    state = models.CharField(max_length=16, choices=State.choices, default=State.TRIGGERED)
    # The time of the fact that opened it (the refusal that froze, the run that settled).
    opened_at = models.DateTimeField()
    acked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    acked_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True)  # a username
    resolved_how = models.CharField(max_length=200, blank=True)  # "a fresh start", "by hand"

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["segment"], condition=Q(resolved_at__isnull=True), name="one_open_incident"
            ),
        ]
        indexes = [models.Index(fields=["state", "-opened_at"], name="incident_by_state")]

    def __str__(self) -> str:
        return self.key


class IncidentStep(models.Model):
    """One step of an incident's lifecycle: who, when, and an optional note."""

    class Kind(models.TextChoices):
        TRIGGERED = "triggered"
        JOINED = "joined"  # another critical notification of the same segment
        ESCALATED = "escalated"
        ACKNOWLEDGED = "acknowledged"
        RESOLVED = "resolved"

    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="steps")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    at = models.DateTimeField()
    actor = models.CharField(max_length=150)  # a username, or "system"
    notification = models.ForeignKey(
        "Notification", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    escalation_level = models.PositiveSmallIntegerField(null=True, blank=True)
    note = models.TextField(blank=True)

    class Meta:
        ordering = ["at", "id"]


class Notification(models.Model):
    class Severity(models.TextChoices):
        NORMAL = "normal"
        CRITICAL = "critical"

    dedupe_key = models.CharField(max_length=300, unique=True)  # R3.6: never emitted twice
    severity = models.CharField(max_length=16, choices=Severity.choices)
    text = models.TextField()
    segment = models.ForeignKey(
        Segment, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    provider_ids = models.JSONField(default=list)
    reprobes = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField()
    acked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    acked_at = models.DateTimeField(null=True, blank=True)
    # R8.2: escalation while unacknowledged; a boundary resolves the segment's alerts.
    escalation_level = models.PositiveSmallIntegerField(default=0)
    last_escalated_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # The incident it belongs to (critical notifications of a segment, R8.2);
    # the first one of an incident is its lead, the one that escalates.
    incident = models.ForeignKey(
        Incident, null=True, blank=True, on_delete=models.SET_NULL, related_name="notifications"
    )
    leads_incident = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created_at"]
        permissions = [("acknowledge_notification", "Can acknowledge alerts")]
        indexes = [
            # GET /metrics counts these at every scrape: no scan of the history.
            models.Index(
                fields=["incident"],
                name="notification_critical_unacked",
                condition=Q(severity="critical", acked_at__isnull=True),
            ),
        ]


class BudgetAccount(models.Model):
    """The one ledger of a run (R5.1); its row is the admission lock."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="budget")
    limits = models.JSONField()


class BudgetEntry(models.Model):
    account = models.ForeignKey(BudgetAccount, on_delete=models.CASCADE, related_name="entries")
    kind = models.CharField(max_length=16)  # admit / release
    idempotency_key = models.CharField(max_length=300)
    resource = models.CharField(max_length=32)
    pool = models.CharField(max_length=32)
    amount = models.PositiveIntegerField()
    purpose = models.CharField(max_length=32)
    for_finalization = models.BooleanField(default=False)
    created_at = models.DateTimeField()
    # The stage that drew it: a use whose holder died before it recorded the
    # attempt has no known outcome (R5.3: its retry draws from the same balance).
    stage = models.ForeignKey(
        "Stage", null=True, blank=True, on_delete=models.SET_NULL, related_name="ledger_entries"
    )
    outcome = models.CharField(max_length=16, blank=True)  # "" or "unknown"

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["account", "idempotency_key", "kind"], name="budget_entry_key"
            )
        ]


class ToolReceipt(models.Model):
    class Effect(models.TextChoices):
        PENDING = "pending"  # written before the effect (attempt before effect)
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        REFUSED = "refused"  # the executor refused its own operation (R4.1)
        UNKNOWN = "unknown"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="receipts")
    stage = models.ForeignKey(Stage, null=True, blank=True, on_delete=models.SET_NULL)
    tool = models.CharField(max_length=200)
    # A registry tool's server and the schema version the call was made against.
    server = models.CharField(max_length=40, blank=True)
    schema_version = models.PositiveIntegerField(null=True, blank=True)
    effect_class = models.CharField(max_length=16, blank=True)
    tool_call_id = models.CharField(max_length=100, blank=True)
    idempotency_key = models.CharField(max_length=300, unique=True)
    arguments = models.JSONField(default=dict)
    effect = models.CharField(max_length=16, choices=Effect.choices, default=Effect.PENDING)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # /metrics: the effects still unknown and not verified (R6.4).
            models.Index(
                fields=["effect"],
                name="receipt_unknown",
                condition=Q(effect="unknown", verified_at__isnull=True),
            ),
        ]


class ToolApproval(models.Model):
    """One call a person must approve, recorded exactly as it will be sent
    (tool, arguments, idempotency key): a yes runs that call, once; a no or no
    answer in time is the call's result the model reads (rules.approvals)."""

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        DENIED = "denied"
        EXPIRED = "expired"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="approvals")
    stage = models.OneToOneField(Stage, on_delete=models.CASCADE, related_name="approval")
    tool = models.CharField(max_length=200)
    server = models.CharField(max_length=40, blank=True)
    effect_class = models.CharField(max_length=16, blank=True)
    annotations = models.JSONField(default=dict, blank=True)
    arguments = models.JSONField(default=dict)
    idempotency_key = models.CharField(max_length=300, unique=True)
    call_id = models.CharField(max_length=100, blank=True)
    # The model's words in the turn that asked for the call (its reasoning).
    reasoning = models.TextField(blank=True)
    policy = models.CharField(max_length=16)
    approver_role = models.CharField(max_length=80)
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    decided_by = models.CharField(max_length=150, blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        indexes = [models.Index(fields=["state", "expires_at"], name="approval_open")]
        permissions = [("decide_approval", "Can approve or deny a paused tool call")]


class BodyChunk(models.Model):
    """R7.2: generated, committed, sent, observed — four separate facts."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="chunks")
    chunk_no = models.PositiveIntegerField()
    version = models.PositiveIntegerField(null=True, blank=True)
    text = models.TextField()
    # The client's tool calls this chunk hands over ({"id", "name", "arguments"});
    # its text then says them in words. Empty for a chunk of the body's text.
    tool_calls = models.JSONField(default=list, blank=True)
    final = models.BooleanField(default=False)
    generated_at = models.DateTimeField()
    committed_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "chunk_no"]
        constraints = [models.UniqueConstraint(fields=["run", "chunk_no"], name="chunk_no")]


class Settlement(models.Model):
    """R6.5: written once per run."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="settlement")
    outcome = models.CharField(max_length=16)
    reason_code = models.CharField(max_length=64)
    reason = models.TextField()
    unknown_effects = models.JSONField(default=list)
    settled_at = models.DateTimeField()

    # The run's delivery judged once (R7.4, ``governance.services.deliveries``), so the
    # report sums columns instead of judging every run of its period on each request.
    # ``delivery_rev`` goes up, by database trigger (migration 0015), whenever a row
    # of the run's chunks, callback or tool receipts is written; the judgement below
    # stands for ``judged_rev`` and is redone while the two differ. Defaults in the
    # database too: rows written outside the ORM (a bulk load) start unjudged.
    delivery_rev = models.PositiveIntegerField(default=1, db_default=1)
    judged_rev = models.PositiveIntegerField(default=0, db_default=0)
    provider_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    chunks_committed = models.PositiveIntegerField(default=0, db_default=0)
    chunks_sent = models.PositiveIntegerField(default=0, db_default=0)
    chunks_observed = models.PositiveIntegerField(default=0, db_default=0)
    delivery_verdict = models.CharField(max_length=40, blank=True, default="", db_default="")
    discrepancy_count = models.PositiveIntegerField(default=0, db_default=0)
    # {"callback": {status, label, note}, "unknown_effects": [...],
    #  "discrepancies": [{code, text}], "usage": [[provider pk, result, reported,
    #  requests, billed input, output, cached], ...]}
    delivery = models.JSONField(
        default=dict, db_default=models.Value({}, models.JSONField()), blank=True
    )
    # What is already added to ``SettledUsageDay``: {"provider_key", "usage"} of the
    # last judgement (the next adds only the difference: an attempt recorded late).
    usage_in_rollup = models.JSONField(
        default=dict, db_default=models.Value({}, models.JSONField()), blank=True
    )

    class Meta:
        permissions = [
            ("view_delivery_report", "Can see the delivery-versus-settlement report"),
        ]
        indexes = [
            # The report window, newest first (its discrepancy list reads this order).
            models.Index(fields=["settled_at", "run_id"], name="settlement_settled_at"),
            models.Index(
                fields=["id"],
                name="settlement_unjudged",
                condition=models.Q(judged_rev__lt=models.F("delivery_rev")),
            ),
        ]


class SettledDay(models.Model):
    """The delivery report's counts per UTC day of settlement, run provider and outcome
    (R7.4): runs, chunks, client evidence, discrepancies — the judged settlement
    columns summed, so a month is read in a few hundred rows. Written only by
    ``governance.services.deliveries``: each judgement adds its difference."""

    day = models.DateField()
    provider_key = models.CharField(max_length=64, blank=True)
    outcome = models.CharField(max_length=16)
    runs = models.BigIntegerField(default=0)
    committed = models.BigIntegerField(default=0)
    sent = models.BigIntegerField(default=0)
    observed = models.BigIntegerField(default=0)
    # Runs per delivery verdict (governance.rules.publication.DeliveryVerdict).
    all_acknowledged = models.BigIntegerField(default=0)
    part_acknowledged = models.BigIntegerField(default=0)
    no_evidence = models.BigIntegerField(default=0)
    nothing_committed = models.BigIntegerField(default=0)
    flagged = models.BigIntegerField(default=0)  # runs with discrepancies
    discrepancies = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["day", "provider_key", "outcome"], name="settled_day_key"
            )
        ]


class SettledUsageDay(models.Model):
    """The billed tokens of settled runs' provider requests, summed per UTC day of
    settlement, run provider and outcome (R7.4): the delivery report prices whole
    days from here instead of every run's requests. Written only by
    ``governance.services.deliveries`` as it judges each run; runs are never deleted."""

    day = models.DateField()
    provider_key = models.CharField(max_length=64, blank=True)  # the run's provider
    outcome = models.CharField(max_length=16)
    # One kind of request (``governance.rules.cost.UsageShape``): who served it, refused
    # or not, whether usage was reported, which kinds of token it bills.
    provider = models.ForeignKey(Provider, on_delete=models.PROTECT, related_name="+")
    refused = models.BooleanField()
    reported = models.BooleanField()
    bills_input = models.BooleanField()
    bills_output = models.BooleanField()
    bills_cached = models.BooleanField()
    requests = models.BigIntegerField(default=0)
    billed_input = models.BigIntegerField(default=0)
    output = models.BigIntegerField(default=0)
    cached = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "day", "provider_key", "outcome", "provider", "refused", "reported",
                    "bills_input", "bills_output", "bills_cached",
                ],
                name="settled_usage_day_key",
            )
        ]  # fmt: skip


class KnowledgeDocument(models.Model):
    """The small knowledge base the search tool reads."""

    title = models.CharField(max_length=200)
    body = models.TextField()
    tags = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["title"]


class AuditEntry(models.Model):
    at = models.DateTimeField()
    actor = models.CharField(max_length=150)
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=100)
    reason = models.TextField(blank=True)
    detail = models.JSONField(default=dict, blank=True)
    idempotency_key = models.CharField(max_length=300, null=True, blank=True, unique=True)

    class Meta:
        ordering = ["-at", "-id"]


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=100)
    key_digest = models.CharField(max_length=64, unique=True)  # sha256 of the token
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Permission codenames the token is limited to (dashboard/site/permissions.py);
    # empty: whatever its user's role allows.
    scopes = models.JSONField(default=list, blank=True)


class ViewerPreference(models.Model):
    """What one dashboard user chose for their own view of it."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="viewer_preference"
    )
    # An IANA zone ("Europe/Berlin"); empty: the browser's own zone.
    time_zone = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)


class SpanRecord(models.Model):
    """Embedded span store: the dashboard shows a run's trace without a collector."""

    trace_id = models.CharField(max_length=32, db_index=True)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True)
    name = models.CharField(max_length=200)
    start = models.DateTimeField(db_index=True)
    end = models.DateTimeField()
    status = models.CharField(max_length=16, blank=True)
    attributes = models.JSONField(default=dict)
    run_id = models.UUIDField(null=True, blank=True, db_index=True)
    component = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ["start"]
        constraints = [
            models.UniqueConstraint(fields=["trace_id", "span_id"], name="span_identity")
        ]


class AlertChannel(models.Model):
    """An outbound channel for notifications (R8.2), configured in the admin."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook", "Generic webhook (JSON)"
        SLACK = "slack", "Slack-compatible incoming webhook"
        EMAIL = "email", "E-mail"
        PAGERDUTY = "pagerduty", "PagerDuty Events API v2"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # Webhook/Slack: the URL; e-mail: comma-separated addresses; PagerDuty: the
    # Events API URL (empty = PagerDuty's default).
    target = models.CharField(max_length=500, blank=True)
    # PagerDuty integration key, read from the environment variable with this name.
    routing_key_env = models.CharField(max_length=100, blank=True)
    # Escalation goes to channels in this order (lowest first).
    escalation_order = models.PositiveSmallIntegerField(default=0)
    daily_budget = models.PositiveIntegerField(
        default=50, help_text="non-critical pushes per UTC day; critical ones bypass it (R3.6)"
    )
    enabled = models.BooleanField(default=True)
    disabled_reason = models.TextField(blank=True)  # set when a permanent failure disabled it
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["escalation_order", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class OutboxAttempt(models.Model):
    """What an outbound delivery records about its attempts: claimed with a
    conditional update, written before the effect, its result after."""

    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    claimed_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField()

    class Meta:
        abstract = True


class NotificationDelivery(OutboxAttempt):
    """One notification event to one channel: the outbox row (exactly once per key)."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"  # the attempt is written before the effect
        DELIVERED = "delivered"
        RETRY = "retry"
        FAILED = "failed"  # permanent: the channel was disabled
        DROPPED = "dropped"  # over the daily budget for non-critical pushes

    notification = models.ForeignKey(
        Notification, on_delete=models.CASCADE, related_name="deliveries"
    )
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32)  # trigger / acknowledge / resolve / escalate-N
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["notification", "channel", "event"], name="delivery_once"
            )
        ]


class RunCallback(OutboxAttempt):
    """The completion callback of a run: attempt written before the call (R7.3)."""

    class State(models.TextChoices):
        PENDING = "pending"
        SENDING = "sending"
        DELIVERED = "delivered"
        RETRY = "retry"
        FAILED = "failed"

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="callback")
    url = models.URLField()
    idempotency_key = models.CharField(max_length=100, unique=True)
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)


class RunViewer(models.Model):
    """A browser connection observing a run (R7.1): it is not the run."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="viewers")
    connection_id = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=16, default="running")  # running / detached
    connected_at = models.DateTimeField()
    disconnected_at = models.DateTimeField(null=True, blank=True)
    last_event_id = models.PositiveBigIntegerField(default=0)  # a RunEvent id (bigint)
