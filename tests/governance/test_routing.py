"""R3.1–R3.3, R3.5, R3.6, R3.8, R3.9 and R2.3: routing a turn across providers."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.breaker import HealthVerdict
from governance.rules.refusal import (
    MAX_REFUSAL_REPROBES,
    RULE_TEXT,
    ProviderRefusal,
    refusal_verdict,
    segment_key,
)
from governance.rules.refusal_memory import TurnRefusalMemory, remember_turn_refusal
from governance.rules.routing import (
    AttemptOutcome,
    Candidate,
    ChainEntry,
    RoutingError,
    attempt_plan,
    drive_turn,
    first_send,
    route_turn,
    why_no_candidate,
)
from governance.rules.segments import (
    NEW_SESSION_KINDS,
    BoundaryKind,
    SegmentConfig,
    apply_boundary,
    first_segment,
)

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
CHAIN = (ChainEntry("a", "model-a"), ChainEntry("b", "model-b"))
HEALTHY = HealthVerdict(True, "closed", None, "closed")
OPEN = HealthVerdict(False, "open", T0 + timedelta(minutes=2), "breaker open after 3 failures")
ACCEPT = AttemptOutcome("accepted")
REFUSE = AttemptOutcome("refused", refusal_category="content_filter")


def state(count: int, when: datetime = T0, provider: str = "a") -> ProviderRefusal:
    return ProviderRefusal(provider, f"model-{provider}", "content_filter", count, when)


@dataclass
class FakeProviders:
    """Answers per provider: a callable (candidate, kind) -> outcome; counts requests."""

    answers: dict
    requests: Counter = field(default_factory=Counter)
    log: list = field(default_factory=list)

    def send(self, candidate: Candidate, kind: str) -> AttemptOutcome:
        self.requests[candidate.provider_id] += 1
        self.log.append((candidate.provider_id, kind))
        answer = self.answers[candidate.provider_id]
        return answer(candidate, kind) if callable(answer) else answer


def turn(fake, refusals, now, *, increment=True, key="s#1", chain=CHAIN, health=None):
    route = route_turn(chain, now=now, health=health or {}, refusals=refusals)
    return drive_turn(
        route,
        fake.send,
        segment_key=key,
        refusals=refusals,
        has_unaccepted_increment=increment,
        now=now,
    )


# --- route_turn -------------------------------------------------------------------------


def test_r3_2_route_keeps_chain_order_when_everyone_is_eligible():
    route = route_turn(CHAIN, now=T0, health={}, refusals={})
    assert [c.provider_id for c in route.candidates] == ["a", "b"]
    assert route.skipped == ()
    assert not any(c.reprobe for c in route.candidates)


def test_r3_2_cooling_provider_is_skipped_with_its_next_probe_at():
    route = route_turn(CHAIN, now=T0 + timedelta(minutes=5), health={}, refusals={"a": state(1)})
    assert [c.provider_id for c in route.candidates] == ["b"]
    (skip,) = route.skipped
    assert (skip.provider_id, skip.reason, skip.until) == (
        "a",
        "cooling",
        T0 + timedelta(minutes=15),
    )
    assert skip.detail == RULE_TEXT


def test_r3_2_due_reprobe_is_a_candidate_marked_reprobe():
    route = route_turn(CHAIN, now=T0 + timedelta(minutes=15), health={}, refusals={"a": state(1)})
    assert route.candidates[0].provider_id == "a"
    assert route.candidates[0].reprobe is True


def test_r3_2_frozen_provider_is_skipped_forever():
    route = route_turn(CHAIN, now=T0 + timedelta(days=400), health={}, refusals={"a": state(4)})
    assert [s.reason for s in route.skipped] == ["frozen"]
    assert [c.provider_id for c in route.candidates] == ["b"]


def test_r2_3_healthy_breaker_does_not_unfreeze_refused_bytes():
    route = route_turn(CHAIN, now=T0, health={"a": HEALTHY}, refusals={"a": state(4)})
    assert route.skipped[0].reason == "frozen"


def test_r2_2_open_breaker_skips_with_retry_time():
    route = route_turn(CHAIN, now=T0, health={"a": OPEN}, refusals={})
    (skip,) = route.skipped
    assert (skip.reason, skip.until, skip.detail) == ("breaker_open", OPEN.retry_at, OPEN.reason)
    disabled = HealthVerdict(False, "disabled", None, "auth failed; fix the key")
    assert route_turn(CHAIN, now=T0, health={"a": disabled}, refusals={}).skipped[0].reason == (
        "disabled"
    )


def test_r2_3_turn_level_memory_skips_the_same_request_for_its_ttl():
    memory = remember_turn_refusal(TurnRefusalMemory(), "a", "digest-1", T0)
    kwargs = dict(health={}, refusals={}, turn_memory=memory)
    this_turn = {"a": ("digest-0", "digest-1"), "b": ("digest-3",)}
    same = route_turn(CHAIN, now=T0 + timedelta(hours=5), request_digests=this_turn, **kwargs)
    assert [(s.provider_id, s.reason) for s in same.skipped] == [("a", "turn_refused")]
    assert [c.provider_id for c in same.candidates] == ["b"]
    # The digest is per provider: b's refusal of "digest-1" would be b's own memory.
    other = {"a": ("digest-2",), "b": ("digest-1",)}
    assert (
        route_turn(CHAIN, now=T0 + timedelta(hours=5), request_digests=other, **kwargs).skipped
        == ()
    )
    expired = route_turn(CHAIN, now=T0 + timedelta(hours=6), request_digests=this_turn, **kwargs)
    assert expired.skipped == ()
    assert route_turn(CHAIN, now=T0, **kwargs).skipped == ()  # no digests given: nothing to match


def test_r3_2_route_rejects_an_empty_or_duplicated_chain():
    with pytest.raises(RoutingError):
        route_turn((), now=T0, health={}, refusals={})
    with pytest.raises(RoutingError):
        route_turn((ChainEntry("a"), ChainEntry("a")), now=T0, health={}, refusals={})


# --- attempt_plan (R3.1 quarantine) ---------------------------------------------------


def test_r3_1_increment_is_quarantined_before_the_segment_is_blamed():
    fresh = Candidate("a", None, reprobe=False, refusal=None)
    assert attempt_plan(fresh, has_unaccepted_increment=True, first_in_turn=True) == (
        "original",
        "re_render",
        "re_render",
        "history_only",
    )
    assert attempt_plan(fresh, has_unaccepted_increment=False, first_in_turn=True) == ("original",)
    assert attempt_plan(fresh, has_unaccepted_increment=True, first_in_turn=False)[0] == "fallback"


def test_r3_2_reprobe_is_one_send_without_rerender():
    due = Candidate("a", None, reprobe=True, refusal=state(1))
    assert attempt_plan(due, has_unaccepted_increment=True, first_in_turn=True) == ("re_probe",)


# --- drive_turn ------------------------------------------------------------------------


def test_r3_1_first_refused_turn_costs_the_provider_exactly_four_requests():
    fake = FakeProviders({"a": REFUSE, "b": ACCEPT})
    outcome = turn(fake, {}, T0)
    assert fake.log == [
        ("a", "original"),
        ("a", "re_render"),
        ("a", "re_render"),
        ("a", "history_only"),
        ("b", "fallback"),
    ]
    assert outcome.result == "accepted" and outcome.accepted_by == "b"
    assert outcome.recorded == (state(1),)
    assert outcome.refusals == {"a": state(1)}
    assert [n.dedupe_key for n in outcome.notices] == ["provider-refusal:s#1:0:a"]


@pytest.mark.parametrize("accepted_at", ["original", "re_render", "history_only"])
def test_r3_1_any_accepted_quarantine_step_means_no_segment_refusal(accepted_at):
    def answer(_candidate, kind):
        return ACCEPT if kind == accepted_at else REFUSE

    fake = FakeProviders({"a": answer, "b": ACCEPT})
    outcome = turn(fake, {}, T0)
    assert outcome.accepted_by == "a" and outcome.accepted_kind == accepted_at
    assert outcome.recorded == () and outcome.refusals == {}
    assert outcome.notices == () and outcome.fallback_card is None
    assert fake.requests["b"] == 0


def test_r3_2_accepted_reprobe_clears_the_segment_state():
    fake = FakeProviders({"a": ACCEPT, "b": ACCEPT})
    outcome = turn(fake, {"a": state(2)}, T0 + timedelta(hours=2))
    assert fake.log == [("a", "re_probe")]
    assert outcome.cleared == ("a",) and outcome.refusals == {}


def test_r3_2_refused_reprobe_increments_and_re_anchors_silently():
    fake = FakeProviders({"a": REFUSE, "b": ACCEPT})
    now = T0 + timedelta(minutes=15)
    outcome = turn(fake, {"a": state(1)}, now)
    assert fake.requests["a"] == 1
    assert outcome.refusals["a"].refusals == 2 and outcome.refusals["a"].refused_at == now
    assert outcome.notices == ()


def test_r2_1_time_based_failure_falls_back_to_the_next_provider():
    fake = FakeProviders({"a": AttemptOutcome("failed", failure_class="server_error"), "b": ACCEPT})
    outcome = turn(fake, {}, T0)
    assert outcome.accepted_by == "b" and fake.requests["a"] == 1
    assert outcome.refusals == {}  # R2.3: a 5xx is not a refusal fact


def test_r2_1_bad_request_fails_the_turn_without_fallback():
    fake = FakeProviders({"a": AttemptOutcome("failed", failure_class="bad_request"), "b": ACCEPT})
    outcome = turn(fake, {}, T0)
    assert (outcome.result, outcome.failure_class) == ("failed", "bad_request")
    assert fake.requests["b"] == 0


def test_r6_2_interrupted_stream_ends_the_turn_for_the_lifecycle():
    fake = FakeProviders({"a": AttemptOutcome("failed", failure_class="interrupted"), "b": ACCEPT})
    outcome = turn(fake, {}, T0)
    assert outcome.result == "interrupted" and fake.requests["b"] == 0


def test_r2_1_every_provider_failing_is_a_failed_turn():
    down = AttemptOutcome("failed", failure_class="timeout")
    outcome = turn(FakeProviders({"a": down, "b": down}), {}, T0)
    assert (outcome.result, outcome.failure_class) == ("failed", "timeout")


def test_r3_2_no_eligible_provider_is_no_provider():
    fake = FakeProviders({"a": ACCEPT, "b": ACCEPT})
    outcome = turn(fake, {"a": state(4), "b": state(4, provider="b")}, T0)
    assert outcome.result == "no_provider" and fake.requests == Counter()
    assert outcome.notices == ()  # the freeze already spoke; skipping is silent


def test_r3_5_fallback_card_lists_refusal_state_and_health_skips():
    fake = FakeProviders({"a": REFUSE, "b": ACCEPT, "c": ACCEPT})
    chain = (*CHAIN, ChainEntry("c", "model-c"))
    outcome = turn(
        fake,
        {"b": state(1, provider="b")},
        T0 + timedelta(minutes=1),
        chain=chain,
        health={"a": OPEN},
    )
    card = outcome.fallback_card
    assert card is not None and card["fallback_to"] == "c"
    (entry,) = card["refusal"]
    assert entry["provider_id"] == "b" and entry["state"] == "cooling"
    assert set(entry) >= {"provider_id", "model", "category", "refusals", "refused_at"}
    assert card["health"][0]["provider_id"] == "a" and card["health"][0]["state"] == "breaker_open"
    assert RULE_TEXT in card["text"]


def test_r3_3_skipped_turns_do_not_move_the_state():
    fake = FakeProviders({"a": REFUSE, "b": ACCEPT})
    before = {"a": state(2, when=T0)}
    for minutes in range(1, 60, 7):
        outcome = turn(fake, before, T0 + timedelta(minutes=minutes))
        assert outcome.refusals == before and outcome.recorded == ()
    assert fake.requests["a"] == 0


def test_r3_1_unknown_attempt_result_is_an_error():
    fake = FakeProviders({"a": AttemptOutcome("maybe"), "b": ACCEPT})  # type: ignore[arg-type]
    with pytest.raises(RoutingError):
        turn(fake, {}, T0)


# --- R3.9 the acceptance timeline, pure level -----------------------------------------


def test_r3_9_acceptance_timeline():
    """4, then 4+3, still 4+3 after 100 h, two dedupe keys, +1 after a boundary."""
    config = SegmentConfig("model-a", tool_surface=("search",))
    segment = first_segment("sess", config, T0)
    fake = FakeProviders({"a": REFUSE, "b": ACCEPT})
    store: dict[str, dict[str, ProviderRefusal]] = {}
    emitted: list[str] = []
    now = T0

    def run_turn(increment: bool = True):
        refusals = store.setdefault(segment.key, {})
        outcome = turn(fake, refusals, now, increment=increment, key=segment.key)
        store[segment.key] = outcome.refusals
        emitted.extend(n.dedupe_key for n in outcome.notices if n.dedupe_key not in emitted)
        return outcome

    run_turn()
    assert fake.requests["a"] == 4
    for step in (timedelta(minutes=15), timedelta(hours=1), timedelta(hours=6)):
        now += step
        run_turn()
    assert fake.requests["a"] == 4 + 3
    assert refusal_verdict(store[segment.key]["a"], now).state == "frozen"
    now += timedelta(hours=100)
    for _ in range(3):
        run_turn()
    assert fake.requests["a"] == 4 + 3  # not one more byte
    assert emitted == [f"provider-refusal:{segment.key}:0:a", f"provider-refusal:{segment.key}:3:a"]

    transition = apply_boundary(
        segment,
        BoundaryKind.TOOL_SURFACE_CHANGE,
        at=now,
        by="system",
        reason="tool surface changed",
        new_config=SegmentConfig("model-a", tool_surface=("search", "calculator")),
    )
    segment = transition.opened
    assert segment.key == segment_key("sess", 2)
    outcome = run_turn(increment=False)
    assert fake.requests["a"] == 4 + 3 + 1
    assert outcome.accepted_by == "b"


# --- properties ---------------------------------------------------------------------------

turn_plans = st.lists(
    st.tuples(st.integers(min_value=0, max_value=60 * 24 * 3), st.booleans()),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(turn_plans)
def test_r3_2_bounded_sends_per_segment_and_provider(plan):
    """Whatever the turns and clock advances: at most 1 + 3 segment-level sends."""
    fake = FakeProviders({"a": REFUSE, "b": ACCEPT})
    refusals: dict[str, ProviderRefusal] = {}
    now = T0
    turns_reaching_a = 0
    for minutes, increment in plan:
        now += timedelta(minutes=minutes)
        before = fake.requests["a"]
        refusals = turn(fake, refusals, now, increment=increment).refusals
        turns_reaching_a += fake.requests["a"] > before
    assert turns_reaching_a <= 1 + MAX_REFUSAL_REPROBES
    assert fake.requests["a"] <= 4 + MAX_REFUSAL_REPROBES


@settings(max_examples=200, deadline=None)
@given(turn_plans, st.sampled_from([REFUSE, ACCEPT, AttemptOutcome("failed", "server_error")]))
def test_r5_1_first_send_is_the_request_drive_turn_sends_first(plan, answer):
    """The claim admits the draw of ``first_send``'s request before the turn
    runs: it must be the one drive_turn sends first, whatever state it meets."""
    fake = FakeProviders({"a": answer, "b": REFUSE})
    refusals: dict[str, ProviderRefusal] = {}
    now = T0
    for minutes, increment in plan:
        now += timedelta(minutes=minutes)
        route = route_turn(CHAIN, now=now, health={}, refusals=refusals)
        expected = first_send(route, has_unaccepted_increment=increment)
        sent_before = len(fake.log)
        refusals = turn(fake, refusals, now, increment=increment).refusals
        if expected is None:
            assert len(fake.log) == sent_before
        else:
            assert fake.log[sent_before] == (expected[0].provider_id, expected[1])


@settings(max_examples=200, deadline=None)
@given(turn_plans)
def test_r3_3_skipped_turns_never_change_refused_at(plan):
    fake = FakeProviders({"a": REFUSE, "b": ACCEPT})
    refusals: dict[str, ProviderRefusal] = {}
    now = T0
    for minutes, increment in plan:
        now += timedelta(minutes=minutes)
        before = fake.requests["a"]
        previous = refusals.get("a")
        refusals = turn(fake, refusals, now, increment=increment).refusals
        if fake.requests["a"] == before:
            assert refusals.get("a") == previous


@settings(max_examples=100, deadline=None)
@given(turn_plans, st.sampled_from(list(BoundaryKind)))
def test_r3_8_a_boundary_makes_every_provider_eligible(plan, kind):
    fake = FakeProviders({"a": REFUSE, "b": REFUSE})
    segment = first_segment("s1", SegmentConfig("m", "chat", ("t",), "p"), T0)
    store: dict[str, dict[str, ProviderRefusal]] = {}
    now = T0
    for minutes, increment in plan:
        now += timedelta(minutes=minutes)
        store[segment.key] = turn(
            fake, store.get(segment.key, {}), now, increment=increment, key=segment.key
        ).refusals
    new_config = {
        BoundaryKind.MODEL_SWITCH: SegmentConfig("m2", "chat", ("t",), "p"),
        BoundaryKind.MODE_CHANGE: SegmentConfig("m", "agent", ("t",), "p"),
        BoundaryKind.TOOL_SURFACE_CHANGE: SegmentConfig("m", "chat", ("t", "u"), "p"),
        BoundaryKind.PROMPT_CHANGE: SegmentConfig("m", "chat", ("t",), "p2"),
    }.get(kind)
    new_session_id = "s2" if kind in NEW_SESSION_KINDS else None
    opened = apply_boundary(
        segment,
        kind,
        at=now,
        by="op",
        reason="r",
        new_session_id=new_session_id,
        new_config=new_config,
    ).opened
    assert opened.key not in store
    route = route_turn(CHAIN, now=now, health={}, refusals=store.get(opened.key, {}))
    assert [c.provider_id for c in route.candidates] == ["a", "b"]
    assert route.skipped == ()


def test_r5_2_exhausted_request_budget_ends_the_turn_on_every_provider():
    fake = FakeProviders(
        {"a": AttemptOutcome("failed", failure_class="budget_exhausted"), "b": ACCEPT}
    )
    outcome = turn(fake, {}, T0)
    assert (outcome.result, outcome.failure_class) == ("failed", "budget_exhausted")
    assert fake.requests["b"] == 0
    assert outcome.refusals == {}


def test_r6_3_why_no_candidate_separates_bytes_time_and_configuration():
    later = T0 + timedelta(minutes=2)
    frozen = route_turn(CHAIN, now=T0, health={}, refusals={"a": state(4), "b": state(4, "b")})
    assert why_no_candidate(frozen.skipped) == ("refused", None)
    mixed = route_turn(CHAIN, now=T0, health={"b": OPEN}, refusals={"a": state(4)})
    assert why_no_candidate(mixed.skipped) == ("breaker_open", later)
    disabled = HealthVerdict(False, "disabled", None, "auth failed")
    off = route_turn(CHAIN, now=T0, health={"a": disabled, "b": disabled}, refusals={})
    assert why_no_candidate(off.skipped) == ("unavailable", None)


def test_r6_3_providers_refused_in_this_turn_count_as_refused_bytes():
    fake = FakeProviders({"a": REFUSE, "b": REFUSE})
    outcome = turn(fake, {}, T0, increment=False)
    assert outcome.result == "no_provider" and outcome.skipped == ()
    refused = [r.provider_id for r in outcome.recorded]
    assert why_no_candidate(outcome.skipped, refused) == ("refused", None)
    assert why_no_candidate((), ()) == ("unavailable", None)


def test_r3_3_refused_at_is_the_moment_of_the_refusal_not_the_turn_start():
    refused_later = AttemptOutcome("refused", "policy", at=T0 + timedelta(minutes=3))
    fake = FakeProviders({"a": refused_later, "b": ACCEPT})
    outcome = turn(fake, {}, T0, increment=False)
    assert outcome.refusals["a"].refused_at == T0 + timedelta(minutes=3)
    verdict = refusal_verdict(outcome.refusals["a"], T0 + timedelta(minutes=16))
    assert verdict.state == "cooling"  # 15 min after the refusal, not after the turn began


# --- the turn's chain, and the stops that end a turn --------------------------------------


MODELS = {"a": "model-a", "b": "model-b", "c": "model-c"}


def test_r1_2_r8_3_the_segments_model_goes_first_to_the_provider_that_serves_it():
    """R8.3: a model switch moves the provider serving the new model first."""
    from governance.rules.routing import turn_chain

    assert turn_chain(["a", "b", "c"], MODELS, "model-c") == (
        ChainEntry("c", "model-c"),
        ChainEntry("a", "model-a"),
        ChainEntry("b", "model-b"),
    )
    assert turn_chain(["a", "b", "c"], MODELS, "model-a") == (
        ChainEntry("a", "model-a"),
        ChainEntry("b", "model-b"),
        ChainEntry("c", "model-c"),
    )


def test_r1_2_unknown_providers_are_left_out_and_models_stay_configured():
    from governance.rules.routing import turn_chain

    chain = turn_chain(["x", "a", "b"], {"a": "model-a", "b": "model-b"}, "model-b")
    assert chain == (ChainEntry("b", "model-b"), ChainEntry("a", "model-a"))
    assert turn_chain(["a", "b"], MODELS, "") == (
        ChainEntry("a", "model-a"),
        ChainEntry("b", "model-b"),
    )
    # Two providers serve the model: the first of the chain goes first, the other stays put.
    twins = {"a": "model-a", "b": "m", "c": "m"}
    assert [e.provider_id for e in turn_chain(["a", "b", "c"], twins, "m")] == ["b", "a", "c"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from("abcdef"), unique=True, min_size=1, max_size=6),
    st.dictionaries(st.sampled_from("abcdef"), st.sampled_from(["m1", "m2", "m3"])),
    st.sampled_from(["m1", "m2", "m3"]),
)
def test_r1_2_turn_chain_reorders_known_providers_and_keeps_the_rest_in_order(ids, models, seg):
    from governance.rules.routing import turn_chain

    chain = turn_chain(ids, models, seg)
    known = [pid for pid in ids if pid in models]
    assert sorted(e.provider_id for e in chain) == sorted(known)
    serving = [pid for pid in known if models[pid] == seg]
    if serving:
        assert chain[0] == ChainEntry(serving[0], seg)
        rest = [pid for pid in known if pid != serving[0]]
    else:
        rest = [e.provider_id for e in chain[1:]]
    assert [e.provider_id for e in chain[1:]] == rest
    assert all(e.model == models[e.provider_id] for e in chain[1:])


@pytest.mark.parametrize("failure", ["cancelled", "not_permitted"])
def test_r4_3_a_stop_or_a_missing_permission_ends_the_turn_without_falling_back(failure):
    fake = FakeProviders({"a": AttemptOutcome("failed", failure_class=failure), "b": ACCEPT})
    outcome = turn(fake, {}, T0)
    assert (outcome.result, outcome.failure_class) == ("failed", failure)
    assert fake.log == [("a", "original")] and fake.requests["b"] == 0
    assert outcome.refusals == {} and outcome.recorded == () and outcome.notices == ()


def test_r3_3_a_stop_during_the_quarantine_records_no_segment_refusal():
    def answer(_candidate, kind):
        return REFUSE if kind == "original" else AttemptOutcome("failed", failure_class="cancelled")

    fake = FakeProviders({"a": answer, "b": ACCEPT})
    outcome = turn(fake, {}, T0)
    assert fake.log == [("a", "original"), ("a", "re_render")]
    assert outcome.recorded == () and outcome.refusals == {} and outcome.notices == ()
    assert outcome.result == "failed" and outcome.failure_class == "cancelled"
