"""R1: threads, sessions, segments and the boundaries between them.

The request of every turn is ``[system][accepted history][new input]`` (R1.1).
Within a segment history only grows; the only things that remove bytes from
the request are boundaries (R1.3). Closing a segment is a value that records
who, why and when; the old segment is never edited (R1.4).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Literal

from governance.rules.refusal import RefusalError, as_utc, segment_key


class BoundaryKind(StrEnum):
    COMPACT = "compact"
    FRESH_START = "fresh_start"
    MODEL_SWITCH = "model_switch"
    MODE_CHANGE = "mode_change"
    TOOL_SURFACE_CHANGE = "tool_surface_change"
    PROMPT_CHANGE = "prompt_change"


# R1.2: compact and fresh start begin a new session (a new generation).
NEW_SESSION_KINDS = frozenset({BoundaryKind.COMPACT, BoundaryKind.FRESH_START})
# R1.3/R8.3: what an operator may force from the dashboard; the rest follow
# from configuration changes.
OPERATOR_BOUNDARY_KINDS = (
    BoundaryKind.COMPACT,
    BoundaryKind.FRESH_START,
    BoundaryKind.MODEL_SWITCH,
)

# What each boundary is called where people read it (pages, an incident's resolution).
BOUNDARY_WORDS = {
    BoundaryKind.COMPACT: "compact",
    BoundaryKind.FRESH_START: "fresh start",
    BoundaryKind.MODEL_SWITCH: "model switch",
    BoundaryKind.MODE_CHANGE: "mode change",
    BoundaryKind.TOOL_SURFACE_CHANGE: "tool-surface change",
    BoundaryKind.PROMPT_CHANGE: "prompt change",
}


def boundary_words(kind: str | None) -> str:
    return BOUNDARY_WORDS.get(kind or "", (kind or "").replace("_", " "))


HistoryPolicy = Literal["keep", "summarize", "drop"]
_HISTORY_POLICY: dict[BoundaryKind, HistoryPolicy] = {
    BoundaryKind.COMPACT: "summarize",
    BoundaryKind.FRESH_START: "drop",
}


class SegmentError(ValueError):
    """An illegal segment operation."""


def history_policy(kind: BoundaryKind | str) -> HistoryPolicy:
    """R1.2: what a boundary of ``kind`` does with the accepted history."""
    return _HISTORY_POLICY.get(BoundaryKind(kind), "keep")


def starts_new_session(kind: BoundaryKind | str) -> bool:
    """R1.2: compact and fresh start begin a new session (a new generation)."""
    return BoundaryKind(kind) in NEW_SESSION_KINDS


@dataclass(frozen=True)
class SegmentConfig:
    """What defines a segment (R1.2): any change starts a new one."""

    model: str
    mode: str = "default"
    tool_surface: tuple[str, ...] = ()
    system_prompt: str = ""
    # The fingerprint of the registry schemas the surface sees (R1.3): the
    # same names with other schemas are another surface.
    tool_schemas: str = ""
    # The client's own tools (canonical JSON of their specs, "" for none): the
    # same surface with another client tool list is another surface (R1.3).
    client_tools: str = ""

    def __post_init__(self) -> None:
        if not self.model:
            raise SegmentError("a segment needs a model")
        # The tool surface is a set; order must not fake a change.
        object.__setattr__(self, "tool_surface", tuple(sorted(set(self.tool_surface))))

    def fingerprint(self) -> str:
        parts: list = [self.model, self.mode, list(self.tool_surface), self.system_prompt]
        if self.tool_schemas:  # absent before the registry: fingerprints stay as they were
            parts.append(self.tool_schemas)
        if self.client_tools:  # likewise: threads without client tools keep their keys
            parts.append(["client_tools", self.client_tools])
        payload = json.dumps(parts, ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Segment:
    session_id: str
    segment_no: int
    config: SegmentConfig
    opened_at: datetime

    @property
    def key(self) -> str:
        return segment_key(self.session_id, self.segment_no)


@dataclass(frozen=True)
class ClosedSegment:
    """R1.4: the record of a boundary — the old segment is closed, not edited."""

    key: str
    kind: BoundaryKind
    closed_by: str
    reason: str
    closed_at: datetime


@dataclass(frozen=True)
class BoundaryTransition:
    closed: ClosedSegment
    opened: Segment
    history: HistoryPolicy  # keep (same session), summarize (compact), drop (fresh start)
    new_session: bool


def first_segment(session_id: str, config: SegmentConfig, at: datetime) -> Segment:
    """R1.2: a new session starts at segment 1."""
    try:
        segment_key(session_id, 1)  # validates the id
    except RefusalError as error:
        # Bad input to a segment rule is a SegmentError, whatever validated it.
        raise SegmentError(str(error)) from None
    return Segment(session_id, 1, config, as_utc(at))


def config_changes(old: SegmentConfig, new: SegmentConfig) -> tuple[BoundaryKind, ...]:
    """The boundary kinds a configuration change amounts to (R1.2, R1.3)."""
    changes = []
    if old.model != new.model:
        changes.append(BoundaryKind.MODEL_SWITCH)
    if old.mode != new.mode:
        changes.append(BoundaryKind.MODE_CHANGE)
    if (old.tool_surface, old.tool_schemas, old.client_tools) != (
        new.tool_surface,
        new.tool_schemas,
        new.client_tools,
    ):
        changes.append(BoundaryKind.TOOL_SURFACE_CHANGE)
    if old.system_prompt != new.system_prompt:
        changes.append(BoundaryKind.PROMPT_CHANGE)
    return tuple(changes)


def apply_boundary(
    current: Segment,
    kind: BoundaryKind | str,
    *,
    at: datetime,
    by: str,
    reason: str,
    new_session_id: str | None = None,
    new_config: SegmentConfig | None = None,
) -> BoundaryTransition:
    """Close ``current`` and open the next segment (R1.2–R1.4).

    Compact and fresh start open segment 1 of a new session (the caller
    supplies the new session's id); every other kind opens segment n+1 of
    the same session. A configuration boundary must actually change the
    configuration in the way its kind says.
    """
    try:
        kind = BoundaryKind(kind)
    except ValueError:
        raise SegmentError(f"unknown boundary kind: {kind!r}") from None
    # R1.4: blank who/why would make the record say nothing.
    if not isinstance(by, str) or not by.strip():
        raise SegmentError("a boundary records who applied it")
    if not isinstance(reason, str) or not reason.strip():
        raise SegmentError("a boundary records why it was applied")
    at = as_utc(at)
    if at < current.opened_at:
        raise SegmentError("a segment cannot close before it opened")
    config = new_config or current.config
    if kind in NEW_SESSION_KINDS:
        if not new_session_id or new_session_id == current.session_id:
            raise SegmentError(f"{kind.value} starts a new session: give a new session id")
        opened = first_segment(new_session_id, config, at)
    else:
        if new_session_id not in (None, current.session_id):
            raise SegmentError(f"{kind.value} stays in the same session")
        if kind not in config_changes(current.config, config):
            raise SegmentError(f"{kind.value} needs a configuration that changes it")
        opened = Segment(current.session_id, current.segment_no + 1, config, at)
    closed = ClosedSegment(current.key, kind, by.strip(), reason.strip(), at)
    return BoundaryTransition(
        closed=closed,
        opened=opened,
        history=history_policy(kind),
        new_session=starts_new_session(kind),
    )


@dataclass(frozen=True)
class History:
    """Accepted history of one segment: append-only (R1.3)."""

    items: tuple[str, ...] = field(default_factory=tuple)

    def append(self, *accepted: str) -> History:
        return replace(self, items=self.items + tuple(accepted))


def request_parts(
    system_prompt: str, history: History, new_input: Sequence[str]
) -> tuple[str, ...]:
    """R1.1: the request bytes of a turn, in order: system, history, input."""
    return (system_prompt, *history.items, *new_input)


def history_after_boundary(
    history: History, transition: BoundaryTransition, summary: str | None = None
) -> History:
    """What the next segment starts with (R1.2): kept, summarized or dropped."""
    if transition.history == "keep":
        return history
    if transition.history == "drop":
        return History()
    if not summary:
        raise SegmentError("compact replaces the history with a summary: give one")
    return History((summary,))


# A registry server's every tool, in a tool surface: "{server}.*".
SURFACE_WILDCARD = ".*"


def surface_allows(name: str, tool_surface: Sequence[str]) -> bool:
    """R1.2: whether the segment's tool surface holds the tool called ``name``:
    named alone, or, for a registry tool ``"{server}.{tool}"``, by ``"{server}.*"``."""
    if name in tool_surface:
        return True
    server, dot, tool = name.partition(".")
    return bool(dot and server and tool) and f"{server}{SURFACE_WILDCARD}" in tool_surface
