"""Seed a realistic demo scenario through the real engine.

Nothing here writes a fact row: threads, runs and boundaries go through
``governance.services`` and every stage runs through ``tasks.stages`` —
in this process, synchronously (Celery eager mode), under a manual clock
that starts about nine hours ago and is moved forward between steps, so
the data spans the morning and ends at about "now". Only configuration is
written directly: the scripted ``demo-*`` providers, a few knowledge-base
documents, and the demo users.

The story (times relative to the start, about nine hours ago):

* a refusal storm: ``demo-sentinel`` refuses the accepted history of
  "incident cost review" and is re-probed at +15 min, +1 h and +6 h until
  it is frozen in that segment (critical alert, unacknowledged); the
  "vendor breach triage" thread is frozen on both of its providers, so its
  runs settle failed with an alert that names the boundary action needed;
* an outage: ``demo-meridian`` answers 503 early on (its breaker opens,
  goes half-open, trips again, then closes), and ``demo-orion`` trips near
  the end and is still open; runs fall back along their chains;
* runs that complete (with the calculator, the knowledge base, a stream
  interrupted and recovered), settle partial (request budget used up after a
  search → finalization only), get cancelled, hit the deadline, and leave a webhook
  effect unknown (a loopback receiver that drops the answer and cannot
  verify);
* delivery (R7.2–R7.4): streamed answers watched by a viewer that
  acknowledged all, part or none of the chunks (through ``services.stream``,
  as the watch page does), and completion callbacks to a loopback receiver
  that takes them at once, after a retry (503 first), or never (503 until the
  attempts run out; the latest is still retrying) — so the delivery report
  shows a realistic mix;
* boundaries in the audit log: a fresh start and a compact by the demo
  operator, with their reasons;
* the demo users: an operator, an on-call and a manager.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import connection
from django.urls import reverse

from dashboard.site.private_files import make_private_file, make_private_folder
from governance import services, time_source
from governance.models import (
    AlertChannel,
    KnowledgeDocument,
    Notification,
    Provider,
    Run,
    RunCallback,
    RunViewer,
    Settlement,
    Stage,
    Thread,
    ToolServer,
)
from governance.roles import ensure_roles
from governance.services import tool_servers

TITLE_PREFIX = "demo:"
DEMO_PAGER_CHANNEL = "demo pager (local sink)"
SCENARIO_HOURS = 9
# An HTTP tool whose every call a person approves (the Approvals page): it posts
# to the web's own demo pager, so an approved call succeeds under `make run`.
DEMO_APPROVAL_TOOL = "ops-notify"

# (username, group): passwords are random per machine and kept in var/.
DEMO_USERS = (
    ("demo-oncall", "on-call"),
    ("demo-operator", "operator"),
    ("demo-manager", "manager"),
)

TRIGGER = "breach-dossier"  # what the strict providers refuse, wherever it appears

KB_DOCUMENTS = [
    (
        "Refund policy",
        "Refunds are issued to the original payment method within 5 business days. "
        "Orders over 500 EUR need a second approval.",
        ["refund", "billing"],
    ),
    (
        "Escalation runbook",
        "Escalate a support ticket to the CRM when the customer is blocked for more "
        "than 4 hours. Record the ticket id and the owner.",
        ["support", "escalation"],
    ),
    (
        "Onboarding checklist",
        "New workspaces need SSO, a billing contact and at least two administrators.",
        ["onboarding"],
    ),
]


# --------------------------------------------------------------------------- users


def ensure_demo_users(var_dir: Path) -> list[tuple[str, str, str]]:
    """The demo operator, on-call and manager; passwords kept stable in var/.

    Returns ``[(username, password, group), ...]``.
    """
    user_model = get_user_model()
    users = []
    ensure_roles()  # the groups with their permissions, even on a flushed database
    for username, group_name in DEMO_USERS:
        password_file = var_dir / f"{username}-password"
        if password_file.exists():
            password = password_file.read_text().strip()
        else:
            password = secrets.token_urlsafe(12)
            make_private_file(password_file)  # 0600 before the password is in it
            password_file.write_text(password + "\n")
        user, _ = user_model.objects.get_or_create(
            username=username, defaults={"email": f"{username}@localhost"}
        )
        user.set_password(password)
        user.save()
        group, _ = Group.objects.get_or_create(name=group_name)
        user.groups.add(group)
        users.append((username, password, group_name))
    return users


# --------------------------------------------------------------------------- providers


def _rule(action: str, spec: Any, *, when: dict | None = None, **extra: Any) -> dict:
    rule: dict[str, Any] = {action: spec, **extra}
    if when:
        rule["when"] = when
    return rule


def _prices(input_: str, output: str, cached: str | None = None) -> dict[str, Any]:
    """Prices per million tokens in USD, so the pages show what refusals cost."""
    return {
        "price_input_per_mtok": Decimal(input_),
        "price_output_per_mtok": Decimal(output),
        "price_cached_per_mtok": Decimal(cached) if cached is not None else None,
        "currency": "USD",
    }


def provider_scripts(round_no: int, webhook_url: str) -> dict[str, tuple[str, dict, dict]]:
    """provider id → (model, script, extra configuration).

    Rules with ``times`` are named after the round: the scripted provider
    keys its counters by the rule, so each round starts its outage afresh.
    """
    tag = f"round {round_no}"
    after_tool = {"last_role": "tool"}
    return {
        # Strict policy models: refuse any request that carries the trigger.
        "demo-sentinel": (
            "sentinel-strict-1",
            {
                "rules": [
                    _rule(
                        "refuse",
                        {"category": "policy", "text": "This conflicts with the content policy."},
                        when={"contains": TRIGGER},
                        delay_s=0.8,
                    ),
                    _rule(
                        "tool_call",
                        {
                            "name": "calculator",
                            "arguments": {"expression": "1250 * 3 + 480"},
                            "text": f"Cross-checking the {TRIGGER} figures.",
                        },
                        when={"last_role_not": "tool", "has_tool": "calculator"},
                        delay_s=1.4,
                    ),
                ],
                "default": {"answer": {"text": "Sentinel: {last_user}", "chunks": 2}},
            },
            _prices("3", "15", "0.3"),
        ),
        "demo-vigil": (
            "vigil-guard-2",
            {
                "rules": [
                    _rule(
                        "refuse",
                        {"category": "content_filter"},
                        when={"contains": TRIGGER},
                        delay_s=0.6,
                    )
                ],
                "default": {"answer": {"text": "Vigil: {last_user}", "chunks": 2}},
            },
            _prices("0.8", "3.2"),
        ),
        # The general-purpose backup of most chains.
        "demo-harbor": (
            "harbor-general-3",
            {
                "rules": [
                    _rule(
                        "answer",
                        {
                            "text": "From the tool result: {last_message}",
                            "chunks": 2,
                            "chunk_interval_s": 0.4,
                        },
                        when=after_tool,
                        delay_s=1.1,
                    )
                ],
                "default": {
                    "answer": {
                        "text": (
                            "Here is what I found about \u201c{last_user}\u201d. The figures "
                            "reconcile with the ledger; nothing needs a second approval."
                        ),
                        "chunks": 3,
                        "chunk_interval_s": 0.5,
                    }
                },
            },
            _prices("0.5", "1.5"),
        ),
        # Primary of support and onboarding: an outage on its first calls.
        "demo-meridian": (
            "meridian-pro",
            {
                "rules": [
                    _rule(
                        "fail",
                        {
                            "status": 503,
                            "code": "overloaded",
                            "message": "upstream capacity exhausted",
                        },
                        name=f"early outage ({tag})",
                        times=4,
                        delay_s=0.3,
                    ),
                    _rule(
                        "answer",
                        {
                            "text": (
                                "What is confirmed so far: refunds go to the original payment "
                                "method. Not confirmed: the approval rules were not searched."
                            ),
                            "chunks": 2,
                        },
                        when={"contains": "Finalize now"},
                        delay_s=0.7,
                    ),
                    _rule(
                        "tool_call",
                        {
                            "name": "webhook",
                            "arguments": {
                                "url": webhook_url,
                                "payload": {"ticket": "SUP-4312", "status": "escalated"},
                            },
                            "text": "Escalating the ticket in the CRM.",
                        },
                        when={
                            "contains": "escalate ticket",
                            "last_role_not": "tool",
                            "has_tool": "webhook",
                        },
                        delay_s=1.2,
                    ),
                    _rule(
                        "tool_call",
                        {"name": "kb_search", "arguments": {"query": "{last_user}"}},
                        when={"last_role_not": "tool", "has_tool": "kb_search"},
                        delay_s=0.9,
                    ),
                    _rule(
                        "answer",
                        {
                            "text": "According to the knowledge base: {last_message}",
                            "chunks": 2,
                            "chunk_interval_s": 0.3,
                        },
                        when=after_tool,
                        delay_s=1.0,
                    ),
                ],
                "default": {
                    "answer": {
                        "text": "Meridian answer to: {last_user}",
                        "chunks": 2,
                        "chunk_interval_s": 0.4,
                    }
                },
            },
            {"base_cooldown_s": 300.0, "max_cooldown_s": 1800.0, **_prices("2.5", "10", "1.25")},
        ),
        # Primary of billing: calls the calculator, overloaded at month-end.
        "demo-orion": (
            "orion-large",
            {
                "rules": [
                    _rule(
                        "fail",
                        {"status": 503, "code": "overloaded", "message": "month-end peak"},
                        name=f"month-end outage ({tag})",
                        when={"contains": "month-end"},
                        times=3,
                        delay_s=0.4,
                    ),
                    _rule(
                        "tool_call",
                        {
                            "name": "calculator",
                            "arguments": {"expression": "(18990 - 14500) * 0.2"},
                            "text": "Let me compute that.",
                        },
                        when={"last_role_not": "tool", "has_tool": "calculator"},
                        delay_s=1.3,
                    ),
                    _rule(
                        "answer",
                        {
                            "text": "The calculation gives {last_message}. Booked as proposed.",
                            "chunks": 2,
                            "chunk_interval_s": 0.3,
                        },
                        when=after_tool,
                        delay_s=0.8,
                    ),
                ],
                "default": {"answer": {"text": "Orion answer to: {last_user}", "chunks": 2}},
            },
            {"base_cooldown_s": 1800.0, "max_cooldown_s": 3600.0, **_prices("5", "15", "0.5")},
        ),
        # Drafting: a stream that breaks once, and a report too slow for its deadline.
        "demo-atlas": (
            "atlas-writer",
            {
                "rules": [
                    # Release notes go to the operations channel: a call a person approves.
                    _rule(
                        "tool_call",
                        {
                            "name": DEMO_APPROVAL_TOOL,
                            "arguments": {
                                "headline": "Release 4.2 is live",
                                "url": "https://status.example/releases/4.2",
                            },
                            "text": "I will tell the operations channel that release 4.2 is live.",
                        },
                        when={"last_role_not": "tool", "has_tool": DEMO_APPROVAL_TOOL},
                        delay_s=0.8,
                    ),
                    _rule(
                        "answer",
                        {
                            "text": "Done: the operations channel was told ({last_message}).",
                            "chunks": 1,
                        },
                        when={"last_role": "tool", "has_tool": DEMO_APPROVAL_TOOL},
                        delay_s=0.5,
                    ),
                    _rule(
                        "stall",
                        {"text": "Draft: the platform team shipped"},
                        name=f"broken stream ({tag})",
                        when={"contains": "status update"},
                        times=1,
                        delay_s=0.7,
                    ),
                    _rule(
                        "answer",
                        {
                            "text": "Quarterly report. " + "Section with every appendix. " * 24,
                            "chunks": 12,
                            "chunk_interval_s": 15,
                        },
                        when={"contains": "quarterly report"},
                        delay_s=2.0,
                    ),
                ],
                "default": {
                    "answer": {
                        "text": (
                            "Draft for \u201c{last_user}\u201d: the platform team shipped the "
                            "new routing, closed two incidents and has one open risk."
                        ),
                        "chunks": 3,
                        "chunk_interval_s": 0.6,
                    }
                },
            },
            _prices("1", "4"),
        ),
    }


# --------------------------------------------------------------------------- webhook receiver


class _DroppingReceiver(BaseHTTPRequestHandler):
    """Accepts a webhook POST and drops the connection without an answer, and
    cannot answer verification (500): the effect stays unknown (R6.2, R6.4)."""

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.close_connection = True
        self.connection.close()

    def do_GET(self):
        body = json.dumps({"status": "error", "detail": "verification store unavailable"})
        data = body.encode()
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class _CallbackReceiver(BaseHTTPRequestHandler):
    """Completion callbacks (R7.3): ``/ok`` takes each at once, ``/flaky`` answers
    503 to the first attempt of each callback and 200 after, ``/down`` always 503."""

    attempts: Counter = Counter()  # noqa: RUF012 (per idempotency key; reset per server)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        key = self.headers.get("Idempotency-Key", "")
        type(self).attempts[key] += 1
        ok = self.path.endswith("/ok") or (
            self.path.endswith("/flaky") and type(self).attempts[key] > 1
        )
        body = b'{"received": true}' if ok else b'{"error": "receiver unavailable"}'
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def _callback_receiver() -> Iterator[str]:
    _CallbackReceiver.attempts = Counter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CallbackReceiver)
    server.daemon_threads = True
    worker = threading.Thread(target=server.serve_forever, name="demo-callbacks", daemon=True)
    worker.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/callbacks"
    finally:
        server.shutdown()
        server.server_close()
        worker.join(5)


@contextmanager
def _receiver() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _DroppingReceiver)
    server.daemon_threads = True
    worker = threading.Thread(target=server.serve_forever, name="demo-webhook", daemon=True)
    worker.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/crm"
    finally:
        server.shutdown()
        server.server_close()
        worker.join(5)


# --------------------------------------------------------------------------- engine set-up


@contextmanager
def _fast_sqlite() -> Iterator[None]:
    """SQLite only: skip the fsync of each of the scenario's few hundred commits.

    Safe against a crash of this process (only an OS crash or power loss could
    lose the last writes); the demo can be seeded again. Restored afterwards.
    """
    if connection.vendor != "sqlite":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        (saved,) = cursor.fetchone()
        cursor.execute("PRAGMA synchronous = OFF")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA synchronous = {int(saved)}")


@contextmanager
def _in_process_engine(start: datetime) -> Iterator[time_source.ManualClock]:
    """Eager Celery (stages run inline after each commit), a manual clock, and
    spans written to the embedded span store; everything restored afterwards."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tasks import celery_app
    from tasks import instrumentation as spans
    from tasks.span_store import DatabaseSpanExporter, span_store_enabled

    conf = celery_app.conf
    saved_conf = (conf.task_always_eager, conf.task_eager_propagates)
    saved_tracer = spans._tracer_provider
    tracer_provider = TracerProvider(
        resource=Resource.create(
            {"service.name": settings.OTEL_SERVICE_NAME, "service.component": "demo"}
        ),
        id_generator=spans.PinnedIdGenerator(),
    )
    # Spans are kept in memory and stored in one go at the end: the same rows
    # the worker's exporter writes, without a write inside every stage.
    finished_spans = InMemorySpanExporter()
    tracer_provider.add_span_processor(SimpleSpanProcessor(finished_spans))
    manual = time_source.ManualClock(start)
    # Inline stages would log every task and HTTP request; keep the output short.
    quiet = {name: logging.getLogger(name) for name in ("celery", "httpx", "kombu")}
    saved_levels = {name: logger.level for name, logger in quiet.items()}
    for logger in quiet.values():
        logger.setLevel(logging.ERROR)
    conf.task_always_eager, conf.task_eager_propagates = True, True
    spans.use_tracer_provider(tracer_provider)
    time_source.install(manual)
    try:
        yield manual
    finally:
        time_source.install(None)
        spans.use_tracer_provider(saved_tracer)
        if span_store_enabled():
            store = DatabaseSpanExporter()
            done = list(finished_spans.get_finished_spans())
            for begin in range(0, len(done), store.max_spans_per_export):
                store.export(done[begin : begin + store.max_spans_per_export])
        tracer_provider.shutdown()
        conf.task_always_eager, conf.task_eager_propagates = saved_conf
        for name, logger in quiet.items():
            logger.setLevel(saved_levels[name])


# --------------------------------------------------------------------------- the scenario


class Scenario:
    def __init__(
        self,
        manual: time_source.ManualClock,
        start: datetime,
        round_no: int,
        users,
        callbacks_url: str = "",
    ) -> None:
        self.clock = manual
        self.start = start
        self.round_no = round_no
        self.users = users
        self.callbacks_url = callbacks_url
        self.read_live: set = set()  # threads whose answers someone reads as they stream
        self.suffix = "" if round_no == 1 else f" (round {round_no})"

    def at(self, hours: float = 0, minutes: float = 0) -> datetime:
        """Move the clock to start + offset (never back: slow streams move it too),
        and send the completion callbacks whose retry is due (the beat job's work)."""
        from tasks.callbacks import resend_due

        target = self.start + timedelta(hours=hours, minutes=minutes)
        now = self.clock()
        if target > now:
            self.clock.advance(target - now)
        resend_due(inline=True)
        return self.clock()

    def thread(
        self, title: str, chain: list[str], tools: list[str], prompt: str, callback: str = ""
    ) -> Thread:
        return services.create_thread(
            provider_chain=chain,
            now=self.clock(),
            title=f"{TITLE_PREFIX} {title}{self.suffix}",
            tool_surface=tools,
            system_prompt=prompt,
            callback_url=f"{self.callbacks_url}/{callback}" if callback else "",
        )

    def watch(self, run: Run, acknowledged: str) -> None:
        """A viewer streams the run's committed chunks (R7.2: sent) and acknowledges
        ``all``, ``part`` (the first) or ``none`` of them (observed), then leaves —
        through the services the watch page and the ack API use."""
        from governance.services import stream

        chunk_nos = list(
            run.chunks.filter(version__isnull=False)
            .order_by("chunk_no")
            .values_list("chunk_no", flat=True)
        )
        connection_id = f"demo-viewer-{run.id}-{secrets.token_hex(4)}"
        stream.connect_viewer(run, connection_id=connection_id, last_event_id=0, now=self.clock())
        self.clock.advance(1)
        stream.mark_chunks_sent(run.id, chunk_nos, now=self.clock())
        through = {"all": len(chunk_nos), "part": min(1, len(chunk_nos)), "none": 0}[acknowledged]
        if through:
            self.clock.advance(1)
            stream.record_ack(run, through, now=self.clock())
        self.clock.advance(1)
        stream.detach_viewer(connection_id, now=self.clock())

    @staticmethod
    def _trace(thread: Thread) -> dict[str, str]:
        """The run span's identity, allocated at admission as the API does."""
        from tasks import instrumentation as spans

        segment = services.open_segment(thread)
        return spans.new_run_trace("", thread_id=str(thread.id), segment_key=segment.key)

    def run(self, thread: Thread, text: str, *, queued_s: float = 3, **options: Any) -> Run:
        """Admit a run, let it wait in the queue, then run its stages inline."""
        from governance.services.broker import publish

        run, stage, _ = services.submit_run(
            thread, input=text, now=self.clock(), trace_context=self._trace(thread), **options
        )
        self.clock.advance(queued_s)
        publish([stage])  # eager: runs now, and every stage it enqueues after it
        done = Run.objects.get(id=run.id)
        if thread.id in self.read_live:
            self.watch(done, "all")
        return done

    def cancelled_run(self, thread: Thread, text: str, by: str) -> Run:
        run, _, _ = services.submit_run(
            thread, input=text, now=self.clock(), trace_context=self._trace(thread)
        )
        self.clock.advance(20)
        # The stop nudges the queued stage (eager here): it settles the run cancelled.
        services.request_cancel(run, by=by, now=self.clock())
        return Run.objects.get(id=run.id)

    def play(self) -> None:
        operator = self.users["operator"]
        oncall = self.users["on-call"]
        # Seven threads, each with its own provider chain and tool surface.
        incident = self.thread(
            "incident cost review",
            ["demo-sentinel", "demo-harbor"],
            ["calculator"],
            "You reconcile incident costs for finance. Show your arithmetic.",
        )
        triage = self.thread(
            "vendor breach triage",
            ["demo-sentinel", "demo-vigil"],
            ["calculator"],
            "You triage vendor security reports for the risk team.",
        )
        support = self.thread(
            "customer support desk",
            ["demo-meridian", "demo-harbor"],
            ["kb_search", "webhook"],
            "You answer customer tickets from the knowledge base; blocked customers go to the CRM.",
        )
        onboarding = self.thread(
            "onboarding questions",
            ["demo-meridian", "demo-atlas"],
            [],
            "You help new workspaces get set up.",
        )
        billing = self.thread(
            "billing reconciliation",
            ["demo-orion", "demo-harbor"],
            ["calculator"],
            "You reconcile invoices and refunds. Use the calculator for every figure.",
        )
        drafting = self.thread(
            "weekly report drafting",
            ["demo-atlas", "demo-harbor"],
            [],
            "You draft status reports for the platform team.",
        )
        reporting = self.thread(
            "quarterly report",
            ["demo-atlas"],
            [],
            "You write long-form reports for the leadership team.",
        )
        releases = (
            self.thread(
                "release announcements",
                ["demo-atlas"],
                [DEMO_APPROVAL_TOOL],
                "You announce releases to the operations channel.",
            )
            if ToolServer.objects.filter(name=DEMO_APPROVAL_TOOL).exists()
            else None
        )
        # Support and onboarding answers are read live by the staff who asked.
        self.read_live = {support.id, onboarding.id}
        # Delivery: streamed answers with callbacks to three kinds of receiver.
        live = self.thread(
            "live answers desk",
            ["demo-harbor"],
            [],
            "You answer staff questions; the answer streams to their screen.",
            callback="ok",
        )
        partner = self.thread(
            "partner status feed",
            ["demo-atlas", "demo-harbor"],
            [],
            "You write short status notes that a partner system receives.",
            callback="flaky",
        )
        legacy = self.thread(
            "legacy CRM sync",
            ["demo-harbor"],
            [],
            "You summarise tickets for the old CRM, which takes a callback per answer.",
            callback="down",
        )

        # 00:10 the refusal storm starts: the first turn puts the trigger into the
        # accepted history; its continuation is refused 4 times, then falls back.
        self.at(minutes=10)
        self.run(incident, "Reconcile the costs of incident INC-2291 for finance.")
        self.at(minutes=12)
        self.run(triage, "Assess the vendor report VR-88 and total the exposure.")
        self.at(minutes=14)
        # On-call acknowledges the triage thread's first-refusal notice.
        ack_target = Notification.objects.filter(
            dedupe_key__startswith="provider-refusal:", segment__thread=triage
        ).first()
        self.at(minutes=20)
        self.run(incident, "What is the total including the contractor hours?", queued_s=8)
        # 00:26 first re-probes (due at +15 min).
        self.at(minutes=26)
        self.run(incident, "Break the total down by team.")
        self.at(minutes=28)
        self.run(triage, "Any update on the exposure total?")
        self.at(minutes=31)
        if ack_target is not None:
            services.acknowledge_notification(ack_target.id, user=oncall, now=self.clock())

        # 00:40 meridian's outage: 503s, the breaker opens, runs fall back.
        self.at(minutes=40)
        self.run(support, "A customer asks how refunds work for a nightly batch order.")
        self.at(minutes=45)
        self.run(onboarding, "Which settings does a new workspace need first?")
        self.at(minutes=50)
        self.run(support, "Another ticket: refund status for order 7781?", queued_s=25)
        self.at(minutes=52)
        self.run(onboarding, "How many administrators should a workspace have?", queued_s=40)
        self.at(hours=1, minutes=0)
        self.run(support, "Does a 620 EUR refund need approval?", queued_s=12)
        self.at(hours=1, minutes=5)
        self.run(onboarding, "Is SSO mandatory?")
        self.at(hours=1, minutes=30)
        self.run(support, "What does the escalation runbook say about blocked customers?")
        # 01:32 second re-probes (due at +1 h).
        self.at(hours=1, minutes=32)
        self.run(incident, "Recheck the contractor rates.")
        self.at(hours=1, minutes=34)
        self.run(triage, "Please total the exposure again.")

        # 01:38 streamed answers: watched to the end, halfway, or not acknowledged at all.
        self.at(hours=1, minutes=38)
        self.watch(self.run(live, "What changed in the refund policy this quarter?"), "all")
        self.at(hours=1, minutes=40)
        self.watch(self.run(partner, "Status note: the payment gateway is degraded."), "all")
        self.at(hours=1, minutes=42)
        self.watch(self.run(legacy, "Summarise ticket SUP-4290 for the CRM."), "part")

        # 01:45 billing: a completed calculation, then a run that runs out of
        # model requests and finalizes with what it has (partial).
        self.at(hours=1, minutes=45)
        self.run(billing, "Calculate the refund total for order 7781.")
        self.at(hours=2, minutes=0)
        self.run(
            support,
            "The customer is blocked for 5 hours: escalate ticket SUP-4312 in the CRM.",
            queued_s=6,
        )
        # 02:10 the operator starts the support thread afresh.
        self.at(hours=2, minutes=10)
        services.apply_boundary(
            support,
            "fresh_start",
            by=operator.get_username(),
            reason=(
                "The CRM escalation left an unknown effect; the ticket was confirmed by "
                "hand, so start clean without the old escalation in the history."
            ),
            now=self.clock(),
            idempotency_key=f"demo-{support.id}-fresh-start",
        )
        self.at(hours=2, minutes=30)
        self.run(support, "How long does a refund take to arrive?")
        self.at(hours=2, minutes=40)
        self.run(billing, "Calculate the discount impact on the Q3 invoices.")
        # 02:45 one model request only: the search runs, the continuation finds
        # no request budget left, and the run finalizes from the reserve (partial).
        self.at(hours=2, minutes=45)
        self.run(
            support,
            "Look up every rule about refund approvals.",
            limits={"model_requests": 1, "output_reserve": 1},
        )
        self.at(hours=3, minutes=0)
        self.run(incident, "Draft the cost summary for the postmortem.")
        self.at(hours=3, minutes=10)
        self.run(drafting, "Write the status update for the platform team.")
        self.at(hours=3, minutes=20)
        self.watch(self.run(live, "Who approves refunds over 500 EUR?"), "part")
        self.at(hours=3, minutes=25)
        self.watch(self.run(partner, "Status note: the gateway recovered."), "none")
        self.at(hours=3, minutes=30)
        self.run(onboarding, "Summarise the onboarding checklist for a new customer.")
        self.at(hours=4, minutes=0)
        self.run(support, "What is the approval threshold for refunds?", queued_s=15)
        # 04:30 a run cancelled by the operator before it started.
        self.at(hours=4, minutes=30)
        self.cancelled_run(
            billing, "Calculate the full ledger variance for 2023.", operator.get_username()
        )
        self.at(hours=5, minutes=0)
        services.apply_boundary(
            onboarding,
            "compact",
            by=operator.get_username(),
            reason="Long onboarding thread: compacted to keep the requests small.",
            now=self.clock(),
            idempotency_key=f"demo-{onboarding.id}-compact",
        )
        self.at(hours=5, minutes=30)
        self.run(onboarding, "Which billing contact do we need?")
        self.at(hours=5, minutes=45)
        self.run(drafting, "Add the incident numbers to the weekly draft.")
        self.at(hours=6, minutes=0)
        self.run(support, "Can a refund go to a different card?")
        self.at(hours=6, minutes=15)
        self.run(billing, "Calculate the credit note for invoice 2231.")
        self.at(hours=6, minutes=30)
        self.watch(self.run(live, "How do I reset a customer's SSO?"), "all")
        self.at(hours=6, minutes=35)
        self.watch(self.run(legacy, "Summarise ticket SUP-4301 for the CRM."), "all")
        # 07:37 third re-probes (due at +6 h): both threads freeze.
        self.at(hours=7, minutes=37)
        self.run(incident, "Final check of the incident totals, please.")
        self.at(hours=7, minutes=39)
        self.run(triage, "Final exposure total for the risk committee?")
        self.at(hours=8, minutes=0)
        self.run(onboarding, "Thanks. Anything else before go-live?")
        # 08:20 orion's month-end peak: three 503s open its breaker (30 min).
        self.at(hours=8, minutes=20)
        self.run(billing, "Start the month-end close: calculate accrued refunds.")
        self.at(hours=8, minutes=30)
        self.run(billing, "month-end: calculate the VAT correction.", queued_s=30)
        self.at(hours=8, minutes=40)
        self.run(billing, "month-end: calculate the FX differences.", queued_s=45)
        self.at(hours=8, minutes=45)
        self.run(incident, "Is the cost summary final?")
        self.at(hours=8, minutes=50)
        self.run(billing, "month-end: what is left to book?")
        self.at(hours=8, minutes=52)
        self.watch(self.run(live, "Is the refund for order 7781 out?"), "none")
        self.watch(self.run(legacy, "Summarise ticket SUP-4312 for the CRM."), "all")
        # 08:55 a report too slow for its 90-second deadline.
        self.at(hours=8, minutes=55)
        self.run(
            reporting,
            "Write the quarterly report with every appendix.",
            deadline_s=90,
            stage_budget_s=120,
        )
        if releases is not None:
            # 08:58 a call waits for an operator's yes in Approvals (its run has
            # four hours; without an answer within one, the call is not made).
            self.at(hours=8, minutes=58)
            self.run(releases, "Tell ops that release 4.2 is live.", deadline_s=4 * 3600)


# --------------------------------------------------------------------------- the command


class Command(BaseCommand):
    help = (
        "Seed a realistic demo scenario through the real engine: threads, a refusal "
        "storm up to a freeze, a provider outage, runs of every outcome, boundaries, "
        "and the demo operator / on-call / manager users."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--force",
            action="store_true",
            help="add another round even when demo data is already present",
        )

    def handle(self, *args, force: bool = False, **options):
        var_dir = Path(settings.VAR_DIR)
        make_private_folder(var_dir)
        present = Thread.objects.filter(title__startswith=TITLE_PREFIX)
        if present.exists() and not force:
            self.stdout.write("demo data already present (use --force to add another round)")
            return
        round_no = (
            present.filter(title__startswith=f"{TITLE_PREFIX} incident cost review").count() + 1
        )
        users = ensure_demo_users(var_dir)
        roles = {group: get_user_model().objects.get(username=name) for name, _pw, group in users}
        for title, body, tags in KB_DOCUMENTS:
            KnowledgeDocument.objects.update_or_create(
                title=title, defaults={"body": body, "tags": tags}
            )
        if settings.GOVERNANCE_DEMO_PAGER:
            # A page goes out on a fresh `make run`: to the web's own demo pager.
            AlertChannel.objects.get_or_create(
                name=DEMO_PAGER_CHANNEL,
                defaults={
                    "kind": AlertChannel.Kind.WEBHOOK,
                    "target": settings.GOVERNANCE_DASHBOARD_URL.rstrip("/") + reverse("demo-pager"),
                },
            )
        if (
            settings.GOVERNANCE_DEMO_PAGER
            and not ToolServer.objects.filter(name=DEMO_APPROVAL_TOOL).exists()
        ):
            tool_servers.create_tool_server(
                name=DEMO_APPROVAL_TOOL, kind="http", by="manage.py demo",
                now=datetime.now(UTC), reason="the demo's approval example",
                url=settings.GOVERNANCE_DASHBOARD_URL.rstrip("/") + reverse("demo-pager"),
                method="POST", description="Post a release note to the operations channel",
                parameters={"type": "object", "required": ["headline"],
                            "properties": {"headline": {"type": "string"},
                                           "url": {"type": "string"}}},
                effect="external_effect", approval="always",
            )  # fmt: skip
        real_now = datetime.now(UTC).replace(microsecond=0)
        start = real_now - timedelta(hours=SCENARIO_HOURS)
        before = set(Run.objects.values_list("id", flat=True))
        with _receiver() as webhook_url, _callback_receiver() as callbacks_url:
            for provider_id, (model, script, extra) in provider_scripts(
                round_no, webhook_url
            ).items():
                Provider.objects.update_or_create(
                    provider_id=provider_id,
                    defaults={"kind": "scripted", "model": model, "script": script, **extra},
                )
            with _fast_sqlite(), _in_process_engine(start) as manual:
                Scenario(manual, start, round_no, roles, callbacks_url).play()
                ended = manual()
        if options.get("verbosity", 1) >= 1:
            self._summary(before, users, round_no, start, ended)

    def _summary(self, before, users, round_no, start, ended) -> None:
        demo_threads = Thread.objects.filter(title__startswith=TITLE_PREFIX)
        new_runs = Run.objects.exclude(id__in=before).filter(thread__in=demo_threads)
        outcomes = Counter(
            Settlement.objects.filter(run__in=new_runs).values_list("outcome", flat=True)
        )
        unsettled = new_runs.exclude(status=Run.Status.SETTLED).count()
        alerts = Notification.objects.filter(segment__thread__in=demo_threads)
        critical = alerts.filter(severity=Notification.Severity.CRITICAL)
        stages = Stage.objects.filter(run__in=new_runs).count()
        out = self.stdout
        out.write(
            self.style.SUCCESS(
                f"Demo round {round_no}: {demo_threads.count()} demo threads, "
                f"{new_runs.count()} runs ({stages} stages) from "
                f"{start:%H:%M} to {ended:%H:%M} UTC."
            )
        )
        by_outcome = ", ".join(f"{name} {outcomes[name]}" for name in sorted(outcomes))
        out.write(
            f"  runs by outcome: {by_outcome}" + (f", unsettled {unsettled}" if unsettled else "")
        )
        callbacks = Counter(
            RunCallback.objects.filter(run__in=new_runs).values_list("state", flat=True)
        )
        watched = RunViewer.objects.filter(run__in=new_runs).values("run").distinct().count()
        out.write(
            f"  delivery: {watched} runs watched; callbacks "
            + ", ".join(f"{state} {callbacks[state]}" for state in sorted(callbacks))
        )
        out.write(
            f"  alerts: {alerts.count()} ({critical.count()} critical, "
            f"{critical.filter(acked_at__isnull=True).count()} critical unacknowledged)"
        )
        out.write("  demo users:")
        for username, password, group in users:
            out.write(f"    {group:<9} user: {username}  password: {password}")
