"""R8.2: which notifications make an incident, its key, who it asks for and
when it escalates next; R3.6: a notice carries the time of its fact."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from governance.rules.incidents import (
    IncidentState,
    escalation_tier,
    groups_into_incident,
    incident_key,
    may_acknowledge,
    may_resolve,
    needs_a_person,
    next_escalation_at,
)
from governance.rules.refusal import ProviderRefusal, refusal_notices

T0 = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_r8_2_only_a_segments_critical_notifications_make_an_incident():
    assert groups_into_incident("critical", "abc-g1#1")
    assert not groups_into_incident("normal", "abc-g1#1")
    assert not groups_into_incident("critical", None)
    assert not groups_into_incident("critical", "")


def test_r8_2_the_incident_key_names_the_segment_and_its_ordinal():
    assert incident_key("abc-g1#1", 1) == "incident:abc-g1#1:1"
    assert incident_key("abc-g1#1", 2) != incident_key("abc-g1#1", 1)
    with pytest.raises(ValueError):
        incident_key("abc-g1#1", 0)


@pytest.mark.parametrize(
    ("state", "person", "ack", "resolve"),
    [
        (IncidentState.TRIGGERED, True, True, True),
        (IncidentState.ACKNOWLEDGED, False, False, True),
        (IncidentState.RESOLVED, False, False, False),
    ],
)
def test_r8_2_only_a_triggered_incident_asks_for_a_person(state, person, ack, resolve):
    assert needs_a_person(state) is person
    assert may_acknowledge(state) is ack
    assert may_resolve(state) is resolve


def test_r8_2_the_next_escalation_is_one_interval_after_the_last_notice():
    interval = timedelta(minutes=15)
    assert (
        next_escalation_at("triggered", notified_at=T0, last_escalated_at=None, interval=interval)
        == T0 + interval
    )
    later = T0 + timedelta(minutes=20)
    assert (
        next_escalation_at("triggered", notified_at=T0, last_escalated_at=later, interval=interval)
        == later + interval
    )
    for state in ("acknowledged", "resolved"):
        assert (
            next_escalation_at(state, notified_at=T0, last_escalated_at=None, interval=interval)
            is None
        )


def test_r8_2_each_escalation_goes_to_the_next_tier_then_stays_on_the_last():
    assert [escalation_tier(level, 3) for level in range(5)] == [0, 1, 2, 2, 2]
    assert escalation_tier(0, 1) == escalation_tier(4, 1) == 0
    assert escalation_tier(2, 0) is None
    with pytest.raises(ValueError):
        escalation_tier(-1, 2)


def test_r3_6_a_freeze_notice_carries_the_refusal_that_froze_not_the_turns_start():
    turn_started = T0
    refused = T0 + timedelta(seconds=34)  # a provider that took 34 s to refuse
    notices = refusal_notices(
        "abc-g1#1", [ProviderRefusal("alpha", refusals=4, refused_at=refused)], turn_started
    )
    assert [n.severity for n in notices] == ["critical"]
    assert notices[0].created_at == refused
    first = refusal_notices(
        "abc-g1#1", [ProviderRefusal("beta", refusals=1, refused_at=refused)], turn_started
    )
    assert [n.created_at for n in first] == [refused]
