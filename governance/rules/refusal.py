"""R3: content refusals — bounded re-probes per segment, then freeze until a boundary.

A refusal is a fact about the bytes of a segment, not about time (R2.3): the
accepted history is replayed on every turn, so waiting does not remove what
was refused. The clock only covers classifier noise, and the number of
re-probes is capped: skipped in this segment for now (bounded re-probes;
frozen in this segment once used up).

State per (segment, provider) is two numbers, ``refusals`` and
``refused_at`` (R3.2). It lives on the ``llm-fallback`` card (R3.5); only the
turn runner, on an actual refusal, moves it (R3.3) through
:func:`record_refusal`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any, Literal

REFUSAL_SCOPE_TTL = timedelta(hours=6)
# The last step reuses the turn-level refusal memory's TTL (R2.3) rather than
# inventing another constant.
REFUSAL_REPROBE_DELAYS: tuple[timedelta, ...] = (
    timedelta(minutes=15),
    timedelta(hours=1),
    REFUSAL_SCOPE_TTL,
)
MAX_REFUSAL_REPROBES = len(REFUSAL_REPROBE_DELAYS)


def max_sends(delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS) -> int:
    """R3.2: the most segment-level sends a (segment, provider) ever gets: the
    first refusal plus one re-probe per delay, then frozen until a boundary."""
    return 1 + len(delays)


MAX_SCHEDULE_TIERS = 5


def check_schedule(
    delays: Sequence[timedelta], ttl: timedelta = REFUSAL_SCOPE_TTL
) -> tuple[timedelta, ...]:
    """R3.2: a re-probe schedule other than the default must have 1 to
    ``MAX_SCHEDULE_TIERS`` re-probes, each delay longer than the one before, and the
    last no longer than ``ttl`` (``REFUSAL_SCOPE_TTL``: the turn-level refusal memory
    would otherwise have forgotten the refusal). Raises RefusalError in plain words."""
    schedule = tuple(delays)
    if not 1 <= len(schedule) <= MAX_SCHEDULE_TIERS:
        raise RefusalError(
            f"a schedule has 1 to {MAX_SCHEDULE_TIERS} re-probes, not {len(schedule)}"
        )
    for delay in schedule:
        if not isinstance(delay, timedelta) or delay <= timedelta(0):
            raise RefusalError("every re-probe delay must be a positive duration")
    for number, (before, after) in enumerate(pairwise(schedule), start=2):
        if after <= before:
            raise RefusalError(
                f"re-probe {number}'s delay must be longer than re-probe {number - 1}'s"
            )
    if schedule[-1] > ttl:
        hours = ttl.total_seconds() / 3600
        raise RefusalError(
            f"the last delay must be at most {hours:g} h (REFUSAL_SCOPE_TTL, the turn-level "
            "refusal memory)"
        )
    return schedule


@dataclass(frozen=True)
class ScheduleChoice:
    """A provider's own re-probe schedule (R3.2), and one per refusal category
    (R2.4: each adapter names its categories). None: R3.2's default."""

    delays: tuple[timedelta, ...] | None = None
    by_category: Mapping[str, tuple[timedelta, ...]] = field(default_factory=dict)

    def starting(self, category: str | None) -> tuple[timedelta, ...] | None:
        """The schedule a refusal of ``category`` starts under."""
        if category and category in self.by_category:
            return self.by_category[category]
        return self.delays


@dataclass(frozen=True)
class ReprobeSchedules(Sequence[timedelta]):
    """R3.2's default schedule — what it reads as, a sequence of delays — with the
    schedules providers chose, for the refusals that start now."""

    default: tuple[timedelta, ...]
    chosen: Mapping[str, ScheduleChoice] = field(default_factory=dict)

    def __getitem__(self, index):  # type: ignore[override]
        return self.default[index]

    def __len__(self) -> int:
        return len(self.default)

    def starting(self, provider_id: str, category: str | None) -> tuple[timedelta, ...] | None:
        choice = self.chosen.get(provider_id)
        return choice.starting(category) if choice is not None else None


def schedule_of(
    refusal: ProviderRefusal | None, delays: Sequence[timedelta]
) -> tuple[timedelta, ...]:
    """R3.2: the schedule a refusal runs under: the one it started under, else ``delays``."""
    if refusal is not None and refusal.delays:
        return tuple(refusal.delays)
    return tuple(delays)


def starting_schedule(
    delays: Sequence[timedelta], provider_id: str, category: str | None
) -> tuple[timedelta, ...] | None:
    """The schedule a refusal by ``provider_id`` starting now gets; None: the default."""
    if isinstance(delays, ReprobeSchedules):
        return delays.starting(provider_id, category)
    return None


# R3.7: the one description of the rule. Every text that describes it —
# comments, the card shown to the model, notifications, dashboard copy —
# uses these words.
RULE_TEXT = (
    "skipped in this segment for now (bounded re-probes; frozen in this segment once used up)"
)
BOUNDARY_ACTIONS_TEXT = "compact, fresh start or switch model"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)

RefusalState = Literal["eligible", "cooling", "frozen"]
Severity = Literal["normal", "critical"]


@dataclass(frozen=True)
class ProviderRefusal:
    """One provider's refusal state in one segment (R3.2, R3.5).

    ``refusals`` is None for a legacy row written before counts existed; such
    a row, like one whose ``refused_at`` cannot be read, is frozen (R3.4).
    """

    provider_id: str
    model: str | None = None
    category: str | None = None
    refusals: int | None = None
    refused_at: int | float | datetime | str | None = None
    # The schedule this refusal started under (R3.2): its provider's or its
    # category's at the first refusal, kept until the state clears, so a later
    # change of schedule never changes its verdicts. None: the default given.
    delays: tuple[timedelta, ...] | None = None


@dataclass(frozen=True)
class RefusalVerdict:
    state: RefusalState
    reprobes: int
    next_probe_at: datetime | None  # aware UTC; None unless cooling


@dataclass(frozen=True)
class Notice:
    """A refusal notification (R3.6). ``dedupe_key`` is never emitted twice."""

    dedupe_key: str
    severity: Severity
    text: str
    segment_key: str
    provider_ids: tuple[str, ...]
    reprobes: int
    created_at: datetime


class RefusalError(ValueError):
    """Bad input to a refusal rule."""


def segment_key(session_id: str, segment_no: int) -> str:
    """R1.2: ``"{session_id}#{segment_no}"``; segments are numbered from 1."""
    if not isinstance(session_id, str) or not session_id or "#" in session_id:
        raise RefusalError(f"session_id must be a non-empty string without '#': {session_id!r}")
    if isinstance(segment_no, bool) or not isinstance(segment_no, int) or segment_no < 1:
        raise RefusalError(f"segment_no must be an integer >= 1: {segment_no!r}")
    return f"{session_id}#{segment_no}"


def parse_segment_key(key: str) -> tuple[str, int]:
    """Inverse of :func:`segment_key`."""
    session_id, sep, number = key.rpartition("#")
    if not sep or not number.isdigit():
        raise RefusalError(f"not a segment key: {key!r}")
    segment_key(session_id, int(number))  # validates both parts
    return session_id, int(number)


def as_utc(moment: datetime) -> datetime:
    """Naive datetimes are UTC (R3.4); aware ones are converted to UTC."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def epoch_ms(value: Any) -> int | None:
    """R3.4: read a timestamp of any shape as epoch milliseconds.

    Accepts int/float epoch milliseconds, ``datetime`` (naive = UTC) and
    ISO-8601 strings. Anything non-finite or unparseable is unknown (None):
    a guard that silently fails on one row shape is how the original bug
    turned "re-probe forever" into "never re-probe".
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, datetime):
        return (as_utc(value) - _EPOCH) // _MS
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            return None
        return (as_utc(parsed) - _EPOCH) // _MS
    return None


def from_epoch_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def refused_at_datetime(refusal: ProviderRefusal) -> datetime | None:
    ms = epoch_ms(refusal.refused_at)
    return None if ms is None else from_epoch_ms(ms)


def _known_count(refusal: ProviderRefusal) -> int | None:
    count = refusal.refusals
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return None
    return count


def refusal_verdict(
    refusal: ProviderRefusal | None,
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> RefusalVerdict:
    """R3.2: eligible, cooling until ``next_probe_at``, or frozen.

    ``now == next_probe_at`` is eligible: the re-probe is due. A legacy row
    (no count) or an unknown ``refused_at`` is frozen (R3.4): the most
    conservative reading, and one a boundary still undoes.
    """
    if not delays:
        raise RefusalError("delays must name at least one re-probe delay")
    now = as_utc(now)
    if refusal is None:
        return RefusalVerdict("eligible", 0, None)
    delays = schedule_of(refusal, delays)
    count = _known_count(refusal)
    if count is None:
        return RefusalVerdict("frozen", len(delays), None)
    if count == 0:
        return RefusalVerdict("eligible", 0, None)
    reprobes = count - 1
    if reprobes >= len(delays):
        return RefusalVerdict("frozen", reprobes, None)
    refused_at = refused_at_datetime(refusal)
    if refused_at is None:
        return RefusalVerdict("frozen", reprobes, None)
    next_probe_at = refused_at + delays[reprobes]
    if now < next_probe_at:
        return RefusalVerdict("cooling", reprobes, next_probe_at)
    return RefusalVerdict("eligible", reprobes, None)


def cooling_from(now: datetime, cools_for: timedelta) -> datetime:
    """R3.2, R3.4: the earliest ``refused_at`` of a refusal that, cooling for
    ``cools_for`` after it (``next_probe_at - refused_at``), still cools at
    ``now``: ``refusal_verdict`` reads ``refused_at`` in whole milliseconds, so
    it is the first whole millisecond after ``now - cools_for``. What a
    database compares its rows with to count them as the verdict would."""
    return from_epoch_ms((as_utc(now) - cools_for - _EPOCH) // _MS + 1)


def reprobe_due(state: str, refusals: int | None) -> bool:
    """R3.2: the next send to a provider is a re-probe when it is eligible again
    with refusals recorded in the segment (one send, no re-render)."""
    return state == "eligible" and bool(refusals)


def record_refusal(
    previous: ProviderRefusal | None,
    *,
    provider_id: str,
    model: str | None,
    category: str | None,
    now: datetime,
    schedule: Sequence[timedelta] | None = None,
) -> ProviderRefusal:
    """R3.2/R3.3: the state after an *actual* refusal at ``now``.

    Only the turn runner calls this, and only when the provider really
    refused; writing a fallback card for a skipped turn never does, so
    skipped turns cannot move the clock. A legacy row stays legacy (frozen).
    ``schedule`` is the one a *new* refusal starts under (None: the default);
    a refusal already under way keeps the schedule it started under.
    """
    if not provider_id:
        raise RefusalError("provider_id is required")
    if previous is not None and previous.provider_id != provider_id:
        raise RefusalError(
            f"refusal state of {previous.provider_id!r} cannot record a refusal by {provider_id!r}"
        )
    if previous is None:
        count: int | None = 1
    else:
        known = _known_count(previous)
        count = None if known is None else known + 1
    starts = previous is None or _known_count(previous) == 0
    return ProviderRefusal(
        provider_id=provider_id,
        model=model if model is not None else (previous.model if previous else None),
        category=category if category is not None else (previous.category if previous else None),
        refusals=count,
        refused_at=as_utc(now),
        delays=(tuple(schedule) if schedule else None) if starts else previous.delays,
    )


def _verdict_words(verdict: RefusalVerdict, refusal: ProviderRefusal) -> str:
    if verdict.state == "frozen":
        since = refused_at_datetime(refusal)
        return "frozen" + (f" since {since:%Y-%m-%d %H:%M} UTC" if since else " (legacy state)")
    if verdict.state == "cooling" and verdict.next_probe_at is not None:
        return f"cooling until {verdict.next_probe_at:%Y-%m-%d %H:%M} UTC"
    return "eligible"


def _notice(
    seg_key: str,
    group: list[tuple[ProviderRefusal, RefusalVerdict]],
    severity: Severity,
    now: datetime,
    delays: Sequence[timedelta],
) -> Notice:
    ids = tuple(sorted(refusal.provider_id for refusal, _ in group))
    reprobes = max(verdict.reprobes for _, verdict in group)
    names = ", ".join(ids)
    states = "; ".join(f"{r.provider_id}: {_verdict_words(v, r)}" for r, v in group)
    # The longest schedule in the group bounds what may still follow.
    longest = max((schedule_of(refusal, delays) for refusal, _ in group), key=len)
    most, sends = len(longest), max_sends(longest)
    if severity == "critical":
        text = (
            f"Content refused in segment {seg_key} by {names}: {RULE_TEXT}. "
            f"All {sends} sends are used up, so it is frozen in this segment ({states}). "
            f"A boundary action is needed: {BOUNDARY_ACTIONS_TEXT}."
        )
    else:
        text = (
            f"Content refused in segment {seg_key} by {names}: {RULE_TEXT}. "
            f"At most {most} re-probes follow ({states}); "
            "the turn falls back to the next provider."
        )
    # A notice carries the time of its fact: the refusal that froze (or first
    # refused), never the start of the turn that sent it.
    refused = [at for refusal, _ in group if (at := refused_at_datetime(refusal)) is not None]
    return Notice(
        dedupe_key=f"provider-refusal:{seg_key}:{reprobes}:{','.join(ids)}",
        severity=severity,
        text=text,
        segment_key=seg_key,
        provider_ids=ids,
        reprobes=reprobes,
        created_at=max(refused) if refused else as_utc(now),
    )


def refusal_notices(
    segment_key: str,  # the public keyword name; shadows the helper in this body
    refusals: Sequence[ProviderRefusal],
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> list[Notice]:
    """R3.6: the notifications a set of refusal states calls for.

    Only two moments speak: the first refusal (``reprobes == 0``, normal:
    states the rule) and the freeze (critical: a person must act). Providers
    in the same moment share one notice; re-probes in between are silent.
    Critical comes first.
    """
    parse_segment_key(segment_key)
    frozen: list[tuple[ProviderRefusal, RefusalVerdict]] = []
    first: list[tuple[ProviderRefusal, RefusalVerdict]] = []
    for refusal in refusals:
        verdict = refusal_verdict(refusal, now, delays)
        if verdict.state == "frozen":
            frozen.append((refusal, verdict))
        elif verdict.reprobes == 0 and _known_count(refusal):
            first.append((refusal, verdict))
    notices = []
    if frozen:
        notices.append(_notice(segment_key, frozen, "critical", now, delays))
    if first:
        notices.append(_notice(segment_key, first, "normal", now, delays))
    return notices


def refusal_notice(
    segment_key: str,  # the public keyword name; shadows the helper in this body
    refusals: Sequence[ProviderRefusal],
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> Notice | None:
    """R3.6: the most severe notice for these refusal states, or None (silent)."""
    notices = refusal_notices(segment_key, refusals, now, delays)
    return notices[0] if notices else None


def refusal_answer_text(
    segment_key: str,
    refusals: Mapping[str, ProviderRefusal],
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> str:
    """R3.7 in the words of the notices: which providers refused in this
    segment, whether each is cooling or frozen, and what clears it. What a
    client is told when its turn settled without an answer because of them
    (the OpenAI-compatible door's ``message.refusal``)."""
    if not refusals:
        return f"No provider answered in segment {segment_key}."
    ordered = [refusals[pid] for pid in sorted(refusals)]
    states = "; ".join(
        f"{r.provider_id}: {_verdict_words(refusal_verdict(r, now, delays), r)}" for r in ordered
    )
    return (
        f"Content refused in segment {segment_key} by "
        f"{', '.join(r.provider_id for r in ordered)}: {RULE_TEXT} ({states}). "
        f"A boundary clears it: {BOUNDARY_ACTIONS_TEXT}."
    )


def every_provider_frozen(
    provider_ids: Sequence[str],
    refusals: Mapping[str, ProviderRefusal],
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> bool:
    """R6.3: only a boundary can help — every provider of the chain is frozen.

    Cooling providers come back by themselves, so a segment where any is
    cooling (or eligible) does not call for a person.
    """
    return bool(provider_ids) and all(
        refusal_verdict(refusals.get(pid), now, delays).state == "frozen" for pid in provider_ids
    )


def no_eligible_provider_notice(
    *,
    run_id: str,
    segment_key: str,
    provider_ids: Sequence[str],
    refusals: Mapping[str, ProviderRefusal],
    now: datetime,
    boundary_action_needed: str,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> Notice | None:
    """R6.3: the critical alert of a run settled because no provider is eligible.

    Only when every provider is frozen: cooling providers come back by
    themselves, so the run settles honestly but nobody is paged for a wait the
    rule ends on its own (R3.6).
    """
    if not every_provider_frozen(provider_ids, refusals, now, delays):
        return None
    # Each refusal counts against the schedule it started under, not the default.
    reprobes = max(refusal_verdict(refusals[pid], now, delays).reprobes for pid in provider_ids)
    return Notice(
        dedupe_key=f"no-eligible-provider:{segment_key}",
        severity="critical",
        text=(
            f"Run {run_id} settled: no provider is eligible in segment {segment_key}; "
            f"each was {RULE_TEXT}. {boundary_action_needed}."
        ),
        segment_key=segment_key,
        provider_ids=tuple(sorted(provider_ids)),
        reprobes=reprobes,
        created_at=now,
    )


# --- the llm-fallback card is the store of R3.2 state (R3.5) ---------------


def card_entry(
    refusal: ProviderRefusal,
    now: datetime,
    delays: Sequence[timedelta] = REFUSAL_REPROBE_DELAYS,
) -> dict[str, Any]:
    """The per-provider refusal metadata written on an ``llm-fallback`` card.

    Reads the state, never changes it (R3.3). ``refused_at`` is stored as
    epoch milliseconds, the shape every reader accepts (R3.4).
    """
    verdict = refusal_verdict(refusal, now, delays)
    entry = {
        "provider_id": refusal.provider_id,
        "model": refusal.model,
        "category": refusal.category,
        "refusals": _known_count(refusal),
        "refused_at": epoch_ms(refusal.refused_at),
        "state": verdict.state,
        "reprobes": verdict.reprobes,
        "next_probe_at": verdict.next_probe_at.isoformat() if verdict.next_probe_at else None,
    }
    if refusal.delays:  # a schedule of its own (R3.2): kept with the state (R3.5)
        entry["delays_s"] = delays_seconds(refusal.delays)
    return entry


def delays_seconds(delays: Sequence[timedelta]) -> list[float]:
    """A schedule as stored: seconds (whole seconds as integers)."""
    return [int(s) if (s := d.total_seconds()) == int(s) else s for d in delays]


def delays_from_seconds(value: Any) -> tuple[timedelta, ...] | None:
    """A stored schedule read back; anything but a list of positive numbers is None
    (the default schedule)."""
    if not isinstance(value, list | tuple) or not value:
        return None
    delays = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int | float):
            return None
        if not math.isfinite(item) or item <= 0:
            return None
        delays.append(timedelta(seconds=item))
    return tuple(delays)


def refusal_from_card(entry: Mapping[str, Any]) -> ProviderRefusal:
    """Read a card entry of any vintage back into state (R3.4).

    Missing or malformed counts stay unknown, which reads as frozen.
    """
    provider_id = entry.get("provider_id") or entry.get("providerId")
    if not isinstance(provider_id, str) or not provider_id:
        raise RefusalError(f"card entry has no provider_id: {dict(entry)!r}")
    count = entry.get("refusals")
    if isinstance(count, bool) or not isinstance(count, int):
        count = None
    refused_at = entry.get("refused_at", entry.get("refusedAt"))
    return ProviderRefusal(
        provider_id=provider_id,
        model=entry.get("model"),
        category=entry.get("category"),
        refusals=count,
        refused_at=refused_at,
        delays=delays_from_seconds(entry.get("delays_s")),
    )


def counts_against_daily_budget(severity: str) -> bool:
    """R3.6: normal notifications count against a channel's daily budget of
    pushes; critical ones bypass it."""
    return severity != "critical"


def within_daily_budget(used_today: int, daily_budget: int) -> bool:
    """R3.6: a normal push goes out while fewer than ``daily_budget`` went today."""
    return used_today < daily_budget
