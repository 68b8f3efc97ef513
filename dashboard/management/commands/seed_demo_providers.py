"""Create the scripted demo providers and a small knowledge base (idempotent).

They let a fresh machine run governed agent runs with no API key: the
primary answers, calls the calculator or the knowledge-base search, and
refuses any request containing "forbidden"; the backup always answers.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from governance.models import KnowledgeDocument, Provider

PRIMARY_SCRIPT = {
    "rules": [
        {"when": {"contains": "forbidden"}, "refuse": {"category": "policy"}},
        {
            "when": {"contains": "calculate", "last_role_not": "tool", "has_tool": "calculator"},
            "tool_call": {"name": "calculator", "arguments": {"expression": "6*7"}},
        },
        {
            "when": {"contains": "search", "last_role_not": "tool", "has_tool": "kb_search"},
            "tool_call": {"name": "kb_search", "arguments": {"query": "{last_user}"}},
        },
        {"when": {"last_role": "tool"}, "answer": {"text": "From the tool: {last_message}"}},
    ],
    "default": {"answer": {"text": "Primary answer to: {last_user}", "chunks": 2}},
}
BACKUP_SCRIPT = {"default": {"answer": {"text": "Backup answer to: {last_user}", "chunks": 2}}}
DOCUMENTS = [
    ("Refusal rule", "A refused provider is skipped in this segment for now.", ["refusal"]),
    ("Boundaries", "Compact, fresh start and switch model open a new segment.", ["segment"]),
    ("Clocks", "Queue, execution, no-progress and deadline are separate clocks.", ["clocks"]),
]


class Command(BaseCommand):
    help = "Create the scripted demo providers and knowledge base (safe to run again)."

    def handle(self, *args, **options):
        for provider_id, script in (
            ("scripted-primary", PRIMARY_SCRIPT),
            ("scripted-backup", BACKUP_SCRIPT),
        ):
            Provider.objects.update_or_create(
                provider_id=provider_id,
                defaults={"kind": "scripted", "model": f"{provider_id}-v1", "script": script},
            )
        for title, body, tags in DOCUMENTS:
            KnowledgeDocument.objects.update_or_create(
                title=title, defaults={"body": body, "tags": tags}
            )
        if options["verbosity"] > 0:
            self.stdout.write("Demo providers: scripted-primary, scripted-backup.")
