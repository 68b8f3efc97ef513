"""The OpenAI-compatible door's conversations: a client's chat-completions
request is a turn of one of its user's threads (R1).

A request names its conversation with a session id; the thread with that key
of the same user is the conversation. Without one, each request is a new
thread: finding a conversation by its messages' prefix is not done yet.

The client sends its whole history each time; the thread keeps the accepted
history (R1.1). A request that extends it by exactly one user message is the
next turn. One that changed or dropped earlier messages opens a new session
(a fresh start by "openai-door", its reason saying where the histories
diverged) whose accepted history is the client's; one whose system prompt
changed is a prompt change, one naming another route or provider a model
switch (each a new segment, R1.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from governance.models import Provider, Segment, Thread
from governance.services.locks import hold_until_commit
from governance.services.threads import (
    append_history,
    apply_boundary,
    create_thread,
    open_segment,
    session_history,
)

DOOR = "openai-door"


@dataclass(frozen=True)
class Message:
    role: str  # user or assistant (system prompts are given apart)
    content: str


@dataclass(frozen=True)
class Conversation:
    thread: Thread
    segment: Segment  # the open one, where the turn runs
    created: bool  # the request made the thread


def diverged_at(accepted: Sequence[Message], given: Sequence[Message]) -> int | None:
    """The first position (1-based) where the client's earlier messages differ
    from the accepted history, or None when they are the same."""
    for at, (kept, sent) in enumerate(zip(accepted, given, strict=False), start=1):
        if kept != sent:
            return at
    if len(accepted) != len(given):
        return min(len(accepted), len(given)) + 1
    return None


def conversation_for_turn(
    user,
    *,
    session_key: str | None,
    provider_chain: Sequence[str],
    system_prompt: str,
    earlier: Sequence[Message],
    title: str,
    now: datetime,
) -> Conversation:
    """The thread and open segment the next turn runs on, brought in line with
    what the client sent (``earlier``: its messages before the new user
    message). Call inside the transaction that admits the run: the thread's
    row stays locked until it commits, so two requests of one session line up."""
    with transaction.atomic():
        if session_key:
            # Two first requests of one new session: the second waits for the
            # first's thread instead of making its own (a unique-key error).
            hold_until_commit(f"conversation:{user.pk}:{session_key}")
        thread = (
            Thread.objects.select_for_update()
            .filter(created_by=user, client_session_key=session_key)
            .first()
            if session_key
            else None
        )
        if thread is None:
            thread = create_thread(
                provider_chain=provider_chain,
                now=now,
                title=title,
                system_prompt=system_prompt,
                user=user,
            )
            if session_key:
                Thread.objects.filter(pk=thread.pk).update(client_session_key=session_key)
                thread.client_session_key = session_key
            segment = open_segment(thread)
            _accept(segment, earlier, now)
            return Conversation(thread, segment, created=True)
        segment = open_segment(thread)
        if list(thread.provider_chain) != list(provider_chain):
            # Another route or provider: a model switch (R1.3), whose segment
            # starts with no refusal state of the old chain's.
            first = Provider.objects.only("model").get(provider_id=provider_chain[0])
            apply_boundary(
                thread,
                "model_switch",
                by=DOOR,
                reason="the client's model names another provider chain: "
                + ", ".join(provider_chain),
                now=now,
                model=first.model,
                provider_chain=provider_chain,
                expected_segment=segment,
            )
            thread.provider_chain = list(provider_chain)
        segment = open_segment(thread)
        if segment.system_prompt != system_prompt:
            segment, _ = apply_boundary(
                thread,
                "prompt_change",
                by=DOOR,
                reason="the client's system prompt changed",
                now=now,
                system_prompt=system_prompt,
                expected_segment=segment,
            )
            segment = open_segment(thread)
        accepted = [
            Message(item.role, item.content)
            for item in session_history(segment.session)
            if item.role in ("user", "assistant")
        ]
        at = diverged_at(accepted, earlier)
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


def _accept(segment: Segment, earlier: Sequence[Message], now: datetime) -> None:
    """The client's earlier messages as the session's accepted history: the
    history it asks the next turn to continue (no run produced them here)."""
    if earlier:
        append_history(
            segment.session,
            [{"role": m.role, "content": m.content} for m in earlier],
            run=None,
            now=now,
        )
