"""A model turn or the one finalization (R1.1, R2, R3, R4.4, R5, R6).

The claim gathers the facts (segment, history, refusal state, breaker
verdicts) and plans the turn from them (``rules.turns.plan_turn``: increment
and route), admitting the first request's ledger draw in its transaction → the
refusal protocol sends what it asks for (``rules.routing.drive_turn``; every
other request admitted from the run's one ledger first) →
``rules.turns.conclude_turn`` → one ``close_stage``.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured

from governance import time_source
from governance.models import Provider, Run, Stage
from governance.rules import routing, turns
from governance.rules import tools as tool_rules
from governance.rules.classification import classify_attempt
from governance.rules.cost import attempt_cost
from governance.rules.refusal import refusal_verdict
from governance.rules.run_clocks import attempt_allowance, stream_event_is_progress
from governance.services import budget as ledger
from governance.services import stages as stage_service
from governance.services.runs import cancel_requested, mark_progress, run_goal
from governance.services.secrets import named_secret
from governance.services.usage import prices_of
from tasks import instrumentation as spans
from tasks import work_metrics
from tasks.adapters import call_provider
from tasks.adapters.base import (
    CallLimits,
    ChatMessage,
    ProviderConfig,
    ProviderRequest,
    ToolCall,
    ToolSpec,
)
from tasks.registry_tools import offered_specs

# What counts as the answer's first chunk (its time to first chunk): content, not headers.
FIRST_CHUNK_KINDS = frozenset({"text", "tool_call", "reasoning"})
PROGRESS_WRITE_EVERY = timedelta(seconds=30)  # mid-stream progress reaches the row this often
_transports: tuple[int, dict[str, httpx.HTTPTransport]] | None = None


def shared_transport(host: str) -> httpx.HTTPTransport:
    """One HTTP transport per provider host and worker process: kept-alive
    connections and one TLS context, instead of building both for every attempt
    (a new client costs tens of milliseconds). Made after the fork, never shared
    across processes. One per host because requests go to the checked IP
    address (``tasks.outbound``) and a pool is keyed by that address: two
    providers behind one address must not share a connection whose TLS was
    made for the other's name."""
    global _transports
    if _transports is None or _transports[0] != os.getpid():
        _transports = (os.getpid(), {})
    transports = _transports[1]
    if host not in transports:
        transports[host] = httpx.HTTPTransport(retries=0)
    return transports[host]


def execute(run: Run, stage: Stage, context: stage_service.TurnContext | None = None):
    final = stage.kind == Stage.Kind.FINALIZATION
    start = time_source.now()
    if context is None:  # not read with the claim
        context = stage_service.turn_context(run, stage, start)
    segment = context.segment
    progress = _Progress(run, context.last_progress_at)
    sender = _Sender(run, stage, context, progress, final=final)
    outcome = routing.drive_turn(
        context.plan.route,
        sender.send,
        segment_key=segment.key,
        refusals=context.refusals,
        has_unaccepted_increment=context.plan.has_unaccepted_increment,
        now=start,
        delays=context.delays,
    )
    facts = turns.TurnFacts(
        run_id=str(run.id),
        stage_id=stage.id,
        goal=run_goal(run),
        final=final,
        increment=tuple(context.plan.increment),
        tool_surface=tuple(segment.tool_surface),
        segment_key=segment.key,
        publication=context.publication,
        client_tools=tuple(t["name"] for t in tool_rules.client_tools_of(segment.client_tools)),
    )
    now = time_source.now()
    conclusion = turns.conclude_turn(facts, sender.calls, outcome, now)
    closed = stage_service.close_stage(
        stage, conclusion, now, run=run, context=context, last_progress_at=progress.at
    )
    for name, amount in conclusion.counts.items():
        spans.count(name, amount)
    return conclusion.outcome, closed


class _Sender:
    """Sends what the refusal protocol asks for (``rules.routing.drive_turn``):
    each request admitted from the run's one ledger first (R5), built from the
    turn's parts at the re-render level the rules say (R3.1), given what is left
    of the four clocks (R6.1), and recorded as a ``rules.turns.TurnCall``."""

    def __init__(
        self,
        run: Run,
        stage: Stage,
        context: stage_service.TurnContext,
        progress: _Progress,
        *,
        final: bool,
    ) -> None:
        self.run, self.stage, self.context, self.progress = run, stage, context, progress
        self.final = final
        offered = turns.offered_tools(context.segment.tool_surface, final=final)
        registry, _ = offered_specs(offered)  # built-ins and registry tools
        # The client's own tools are offered too; their calls go back to it.
        client = () if final else tuple(
            ToolSpec(t["name"], t["description"], t["parameters"])
            for t in tool_rules.client_tools_of(context.segment.client_tools)
        )  # fmt: skip
        self.tools = registry + client
        self.tool_names = tool_rules.wire_names(spec.name for spec in self.tools)
        self.options = dict(run.request_options or {})
        self.recovery = stage.typed_payload.recovery  # R5.3: a recovery's draws are keyed apart
        self.calls: list[turns.TurnCall] = []
        self.steps: dict[str, int] = {}

    def send(self, candidate: routing.Candidate, kind: str) -> routing.AttemptOutcome:
        provider = self.context.providers[candidate.provider_id]
        step = self.steps[provider.provider_id] = self.steps.get(provider.provider_id, 0) + 1
        now = time_source.now()
        blocked = self._blocked(provider, kind, step, now)
        if blocked is not None:
            return blocked
        level = turns.rerender_level(self.calls, provider.provider_id, kind)
        parts = turns.attempt_parts(self.context.history, self.context.plan.increment, kind, level)
        request = ProviderRequest(
            model=candidate.model or provider.model,
            messages=tuple(
                _message(m)
                for m in turns.request_messages(self.context.segment.system_prompt, parts)
            ),
            tools=self.tools,
            tool_names=self.tool_names,
            max_tokens=self.options.get("max_tokens") or ProviderRequest.max_tokens,
            sampling=self.options.get("sampling") or {},
            idempotency_key=f"{self.run.id}:{self.stage.id}:{provider.provider_id}:{kind}:{step}",
        )
        response, classification, ended = self._call(provider, kind, request, now)
        self.calls.append(
            turns.TurnCall(
                provider_id=provider.provider_id,
                model=provider.model,
                kind=kind,
                parts=tuple(parts),
                started_at=now,
                classification=classification,
                text=response.text,
                tool_calls=tuple(
                    {"id": c.id, "name": c.name, "arguments": c.arguments}
                    for c in response.tool_calls
                ),
                text_pieces=tuple(e.text for e in response.events if e.kind == "text" and e.text),
                latency_ms=response.latency_ms,
                status_code=response.status_code,
                finish_reason=response.finish_reason or "",
                usage=dict(response.usage),
                error=response.error,
                timeout_name=response.timeout_name or "",
                tool_names=self.tool_names,
            )
        )
        return turns.attempt_outcome(classification, response.timeout_name, ended)

    def _blocked(
        self, provider: Provider, kind: str, step: int, now: datetime
    ) -> routing.AttemptOutcome | None:
        """The request's draw admitted (R5), a stop and the permission asked (R4.3):
        None when it may be sent, else what stopped it."""
        run, stage = self.run, self.stage
        draw = turns.turn_draw(
            stage_id=stage.id, claim=stage.deliveries, provider_id=provider.provider_id,
            kind=kind, step=step, recovery=self.recovery, final=self.final,
        )  # fmt: skip
        # The first request's draw was admitted with the claim; the others here.
        admission = self.context.admitted.pop(draw.key, None) or ledger.admit(
            run, draw.resource, draw.amount, draw.key, draw.purpose,
            for_finalization=draw.for_finalization, now=now, stage=stage,
        )  # fmt: skip
        if not admission.admitted:
            work_metrics.ledger_exhausted(str(draw.resource))
        return turns.dispatch_outcome(
            # The stage began after checking for a stop; later sends ask again.
            cancel_requested=bool(self.calls) and cancel_requested(run),
            permitted=bool(run.authorization.get("recorded_at")),  # recorded at admission
            budget_admitted=admission.admitted,
        )

    def _call(self, provider: Provider, kind: str, request: ProviderRequest, now: datetime):
        """The provider asked within what is left of the clocks (R6.1), in its
        attempt span; the answer, its classification (R2.1) and when it ended."""
        run, stage = self.run, self.stage
        allowance = attempt_allowance(
            now=now,
            stage_budget_s=run.stage_budget_s,
            deadline_at=run.deadline_at,
            run_started_at=run.created_at,
            last_progress_at=self.progress.at,
            no_progress_limit_s=run.no_progress_limit_s,
            own_allowance_since=stage.started_at if self.final else None,
        )
        with spans.attempt_span(
            provider_id=provider.provider_id, kind=kind, model=request.model,
            started_at=now, segment_key=self.context.segment.key, vendor=provider.kind,
        ) as attempt:  # fmt: skip
            response = call_provider(
                _config(provider),
                request,
                limits=CallLimits(
                    allowance.budget_s, allowance.no_progress_s, allowance.deadline_bound
                ),
                clock=time_source.current(),
                on_event=self.progress.seen,
                transport=shared_transport(urlsplit(provider.base_url).netloc.lower()),
            )
            ended = time_source.now()
            classification = classify_attempt(response.evidence, ended)
            verdict = refusal_verdict(
                self.context.refusals.get(provider.provider_id), now, self.context.delays
            )
            attempt.capture(
                lambda: (
                    [{"role": m.role, "content": m.content} for m in request.messages],
                    [{"role": "assistant", "content": response.text}],
                )
            )
            attempt.finish(
                ended,
                {
                    "gen_ai.response.finish_reasons": [response.finish_reason or ""],
                    "gen_ai.response.model": response.response_model,
                    # None (left out) when the provider reported no usage.
                    "gen_ai.usage.input_tokens": response.usage.get("input_tokens"),
                    "gen_ai.usage.output_tokens": response.usage.get("output_tokens"),
                    "governance.refusal.verdict": verdict.state,
                    "governance.refusal.reprobes": verdict.reprobes,
                    "governance.failure_class": classification.failure_class or "",
                    "governance.run_id": str(run.id),
                },
                first_chunk_at=next(
                    (e.at for e in response.events if e.kind in FIRST_CHUNK_KINDS), None
                ),
            )
        spent = attempt_cost(response.usage, prices_of(provider))
        if spent.amount is not None:
            work_metrics.cost(provider.provider_id, spent.currency, float(spent.amount))
        return response, classification, ended


class _Progress:
    """R6.1: business progress seen in the stream moves the no-progress clock.
    Kept here and written with the stage's close (and, for long streams, at most
    every ``PROGRESS_WRITE_EVERY`` so the dashboard sees a live run)."""

    def __init__(self, run: Run, at: datetime) -> None:
        self.run = run
        self.at = max(at, run.created_at)
        self.written = self.at

    def seen(self, event) -> None:
        if stream_event_is_progress(event.kind) and event.at > self.at:
            self.at = event.at
            if self.at - self.written >= PROGRESS_WRITE_EVERY:
                mark_progress(self.run, self.at)
                self.written = self.at


def _message(item: dict) -> ChatMessage:
    return ChatMessage(
        role=item["role"],
        content=item.get("content", ""),
        tool_call_id=item.get("tool_call_id") or None,
        tool_calls=tuple(
            ToolCall(call["id"], call["name"], call.get("arguments") or {})
            for call in item.get("tool_calls") or []
        ),
    )


def _config(provider: Provider) -> ProviderConfig:
    """The adapter's configuration, with the key read from the variable the
    provider names. A variable the allow-list refuses (a row stored before it,
    or since narrowed) is not read: the attempt is refused, nothing is sent."""
    api_key, refused = None, ""
    if provider.api_key_env:
        try:
            api_key = named_secret(provider.api_key_env, "api_key_env")
        except ImproperlyConfigured as exc:
            refused = str(exc)
    return ProviderConfig(
        provider_id=provider.provider_id,
        kind=provider.kind,
        model=provider.model,
        base_url=provider.base_url,
        api_key=api_key,
        connect_timeout_s=provider.connect_timeout_s,
        read_timeout_s=provider.read_timeout_s,
        script=provider.script,
        refused=refused,
    )
