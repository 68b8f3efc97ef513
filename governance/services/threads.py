"""Threads, sessions, segments and boundaries (R1); the accepted history."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cache
from typing import Any

from django.db import transaction

from governance.models import (
    AuditEntry,
    HistoryItem,
    Provider,
    Run,
    Segment,
    Thread,
    ThreadSession,
)
from governance.rules import segments as segment_rules
from governance.services import incidents, tool_servers
from governance.services import statements as sql
from governance.services.audit import audit
from governance.services.errors import BoundaryConflict, ServiceError
from governance.services.outbound import require_outbound_url
from governance.services.routes import check_provider_chain


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
    client_tools: str = "",
    client_session_key: str | None = None,
    client_model: str = "",
) -> Thread:
    """A thread with its first session and segment 1 (R1.2)."""
    chain = check_provider_chain(list(provider_chain or []))
    if problem := tool_servers.surface_problem(list(tool_surface)):
        raise ServiceError("tool_surface", problem)
    # The worker will POST here: no loopback, private or metadata address (checked again at send).
    require_outbound_url(callback_url, "callback_url")
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
            client_tools=client_tools,
            client_session_key=client_session_key,
            client_model=client_model,
            callback_url=callback_url,
            created_by=user if getattr(user, "is_authenticated", False) else None,
            created_at=now,
        )
        session = ThreadSession.objects.create(
            id=_session_id(thread, 1), thread=thread, generation=1, created_at=now
        )
        _open_segment(thread, session, 1, segment_config_of(thread), now)
    return thread


# The built-ins; registry tools are named "{server}.{tool}", "{server}.*"
# or, for an HTTP tool, "{server}" (governance/services/tool_servers.py).
TOOL_NAMES = tool_servers.BUILTIN_TOOL_NAMES


def segment_config_of(source: Thread | Segment) -> segment_rules.SegmentConfig:
    """A segment's configuration; for a thread (its first segment), the
    registry schemas its surface sees now."""
    schemas = (
        source.tool_schemas
        if isinstance(source, Segment)
        else tool_servers.surface_schemas(source.tool_surface)
    )
    return segment_rules.SegmentConfig(
        model=source.model,
        mode=source.mode,
        tool_surface=tuple(source.tool_surface),
        system_prompt=source.system_prompt,
        tool_schemas=schemas,
        client_tools=source.client_tools,
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
        tool_schemas=config.tool_schemas,
        client_tools=config.client_tools,
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
    provider_chain: Sequence[str] | None = None,
    client_tools: str | None = None,
) -> tuple[Segment, bool]:
    """Close the open segment and open the next (R1.2–R1.4, R8.3).

    ``provider_chain``: a model switch's new chain (the thread's from the next
    segment on; the OpenAI-compatible door's request naming another route).
    ``client_tools``: a tool-surface change's new client tool list (the door's
    request with other ``tools``).

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
    kind = _checked_boundary(kind, reason, model, tool_surface)
    if provider_chain is not None:
        if kind is not segment_rules.BoundaryKind.MODEL_SWITCH:
            raise ServiceError("provider_chain", "only a model switch changes the provider chain")
        provider_chain = check_provider_chain(list(provider_chain))
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
        new_config = _next_config(old_config, model, mode, tool_surface, system_prompt)
        if client_tools is not None:
            new_config = dataclasses.replace(new_config, client_tools=client_tools)
        transition = _transition(thread, current, kind, old_config, new_config, by, reason, now)
        session = (
            _next_session(thread, current.session, transition, kind, now)
            if transition.new_session
            else current.session
        )
        Segment.objects.filter(pk=current.pk).update(
            closed_at=now, closed_kind=kind.value, closed_by=by, close_reason=reason.strip()
        )
        opened = _open_segment(thread, session, transition.opened.segment_no, new_config, now)
        # The boundary clears the segment's trouble: its incident and alerts resolve (R8.2).
        incidents.segment_trouble_cleared(
            current, kind=kind.value, by=by, reason=reason.strip(), now=now
        )
        Segment.objects.filter(pk=current.pk).update(next_segment=opened)
        Thread.objects.filter(pk=thread.pk).update(
            model=new_config.model,
            mode=new_config.mode,
            tool_surface=list(new_config.tool_surface),
            system_prompt=new_config.system_prompt,
            client_tools=new_config.client_tools,
            **({"provider_chain": provider_chain} if provider_chain is not None else {}),
        )
        audit(
            actor=by,
            action=f"boundary.{kind.value}",
            target_type="segment",
            target_id=current.key,
            reason=reason.strip(),
            detail={
                "closed": current.key,
                "opened": opened.key,
                "model": new_config.model,
                **({"provider_chain": provider_chain} if provider_chain is not None else {}),
            },
            now=now,
            idempotency_key=audit_key,
        )
    return opened, True


def _checked_boundary(
    kind: str, reason: str, model: str | None, tool_surface: Sequence[str] | None
) -> segment_rules.BoundaryKind:
    """The boundary's kind, once what the operator gave is whole (4xx otherwise)."""
    try:
        kind = segment_rules.BoundaryKind(kind)
    except ValueError:
        kinds = ", ".join(k.value for k in segment_rules.BoundaryKind)
        raise ServiceError("kind", f"unknown boundary kind {kind!r}; one of {kinds}") from None
    if not reason or not reason.strip():
        raise ServiceError("reason", "say why the boundary is applied")
    if kind is segment_rules.BoundaryKind.MODEL_SWITCH and not model:
        raise ServiceError("model", "name the model to switch to")
    if tool_surface is not None and (problem := tool_servers.surface_problem(list(tool_surface))):
        raise ServiceError("tool_surface", problem)
    return kind


def _next_config(
    old: segment_rules.SegmentConfig,
    model: str | None,
    mode: str | None,
    tool_surface: Sequence[str] | None,
    system_prompt: str | None,
) -> segment_rules.SegmentConfig:
    """The next segment's configuration: what the operator changed, the rest kept."""
    surface = tuple(tool_surface) if tool_surface is not None else old.tool_surface
    return segment_rules.SegmentConfig(
        model=model if model is not None else old.model,
        mode=mode if mode is not None else old.mode,
        tool_surface=surface,
        system_prompt=system_prompt if system_prompt is not None else old.system_prompt,
        # The next segment sees the registry's schemas as they are now (R1.3).
        tool_schemas=tool_servers.surface_schemas(surface),
        client_tools=old.client_tools,
    )


def _transition(
    thread: Thread,
    current: Segment,
    kind: segment_rules.BoundaryKind,
    old_config: segment_rules.SegmentConfig,
    new_config: segment_rules.SegmentConfig,
    by: str,
    reason: str,
    now: datetime,
) -> segment_rules.BoundaryTransition:
    """What the boundary does to the open segment, as the segment rules say (R1.2–R1.4)."""
    generation = current.session.generation
    new_session_id = (
        _session_id(thread, generation + 1) if segment_rules.starts_new_session(kind) else None
    )
    value = segment_rules.Segment(
        current.session_id, current.segment_no, old_config, current.opened_at
    )
    try:
        return segment_rules.apply_boundary(
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


def _next_session(
    thread: Thread,
    current: ThreadSession,
    transition: segment_rules.BoundaryTransition,
    kind: segment_rules.BoundaryKind,
    now: datetime,
) -> ThreadSession:
    """R1.2/R1.3: the new session and what it starts with — the history kept,
    summarized or dropped."""
    history = list(current.history.all())
    summary = _summary_of(history) if history else ""
    kept = (
        segment_rules.history_after_boundary(
            segment_rules.History(tuple(item.content for item in history)), transition, summary
        )
        if history
        else segment_rules.History()  # nothing to keep, summarize or drop
    )
    session = ThreadSession.objects.create(
        id=transition.opened.session_id,
        thread=thread,
        generation=current.generation + 1,
        opened_by=kind.value,
        summary=summary if transition.history == "summarize" else "",
        created_at=now,
    )
    HistoryItem.objects.bulk_create(
        HistoryItem(session=session, seq=seq, role="user", content=text, accepted_at=now)
        for seq, text in enumerate(kept.items, start=1)
    )
    return session


def follow_tool_schemas(server_name: str, now: datetime, *, why: str) -> list[Segment]:
    """R1.3: a change of the registry schemas a thread's surface sees
    is a tool-surface change. Every open segment that names ``server_name`` and
    now sees other schemas is closed by a ``tool_surface_change`` boundary
    (recorded like any other: who, why, when, audited), the next opened with
    the same surface and the new schemas. Call inside the listing's transaction."""
    opened = []
    prefix = f"{server_name}."
    candidates = Segment.objects.filter(closed_at__isnull=True).exclude(tool_surface=[])
    for segment in candidates.select_related("thread"):
        surface = list(segment.tool_surface)
        if not any(e == server_name or e.startswith(prefix) for e in surface):
            continue
        schemas = tool_servers.surface_schemas(surface)
        old = segment_config_of(segment)
        new_config = dataclasses.replace(old, tool_schemas=schemas)
        kind = segment_rules.BoundaryKind.TOOL_SURFACE_CHANGE
        if kind not in segment_rules.config_changes(old, new_config):
            continue
        new, _created = apply_boundary(
            segment.thread,
            kind,
            by=f"tool registry ({server_name})",
            reason=why,
            now=now,
            idempotency_key=f"tool-schemas:{segment.key}:{schemas or 'none'}",
            expected_segment=segment,
        )
        opened.append(new)
    return opened


def _boundary_done(audit_key: str) -> Segment | None:
    done = AuditEntry.objects.filter(idempotency_key=audit_key).first()
    return Segment.objects.get(key=done.detail["opened"]) if done is not None else None


def boundary_for_key(idempotency_key: str) -> Segment | None:
    """The segment a boundary with this key opened, if it was applied already."""
    return _boundary_done(f"boundary:{idempotency_key}") if idempotency_key else None


def accepted_messages(session_id: Any) -> sql.Later[list[dict[str, Any]]]:
    """A session's accepted history in order, as the messages a turn replays (R1.1)."""
    shape = _message_columns()
    return sql.Later(
        f"SELECT {shape.sql} FROM {sql.table(HistoryItem)} h WHERE h.session_id = %s"
        " ORDER BY h.seq",
        [sql.value(HistoryItem, "session", session_id)],
        lambda rows: [dict(zip(shape.attnames, shape.values(row), strict=True)) for row in rows],
    )


@cache
def _message_columns() -> sql.Columns:
    return sql.Columns(HistoryItem, "h", only=("role", "content", "tool_call_id", "tool_calls"))


def session_history(session: ThreadSession) -> list[HistoryItem]:
    return list(session.history.order_by("seq"))


def append_history(
    session: ThreadSession,
    items: Iterable[dict[str, Any]],
    *,
    run: Run | None,
    now: datetime,
    last_seq: int | None = None,
) -> None:
    """R1.3: accepted history only grows. ``last_seq``: the caller already read
    the history (seqs run 1…n) and holds the thread's one turn."""
    last = (
        last_seq
        if last_seq is not None
        else session.history.order_by("-seq").values_list("seq", flat=True).first() or 0
    )
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
                client_digest=item.get("client_digest") or "",
                run=run,
                accepted_at=now,
            )
        )
    sql.insert(rows)
