"""Re-probe outcomes (R3.2): how often a refused request flips to accepted.

The R3.2 schedule (15 min / 1 h / 6 h) was an engineering guess; these
statistics read the recorded sends and say, per tier, how often the provider
accepted. Pure: the facts and the period come in as arguments.

A send's **tier** follows from the recorded facts of its (segment, provider),
replayed in order (R3.1–R3.3, R3.8):

- ``original``: an original (or fallback) send that was refused — the send
  that starts the quarantine. Accepted originals are not a tier: nothing was
  refused yet.
- ``re_render`` / ``history_only``: the quarantine's sends after it (R3.1).
- ``re_probe`` with ``step`` n: the n-th re-probe of the segment refusal
  (n = the refusals recorded in this segment so far, R3.2).
- ``after_boundary`` with the boundary kind: the first send of a new segment
  to a provider that was still refused (cooling or frozen) in the segment the
  boundary closed (R3.8).

A **segment refusal** is a refused send that is the provider's last send of
its turn (the accepted history itself was refused, R3.1); an accepted send
clears the state (R3.2). The acceptance rate is ``accepted / (accepted +
refused)``: a send that failed for a time-based reason (R2.1) gave no answer
about the bytes and is counted apart.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median
from typing import NamedTuple

Z_95 = 1.959963984540054  # the two-sided 95 % normal quantile

TIER_ORIGINAL = "original"
TIER_RE_RENDER = "re_render"
TIER_HISTORY_ONLY = "history_only"
TIER_RE_PROBE = "re_probe"
TIER_AFTER_BOUNDARY = "after_boundary"
TIER_ORDER = (TIER_ORIGINAL, TIER_RE_RENDER, TIER_HISTORY_ONLY, TIER_RE_PROBE, TIER_AFTER_BOUNDARY)

_OPENING_KINDS = ("original", "fallback")


class InsightError(ValueError):
    """Bad input to an insight rule."""


class SendFact(NamedTuple):
    """One recorded provider request (a ``ProviderAttempt``).

    Named tuples, this and ``TieredSend``: a period holds thousands of them and a
    frozen dataclass costs several times as much to make (bench/scale.py:
    a third of ``tier_sends`` at 2,000 sends)."""

    attempt_id: int
    segment_id: int
    stage_id: int
    provider_id: str
    model: str
    kind: str  # original / fallback / re_render / history_only / re_probe
    started_at: datetime
    result: str  # accepted / refused / failed
    refusal_category: str = ""
    latency_ms: int = 0

    @property
    def answered_at(self) -> datetime:
        """When the answer came: a refusal is anchored here (R3.2)."""
        return self.started_at + timedelta(milliseconds=self.latency_ms or 0)


@dataclass(frozen=True)
class CarriedRefusal:
    """A provider's refusal state when a boundary closed its segment (R1.4, R3.8)."""

    segment_id: int  # the segment the boundary opened
    provider_id: str
    boundary_kind: str
    refusals: int | None
    refused_at: datetime | None
    category: str = ""


class TieredSend(NamedTuple):
    """A send with its tier: ``governance.services.insight_tiers`` keeps it on the
    attempt (``attempt_id``), and the Insights page sums what is kept."""

    tier: str
    step: int  # the re-probe number; 0 for the other tiers
    boundary_kind: str  # after_boundary only
    provider_id: str
    model: str
    category: str
    result: str
    at: datetime
    since_refusal: timedelta | None  # since the latest refusal before this send
    attempt_id: int = 0  # the SendFact's


class TierCount(NamedTuple):
    """One group of tiered sends as counted (by the database, or by
    :func:`reprobe_outcomes`): the input of :func:`tier_rows`."""

    tier: str
    step: int
    boundary_kind: str
    provider_id: str  # "" in a count over every provider
    model: str
    category: str
    sends: int
    accepted: int
    refused: int
    median_since_refusal: timedelta | None
    since_samples: int = 0


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass(frozen=True)
class TierRow:
    tier: str
    step: int
    boundary_kind: str
    provider_id: str  # "" in a row over every provider
    model: str
    category: str
    sends: int
    accepted: int
    refused: int
    failed: int
    rate: float | None  # accepted / (accepted + refused); None without an answer
    interval: Interval | None
    median_since_refusal: timedelta | None
    since_samples: int = 0

    @property
    def answered(self) -> int:
        return self.accepted + self.refused


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> Interval | None:
    """The Wilson score interval of a proportion (95 % by default); None for no trials."""
    if isinstance(successes, bool) or isinstance(trials, bool):
        raise InsightError("counts must be integers")
    if trials < 0 or successes < 0 or successes > trials:
        raise InsightError(f"need 0 <= successes <= trials, got {successes}/{trials}")
    if trials == 0:
        return None
    p = successes / trials
    z2 = z * z
    denominator = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def median_duration(values: Iterable[timedelta]) -> timedelta | None:
    """The median of durations (the mean of the middle two for an even count)."""
    seconds = [value.total_seconds() for value in values]
    if not seconds:
        return None
    return timedelta(seconds=median(seconds))


@dataclass
class _PairState:
    refusals: int = 0  # segment refusals since the last accepted send (R3.2)
    category: str = ""  # of the latest refused send
    last_refusal_at: datetime | None = None
    seen: bool = False


def tier_sends(
    sends: Sequence[SendFact],
    carried: Sequence[CarriedRefusal] = (),
    *,
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[TieredSend]:
    """Each send in ``[start, end)`` that belongs to a tier, with its tier (no
    ``start``/``end``: every send given).

    ``sends`` must hold every refusal-related send of the segments concerned
    (earlier ones too: a re-probe's number depends on the refusals before
    it), and each segment's first send to a provider named in ``carried``.
    A send's tier depends only on the sends before it, and on whether each
    earlier refused send was the last of its turn: once a turn is over, the
    tiers of its sends never change.
    """
    if start is not None and end is not None and start >= end:
        raise InsightError("the period must start before it ends")
    carried_by_pair = {(c.segment_id, c.provider_id): c for c in carried}
    ordered = sorted(sends, key=lambda s: (s.started_at, s.attempt_id))
    # The last send of each (stage, provider): its refusal is a segment refusal.
    last_in_turn: dict[tuple[int, str], int] = {}
    for send in ordered:
        last_in_turn[(send.stage_id, send.provider_id)] = send.attempt_id
    states: dict[tuple[int, str], _PairState] = defaultdict(_PairState)
    tiered: list[TieredSend] = []
    for send in ordered:
        pair = (send.segment_id, send.provider_id)
        state = states[pair]
        first = not state.seen
        state.seen = True
        tier, step, boundary_kind = None, 0, ""
        category = state.category
        since_anchor = state.last_refusal_at
        came_over = carried_by_pair.get(pair) if first else None
        if came_over is not None and (came_over.refusals is None or came_over.refusals > 0):
            tier, boundary_kind = TIER_AFTER_BOUNDARY, came_over.boundary_kind
            category = came_over.category
            since_anchor = came_over.refused_at
        elif send.kind == "re_probe":
            tier, step = TIER_RE_PROBE, max(1, state.refusals)
        elif send.kind in (TIER_RE_RENDER, TIER_HISTORY_ONLY):
            tier = send.kind
        elif send.kind in _OPENING_KINDS and send.result == "refused":
            tier = TIER_ORIGINAL
            category = send.refusal_category or category
        if send.result == "refused":
            state.last_refusal_at = send.answered_at
            state.category = send.refusal_category or state.category
            if last_in_turn[(send.stage_id, send.provider_id)] == send.attempt_id:
                state.refusals += 1
        elif send.result == "accepted":
            state.refusals = 0  # an accepted send clears the segment's state (R3.2)
        if tier is None:
            continue
        if (start is not None and send.started_at < start) or (
            end is not None and send.started_at >= end
        ):
            continue
        tiered.append(
            TieredSend(
                tier=tier,
                step=step,
                boundary_kind=boundary_kind,
                provider_id=send.provider_id,
                model=send.model,
                category=category or send.refusal_category,
                result=send.result,
                at=send.started_at,
                since_refusal=(send.started_at - since_anchor) if since_anchor else None,
                attempt_id=send.attempt_id,
            )
        )
    return tiered


def _tier_rank(tier: str, step: int, boundary_kind: str) -> tuple[int, int, str]:
    return (TIER_ORDER.index(tier) if tier in TIER_ORDER else len(TIER_ORDER), step, boundary_kind)


@dataclass
class _Tally:
    sends: int = 0
    accepted: int = 0
    refused: int = 0
    since: list[timedelta] = field(default_factory=list)


def reprobe_outcomes(tiered: Iterable[TieredSend], *, by_provider: bool = True) -> list[TierRow]:
    """Per tier (and, with ``by_provider``, per provider, model and category):
    sends, accepted, refused, failed, the acceptance rate with its 95 % Wilson
    interval, and the median time since the latest refusal."""
    tallies: dict[tuple[str, int, str, str, str, str], _Tally] = defaultdict(_Tally)
    for send in tiered:
        key = (
            send.tier,
            send.step,
            send.boundary_kind,
            send.provider_id if by_provider else "",
            send.model if by_provider else "",
            send.category if by_provider else "",
        )
        tally = tallies[key]
        tally.sends += 1
        tally.accepted += send.result == "accepted"
        tally.refused += send.result == "refused"
        if send.since_refusal is not None:
            tally.since.append(send.since_refusal)
    return tier_rows(
        TierCount(
            *key,
            sends=tally.sends,
            accepted=tally.accepted,
            refused=tally.refused,
            median_since_refusal=median_duration(tally.since),
            since_samples=len(tally.since),
        )
        for key, tally in tallies.items()
    )


def tier_rows(counts: Iterable[TierCount]) -> list[TierRow]:
    """The rows of counted groups: failed, the acceptance rate = accepted ÷
    (accepted + refused) with its 95 % Wilson interval, in tier order."""
    rows = []
    for count in counts:
        answered = count.accepted + count.refused
        rows.append(
            TierRow(
                count.tier,
                count.step,
                count.boundary_kind,
                count.provider_id,
                count.model,
                count.category,
                sends=count.sends,
                accepted=count.accepted,
                refused=count.refused,
                failed=count.sends - answered,
                rate=count.accepted / answered if answered else None,
                interval=wilson_interval(count.accepted, answered),
                median_since_refusal=count.median_since_refusal,
                since_samples=count.since_samples,
            )
        )
    rows.sort(
        key=lambda r: (
            *_tier_rank(r.tier, r.step, r.boundary_kind),
            r.provider_id,
            r.model,
            r.category,
        )
    )
    return rows


def tier_label(tier: str, step: int = 0, boundary_kind: str = "") -> str:
    """The plain words of a tier, the same on the page, in the CSV and the API."""
    if tier == TIER_ORIGINAL:
        return "original refused send"
    if tier == TIER_RE_RENDER:
        return "re-render"
    if tier == TIER_HISTORY_ONLY:
        return "history-only"
    if tier == TIER_RE_PROBE:
        return f"re-probe {step}"
    if tier == TIER_AFTER_BOUNDARY:
        return f"first send after {boundary_kind.replace('_', ' ') or 'a boundary'}"
    return tier


# --------------------------------------------------------------------------- what if
#
# Replay the recorded refusal timelines of a period under another schedule
# (R3.2's delays and number of re-probes). An estimate from recorded data:
#
# - a **timeline** starts at a segment refusal of a (segment, provider) with no
#   refusal state yet (R3.1) and ends at its first accepted send;
# - the segment's recorded turns after it are the moments a re-probe could have
#   gone out: re-probe n goes at the first turn at or after the latest refusal
#   plus the n-th delay (R3.2);
# - the chance that re-probe n is accepted is the observed acceptance rate of
#   re-probe n over the period (a step without answers borrows the nearest step
#   below it that has some) — it assumes the chance depends on the re-probe's
#   number, not on its delay;
# - a timeline whose re-probes are all refused is frozen at its last re-probe.


@dataclass(frozen=True)
class RefusalTimeline:
    segment_id: int
    provider_id: str
    refused_at: datetime  # the segment refusal that opened it
    turns: tuple[datetime, ...]  # the segment's later recorded turns, in order
    delays: tuple[timedelta, ...]  # the schedule it ran under
    opening_sends: int  # the refused provider's sends in the opening turn (R3.1)
    reprobes: int  # recorded re-probe sends, whatever their answer
    refused_reprobes: int  # of which refused (each moves the schedule on, R3.2)
    accepted: bool  # a recorded send was accepted (the state cleared, R3.2)

    @property
    def frozen(self) -> bool:
        """Recorded: every re-probe of its schedule used up and refused."""
        return not self.accepted and self.refused_reprobes >= len(self.delays)


@dataclass(frozen=True)
class FlipRate:
    step: int  # re-probe n
    accepted: int
    answered: int  # accepted + refused: the sample the rate comes from
    source_step: int | None  # the step whose sample is used; None: no sample at all

    @property
    def rate(self) -> float:
        return self.accepted / self.answered if self.answered else 0.0


@dataclass(frozen=True)
class TimelineReplay:
    segment_id: int
    provider_id: str
    refused_at: datetime
    reprobe_times: tuple[datetime, ...]  # when each re-probe would go out
    frozen_at: datetime | None  # the last re-probe, when every re-probe fits
    frozen_chance: float  # the chance that all of them are refused


@dataclass(frozen=True)
class ScheduleReplay:
    delays: tuple[timedelta, ...] | None  # None: each timeline's own schedule
    timelines: int
    reprobe_sends: float  # expected re-probes sent to refusing providers
    answers: float  # expected accepted re-probes
    frozen: float  # expected timelines frozen
    could_freeze: int  # timelines that lived long enough to use every re-probe
    median_to_freeze: timedelta | None  # first refusal → freeze, over ``could_freeze``
    replays: tuple[TimelineReplay, ...]


@dataclass(frozen=True)
class WhatIf:
    current: ScheduleReplay  # each timeline under the schedule it ran under
    proposed: ScheduleReplay
    rates: tuple[FlipRate, ...]
    opening_sends: int  # the same under any schedule
    recorded_reprobes: int
    recorded_accepted: int
    recorded_frozen: int
    schedules_as_run: tuple[tuple[timedelta, ...], ...] = ()  # distinct, most used first

    @property
    def timelines(self) -> int:
        return self.current.timelines

    @property
    def extra_sends(self) -> float:
        return self.proposed.reprobe_sends - self.current.reprobe_sends

    @property
    def answers_gained(self) -> float:
        """Positive: answers gained; negative: answers lost."""
        return self.proposed.answers - self.current.answers


def refusal_timelines(
    sends: Sequence[SendFact],
    turns: Mapping[int, Sequence[datetime]],
    *,
    start: datetime,
    end: datetime,
    delays: Callable[[int, str], Sequence[timedelta]],
) -> list[RefusalTimeline]:
    """The refusal timelines opened in ``[start, end)``.

    ``sends`` as for :func:`tier_sends`; ``turns``: each segment's recorded
    turn times (any provider sent to or skipped); ``delays(segment_id,
    provider_id)``: the schedule the pair ran under.
    """
    if start >= end:
        raise InsightError("the period must start before it ends")
    ordered = sorted(sends, key=lambda s: (s.started_at, s.attempt_id))
    last_in_turn: dict[tuple[int, str], int] = {}
    per_turn: dict[tuple[int, str], int] = defaultdict(int)
    for send in ordered:
        last_in_turn[(send.stage_id, send.provider_id)] = send.attempt_id
        per_turn[(send.stage_id, send.provider_id)] += 1
    open_: dict[tuple[int, str], dict] = {}
    done: list[dict] = []
    for send in ordered:
        pair = (send.segment_id, send.provider_id)
        timeline = open_.get(pair)
        if timeline is not None and send.kind == "re_probe":
            timeline["reprobes"] += 1
        if send.result == "accepted":
            if timeline is not None:
                timeline["accepted"] = True
                done.append(open_.pop(pair))
            continue
        if send.result != "refused":
            continue
        if last_in_turn[(send.stage_id, send.provider_id)] != send.attempt_id:
            continue  # the quarantine goes on in this turn (R3.1)
        if timeline is None:
            open_[pair] = {
                "pair": pair,
                "refused_at": send.answered_at,
                "opening_sends": per_turn[(send.stage_id, send.provider_id)],
                "reprobes": 0,
                "refused_reprobes": 0,
                "accepted": False,
            }
        elif send.kind == "re_probe":
            timeline["refused_reprobes"] += 1
    done.extend(open_.values())
    timelines = []
    for item in done:
        segment_id, provider_id = item["pair"]
        refused_at = item["refused_at"]
        if not (start <= refused_at < end):
            continue
        later = tuple(sorted(t for t in turns.get(segment_id, ()) if t > refused_at))
        timelines.append(
            RefusalTimeline(
                segment_id=segment_id,
                provider_id=provider_id,
                refused_at=refused_at,
                turns=later,
                delays=tuple(delays(segment_id, provider_id)),
                opening_sends=item["opening_sends"],
                reprobes=item["reprobes"],
                refused_reprobes=item["refused_reprobes"],
                accepted=item["accepted"],
            )
        )
    timelines.sort(key=lambda t: (t.refused_at, t.segment_id, t.provider_id))
    return timelines


def flip_rates(tiered: Iterable[TieredSend], steps: int) -> tuple[FlipRate, ...]:
    """The observed acceptance of re-probe 1 … ``steps`` (R3.2), with its sample.

    A step without an answered re-probe borrows the nearest step below it that
    has one (then the nearest above); with no answered re-probe at all the
    chance is 0 and ``source_step`` None."""
    if steps < 1:
        raise InsightError("at least one re-probe")
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for send in tiered:
        if send.tier != TIER_RE_PROBE or send.result not in ("accepted", "refused"):
            continue
        counts[send.step][1] += 1
        counts[send.step][0] += send.result == "accepted"
    known = sorted(step for step, (_, answered) in counts.items() if answered)
    rates = []
    for step in range(1, steps + 1):
        below = [s for s in known if s <= step]
        above = [s for s in known if s > step]
        source = below[-1] if below else (above[0] if above else None)
        accepted, answered = counts[source] if source is not None else (0, 0)
        rates.append(FlipRate(step, accepted, answered, source))
    return tuple(rates)


def _replay_one(
    timeline: RefusalTimeline, delays: Sequence[timedelta], rates: Sequence[FlipRate], now: datetime
) -> tuple[TimelineReplay, float, float]:
    turns = [t for t in timeline.turns if t <= now]
    last, reach, sends, answers = timeline.refused_at, 1.0, 0.0, 0.0
    times: list[datetime] = []
    index = 0
    for step, delay in enumerate(delays, start=1):
        due = last + delay
        while index < len(turns) and turns[index] < due:
            index += 1
        if index == len(turns):
            break  # the segment had no later turn: still cooling at the end
        at = turns[index]
        index += 1
        chance = rates[step - 1].rate
        sends += reach
        answers += reach * chance
        reach *= 1 - chance
        last = at
        times.append(at)
    complete = len(times) == len(delays)
    replay = TimelineReplay(
        segment_id=timeline.segment_id,
        provider_id=timeline.provider_id,
        refused_at=timeline.refused_at,
        reprobe_times=tuple(times),
        frozen_at=times[-1] if complete else None,
        frozen_chance=reach if complete else 0.0,
    )
    return replay, sends, answers


def replay_schedule(
    timelines: Sequence[RefusalTimeline],
    delays: Sequence[timedelta] | None,
    rates: Sequence[FlipRate],
    *,
    now: datetime,
) -> ScheduleReplay:
    """Every timeline under ``delays`` (None: its own schedule), up to ``now``."""
    schedule = tuple(delays) if delays is not None else None
    replays, sends, answers = [], 0.0, 0.0
    for timeline in timelines:
        own = schedule if schedule is not None else timeline.delays
        if len(rates) < len(own):
            raise InsightError(f"need a flip rate for each of {len(own)} re-probes")
        replay, one_sends, one_answers = _replay_one(timeline, own, rates, now)
        replays.append(replay)
        sends += one_sends
        answers += one_answers
    freezing = [r for r in replays if r.frozen_at is not None]
    return ScheduleReplay(
        delays=schedule,
        timelines=len(replays),
        reprobe_sends=sends,
        answers=answers,
        frozen=sum(r.frozen_chance for r in freezing),
        could_freeze=len(freezing),
        median_to_freeze=median_duration(r.frozen_at - r.refused_at for r in freezing),
        replays=tuple(replays),
    )


def what_if(
    timelines: Sequence[RefusalTimeline],
    proposed: Sequence[timedelta],
    tiered: Iterable[TieredSend],
    *,
    now: datetime,
) -> WhatIf:
    """The recorded timelines under their own schedules and under ``proposed``,
    with the same flip rates, side by side with what was recorded."""
    proposed = tuple(proposed)
    if not proposed:
        raise InsightError("a schedule has at least one re-probe")
    steps = max([len(proposed), *(len(t.delays) for t in timelines)])
    rates = flip_rates(tiered, steps)
    return WhatIf(
        current=replay_schedule(timelines, None, rates, now=now),
        proposed=replay_schedule(timelines, proposed, rates, now=now),
        rates=rates,
        opening_sends=sum(t.opening_sends for t in timelines),
        recorded_reprobes=sum(t.reprobes for t in timelines),
        recorded_accepted=sum(t.accepted for t in timelines),
        recorded_frozen=sum(t.frozen for t in timelines),
        schedules_as_run=tuple(
            schedule
            for schedule, _count in sorted(
                Counter(t.delays for t in timelines).items(), key=lambda item: -item[1]
            )
        ),
    )
