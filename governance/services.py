"""Every transaction that changes a fact. Views and tasks call these; they never
write fact tables themselves, and never re-implement a rule: the rules are the
pure modules next to this one.
"""

from __future__ import annotations

import hashlib
import json
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Coalesce

from governance import budget as budget_rules
from governance import health as health_rules
from governance import lifecycle as lc
from governance import segments as segment_rules
from governance import services_alerts
from governance.models import (
    AuditEntry,
    BodyChunk,
    BudgetAccount,
    BudgetEntry,
    HistoryItem,
    Notification,
    Provider,
    ProviderAttempt,
    ProviderHealthState,
    Run,
    RunEvent,
    Segment,
    SegmentRefusal,
    Settlement,
    Stage,
    Thread,
    ThreadSession,
    ToolReceipt,
    TurnRefusalMemo,
)
from governance.refusal import ProviderRefusal, card_entry, refusal_verdict
from governance.refusal import refused_at_datetime as refusal_datetime
from governance.routing import TurnOutcome


class ServiceError(ValueError):
    """Bad input to a service: ``field`` names what is wrong (API answers 4xx)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def record_event(
    run: Run,
    kind: str,
    at: datetime,
    metadata: dict[str, Any],
    *,
    segment: Segment,
    stage: Stage | None = None,
) -> RunEvent:
    """Append to the run's ordered event log (what the stream and timelines read)."""
    return RunEvent.objects.create(
        run=run, segment=segment, stage=stage, kind=kind, at=at, metadata=metadata
    )


def reprobe_delays() -> tuple[timedelta, ...]:
    return tuple(settings.GOVERNANCE_REFUSAL_REPROBE_DELAYS)


# --------------------------------------------------------------------------- threads


def _session_id(thread: Thread, generation: int) -> str:
    return f"{thread.id.hex[:12]}-g{generation}"


def create_thread(
    *,
    provider_chain: Sequence[str],
    now: datetime,
    title: str = "",
    model: str = "",
    mode: str = "default",
    tool_surface: Sequence[str] = (),
    system_prompt: str = "",
    callback_url: str = "",
    user=None,
) -> Thread:
    """A thread with its first session and segment 1 (R1.2)."""
    chain = list(provider_chain or [])
    if not chain or not all(isinstance(p, str) and p for p in chain):
        raise ServiceError("provider_chain", "list at least one provider id")
    if len(set(chain)) != len(chain):
        raise ServiceError("provider_chain", "a provider appears twice")
    known = set(
        Provider.objects.filter(provider_id__in=chain).values_list("provider_id", flat=True)
    )
    missing = [p for p in chain if p not in known]
    if missing:
        raise ServiceError("provider_chain", f"unknown provider(s): {', '.join(missing)}")
    unknown_tools = sorted(set(tool_surface) - set(TOOL_NAMES))
    if unknown_tools:
        raise ServiceError("tool_surface", f"unknown tool(s): {', '.join(unknown_tools)}")
    if not model:
        model = Provider.objects.get(provider_id=chain[0]).model
    with transaction.atomic():
        thread = Thread.objects.create(
            title=title[:200],
            provider_chain=chain,
            model=model,
            mode=mode or "default",
            tool_surface=sorted(set(tool_surface)),
            system_prompt=system_prompt,
            callback_url=callback_url,
            created_by=user if getattr(user, "is_authenticated", False) else None,
            created_at=now,
        )
        session = ThreadSession.objects.create(
            id=_session_id(thread, 1), thread=thread, generation=1, created_at=now
        )
        _open_segment(thread, session, 1, segment_config_of(thread), now)
    return thread


TOOL_NAMES = ("calculator", "kb_search", "webhook")


def segment_config_of(source: Thread | Segment) -> segment_rules.SegmentConfig:
    return segment_rules.SegmentConfig(
        model=source.model,
        mode=source.mode,
        tool_surface=tuple(source.tool_surface),
        system_prompt=source.system_prompt,
    )


def _open_segment(
    thread: Thread,
    session: ThreadSession,
    number: int,
    config: segment_rules.SegmentConfig,
    now: datetime,
) -> Segment:
    value = segment_rules.Segment(session.id, number, config, now)
    return Segment.objects.create(
        key=value.key,
        thread=thread,
        session=session,
        segment_no=number,
        model=config.model,
        mode=config.mode,
        tool_surface=list(config.tool_surface),
        system_prompt=config.system_prompt,
        opened_at=now,
    )


def open_segment(thread: Thread) -> Segment:
    return Segment.objects.select_related("session").get(thread=thread, closed_at__isnull=True)


def _summary_of(history: Sequence[HistoryItem]) -> str:
    # A compact keeps a deterministic, bounded digest of what was said; it never
    # pretends to be the original (R6.4: summaries do not rebuild originals).
    lines = [f"{item.role}: {item.content.strip()[:200]}" for item in history[-6:]]
    return f"Summary of {len(history)} earlier message(s):\n" + "\n".join(lines)


def apply_boundary(
    thread: Thread,
    kind: str,
    *,
    by: str,
    reason: str,
    now: datetime,
    idempotency_key: str | None = None,
    model: str | None = None,
    mode: str | None = None,
    tool_surface: Sequence[str] | None = None,
    system_prompt: str | None = None,
    expected_segment: Segment | None = None,
) -> tuple[Segment, bool]:
    """Close the open segment and open the next (R1.2–R1.4, R8.3).

    ``expected_segment``: the segment the operator confirmed on; if another
    boundary closed it meanwhile, ``BoundaryConflict`` instead of acting on a
    segment nobody looked at.

    Idempotent by key: the same key returns the segment it opened the first
    time (a double click makes one boundary). Returns (segment, created).
    """
    audit_key = f"boundary:{idempotency_key}" if idempotency_key else None
    if audit_key:
        opened = _boundary_done(audit_key)
        if opened is not None:
            return opened, False
    try:
        kind = segment_rules.BoundaryKind(kind)
    except ValueError:
        kinds = ", ".join(k.value for k in segment_rules.BoundaryKind)
        raise ServiceError("kind", f"unknown boundary kind {kind!r}; one of {kinds}") from None
    if not reason or not reason.strip():
        raise ServiceError("reason", "say why the boundary is applied")
    if kind is segment_rules.BoundaryKind.MODEL_SWITCH and not model:
        raise ServiceError("model", "name the model to switch to")
    if tool_surface is not None:
        unknown_tools = sorted(set(tool_surface) - set(TOOL_NAMES))
        if unknown_tools:
            raise ServiceError("tool_surface", f"unknown tool(s): {', '.join(unknown_tools)}")
    with transaction.atomic():
        # One boundary at a time per thread: a double click waits here, then
        # finds the first click's boundary by its key.
        Thread.objects.select_for_update().get(pk=thread.pk)
        if audit_key:
            opened = _boundary_done(audit_key)
            if opened is not None:
                return opened, False
        current = (
            Segment.objects.select_for_update()
            .select_related("session")
            .get(thread=thread, closed_at__isnull=True)
        )
        if expected_segment is not None and current.pk != expected_segment.pk:
            raise BoundaryConflict(
                "segment", f"{expected_segment.key} was closed meanwhile; {current.key} is open"
            )
        old_config = segment_config_of(current)
        new_config = segment_rules.SegmentConfig(
            model=model if model is not None else old_config.model,
            mode=mode if mode is not None else old_config.mode,
            tool_surface=tuple(tool_surface)
            if tool_surface is not None
            else old_config.tool_surface,
            system_prompt=system_prompt if system_prompt is not None else old_config.system_prompt,
        )
        generation = current.session.generation
        new_session_id = (
            _session_id(thread, generation + 1) if kind in segment_rules.NEW_SESSION_KINDS else None
        )
        value = segment_rules.Segment(
            current.session_id, current.segment_no, old_config, current.opened_at
        )
        try:
            transition = segment_rules.apply_boundary(
                value,
                kind,
                at=now,
                by=by,
                reason=reason,
                new_session_id=new_session_id,
                new_config=new_config,
            )
        except segment_rules.SegmentError as exc:
            raise ServiceError("kind", str(exc)) from None
        if transition.new_session:
            history = list(current.session.history.all())
            session = ThreadSession.objects.create(
                id=transition.opened.session_id,
                thread=thread,
                generation=generation + 1,
                opened_by=kind.value,
                summary=_summary_of(history) if transition.history == "summarize" else "",
                created_at=now,
            )
            if transition.history == "summarize" and history:
                HistoryItem.objects.create(
                    session=session, seq=1, role="user", content=session.summary, accepted_at=now
                )
        else:
            session = current.session
        Segment.objects.filter(pk=current.pk).update(
            closed_at=now, closed_kind=kind.value, closed_by=by, close_reason=reason.strip()
        )
        opened = _open_segment(thread, session, transition.opened.segment_no, new_config, now)
        services_alerts.segment_closed(current, now)  # the boundary resolves its alerts (R8.2)
        Segment.objects.filter(pk=current.pk).update(next_segment=opened)
        Thread.objects.filter(pk=thread.pk).update(
            model=new_config.model,
            mode=new_config.mode,
            tool_surface=list(new_config.tool_surface),
            system_prompt=new_config.system_prompt,
        )
        audit(
            actor=by,
            action=f"boundary.{kind.value}",
            target_type="segment",
            target_id=current.key,
            reason=reason.strip(),
            detail={"closed": current.key, "opened": opened.key, "model": new_config.model},
            now=now,
            idempotency_key=audit_key,
        )
    return opened, True


def _boundary_done(audit_key: str) -> Segment | None:
    done = AuditEntry.objects.filter(idempotency_key=audit_key).first()
    return Segment.objects.get(key=done.detail["opened"]) if done is not None else None


def boundary_for_key(idempotency_key: str) -> Segment | None:
    """The segment a boundary with this key opened, if it was applied already."""
    return _boundary_done(f"boundary:{idempotency_key}") if idempotency_key else None


class BoundaryConflict(ServiceError):
    """The segment the operator looked at was closed meanwhile (answer 409)."""


# --------------------------------------------------------------------------- history


def session_history(session: ThreadSession) -> list[HistoryItem]:
    return list(session.history.order_by("seq"))


def append_history(
    session: ThreadSession, items: Iterable[dict[str, Any]], *, run: Run | None, now: datetime
) -> None:
    """R1.3: accepted history only grows."""
    last = session.history.order_by("-seq").values_list("seq", flat=True).first() or 0
    rows = []
    for offset, item in enumerate(items, start=1):
        rows.append(
            HistoryItem(
                session=session,
                seq=last + offset,
                role=item["role"],
                content=item.get("content", ""),
                tool_call_id=item.get("tool_call_id") or "",
                tool_calls=item.get("tool_calls") or [],
                run=run,
                accepted_at=now,
            )
        )
    HistoryItem.objects.bulk_create(rows)


# --------------------------------------------------------------------------- refusal state


def refusal_of(row: SegmentRefusal) -> ProviderRefusal:
    """A fast-read row as the R3.2 value the rules read."""
    return ProviderRefusal(
        provider_id=row.provider_id,
        model=row.model or None,
        category=row.category or None,
        refusals=row.refusals,
        refused_at=row.refused_at,
    )


def segment_refusals(segment: Segment) -> dict[str, ProviderRefusal]:
    """R3.2 state of a segment, from the fast-read rows kept with the cards."""
    return {row.provider_id: refusal_of(row) for row in segment.refusals.all()}


def emit_notice(notice, segment: Segment | None) -> tuple[Notification, bool]:
    """R3.6: the same dedupe key is never emitted twice (a repeat is a no-op)."""
    try:
        with transaction.atomic():
            notification = Notification.objects.create(
                dedupe_key=notice.dedupe_key,
                severity=notice.severity,
                text=notice.text,
                segment=segment,
                provider_ids=list(notice.provider_ids),
                reprobes=notice.reprobes,
                created_at=notice.created_at,
            )
            services_alerts.notification_created(notification)  # outbox rows (R8.2)
            return notification, True
    except IntegrityError:
        return Notification.objects.get(dedupe_key=notice.dedupe_key), False


def record_turn(
    *,
    run: Run,
    stage: Stage,
    segment: Segment,
    outcome: TurnOutcome,
    attempts: Sequence[dict[str, Any]],
    now: datetime,
) -> list[Notification]:
    """Store one model turn's facts (R3.3, R3.5, R3.6). Call inside the stage's
    closing transaction: the refusal state, its card and the notices move together.

    Only actual refusals (``outcome.recorded``) write refusal state; skipped
    providers are read onto the card and never written.
    """
    ProviderAttempt.objects.bulk_create(
        ProviderAttempt(run=run, stage=stage, segment=segment, **attempt) for attempt in attempts
    )
    for refusal in outcome.recorded:
        SegmentRefusal.objects.update_or_create(
            segment=segment,
            provider_id=refusal.provider_id,
            defaults={
                "model": refusal.model or "",
                "category": refusal.category or "",
                "refusals": refusal.refusals,
                "refused_at": refusal.refused_at,
            },
        )
    if outcome.cleared:
        SegmentRefusal.objects.filter(segment=segment, provider_id__in=outcome.cleared).delete()
    if outcome.fallback_card is not None:
        record_event(
            run,
            "llm-fallback",
            now,
            outcome.fallback_card,
            segment=segment,
            stage=stage,
        )
    created = []
    for notice in outcome.notices:
        notification, is_new = emit_notice(notice, segment)
        if is_new:
            created.append(notification)
    return created


def remember_turn_refusal(provider: Provider, request_digest: str, now: datetime) -> None:
    TurnRefusalMemo.objects.update_or_create(
        provider=provider, request_digest=request_digest, defaults={"refused_at": now}
    )


def turn_memory(provider_ids: Sequence[str], now: datetime) -> health_rules.TurnRefusalMemory:
    memory = health_rules.TurnRefusalMemory()
    rows = TurnRefusalMemo.objects.filter(
        provider__provider_id__in=provider_ids,
        refused_at__gt=now - health_rules.REFUSAL_SCOPE_TTL,
    ).select_related("provider")
    for row in rows:
        memory = health_rules.remember_turn_refusal(
            memory, row.provider.provider_id, row.request_digest, row.refused_at
        )
    return memory


# --------------------------------------------------------------------------- health


def provider_health(
    provider: Provider, row: ProviderHealthState | None
) -> health_rules.ProviderHealth:
    """The breaker row as the pure value the health rules read (R2.2)."""
    if row is None:
        return health_rules.ProviderHealth(provider_id=provider.provider_id)
    return health_rules.ProviderHealth(
        provider_id=provider.provider_id,
        breaker=row.breaker,
        consecutive_failures=row.consecutive_failures,
        trips=row.trips,
        open_until=row.open_until,
        last_failure_class=row.last_failure_class or None,
        last_failure_at=row.last_failure_at,
        disabled_config=row.disabled_config or None,
        probe_lease_until=row.probe_lease_until,
        last_success_at=row.last_success_at,
    )


def breaker_policy(provider: Provider) -> health_rules.BreakerPolicy:
    return health_rules.BreakerPolicy(
        failure_threshold=provider.failure_threshold,
        base_cooldown=timedelta(seconds=provider.base_cooldown_s),
        max_cooldown=timedelta(seconds=max(provider.max_cooldown_s, provider.base_cooldown_s)),
    )


def health_verdicts(providers: Sequence[Provider], now: datetime) -> dict[str, Any]:
    verdicts = {}
    for provider in providers:
        row, _ = ProviderHealthState.objects.select_related("provider").get_or_create(
            provider=provider
        )
        value = provider_health(provider, row)
        if not provider.enabled:
            verdicts[provider.provider_id] = health_rules.HealthVerdict(
                False, "disabled", None, "disabled by an administrator"
            )
            continue
        verdicts[provider.provider_id] = health_rules.health_verdict(
            value, now, provider.config_fingerprint()
        )
    return verdicts


def record_provider_result(
    provider: Provider,
    classification: health_rules.Classification | None,
    now: datetime,
    *,
    error: str = "",
    rng: random.Random | None = None,
) -> None:
    """R2.2: move the breaker on a time-based failure or a success (row lock)."""
    with transaction.atomic():
        row, _ = ProviderHealthState.objects.get_or_create(provider=provider)
        row = (
            ProviderHealthState.objects.select_for_update()
            .select_related("provider")
            .get(pk=row.pk)
        )
        value = provider_health(provider, row)
        if classification is None or classification.failure_class is None:
            new = health_rules.record_success(value, now)
        else:
            new = health_rules.record_failure(
                value,
                classification,
                now,
                breaker_policy(provider),
                rng or random.Random(),
                provider.config_fingerprint(),
            )
        for field_name in (
            "breaker",
            "consecutive_failures",
            "trips",
            "open_until",
            "last_failure_at",
            "probe_lease_until",
            "last_success_at",
        ):
            setattr(row, field_name, getattr(new, field_name))
        row.last_failure_class = new.last_failure_class or ""
        row.disabled_config = new.disabled_config or ""
        if error:
            row.last_error = error[:2000]
        row.save()


# --------------------------------------------------------------------------- budget


def _ledger(account: BudgetAccount) -> budget_rules.Ledger:
    limits = budget_rules.BudgetLimits(**account.limits)
    entries = tuple(
        budget_rules.LedgerEntry(
            kind=row.kind,
            idempotency_key=row.idempotency_key,
            resource=row.resource,
            pool=row.pool,
            amount=row.amount,
            purpose=row.purpose,
            for_finalization=row.for_finalization,
        )
        for row in account.entries.order_by("id")
    )
    return budget_rules.Ledger(limits, entries)


def admit(
    run: Run,
    resource: str,
    amount: int,
    key: str,
    purpose: str = "original",
    *,
    for_finalization: bool = False,
    now: datetime,
) -> budget_rules.Admission:
    """R5.1/R5.4: atomic admission against the run's one ledger (row lock)."""
    with transaction.atomic():
        account = BudgetAccount.objects.select_for_update().get(run=run)
        ledger = _ledger(account)
        new_ledger, admission = budget_rules.admit(
            ledger, resource, amount, key, purpose, for_finalization=for_finalization
        )
        if admission.admitted and not admission.duplicate:
            entry = new_ledger.entries[-1]
            BudgetEntry.objects.create(
                account=account,
                kind=entry.kind.value,
                idempotency_key=entry.idempotency_key,
                resource=entry.resource.value,
                pool=entry.pool.value,
                amount=entry.amount,
                purpose=entry.purpose.value,
                for_finalization=entry.for_finalization,
                created_at=now,
            )
        return admission


def budget_view(run: Run) -> dict[str, budget_rules.Balance]:
    """R5.1: the runtime reads this view; it never keeps a second ledger."""
    return {r.value: b for r, b in budget_rules.balance(_ledger(run.budget)).items()}


# --------------------------------------------------------------------------- runs


def submit_run(
    thread: Thread,
    *,
    input: str,
    now: datetime,
    user=None,
    idempotency_key: str | None = None,
    deadline_s: float | None = None,
    stage_budget_s: float | None = None,
    no_progress_s: float | None = None,
    limits: dict[str, int] | None = None,
    trace_context: dict[str, str] | None = None,
    previous_run: Run | None = None,
) -> tuple[Run, Stage | None, bool]:
    """Admit a run on the thread's open segment and queue its first stage.

    Returns (run, first stage or None for a repeated key, created).
    """
    if not isinstance(input, str) or not input.strip():
        raise ServiceError("input", "say what the run should do")
    if idempotency_key:
        existing = Run.objects.filter(idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.thread_id != thread.id:
                raise ServiceError("idempotency_key", "already used for another thread")
            return existing, None, False
    merged = dict(settings.RUN_DEFAULT_BUDGET)
    for name, value in (limits or {}).items():
        if name not in merged:
            raise ServiceError("budget", f"unknown resource {name!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServiceError("budget", f"{name} must be a whole number >= 0")
        merged[name] = value
    durations = {
        "deadline_s": deadline_s or settings.RUN_DEFAULT_DEADLINE_S,
        "stage_budget_s": stage_budget_s or settings.RUN_DEFAULT_STAGE_BUDGET_S,
        "no_progress_s": no_progress_s or settings.RUN_DEFAULT_NO_PROGRESS_S,
    }
    for name, value in durations.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ServiceError(name, "must be a positive number of seconds")
    scopes = sorted(
        getattr(user, "get_all_permissions", lambda: set())()
        if getattr(user, "is_authenticated", False)
        else []
    )

    def admit_new() -> tuple[Run, Stage, bool]:
        segment = open_segment(thread)
        run = Run.objects.create(
            thread=thread,
            segment=segment,
            input=input,
            created_at=now,
            deadline_at=now + timedelta(seconds=durations["deadline_s"]),
            last_progress_at=now,
            no_progress_limit_s=durations["no_progress_s"],
            stage_budget_s=durations["stage_budget_s"],
            authorization={
                "user": getattr(user, "username", "") or "",
                "scopes": scopes,
                "recorded_at": now.isoformat(),
            },
            idempotency_key=idempotency_key or None,
            trace_context=trace_context or {},
            callback_url=thread.callback_url,
            previous_run=previous_run,
        )
        BudgetAccount.objects.create(run=run, limits=merged)
        stage = enqueue_stage(
            run, Stage.Kind.MODEL_TURN, {"increment": [{"role": "user", "content": input}]}, now
        )
        return run, stage, True

    try:
        with transaction.atomic():
            return admit_new()
    except IntegrityError:
        # Another request with the same key got there first: answer with its run.
        if idempotency_key and (
            existing := Run.objects.filter(idempotency_key=idempotency_key).first()
        ):
            return existing, None, False
        raise


def enqueue_stage(run: Run, kind: str, payload: dict[str, Any], now: datetime) -> Stage:
    last = run.stages.order_by("-seq").values_list("seq", flat=True).first() or 0
    stage = Stage.objects.create(run=run, seq=last + 1, kind=kind, payload=payload, enqueued_at=now)
    record_event(
        run,
        "stage",
        now,
        {"stage": stage.seq, "kind": kind, "state": "queued"},
        segment=run.segment,
        stage=stage,
    )
    return stage


def claim_stage(stage_id: int, now: datetime, *, lease: timedelta) -> Stage | None:
    """Start a stage unless its effect is already recorded (at-least-once delivery).

    A finished stage is a no-op. An unfinished one is taken when nobody holds
    it, or when the holder's lease ran out (its worker died): "another worker
    got there first" otherwise. ``deliveries`` counts the pick-ups.
    """
    changed = (
        Stage.objects.filter(id=stage_id, finished_at__isnull=True)
        .filter(Q(claimed_at__isnull=True) | Q(claimed_at__lt=now - lease))
        .update(
            deliveries=F("deliveries") + 1,
            started_at=Coalesce(F("started_at"), now),
            claimed_at=now,
        )
    )
    if not changed:
        return None
    return Stage.objects.select_related("run", "run__thread", "run__segment").get(id=stage_id)


def finish_stage(
    stage: Stage,
    *,
    outcome: str,
    now: datetime,
    clocks: dict[str, int] | None = None,
    timeout_name: str = "",
    detail: str = "",
) -> bool:
    changed = Stage.objects.filter(id=stage.id, finished_at__isnull=True).update(
        finished_at=now,
        outcome=outcome,
        timeout_name=timeout_name,
        detail=detail[:4000],
        clocks=clocks or {},
    )
    if changed:
        record_event(
            stage.run,
            "stage",
            now,
            {
                "stage": stage.seq,
                "kind": stage.kind,
                "state": "finished",
                "outcome": outcome,
                "timeout": timeout_name,
            },
            segment=stage.run.segment,
            stage=stage,
        )
    return bool(changed)


def mark_progress(run: Run, at: datetime) -> None:
    """R6.1: only business progress moves the no-progress clock."""
    Run.objects.filter(id=run.id).filter(
        Q(last_progress_at__lt=at) | Q(last_progress_at__isnull=True)
    ).update(last_progress_at=at)


# --------------------------------------------------------------------------- lifecycle


def _fact_payload(fact: lc.OwnerFact) -> dict[str, Any]:
    payload = {
        "owner": fact.owner.value,
        "kind": fact.kind.value,
        "subject": fact.subject,
        "detail": fact.detail,
        "idempotency_key": fact.idempotency_key,
        "version": fact.version,
        "failure_class": fact.failure_class,
    }
    if fact.answer is not None:
        payload["answer"] = asdict(fact.answer)
    return payload


def _fact_from(payload: dict[str, Any]) -> lc.OwnerFact:
    answer = payload.get("answer")
    return lc.OwnerFact(
        owner=payload["owner"],
        kind=payload["kind"],
        subject=payload["subject"],
        detail=payload.get("detail") or "",
        idempotency_key=payload.get("idempotency_key"),
        version=payload.get("version"),
        failure_class=payload.get("failure_class"),
        answer=(
            lc.Answer(answer["goal"], tuple(answer["stated_gaps"]), answer["narrowed"])
            if answer
            else None
        ),
    )


def record_fact(run: Run, fact: lc.OwnerFact, now: datetime, stage: Stage | None = None) -> None:
    record_event(
        run,
        "fact",
        now,
        _fact_payload(fact),
        segment=run.segment,
        stage=stage,
    )


def run_goal(run: Run) -> str:
    return f"run:{run.id}"


def run_facts(run: Run, recovery: lc.RecoveryConditions | None = None) -> lc.RunFacts:
    facts = tuple(
        _fact_from(event.metadata) for event in run.events.filter(kind="fact").order_by("id")
    )
    finalization_from = None
    if run.phase == "finalization":
        marker = (
            run.events.filter(kind="decision", metadata__path="finalization_only")
            .order_by("id")
            .first()
        )
        finalization_from = (
            run.events.filter(kind="fact", id__lt=marker.id).count() if marker else len(facts)
        )
    settlement = None
    if hasattr(run, "settlement") and Settlement.objects.filter(run=run).exists():
        row = run.settlement
        settlement = lc.Settlement(
            row.outcome, row.reason_code, row.reason, tuple(row.unknown_effects)
        )
    return lc.RunFacts(
        run_id=str(run.id),
        goal=run_goal(run),
        facts=facts,
        phase="settled" if settlement else run.phase,
        finalization_from=finalization_from,
        settlement=settlement,
        recovery=recovery,
    )


def record_decision(run: Run, decision: lc.Decision, now: datetime) -> None:
    entry = {"at": now.isoformat(), "path": decision.path.value, "reason": decision.reason}
    if decision.boundary_action_needed:
        entry["boundary_action_needed"] = decision.boundary_action_needed
    Run.objects.filter(id=run.id).update(decisions=[*run.decisions, entry])
    run.decisions = [*run.decisions, entry]
    record_event(
        run,
        "decision",
        now,
        {
            "path": decision.path.value,
            "reason": decision.reason,
            "must_keep": list(decision.must_keep),
        },
        segment=run.segment,
    )
    if decision.path is lc.Path.FINALIZATION_ONLY and run.phase != "finalization":
        Run.objects.filter(id=run.id).update(phase="finalization", status=Run.Status.FINALIZING)
        run.phase = "finalization"


def settle(run: Run, settlement: lc.Settlement, now: datetime) -> tuple[Settlement, bool]:
    """R6.5: written once; a repeat returns the settlement that stands."""
    try:
        with transaction.atomic():
            row = Settlement.objects.create(
                run=run,
                outcome=settlement.outcome.value,
                reason_code=settlement.reason_code.value,
                reason=settlement.reason,
                unknown_effects=list(settlement.unknown_effects),
                settled_at=now,
            )
    except IntegrityError:
        return Settlement.objects.get(run=run), False
    Run.objects.filter(id=run.id).update(status=Run.Status.SETTLED, phase="settled")
    run.status, run.phase = Run.Status.SETTLED, "settled"
    record_event(
        run,
        "settlement",
        now,
        {
            "outcome": row.outcome,
            "reason_code": row.reason_code,
            "reason": row.reason,
            "unknown_effects": row.unknown_effects,
        },
        segment=run.segment,
    )
    return row, True


def request_cancel(run: Run, *, by: str, now: datetime) -> bool:
    """R7.1: only an explicit stop cancels. Idempotent; a settled run is not reopened."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(id=run.id)
        if locked.status == Run.Status.SETTLED or locked.cancel_requested_at is not None:
            return False
        Run.objects.filter(id=run.id).update(cancel_requested_at=now, cancel_requested_by=by)
        record_fact(
            locked,
            lc.OwnerFact(lc.Owner.USER, lc.FactKind.CANCEL_REQUESTED, str(run.id), f"by {by}"),
            now,
        )
        audit(
            actor=by,
            action="run.cancel",
            target_type="run",
            target_id=str(run.id),
            reason="user stop",
            detail={},
            now=now,
        )
    return True


# --------------------------------------------------------------------------- tools & body


def open_receipt(
    run: Run, stage: Stage, *, tool: str, key: str, arguments: dict, call_id: str, now: datetime
) -> tuple[ToolReceipt, bool]:
    """Write the attempt before the effect: a receipt in ``pending``."""
    receipt, created = ToolReceipt.objects.get_or_create(
        idempotency_key=key,
        defaults={
            "run": run,
            "stage": stage,
            "tool": tool,
            "tool_call_id": call_id,
            "arguments": arguments,
            "created_at": now,
        },
    )
    return receipt, created


def close_receipt(
    receipt: ToolReceipt, *, effect: str, output: Any, error: str, now: datetime, verified=False
) -> None:
    receipt.effect = effect
    receipt.result = output
    receipt.error = error[:4000]
    receipt.finished_at = receipt.finished_at or now
    if verified:
        receipt.verified_at = now
    receipt.save(update_fields=["effect", "result", "error", "finished_at", "verified_at"])


def commit_chunks(run: Run, texts: Sequence[str], now: datetime) -> list[BodyChunk]:
    """R7.2: each chunk generated then committed with a version."""
    last = run.chunks.order_by("-chunk_no").values_list("chunk_no", flat=True).first() or 0
    rows = []
    for offset, text in enumerate(texts, start=1):
        rows.append(
            BodyChunk(
                run=run,
                chunk_no=last + offset,
                version=last + offset,
                text=text,
                final=offset == len(texts),
                generated_at=now,
                committed_at=now,
            )
        )
    created = BodyChunk.objects.bulk_create(rows)
    for chunk in created:
        record_event(
            run,
            "chunk",
            now,
            {
                "chunk_no": chunk.chunk_no,
                "version": chunk.version,
                "text": chunk.text,
                "final": chunk.final,
            },
            segment=run.segment,
        )
    return created


# --------------------------------------------------------------------------- audit


def audit(
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: str,
    reason: str,
    detail: dict[str, Any],
    now: datetime,
    idempotency_key: str | None = None,
) -> AuditEntry:
    return AuditEntry.objects.create(
        at=now,
        actor=actor,
        action=action,
        target_type=target_type,
        target_id=target_id,
        reason=reason,
        detail=detail,
        idempotency_key=idempotency_key or None,
    )


def request_digest(parts: Sequence[dict[str, Any]], provider_id: str) -> str:
    payload = json.dumps([provider_id, list(parts)], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


def refusal_rows_view(segment: Segment, now: datetime) -> list[dict[str, Any]]:
    """Each provider of the thread's chain with its verdict in this segment (R8.1)."""
    refusals = segment_refusals(segment)
    rows = []
    for provider_id in segment.thread.provider_chain:
        refusal = refusals.get(provider_id)
        verdict = refusal_verdict(refusal, now, reprobe_delays())
        entry = (
            card_entry(refusal, now, reprobe_delays())
            if refusal
            else {"provider_id": provider_id, "refusals": 0, "refused_at": None}
        )
        refused_at = refusal_datetime(refusal) if refusal else None
        entry.update(
            refused_at=refused_at.isoformat() if refused_at else None,
            state=verdict.state,
            reprobes=verdict.reprobes,
            next_probe_at=verdict.next_probe_at.isoformat() if verdict.next_probe_at else None,
            max_sends=1 + len(reprobe_delays()),
        )
        rows.append(entry)
    return rows


def new_id() -> str:
    return uuid.uuid4().hex


# --------------------------------------------------------------------------- alerts


def acknowledge_notification(
    notification_id: int, *, user, now: datetime
) -> tuple[Notification, bool]:
    """R8.2: a named person acknowledges an alert, once (a claim by conditional update).

    Returns (notification, changed). A second acknowledgement changes nothing
    and keeps the first person and time ("another on-call got there first").
    """
    changed = Notification.objects.filter(id=notification_id, acked_at__isnull=True).update(
        acked_by=user, acked_at=now
    )
    notification = Notification.objects.select_related("acked_by", "segment").get(
        id=notification_id
    )
    if changed:
        audit(
            actor=user.get_username(),
            action="alert.acknowledge",
            target_type="notification",
            target_id=str(notification.id),
            reason="",
            detail={"dedupe_key": notification.dedupe_key, "severity": notification.severity},
            now=now,
        )
        services_alerts.notification_acknowledged(notification, now)  # stops escalation
    return notification, bool(changed)
