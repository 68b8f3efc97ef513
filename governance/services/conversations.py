"""The OpenAI-compatible door's conversations: a client's chat-completions
request is a turn of one of its user's threads (R1).

A request names its conversation with a session id; the thread with that key
of the same user is the conversation. Without one, its messages do: a run
keeps the digest of the messages it answered (``Run.client_prefix``), so a
request whose history is those messages and that run's answer continues the
run's thread, found by an index lookup, whatever the number of threads
(``prefix_of``). A request that continues no run of its user is a new thread.

The client sends its whole history each time; the thread keeps the accepted
history (R1.1). The messages after the client's last assistant message are
the turn's increment (a user message, or the results of the client's tool
calls: R3.1 quarantine applies to those). What comes before must be the
history the thread accepted, as the client saw it:

* an increment accepted re-rendered or withheld (R3.1) still matches the
  client's own bytes (``HistoryItem.client_digest``), and the provider keeps
  getting the accepted form, never the refused bytes again;
* after an operator's compact or fresh start the client still sends the
  history before it: that prefix is recognized and not forwarded (the new
  session's accepted history is: nothing, or the summary);
* messages past the accepted history that no turn accepted (a refused
  turn's message, and the empty answer it got) join it as the client's, in
  the same segment, so its refusal state holds (R3.2);
* anything else (an edited or dropped message) opens a new session by the
  door (a fresh start by "openai-door" saying where the histories diverged)
  whose accepted history is the client's.

A changed system prompt is a prompt change, another route or provider a
model switch, another tool list a tool-surface change (each a new segment,
R1.3).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from governance.models import HistoryItem, Provider, Run, Segment, Thread, ThreadSession
from governance.rules.segments import NEW_SESSION_KINDS
from governance.services.locks import hold_until_commit
from governance.services.threads import (
    append_history,
    apply_boundary,
    create_thread,
    open_segment,
)

DOOR = "openai-door"


def _calls_text(calls: Sequence[dict[str, Any]]) -> str:
    rows = [
        {"id": c["id"], "name": c["name"], "arguments": c.get("arguments") or {}} for c in calls
    ]
    return json.dumps(rows, sort_keys=True, ensure_ascii=False) if rows else ""


@dataclass(frozen=True)
class Message:
    """One message as the client sent it (system prompts are given apart)."""

    role: str  # user, assistant or tool
    content: str
    tool_calls: str = ""  # an assistant's calls, canonical JSON ("" for none)
    tool_call_id: str = ""  # a tool result: the call it answers

    @classmethod
    def of(
        cls, role: str, content: str, tool_calls: Sequence[dict] = (), tool_call_id: str = ""
    ) -> Message:
        return cls(role, content, _calls_text(tool_calls), tool_call_id or "")

    @property
    def digest(self) -> str:
        payload = json.dumps([self.role, self.content, self.tool_calls, self.tool_call_id])
        return hashlib.sha256(payload.encode()).hexdigest()

    def as_item(self) -> dict[str, Any]:
        """The message as accepted history (and a turn's increment) keeps it."""
        item: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            item["tool_calls"] = json.loads(self.tool_calls)
        if self.tool_call_id:
            item["tool_call_id"] = self.tool_call_id
        return {**item, "client_digest": self.digest}


def prefix_of(messages: Sequence[Message]) -> str:
    """The digest of a client's messages in order (``Run.client_prefix``)."""
    return hashlib.sha256("\n".join(m.digest for m in messages).encode()).hexdigest()


def _matches(kept: HistoryItem, sent: Message) -> bool:
    """The accepted item is what the client sent, or what it was accepted as."""
    if kept.client_digest and kept.client_digest == sent.digest:
        return True
    return Message.of(kept.role, kept.content, kept.tool_calls, kept.tool_call_id) == sent


@dataclass(frozen=True)
class Conversation:
    thread: Thread
    segment: Segment  # the open one, where the turn runs
    created: bool  # the request made the thread
    # An operator's compact or fresh start applies: how many of the client's
    # earlier messages are not forwarded, and the boundary's kind.
    trimmed: int = 0
    boundary: str = ""


def diverged_at(accepted: Sequence[HistoryItem], given: Sequence[Message]) -> int | None:
    """The first position (1-based) where the client's earlier messages differ
    from the accepted history, or None when they are the same."""
    for at, (kept, sent) in enumerate(zip(accepted, given, strict=False), start=1):
        if not _matches(kept, sent):
            return at
    if len(accepted) != len(given):
        return min(len(accepted), len(given)) + 1
    return None


def conversation_for_turn(
    user,
    *,
    session_key: str | None,
    client_model: str,
    provider_chain: Sequence[str],
    system_prompt: str,
    client_tools: str,
    earlier: Sequence[Message],
    title: str,
    now: datetime,
) -> Conversation:
    """The thread and open segment the next turn runs on, brought in line with
    what the client sent (``earlier``: its messages before the turn's
    increment). Call inside the transaction that admits the run: the thread's
    row stays locked until it commits, so two requests of one session line up."""
    with transaction.atomic():
        if session_key:
            # Two first requests of one new session: the second waits for the
            # first's thread instead of making its own (a unique-key error).
            hold_until_commit(f"conversation:{user.pk}:{session_key}")
        thread = _thread_of(user, session_key, earlier)
        if thread is None:
            thread = create_thread(
                provider_chain=provider_chain,
                now=now,
                title=title,
                system_prompt=system_prompt,
                client_tools=client_tools,
                user=user,
                client_session_key=session_key,
                client_model=client_model,
            )
            segment = open_segment(thread)
            _accept(segment, earlier, now)
            return Conversation(thread, segment, created=True)
        segment = _same_configuration(
            thread, client_model, provider_chain, system_prompt, client_tools, now
        )
        seen_by_session = [
            _client_seen(session) for session in _client_sessions(thread, segment.session)
        ]
        seen = [item for items in seen_by_session for item in items]
        at = diverged_at(seen, earlier)
        extra = earlier[len(seen) :]
        if at == len(seen) + 1 and extra and all(m.role != "tool" for m in extra):
            # The client's history goes on past the accepted one with messages
            # no turn accepted (a refused turn's message and the empty answer
            # the client got): they join the accepted history as the client's.
            # A fresh start instead would clear the segment's refusal state
            # and ask every provider again, every turn (R3.2). Tool results
            # still come only as a turn's increment (R3.1).
            _accept(segment, extra, now)
            at = None
        if at is not None:
            apply_boundary(
                thread,
                "fresh_start",
                by=DOOR,
                reason=f"the client's history diverged at message {at}",
                now=now,
                expected_segment=segment,
            )
            segment = open_segment(thread)
            _accept(segment, earlier, now)
            return Conversation(thread, segment, created=False)
        before = sum(len(items) for items in seen_by_session[:-1])
        if not before:
            return Conversation(thread, segment, created=False)
        return Conversation(
            thread, segment, created=False, trimmed=before, boundary=segment.session.opened_by
        )


def _thread_of(user, session_key: str | None, earlier: Sequence[Message]) -> Thread | None:
    """The conversation's thread, locked: the session's, or without a session
    id the thread of the user's latest run that answered ``earlier`` but its
    last message (an assistant's: the increment starts after it)."""
    threads = Thread.objects.select_for_update()
    if session_key:
        return threads.filter(created_by=user, client_session_key=session_key).first()
    if not earlier or earlier[-1].role != "assistant":
        return None
    answered = (
        Run.objects.filter(owner=user, client_prefix=prefix_of(earlier[:-1]))
        .order_by("-created_at")
        .values_list("thread_id", flat=True)
        .first()
    )
    return threads.filter(pk=answered).first() if answered else None


def _same_configuration(
    thread: Thread,
    client_model: str,
    provider_chain: Sequence[str],
    system_prompt: str,
    client_tools: str,
    now: datetime,
) -> Segment:
    """The open segment, after the boundaries the client's configuration asks
    for (R1.3): another route is a model switch (whose segment starts with no
    refusal state of the old chain's), another system prompt a prompt change,
    another tool list a tool-surface change. While the client names the model
    it named before, an operator's model switch stands."""
    segment = open_segment(thread)
    switched = thread.client_model != client_model
    if switched:
        Thread.objects.filter(pk=thread.pk).update(client_model=client_model)
    if switched and list(thread.provider_chain) != list(provider_chain):
        first = Provider.objects.only("model").get(provider_id=provider_chain[0])
        apply_boundary(
            thread,
            "model_switch",
            by=DOOR,
            reason="the client's model names another provider chain: " + ", ".join(provider_chain),
            now=now,
            model=first.model,
            provider_chain=provider_chain,
            expected_segment=segment,
        )
        thread.provider_chain = list(provider_chain)
        segment = open_segment(thread)
    for kind, field, wanted, reason in (
        ("prompt_change", "system_prompt", system_prompt, "the client's system prompt changed"),
        ("tool_surface_change", "client_tools", client_tools, "the client's tool list changed"),
    ):
        if getattr(segment, field) != wanted:
            apply_boundary(
                thread, kind, by=DOOR, reason=reason, now=now, expected_segment=segment,
                **{field: wanted},
            )  # fmt: skip
            segment = open_segment(thread)
    return segment


def _client_sessions(thread: Thread, current: ThreadSession) -> list[ThreadSession]:
    """The sessions whose history the client still sends, oldest first: the
    current one, and before it those an operator's compact or fresh start
    ended (the client never saw those boundaries). A session the door opened
    (the client's history diverged) starts from what the client sent."""
    if current.generation == 1:
        return [current]
    sessions = {s.generation: s for s in ThreadSession.objects.filter(thread=thread)}
    opened_by_door = set(
        Segment.objects.filter(
            thread=thread, closed_kind__in=[k.value for k in NEW_SESSION_KINDS], closed_by=DOOR
        ).values_list("next_segment__session__generation", flat=True)
    )
    chain = [current]
    generation = current.generation
    while generation > 1 and generation not in opened_by_door:
        generation -= 1
        chain.insert(0, sessions[generation])
    return chain


def _client_seen(session: ThreadSession) -> list[HistoryItem]:
    """A session's accepted history as the client saw it: without the summary
    a compact put first (the client never sent or received it)."""
    items = list(session.history.order_by("seq"))
    return items[1:] if session.summary and items else items


def _accept(segment: Segment, earlier: Sequence[Message], now: datetime) -> None:
    """The client's earlier messages as the session's accepted history: the
    history it asks the next turn to continue (no run produced them here)."""
    if earlier:
        append_history(segment.session, [m.as_item() for m in earlier], run=None, now=now)
