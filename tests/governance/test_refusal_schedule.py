"""R3.2: a re-probe schedule other than the default, validated."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance.rules.refusal import (
    MAX_SCHEDULE_TIERS,
    REFUSAL_REPROBE_DELAYS,
    REFUSAL_SCOPE_TTL,
    RefusalError,
    check_schedule,
)

MIN = timedelta(minutes=1)


def test_r3_2_the_default_schedule_is_a_valid_schedule():
    assert check_schedule(REFUSAL_REPROBE_DELAYS) == REFUSAL_REPROBE_DELAYS
    assert check_schedule([MIN]) == (MIN,)
    assert check_schedule([MIN * n for n in range(1, MAX_SCHEDULE_TIERS + 1)])[-1] == 5 * MIN


@pytest.mark.parametrize(
    ("delays", "words"),
    [
        ((), "1 to 5 re-probes, not 0"),
        (tuple(MIN * n for n in range(1, 7)), "1 to 5 re-probes, not 6"),
        ((10 * MIN, 10 * MIN), "re-probe 2's delay must be longer than re-probe 1's"),
        ((MIN, 3 * MIN, 2 * MIN), "re-probe 3's delay must be longer than re-probe 2's"),
        ((MIN, REFUSAL_SCOPE_TTL + MIN), "the last delay must be at most 6 h"),
        ((timedelta(0),), "positive"),
        ((-MIN, MIN), "positive"),
        (("15m",), "positive"),
    ],
)
def test_r3_2_a_bad_schedule_is_refused_in_plain_words(delays, words):
    with pytest.raises(RefusalError, match=words):
        check_schedule(delays)


# --------------------------------------------------------------------------- per provider

from datetime import UTC, datetime  # noqa: E402

from governance.rules.refusal import (  # noqa: E402
    ProviderRefusal,
    ReprobeSchedules,
    ScheduleChoice,
    card_entry,
    delays_from_seconds,
    record_refusal,
    refusal_from_card,
    refusal_notices,
    refusal_verdict,
    schedule_of,
)
from governance.rules.routing import (  # noqa: E402
    AttemptOutcome,
    ChainEntry,
    drive_turn,
    route_turn,
)

T0 = datetime(2025, 5, 1, 9, 0, tzinfo=UTC)
SEG = "sess-1#1"
OWN = (10 * MIN, 30 * MIN)


def _turn(refusals, at, delays, *, answer="refused", category="policy"):
    """One turn, alpha first, beta accepting: alpha refuses (or accepts) each send."""
    route = route_turn(
        [ChainEntry("alpha", "a"), ChainEntry("beta", "b")],
        now=at, health={}, refusals=refusals, delays=delays,
    )  # fmt: skip

    def send(candidate, kind):
        if candidate.provider_id == "alpha" and answer == "refused":
            return AttemptOutcome("refused", refusal_category=category, at=at)
        return AttemptOutcome("accepted", at=at)

    return drive_turn(
        route, send, segment_key=SEG, refusals=refusals, has_unaccepted_increment=False,
        now=at, delays=delays,
    )  # fmt: skip


def test_r3_2_a_refusal_starts_under_its_providers_schedule_and_keeps_it():
    schedules = ReprobeSchedules(REFUSAL_REPROBE_DELAYS, {"alpha": ScheduleChoice(OWN)})
    first = _turn({}, T0, schedules)
    [alpha] = first.recorded
    assert alpha.delays == OWN and alpha.refusals == 1
    assert refusal_verdict(alpha, T0 + 9 * MIN, schedules).state == "cooling"
    assert refusal_verdict(alpha, T0 + 10 * MIN, schedules).state == "eligible"
    # The provider's schedule changes (now one re-probe after 1 h): the refusal
    # under way keeps the one it started under.
    changed = ReprobeSchedules(REFUSAL_REPROBE_DELAYS, {"alpha": ScheduleChoice((60 * MIN,))})
    assert refusal_verdict(alpha, T0 + 10 * MIN, changed).state == "eligible"
    second = _turn(first.refusals, T0 + 10 * MIN, changed)
    assert second.recorded[0].delays == OWN and second.recorded[0].refusals == 2
    assert refusal_verdict(second.recorded[0], T0 + 39 * MIN, changed).state == "cooling"
    third = _turn(second.refusals, T0 + 40 * MIN, changed)
    frozen = third.recorded[0]
    verdict = refusal_verdict(frozen, T0 + 100 * 60 * MIN, changed)
    assert (verdict.state, verdict.reprobes) == ("frozen", 2)  # two re-probes, not three
    # R3.6: the freeze speaks once, critical, with the schedule's own numbers.
    [notice] = [n for n in third.notices if n.severity == "critical"]
    assert notice.dedupe_key == f"provider-refusal:{SEG}:2:alpha"
    assert "All 3 sends are used up" in notice.text


def test_r3_2_a_providers_refusal_category_may_have_its_own_schedule():
    choice = ScheduleChoice(OWN, {"policy": (5 * MIN,)})
    schedules = ReprobeSchedules(REFUSAL_REPROBE_DELAYS, {"alpha": choice})
    assert _turn({}, T0, schedules, category="policy").recorded[0].delays == (5 * MIN,)
    assert _turn({}, T0, schedules, category="content_filter").recorded[0].delays == OWN
    # a provider without a schedule of its own: R3.2's default (stored as None)
    plain = ReprobeSchedules(REFUSAL_REPROBE_DELAYS, {})
    default = _turn({}, T0, plain).recorded[0]
    assert default.delays is None and schedule_of(default, plain) == REFUSAL_REPROBE_DELAYS
    first = _turn({}, T0, plain, category="policy").notices[0]
    assert "At most 3 re-probes follow" in first.text


def test_r3_2_the_default_schedule_reads_as_the_delays_it_holds():
    schedules = ReprobeSchedules(REFUSAL_REPROBE_DELAYS, {"alpha": ScheduleChoice(OWN)})
    assert len(schedules) == 3 and tuple(schedules) == REFUSAL_REPROBE_DELAYS
    assert schedules[-1] == REFUSAL_SCOPE_TTL
    assert schedules.starting("beta", "policy") is None


def test_r3_2_an_existing_refusal_never_takes_a_new_schedule():
    legacy = ProviderRefusal("alpha", refusals=2, refused_at=T0)  # started under the default
    again = record_refusal(
        legacy, provider_id="alpha", model=None, category=None, now=T0, schedule=OWN
    )
    assert again.delays is None and again.refusals == 3


def test_r3_5_the_card_carries_the_schedule_and_reads_it_back():
    refusal = ProviderRefusal("alpha", refusals=1, refused_at=T0, delays=(90 * MIN, 2 * 60 * MIN))
    entry = card_entry(refusal, T0)
    assert entry["delays_s"] == [5400, 7200]
    assert entry["next_probe_at"] == (T0 + 90 * MIN).isoformat()
    assert refusal_from_card(entry).delays == (90 * MIN, 120 * MIN)
    plain = card_entry(ProviderRefusal("alpha", refusals=1, refused_at=T0), T0)
    assert "delays_s" not in plain  # the default schedule leaves the card as before
    for bad in ("600", [], [600, -1], [True], [float("nan")], None):
        assert delays_from_seconds(bad) is None


def test_r3_6_notices_of_a_group_count_the_longest_schedule():
    short = ProviderRefusal("alpha", refusals=1, refused_at=T0, delays=(MIN,))
    long = ProviderRefusal("beta", refusals=1, refused_at=T0)
    [notice] = refusal_notices(SEG, [short, long], T0, REFUSAL_REPROBE_DELAYS)
    assert "At most 3 re-probes follow" in notice.text
