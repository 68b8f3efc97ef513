"""Tests for governance.rules.connection (R7.1, with R6.5 settlement outcomes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.connection import (
    SETTLED_STATES,
    ConnectionEvent,
    ConnectionEventKind,
    ConnectionState,
    IllegalConnectionTransition,
    RunConnection,
    apply_connection_event,
)
from governance.rules.publication import SettlementOutcome

S = ConnectionState
DISCONNECT = ConnectionEvent.disconnect()
RECONNECT = ConnectionEvent.reconnect()
USER_STOP = ConnectionEvent.user_stop()


def settle(outcome: SettlementOutcome) -> ConnectionEvent:
    return ConnectionEvent.settle(outcome)


def run_events(*events: ConnectionEvent, start: RunConnection | None = None) -> RunConnection:
    connection = start or RunConnection()
    for event in events:
        connection = apply_connection_event(connection, event).after
    return connection


# --- the diagram's edges -------------------------------------------------------


def test_r7_1_disconnect_detaches_and_does_not_cancel():
    transition = apply_connection_event(RunConnection(), DISCONNECT)
    assert transition.state is S.DETACHED
    assert transition.after.user_stop_requested is False
    assert transition.starts_work is False
    assert transition.replays_original_events is False


def test_r7_1_reconnect_resubscribes_without_starting_work():
    detached = run_events(DISCONNECT)
    transition = apply_connection_event(detached, RECONNECT)
    assert transition.state is S.RUNNING
    assert transition.starts_work is False
    assert transition.replays_original_events is False


def test_r7_1_explicit_user_stop_requests_cancel():
    transition = apply_connection_event(RunConnection(), USER_STOP)
    assert transition.state is S.CANCEL_REQUESTED
    assert transition.after.user_stop_requested is True
    assert transition.starts_work is False


def test_r7_1_cancel_requested_settles_cancelled():
    connection = run_events(USER_STOP, settle(SettlementOutcome.CANCELLED))
    assert connection.state is S.SETTLED
    assert connection.settlement is SettlementOutcome.CANCELLED


@pytest.mark.parametrize("outcome", list(SettlementOutcome))
def test_r7_1_running_settles_with_any_outcome_after_stop_or_not(outcome):
    prefix = (USER_STOP,) if outcome is SettlementOutcome.CANCELLED else ()
    connection = run_events(*prefix, settle(outcome))
    assert connection.state is S.SETTLED
    assert connection.settlement is outcome


@pytest.mark.parametrize(
    "outcome", [SettlementOutcome.COMPLETED, SettlementOutcome.PARTIAL, SettlementOutcome.FAILED]
)
def test_r7_1_detached_settles(outcome):
    connection = run_events(DISCONNECT, settle(outcome))
    assert connection.state is S.SETTLED
    assert connection.settlement is outcome


def test_r7_1_reconnect_after_settlement_replays_original_events():
    settled = run_events(DISCONNECT, settle(SettlementOutcome.FAILED))
    transition = apply_connection_event(settled, RECONNECT)
    assert transition.state is S.REPLAY_ORIGINAL
    assert transition.replays_original_events is True
    assert transition.starts_work is False


def test_r7_1_replay_never_turns_old_failure_into_success():
    connection = run_events(
        settle(SettlementOutcome.FAILED), RECONNECT, DISCONNECT, RECONNECT, RECONNECT
    )
    assert connection.state is S.REPLAY_ORIGINAL
    assert connection.settlement is SettlementOutcome.FAILED


# --- decided edges ---------------------------------------------------------------


def test_r7_1_repeated_disconnect_and_reconnect_are_idempotent():
    assert run_events(DISCONNECT, DISCONNECT).state is S.DETACHED
    assert run_events(RECONNECT).state is S.RUNNING


def test_r7_1_user_stop_while_detached_is_still_an_explicit_stop():
    connection = run_events(DISCONNECT, USER_STOP)
    assert connection.state is S.CANCEL_REQUESTED
    assert connection.user_stop_requested is True


def test_r7_1_disconnect_after_stop_keeps_the_cancel_request():
    connection = run_events(USER_STOP, DISCONNECT)
    assert connection.state is S.CANCEL_REQUESTED
    connection = run_events(RECONNECT, USER_STOP, start=connection)
    assert connection.state is S.CANCEL_REQUESTED


def test_r7_1_cancel_requested_may_settle_with_what_actually_happened():
    # The answer may have finished before the stop took effect: R6.5 records facts.
    connection = run_events(USER_STOP, settle(SettlementOutcome.COMPLETED))
    assert connection.settlement is SettlementOutcome.COMPLETED


def test_r7_1_disconnect_after_replay_returns_to_settled():
    connection = run_events(settle(SettlementOutcome.PARTIAL), RECONNECT, DISCONNECT)
    assert connection.state is S.SETTLED
    assert connection.settlement is SettlementOutcome.PARTIAL


# --- illegal transitions -----------------------------------------------------------


def test_r7_1_disconnect_can_never_settle_cancelled():
    with pytest.raises(IllegalConnectionTransition) as caught:
        run_events(DISCONNECT, settle(SettlementOutcome.CANCELLED))
    assert caught.value.state is S.DETACHED
    assert caught.value.event.kind is ConnectionEventKind.SETTLE
    assert "detached" in str(caught.value)
    assert "settle(cancelled)" in str(caught.value)


def test_r7_1_running_without_stop_cannot_settle_cancelled():
    with pytest.raises(IllegalConnectionTransition, match="explicit user stop"):
        apply_connection_event(RunConnection(), settle(SettlementOutcome.CANCELLED))


@pytest.mark.parametrize("state", sorted(SETTLED_STATES))
def test_r6_5_r7_1_settlement_is_written_once(state):
    connection = RunConnection(state=state, settlement=SettlementOutcome.FAILED)
    with pytest.raises(IllegalConnectionTransition) as caught:
        apply_connection_event(connection, settle(SettlementOutcome.COMPLETED))
    assert caught.value.state is state
    assert str(state) in str(caught.value)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("state", sorted(SETTLED_STATES))
def test_r7_1_user_stop_after_settlement_is_illegal(state):
    connection = RunConnection(state=state, settlement=SettlementOutcome.COMPLETED)
    with pytest.raises(IllegalConnectionTransition, match="user_stop in state"):
        apply_connection_event(connection, USER_STOP)


# --- bad input -----------------------------------------------------------------------


def test_r7_1_settle_event_needs_an_outcome():
    with pytest.raises(ValueError, match="outcome"):
        ConnectionEvent(ConnectionEventKind.SETTLE)


def test_r7_1_non_settle_event_refuses_an_outcome():
    with pytest.raises(ValueError, match="no settlement outcome"):
        ConnectionEvent(ConnectionEventKind.DISCONNECT, SettlementOutcome.COMPLETED)


def test_r7_1_unknown_event_kind_and_outcome_are_rejected():
    with pytest.raises(ValueError):
        ConnectionEvent("hang_up")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ConnectionEvent.settle("done")  # type: ignore[arg-type]


def test_r7_1_event_kinds_accept_their_string_values():
    assert ConnectionEvent("user_stop").kind is ConnectionEventKind.USER_STOP  # type: ignore[arg-type]
    assert ConnectionEvent("settle", "partial").outcome is SettlementOutcome.PARTIAL  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "settlement", "stopped"),
    [
        (S.RUNNING, SettlementOutcome.COMPLETED, False),  # settlement on an unsettled run
        (S.SETTLED, None, False),  # settled without a settlement
        (S.CANCEL_REQUESTED, None, False),  # cancel without a user stop
        (S.SETTLED, SettlementOutcome.CANCELLED, False),  # cancelled without a user stop
    ],
)
def test_r7_1_inconsistent_connection_values_are_rejected(state, settlement, stopped):
    with pytest.raises(ValueError):
        RunConnection(state=state, settlement=settlement, user_stop_requested=stopped)


def test_r7_1_apply_rejects_wrong_types():
    with pytest.raises(ValueError, match="RunConnection"):
        apply_connection_event("running", DISCONNECT)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ConnectionEvent"):
        apply_connection_event(RunConnection(), "disconnect")  # type: ignore[arg-type]


# --- properties over any event sequence ---------------------------------------------------

events_strategy = st.one_of(
    st.just(DISCONNECT),
    st.just(RECONNECT),
    st.just(USER_STOP),
    st.sampled_from(list(SettlementOutcome)).map(ConnectionEvent.settle),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(events_strategy, max_size=30))
def test_r7_1_property_cancel_only_by_stop_no_running_after_settle_no_work(events):
    connection = RunConnection()
    stop_seen = False
    settled_with: SettlementOutcome | None = None
    for event in events:
        try:
            transition = apply_connection_event(connection, event)
        except IllegalConnectionTransition as error:
            # An illegal event leaves nothing behind and names state and event.
            assert error.state is connection.state
            assert error.event == event
            continue
        stop_seen = stop_seen or event.kind is ConnectionEventKind.USER_STOP
        after = transition.after
        assert transition.starts_work is False
        if after.state is S.CANCEL_REQUESTED or after.settlement is SettlementOutcome.CANCELLED:
            assert stop_seen, "reached cancel without an explicit user stop"
        if settled_with is not None:
            assert after.state in SETTLED_STATES, "after Settled an event led back to work"
            assert after.settlement is settled_with, "settlement changed after it was written"
        elif after.settlement is not None:
            settled_with = after.settlement
        assert transition.replays_original_events == (
            transition.before.state in SETTLED_STATES
            and event.kind is ConnectionEventKind.RECONNECT
        )
        connection = after


# The R7.1 diagram plus the decided edges, written out independently of the module.
EXPECTED_NEXT = {
    (S.RUNNING, "disconnect"): S.DETACHED,
    (S.RUNNING, "reconnect"): S.RUNNING,
    (S.RUNNING, "user_stop"): S.CANCEL_REQUESTED,
    (S.RUNNING, "settle"): S.SETTLED,
    (S.DETACHED, "disconnect"): S.DETACHED,
    (S.DETACHED, "reconnect"): S.RUNNING,
    (S.DETACHED, "user_stop"): S.CANCEL_REQUESTED,
    (S.DETACHED, "settle"): S.SETTLED,
    (S.CANCEL_REQUESTED, "disconnect"): S.CANCEL_REQUESTED,
    (S.CANCEL_REQUESTED, "reconnect"): S.CANCEL_REQUESTED,
    (S.CANCEL_REQUESTED, "user_stop"): S.CANCEL_REQUESTED,
    (S.CANCEL_REQUESTED, "settle"): S.SETTLED,
    (S.SETTLED, "disconnect"): S.SETTLED,
    (S.SETTLED, "reconnect"): S.REPLAY_ORIGINAL,
    (S.SETTLED, "user_stop"): None,
    (S.SETTLED, "settle"): None,
    (S.REPLAY_ORIGINAL, "disconnect"): S.SETTLED,
    (S.REPLAY_ORIGINAL, "reconnect"): S.REPLAY_ORIGINAL,
    (S.REPLAY_ORIGINAL, "user_stop"): None,
    (S.REPLAY_ORIGINAL, "settle"): None,
}


@pytest.mark.parametrize(("state", "kind"), sorted(EXPECTED_NEXT))
def test_r7_1_full_transition_table(state, kind):
    stopped = state is S.CANCEL_REQUESTED
    settlement = SettlementOutcome.FAILED if state in SETTLED_STATES else None
    connection = RunConnection(state, settlement, stopped)
    event = settle(SettlementOutcome.PARTIAL) if kind == "settle" else ConnectionEvent(kind)
    expected = EXPECTED_NEXT[(state, kind)]
    if expected is None:
        with pytest.raises(IllegalConnectionTransition):
            apply_connection_event(connection, event)
        return
    transition = apply_connection_event(connection, event)
    assert transition.state is expected
    assert transition.starts_work is False
