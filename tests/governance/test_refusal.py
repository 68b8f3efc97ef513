"""R3.2–R3.7 and R2.3: the refusal state machine, timestamps, notices, cards."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.refusal import (
    MAX_REFUSAL_REPROBES,
    REFUSAL_REPROBE_DELAYS,
    REFUSAL_SCOPE_TTL,
    RULE_TEXT,
    ProviderRefusal,
    RefusalError,
    RefusalVerdict,
    card_entry,
    cooling_from,
    epoch_ms,
    every_provider_frozen,
    parse_segment_key,
    record_refusal,
    refusal_from_card,
    refusal_notice,
    refusal_notices,
    refusal_verdict,
    segment_key,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
T0_MS = 1772355600000  # T0 in epoch milliseconds, computed independently below


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def refused(count: int | None, when=T0, provider: str = "openai") -> ProviderRefusal:
    return ProviderRefusal(provider, "gpt", "content_filter", refusals=count, refused_at=when)


# --- constants ---------------------------------------------------------------


def test_r3_2_default_schedule_is_15m_1h_6h():
    assert (
        timedelta(minutes=15),
        timedelta(hours=1),
        timedelta(hours=6),
    ) == REFUSAL_REPROBE_DELAYS
    assert MAX_REFUSAL_REPROBES == len(REFUSAL_REPROBE_DELAYS) == 3


def test_r2_3_scope_ttl_is_the_last_reprobe_delay():
    assert REFUSAL_SCOPE_TTL == timedelta(hours=6) == REFUSAL_REPROBE_DELAYS[-1]


# --- R1.2 segment keys -----------------------------------------------------------


def test_r1_2_segment_key_format_and_round_trip():
    assert segment_key("sess-1", 3) == "sess-1#3"
    assert parse_segment_key("sess-1#3") == ("sess-1", 3)


@pytest.mark.parametrize(
    ("session_id", "number"), [("", 1), ("a#b", 1), ("s", 0), ("s", -2), ("s", True), ("s", 1.0)]
)
def test_r1_2_segment_key_rejects_bad_parts(session_id, number):
    with pytest.raises(RefusalError):
        segment_key(session_id, number)


@pytest.mark.parametrize("key", ["nohash", "s#", "s#x", "#1", "s#0"])
def test_r1_2_parse_segment_key_rejects_garbage(key):
    with pytest.raises(RefusalError):
        parse_segment_key(key)


# --- R3.4 timestamps of any shape -----------------------------------------------


def test_r3_4_epoch_ms_reference_value():
    assert (T0 - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1) == T0_MS


@pytest.mark.parametrize(
    "value",
    [
        T0_MS,
        float(T0_MS),
        T0,
        T0.replace(tzinfo=None),  # naive = UTC
        T0.astimezone(timezone(timedelta(hours=8))),
        "2026-03-01T09:00:00Z",
        "2026-03-01T09:00:00+00:00",
        "2026-03-01T17:00:00+08:00",
        " 2026-03-01T09:00:00.000Z ",
        "2026-03-01T09:00:00",  # naive ISO = UTC
    ],
)
def test_r3_4_epoch_ms_accepts_every_shape(value):
    assert epoch_ms(value) == T0_MS


@pytest.mark.parametrize(
    "value",
    [None, math.nan, math.inf, -math.inf, "", "yesterday", "12:00", True, False, [], {}, object()],
)
def test_r3_4_epoch_ms_unknown_is_none(value):
    assert epoch_ms(value) is None


@given(st.datetimes(timezones=st.just(UTC)))
def test_r3_4_epoch_ms_agrees_across_shapes(moment):
    ms = epoch_ms(moment)
    assert ms == epoch_ms(moment.isoformat())
    assert ms == epoch_ms(moment.replace(tzinfo=None))
    assert ms == epoch_ms(ms)


# --- R3.2 verdicts -------------------------------------------------------------------


def test_r3_2_no_state_is_eligible():
    assert refusal_verdict(None, T0) == RefusalVerdict("eligible", 0, None)


@pytest.mark.parametrize(
    ("count", "delay"),
    [(1, timedelta(minutes=15)), (2, timedelta(hours=1)), (3, timedelta(hours=6))],
)
def test_r3_2_cooling_until_refused_at_plus_the_step_delay(count, delay):
    verdict = refusal_verdict(refused(count), T0 + delay - timedelta(milliseconds=1))
    assert verdict == RefusalVerdict("cooling", count - 1, T0 + delay)


@settings(max_examples=300, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=3),
    now_us=st.integers(min_value=0, max_value=10**6),
    offset_us=st.integers(min_value=-5000, max_value=5000),
)
def test_r3_2_cooling_from_agrees_with_the_verdict_to_the_microsecond(count, now_us, offset_us):
    """R3.2, R3.4: a refusal is cooling exactly when refused at or after
    ``cooling_from`` (what lets GET /metrics have the database count the
    states), around the boundary, where whole milliseconds matter."""
    delay = REFUSAL_REPROBE_DELAYS[count - 1]
    now = T0 + timedelta(microseconds=now_us)
    refused_at = now - delay + timedelta(microseconds=offset_us)
    cooling = refusal_verdict(refused(count, when=refused_at), now).state == "cooling"
    assert cooling == (refused_at >= cooling_from(now, delay))


@pytest.mark.parametrize("count", [1, 2, 3])
def test_r3_2_reprobe_is_due_exactly_at_next_probe_at(count):
    delay = REFUSAL_REPROBE_DELAYS[count - 1]
    verdict = refusal_verdict(refused(count), T0 + delay)
    assert verdict == RefusalVerdict("eligible", count - 1, None)


@pytest.mark.parametrize("count", [4, 5, 40])
def test_r3_2_frozen_once_reprobes_are_used_up(count):
    for now in (T0, at(60 * 100), at(60 * 24 * 365)):
        verdict = refusal_verdict(refused(count), now)
        assert verdict.state == "frozen"
        assert verdict.reprobes == count - 1
        assert verdict.next_probe_at is None


def test_r3_2_custom_delays_change_the_cap():
    delays = (timedelta(minutes=1),)
    assert refusal_verdict(refused(1), at(0.5), delays).state == "cooling"
    assert refusal_verdict(refused(1), at(1), delays).state == "eligible"
    assert refusal_verdict(refused(2), at(999), delays).state == "frozen"
    with pytest.raises(RefusalError):
        refusal_verdict(refused(1), T0, ())


def test_r3_2_naive_now_is_utc():
    assert refusal_verdict(refused(1), at(14).replace(tzinfo=None)).state == "cooling"


def test_r3_2_zero_refusals_is_eligible():
    assert refusal_verdict(refused(0), T0).state == "eligible"


# --- R3.4 legacy rows ------------------------------------------------------------------


@pytest.mark.parametrize(
    "row",
    [
        ProviderRefusal("p", refusals=None, refused_at=T0),  # no count: legacy
        ProviderRefusal("p", refusals=1, refused_at=None),  # unknown time
        ProviderRefusal("p", refusals=2, refused_at="not a time"),
        ProviderRefusal("p", refusals=1, refused_at=math.nan),
        ProviderRefusal("p", refusals=-1, refused_at=T0),  # nonsense count
        ProviderRefusal("p", refusals="2", refused_at=T0),  # type: ignore[arg-type]
    ],
)
def test_r3_4_legacy_or_unreadable_rows_are_frozen(row):
    for now in (T0, at(60 * 1000)):
        assert refusal_verdict(row, now).state == "frozen"


def test_r3_4_legacy_row_with_date_and_number_shapes_agree():
    """The original bug: one row shape re-probed forever, the other never."""
    as_number = refused(1, when=T0_MS)
    as_date = refused(1, when=T0)
    as_text = refused(1, when="2026-03-01T09:00:00Z")
    for minutes in (0, 14, 15, 100):
        verdicts = {refusal_verdict(row, at(minutes)) for row in (as_number, as_date, as_text)}
        assert len(verdicts) == 1


# --- R3.2 / R3.3 record_refusal --------------------------------------------------


def test_r3_3_first_refusal_starts_the_count():
    first = record_refusal(None, provider_id="p", model="m", category="policy", now=T0)
    assert first == ProviderRefusal("p", "m", "policy", refusals=1, refused_at=T0)


def test_r3_3_each_actual_refusal_increments_and_re_anchors():
    state = record_refusal(None, provider_id="p", model="m", category="policy", now=T0)
    state = record_refusal(state, provider_id="p", model=None, category=None, now=at(15))
    assert state.refusals == 2
    assert state.refused_at == at(15)
    assert (state.model, state.category) == ("m", "policy")  # kept when not re-stated


def test_r3_4_record_on_a_legacy_row_stays_legacy():
    legacy = ProviderRefusal("p", refusals=None, refused_at="garbage")
    after = record_refusal(legacy, provider_id="p", model="m", category="c", now=T0)
    assert after.refusals is None
    assert refusal_verdict(after, at(10_000)).state == "frozen"


def test_r3_3_record_refuses_another_providers_state():
    with pytest.raises(RefusalError):
        record_refusal(refused(1, provider="a"), provider_id="b", model=None, category=None, now=T0)
    with pytest.raises(RefusalError):
        record_refusal(None, provider_id="", model=None, category=None, now=T0)


def test_r3_2_record_stores_aware_utc():
    naive = record_refusal(
        None, provider_id="p", model=None, category=None, now=datetime(2026, 1, 1)
    )
    assert naive.refused_at == datetime(2026, 1, 1, tzinfo=UTC)


# --- R3.6 notices -----------------------------------------------------------------------


def test_r3_6_first_refusal_is_a_normal_notice_saying_the_rule():
    notice = refusal_notice("s#1", [refused(1)], T0)
    assert notice is not None
    assert notice.dedupe_key == "provider-refusal:s#1:0:openai"
    assert notice.severity == "normal"
    assert RULE_TEXT in notice.text
    assert "At most 3 re-probes" in notice.text


@pytest.mark.parametrize("count", [2, 3])
def test_r3_6_reprobe_refusals_are_silent(count):
    assert refusal_notice("s#1", [refused(count)], T0) is None


def test_r3_6_freeze_is_critical_and_names_the_boundary_action():
    notice = refusal_notice("s#1", [refused(4)], T0)
    assert notice is not None
    assert notice.dedupe_key == "provider-refusal:s#1:3:openai"
    assert notice.severity == "critical"
    assert "compact, fresh start or switch model" in notice.text
    assert RULE_TEXT in notice.text


def test_r3_6_provider_ids_are_sorted_and_comma_joined():
    notice = refusal_notice("s#2", [refused(1, provider="zeta"), refused(1, provider="alpha")], T0)
    assert notice is not None
    assert notice.dedupe_key == "provider-refusal:s#2:0:alpha,zeta"
    assert notice.provider_ids == ("alpha", "zeta")


def test_r3_6_mixed_moments_give_one_notice_each_critical_first():
    notices = refusal_notices("s#1", [refused(1, provider="b"), refused(4, provider="a")], T0)
    assert [(n.severity, n.dedupe_key) for n in notices] == [
        ("critical", "provider-refusal:s#1:3:a"),
        ("normal", "provider-refusal:s#1:0:b"),
    ]
    assert (
        refusal_notice("s#1", [refused(1, provider="b"), refused(4, provider="a")], T0)
        == (notices[0])
    )


def test_r3_6_notice_needs_a_segment_key():
    with pytest.raises(RefusalError):
        refusal_notice("not-a-key", [refused(1)], T0)


def test_r3_6_no_refusals_no_notice():
    assert refusal_notices("s#1", [], T0) == []


# --- R3.5 fallback card entries -----------------------------------------------------


def test_r3_5_card_entry_holds_the_state_and_reads_it_back():
    state = refused(2, when=T0)
    entry = card_entry(state, at(30))
    assert entry == {
        "provider_id": "openai",
        "model": "gpt",
        "category": "content_filter",
        "refusals": 2,
        "refused_at": T0_MS,
        "state": "cooling",
        "reprobes": 1,
        "next_probe_at": at(60).isoformat(),
    }
    back = refusal_from_card(entry)
    assert refusal_verdict(back, at(30)) == refusal_verdict(state, at(30))


def test_r3_5_card_of_a_frozen_provider():
    entry = card_entry(refused(4), at(1))
    assert (entry["state"], entry["next_probe_at"]) == ("frozen", None)


def test_r3_4_old_card_shapes_are_read_conservatively():
    camel = refusal_from_card({"providerId": "p", "refusedAt": T0_MS, "refusals": 1})
    assert refusal_verdict(camel, at(1)).state == "cooling"
    no_count = refusal_from_card({"provider_id": "p", "refused_at": T0_MS})
    assert refusal_verdict(no_count, at(10_000)).state == "frozen"
    with pytest.raises(RefusalError):
        refusal_from_card({"refusals": 1})


# --- properties --------------------------------------------------------------------------

advances = st.lists(st.integers(min_value=0, max_value=60 * 24 * 30), min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(advances)
def test_r3_2_at_most_four_refusals_reach_the_state_over_unlimited_time(minute_gaps):
    """Re-probe whenever allowed, always refused: the count caps at 1 + 3."""
    state = record_refusal(None, provider_id="p", model=None, category=None, now=T0)
    now = T0
    sends = 1
    for gap in minute_gaps:
        now += timedelta(minutes=gap)
        verdict = refusal_verdict(state, now)
        if verdict.state == "eligible":
            sends += 1
            state = record_refusal(state, provider_id="p", model=None, category=None, now=now)
    assert sends <= 1 + MAX_REFUSAL_REPROBES
    assert state.refusals == sends


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=10**7))
def test_r3_2_verdict_is_monotone_in_time(count, minutes):
    """Waiting never turns an eligible or frozen verdict back into cooling."""
    earlier = refusal_verdict(refused(count), at(minutes))
    later = refusal_verdict(refused(count), at(minutes + 1))
    order = {"cooling": 0, "eligible": 1, "frozen": 2}
    if earlier.state == "frozen":
        assert later.state == "frozen"
    else:
        assert order[later.state] >= order[earlier.state]


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=10**6))
def test_r3_6_only_first_refusal_and_freeze_speak(count, minutes):
    notice = refusal_notice("s#1", [refused(count)], at(minutes))
    if count == 1:
        assert notice is not None and notice.severity == "normal"
    elif count > MAX_REFUSAL_REPROBES:
        assert notice is not None and notice.severity == "critical"
    else:
        assert notice is None


def test_r3_6_public_signature_accepts_keywords():
    """The fixed public surface: refusal_notice(segment_key=, refusals=, now=)."""
    notice = refusal_notice(segment_key="s#9", refusals=[refused(1)], now=T0)
    assert notice is not None and notice.dedupe_key == "provider-refusal:s#9:0:openai"
    verdict = refusal_verdict(refusal=refused(1), now=T0, delays=REFUSAL_REPROBE_DELAYS)
    assert verdict.next_probe_at == T0 + timedelta(minutes=15)


def test_r6_3_every_provider_frozen_only_when_no_rule_can_bring_one_back():
    frozen, cooling = refused(4), refused(1)
    assert every_provider_frozen(["openai"], {"openai": frozen}, at(1))
    assert not every_provider_frozen(["openai"], {"openai": cooling}, at(1))
    assert not every_provider_frozen(["openai", "b"], {"openai": frozen}, at(1))  # b eligible
    assert not every_provider_frozen([], {}, at(1))
    legacy = ProviderRefusal("b", refusals=None)
    assert every_provider_frozen(["openai", "b"], {"openai": frozen, "b": legacy}, at(1))


# --- R6.3 the no-eligible-provider alert -----------------------------------------------


def _no_eligible(refusals, provider_ids=("openai", "b"), now=None):
    from governance.rules.refusal import no_eligible_provider_notice

    return no_eligible_provider_notice(
        run_id="run-1",
        segment_key="s#1",
        provider_ids=provider_ids,
        refusals=refusals,
        now=now or at(5),
        boundary_action_needed="compact, fresh start or switch model: a new segment helps",
    )


def test_r6_3_no_eligible_provider_alerts_when_every_provider_is_frozen():
    frozen = {"openai": refused(4), "b": refused(4, provider="b")}
    notice = _no_eligible(frozen, provider_ids=("openai", "b"))
    assert notice is not None and notice.severity == "critical"
    assert notice.dedupe_key == "no-eligible-provider:s#1"
    assert notice.provider_ids == ("b", "openai") and notice.segment_key == "s#1"
    assert notice.reprobes == MAX_REFUSAL_REPROBES
    assert RULE_TEXT in notice.text and "run-1" in notice.text
    assert "switch model" in notice.text  # it names the boundary action needed


def test_r6_3_the_alert_counts_reprobes_against_each_refusals_own_schedule():
    """A refusal under a longer schedule froze after its own re-probes, not the default's."""
    longer = tuple(timedelta(minutes=m) for m in (1, 2, 3, 4, 5))
    own = replace(refused(6, provider="b"), delays=longer)
    notice = _no_eligible({"openai": refused(4), "b": own}, now=at(60))
    assert notice is not None and notice.reprobes == len(longer) > MAX_REFUSAL_REPROBES
    # Under its own schedule, 4 sends leave one re-probe: cooling, nobody paged.
    assert _no_eligible({"openai": refused(4), "b": replace(own, refusals=4)}, now=at(1)) is None


def test_r6_3_r3_6_a_cooling_or_eligible_provider_pages_nobody():
    """R3.6: cooling providers come back by themselves: the run may settle, but no one is paged."""
    frozen = refused(4)
    assert _no_eligible({"openai": frozen, "b": refused(1, provider="b")}) is None  # cooling
    assert _no_eligible({"openai": frozen}) is None  # b has no refusal state: eligible
    assert _no_eligible({}, provider_ids=()) is None


def test_r6_3_r3_4_a_legacy_row_counts_as_frozen_for_the_alert():
    legacy = ProviderRefusal("b", refusals=None)
    assert _no_eligible({"openai": refused(4), "b": legacy}) is not None


def test_r3_2_a_reprobe_is_due_when_eligible_again_with_refusals_recorded():
    from governance.rules.refusal import reprobe_due

    assert reprobe_due("eligible", 1) and reprobe_due("eligible", 3)
    assert not reprobe_due("eligible", 0) and not reprobe_due("eligible", None)
    assert not reprobe_due("cooling", 1) and not reprobe_due("frozen", 4)


def test_r3_6_critical_bypasses_the_daily_budget_and_normal_counts_against_it():
    from governance.rules.refusal import counts_against_daily_budget, within_daily_budget

    assert not counts_against_daily_budget("critical")
    assert counts_against_daily_budget("normal")
    assert within_daily_budget(0, 1) and within_daily_budget(4, 5)
    assert not within_daily_budget(5, 5) and not within_daily_budget(0, 0)
