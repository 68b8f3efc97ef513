from django import forms
from django.contrib import admin

from governance.models import (
    AlertChannel,
    ApiToken,
    AuditEntry,
    KnowledgeDocument,
    Notification,
    Provider,
    ProviderHealthState,
    ToolServer,
)
from governance.services.alerts import channel_target_problem
from governance.services.errors import ServiceError
from governance.services.providers import check_base_url
from governance.services.routes import require_free_name
from governance.services.secrets import mask_url, require_key_env
from governance.services.tool_servers import check_url

KEY_ENV_HELP = (
    "The NAME of the environment variable that holds the key — never the key itself. "
    "It must match GOVERNANCE_KEY_ENV_ALLOW (default: GOVERNANCE_KEY_* and the "
    "conventional provider names such as OPENAI_API_KEY); the system's own settings "
    "and *_FILE names are never allowed."
)


def _judge(form: forms.ModelForm, field: str, check) -> None:
    """Run a service's check on a field the admin changed; its refusal is the field's error."""
    value = form.cleaned_data.get(field) or ""
    if field not in form.errors and value and field in form.changed_data:
        try:
            check(value, field)
        except ServiceError as exc:
            form.add_error(field, exc.message)


def _provider_id_free(provider_id: str, field: str) -> None:
    # Inside the admin's transaction of the save: the name stays held until it commits.
    require_free_name(provider_id, for_a="provider", field=field)


class ProviderForm(forms.ModelForm):
    """The admin's provider form: the key variable and the base URL pass the
    provider service's checks (``check_base_url``, ``require_key_env``), and
    the id is no route's name (``require_free_name``)."""

    base_url = forms.URLField(
        required=False,
        max_length=200,
        assume_scheme="https",
        help_text=(
            "Where requests (and the key) go: no user:password@ or key in the URL; a "
            "loopback or private address must be listed in GOVERNANCE_OUTBOUND_ALLOW."
        ),
    )

    class Meta:
        model = Provider
        fields = (
            "provider_id", "kind", "model", "base_url", "api_key_env", "script",
            "connect_timeout_s", "read_timeout_s", "failure_threshold", "base_cooldown_s",
            "max_cooldown_s", "enabled", "price_input_per_mtok", "price_output_per_mtok",
            "price_cached_per_mtok", "currency", "refusal_schedule",
        )  # fmt: skip
        help_texts = {"api_key_env": KEY_ENV_HELP}

    def clean(self):
        data = super().clean()
        _judge(self, "provider_id", _provider_id_free)
        _judge(self, "base_url", check_base_url)
        _judge(self, "api_key_env", require_key_env)
        return data


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    form = ProviderForm
    list_display = ("provider_id", "kind", "model", "shown_base_url", "enabled")
    list_filter = ("kind", "enabled")
    search_fields = ("provider_id", "model")

    @admin.display(description="Base URL", ordering="base_url")
    def shown_base_url(self, obj: Provider) -> str:
        return mask_url(obj.base_url)


class ToolServerForm(forms.ModelForm):
    """The admin's registry form: the URLs and the token variable pass the
    tool service's checks (``check_url``, ``require_key_env``)."""

    class Meta:
        model = ToolServer
        fields = (
            "name", "kind", "url", "token_env", "method", "description", "parameters",
            "effect", "verify_url", "timeout_s", "enabled", "effect_overrides",
        )  # fmt: skip
        help_texts = {"token_env": KEY_ENV_HELP.replace("the key", "the bearer token")}

    def clean(self):
        data = super().clean()
        _judge(self, "url", check_url)
        _judge(self, "verify_url", check_url)
        _judge(self, "token_env", require_key_env)
        return data


@admin.register(ToolServer)
class ToolServerAdmin(admin.ModelAdmin):
    """The tool registry. Listings are the server's: read-only here;
    ``manage.py tool refresh`` or ``PATCH /api/v1/tools/{name}`` lists again."""

    form = ToolServerForm
    list_display = ("name", "kind", "shown_url", "enabled", "schema_version", "listed_at")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "url")
    readonly_fields = (
        "listed_tools", "schema_version", "schema_fingerprint", "listed_at", "list_error",
    )  # fmt: skip

    @admin.display(description="URL", ordering="url")
    def shown_url(self, obj: ToolServer) -> str:
        return mask_url(obj.url)


@admin.register(ProviderHealthState)
class ProviderHealthAdmin(admin.ModelAdmin):
    list_display = (
        "provider",
        "breaker",
        "consecutive_failures",
        "open_until",
        "last_failure_class",
    )
    readonly_fields = [f.name for f in ProviderHealthState._meta.fields]


@admin.register(KnowledgeDocument)
class KnowledgeDocumentAdmin(admin.ModelAdmin):
    list_display = ("title",)
    search_fields = ("title", "body")


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ("dedupe_key", "severity", "created_at", "acked_by", "acked_at")
    list_filter = ("severity",)
    readonly_fields = [f.name for f in Notification._meta.fields]


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ("at", "actor", "action", "target_type", "target_id")
    readonly_fields = [f.name for f in AuditEntry._meta.fields]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("key_digest", "created_at", "last_used_at")


class AlertChannelForm(forms.ModelForm):
    class Meta:
        model = AlertChannel
        fields = (
            "name",
            "kind",
            "target",
            "routing_key_env",
            "escalation_order",
            "daily_budget",
            "enabled",
        )
        help_texts = {
            "target": (
                "Webhook and Slack: the URL to POST to. E-mail: addresses, comma-separated. "
                "PagerDuty: the Events API v2 URL (empty = https://events.pagerduty.com/v2/enqueue)."
            ),
            "routing_key_env": (
                "PagerDuty only: the NAME of the environment variable that holds the "
                "integration (routing) key — never the key itself. It must match "
                "GOVERNANCE_KEY_ENV_ALLOW (default: GOVERNANCE_KEY_* and the conventional "
                "provider names); the system's own settings and *_FILE names never are."
            ),
            "escalation_order": (
                "Channels with the lowest number hear every alert first; an unacknowledged "
                "critical alert is re-sent to the next number up every "
                "GOVERNANCE_ESCALATION_MINUTES (default 15), until someone acknowledges it."
            ),
            "daily_budget": (
                "Normal (non-critical) pushes per UTC day; the rest are dropped and recorded. "
                "Critical alerts bypass it (R3.6)."
            ),
            "enabled": (
                "A permanent delivery failure (4xx, bad configuration) turns this off and says "
                "why below; fix the channel and tick it again."
            ),
        }
        widgets = {"target": forms.TextInput(attrs={"size": 80})}

    def clean(self):
        data = super().clean()
        kind, target = data.get("kind"), (data.get("target") or "").strip()
        if kind in (AlertChannel.Kind.WEBHOOK, AlertChannel.Kind.SLACK) and not target.startswith(
            ("http://", "https://")
        ):
            self.add_error("target", "give the http(s) URL to POST to")
        if kind == AlertChannel.Kind.EMAIL:
            addresses = [a.strip() for a in target.split(",") if a.strip()]
            if not addresses:
                self.add_error("target", "give at least one e-mail address")
            for address in addresses:
                try:
                    forms.EmailField().clean(address)
                except forms.ValidationError:
                    self.add_error("target", f"{address!r} is not an e-mail address")
        if kind == AlertChannel.Kind.PAGERDUTY and not (data.get("routing_key_env") or "").strip():
            self.add_error("routing_key_env", "name the environment variable with the routing key")
        _judge(self, "routing_key_env", require_key_env)
        if "target" not in self.errors and (problem := channel_target_problem(kind, target)):
            self.add_error("target", problem)  # checked again when sending
        return data


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    form = AlertChannelForm
    list_display = (
        "name",
        "kind",
        "escalation_order",
        "daily_budget",
        "state",
        "disabled_at",
    )
    list_filter = ("kind", "enabled")
    search_fields = ("name", "target")
    readonly_fields = ("disabled_reason", "disabled_at", "created_at")
    fieldsets = (
        (None, {"fields": ("name", "kind", "target", "routing_key_env")}),
        ("Routing", {"fields": ("escalation_order", "daily_budget")}),
        ("State", {"fields": ("enabled", "disabled_reason", "disabled_at", "created_at")}),
    )

    @admin.display(description="State")
    def state(self, obj: AlertChannel) -> str:
        if obj.enabled:
            return "enabled"
        return f"disabled: {obj.disabled_reason}" if obj.disabled_reason else "disabled"

    def save_model(self, request, obj, form, change):
        if obj.enabled and (obj.disabled_reason or obj.disabled_at):
            # Re-enabled by a person: the old failure no longer describes it.
            obj.disabled_reason, obj.disabled_at = "", None
        super().save_model(request, obj, form, change)
