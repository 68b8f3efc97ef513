from django.contrib import admin

from governance.models import (
    ApiToken,
    AuditEntry,
    KnowledgeDocument,
    Notification,
    Provider,
    ProviderHealthState,
)


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ("provider_id", "kind", "model", "base_url", "enabled")
    list_filter = ("kind", "enabled")
    search_fields = ("provider_id", "model")


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
