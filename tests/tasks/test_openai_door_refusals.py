"""R3 across requests of the OpenAI-compatible door: a client that resends its
whole history (the refused bytes in its first message) every turn, the official
SDK against the live server, a real worker, loopback providers that count what
they receive, and the injected clock moved between turns so that the re-probe
schedule falls due — no sleeping for the rule's time."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance.models import (
    Notification,
    Provider,
    ProviderAttempt,
    Run,
    Segment,
    SegmentRefusal,
    Thread,
)
from governance.rules.refusal import BOUNDARY_ACTIONS_TEXT, RULE_TEXT, refusal_verdict
from governance.services import routes as route_services
from governance.services.refusals import refusal_of, reprobe_delays
from tests.tasks.openai_door import TRIGGER, LenientProvider, LoopbackProvider, history, sdk

pytestmark = pytest.mark.django_db(transaction=True)


def sent_to(model: str) -> int:
    """Requests the refusing loopback server received for ``model``."""
    return sum(1 for body in LoopbackProvider.requests if body["model"] == model)


def add_provider(provider_id: str, base_url: str) -> None:
    Provider.objects.create(
        provider_id=provider_id, kind="openai", model=f"{provider_id}-1", base_url=base_url,
        api_key_env="GOVERNANCE_KEY_ECHO",
    )  # fmt: skip


@pytest.fixture
def routes(door, provider_server, lenient_server, manual_clock):
    """``guarded``: strict (refuses the trigger) then lenient (answers anything);
    ``walled``: strict then stern, both refusing the trigger."""
    add_provider("strict", provider_server)
    add_provider("stern", provider_server)
    add_provider("lenient", lenient_server)
    for name, chain in (("guarded", ["strict", "lenient"]), ("walled", ["strict", "stern"])):
        route_services.create_route(name=name, provider_chain=chain, by="tests", now=manual_clock())


def test_a_refused_history_over_30_turns_costs_the_refuser_at_most_4_requests(
    live_server, worker, manual_clock, routes
):
    """R3.1 (a user's own words are not quarantined: one request), R3.2 (three
    re-probes, as they fall due, then frozen), R3.3 (skipped turns move no
    clock), R3.6 (two notices): 30 turns, 31 minutes apart, and 7 hours more
    before turns 20, 25 and 30 — past the longest delay, so a provider still
    cooling would have been re-probed there. Every turn is answered by the
    fallback; the refusing provider gets 4 requests in all."""
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "refused-30"})
    said = [{"role": "user", "content": f"What does {TRIGGER} mean?"}]
    sent_at_turn = []
    for turn in range(1, 31):
        if turn > 1:
            manual_clock.advance(minutes=31)
        if turn in (20, 25, 30):
            manual_clock.advance(hours=7)
        before = sent_to("strict-1")
        answer = client.chat.completions.create(model="guarded", messages=said)
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", (turn, choice)
        assert answer.model_extra["governance"]["provider_id"] == "lenient", turn
        assert choice.message.content == f"Echo: {said[-1]['content']}"
        sent_at_turn += [turn] * (sent_to("strict-1") - before)
        said += [
            {"role": "assistant", "content": choice.message.content},
            {"role": "user", "content": f"And turn {turn + 1}?"},
        ]
    # t = 0 refused; 31 min ≥ 15 min; 93 min ≥ 31 + 60; 465 min ≥ 93 + 360: frozen.
    assert sent_at_turn == [1, 2, 4, 16]
    assert sent_to("strict-1") == 4 and len(LenientProvider.requests) == 30

    thread = Thread.objects.get()
    segment = Segment.objects.get(thread=thread)  # one segment all along: no boundary
    assert thread.client_session_key == "refused-30"
    assert Run.objects.filter(thread=thread, status=Run.Status.SETTLED).count() == 30
    assert set(Run.objects.values_list("settlement__outcome", flat=True)) == {"completed"}
    assert history(thread) == [(m["role"], m["content"]) for m in said[:-1]]
    attempts = ProviderAttempt.objects.filter(provider__provider_id="strict").order_by(
        "started_at", "id"
    )
    assert [(a.kind, a.result) for a in attempts] == [("original", "refused")] + [
        ("re_probe", "refused")
    ] * 3
    assert {a.segment_id for a in attempts} == {segment.id}

    state = SegmentRefusal.objects.get(segment=segment, provider_id="strict")
    assert state.refusals == 4
    assert refusal_verdict(refusal_of(state), manual_clock(), reprobe_delays()).state == "frozen"
    assert not SegmentRefusal.objects.filter(provider_id="lenient").exists()
    notices = dict(
        Notification.objects.filter(segment=segment).values_list("dedupe_key", "severity")
    )
    assert notices == {
        f"provider-refusal:{segment.key}:0:strict": "normal",
        f"provider-refusal:{segment.key}:3:strict": "critical",
    }
    # The fallback was sent the client's whole history, the refused bytes first.
    assert LenientProvider.requests[-1]["messages"][0]["content"] == said[0]["content"]


def test_a_repeated_request_where_every_provider_is_cooling_sends_nothing(
    live_server, worker, manual_clock, routes
):
    """R3.2, R3.7: both providers of the route refused the first request; the
    same request five times more, minutes apart, sends nothing to either and
    answers ``content_filter`` at once, naming them, their state and the
    boundary that clears it; streamed too."""
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "walled-1"})
    said = [{"role": "user", "content": f"Say {TRIGGER}."}]
    first = client.chat.completions.create(model="walled", messages=said)
    assert first.choices[0].finish_reason == "content_filter"
    assert (sent_to("strict-1"), sent_to("stern-1")) == (1, 1)
    for _ in range(5):
        manual_clock.advance(minutes=2)
        again = client.chat.completions.create(model="walled", messages=said)
        choice = again.choices[0]
        assert choice.finish_reason == "content_filter" and not choice.message.content
        refusal = choice.message.refusal
        assert "by stern, strict" in refusal and RULE_TEXT in refusal
        assert "stern: cooling until" in refusal and "strict: cooling until" in refusal
        assert f"A boundary clears it: {BOUNDARY_ACTIONS_TEXT}." in refusal
        assert again.model_extra["governance"]["provider_id"] is None
    # Streamed, the same answer: no text, the refusal in the last chunk's delta.
    pieces = list(client.chat.completions.create(model="walled", messages=said, stream=True))
    assert "".join(p.choices[0].delta.content or "" for p in pieces if p.choices) == ""
    assert pieces[-1].choices[0].finish_reason == "content_filter"
    assert RULE_TEXT in pieces[-1].choices[0].delta.refusal
    assert (sent_to("strict-1"), sent_to("stern-1")) == (1, 1)  # not one byte more
    thread = Thread.objects.get()
    assert Segment.objects.filter(thread=thread).count() == 1
    assert Run.objects.filter(thread=thread).count() == 7
    assert ProviderAttempt.objects.count() == 2


def test_a_repeated_request_where_every_provider_is_frozen_sends_nothing(
    live_server, worker, manual_clock, routes
):
    """R3.2, R3.7: both providers refuse a first request and three re-probes
    (each a new request, as it falls due), so both are frozen in the segment;
    the refused request sent again five times, days apart, sends nothing and
    answers ``content_filter`` naming them frozen and the boundary that clears it."""
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "walled-2"})

    def ask(text: str):
        return client.chat.completions.create(
            model="walled", messages=[{"role": "user", "content": text}]
        )

    steps = (
        timedelta(0),
        timedelta(minutes=16),
        timedelta(minutes=61),
        timedelta(hours=6, minutes=1),
    )
    for attempt, step in enumerate(steps, start=1):
        manual_clock.advance(step)
        refused = ask(f"Say {TRIGGER}, attempt {attempt}.")
        assert refused.choices[0].finish_reason == "content_filter"
        assert (sent_to("strict-1"), sent_to("stern-1")) == (attempt, attempt)
    segment = Segment.objects.get()
    for state in SegmentRefusal.objects.filter(segment=segment):
        assert state.refusals == 4
        assert (
            refusal_verdict(refusal_of(state), manual_clock(), reprobe_delays()).state == "frozen"
        )
    for _ in range(5):
        # Past R2.3's turn memory (6 h): only the frozen state keeps it unsent.
        manual_clock.advance(hours=50)
        again = ask(f"Say {TRIGGER}, attempt 1.")
        choice = again.choices[0]
        assert choice.finish_reason == "content_filter" and not choice.message.content
        refusal = choice.message.refusal
        assert "stern: frozen since" in refusal and "strict: frozen since" in refusal
        assert RULE_TEXT in refusal and f"A boundary clears it: {BOUNDARY_ACTIONS_TEXT}." in refusal
    assert (sent_to("strict-1"), sent_to("stern-1")) == (4, 4)  # not one byte more
    assert Segment.objects.count() == 1 and Run.objects.count() == 9
    assert ProviderAttempt.objects.count() == 8


def test_a_client_that_goes_on_after_a_content_filter_stays_in_its_segment(
    live_server, worker, manual_clock, routes
):
    """R1.3, R3.2: a client keeps the refused turn in its history (its message
    and the empty answer the SDK handed back) and asks the next question
    minutes later: the same segment, both providers still cooling, nothing sent."""
    client = sdk(live_server).with_options(default_headers={"X-Session-Id": "walled-3"})
    said = [{"role": "user", "content": f"Say {TRIGGER}."}]
    for turn in range(1, 4):
        manual_clock.advance(minutes=1)
        answer = client.chat.completions.create(model="walled", messages=said)
        assert answer.choices[0].finish_reason == "content_filter"
        said += [
            answer.choices[0].message.model_dump(include={"role", "content", "refusal"}),
            {"role": "user", "content": f"Then tell me something else ({turn})."},
        ]
    assert Segment.objects.count() == 1
    assert (sent_to("strict-1"), sent_to("stern-1")) == (1, 1)
