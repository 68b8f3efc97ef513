"""R7.1: a browser connection observes a run; it is not the run.

```
Running ⇄ Detached         (disconnect unsubscribes; reconnect resubscribes)
Running → CancelRequested → Settled   (only an explicit user stop cancels)
Running → Settled, Detached → Settled
Settled → ReplayOriginal   (reconnect replays the original events)
```

What this module guarantees, whatever the event order:

- a disconnect never cancels: only ``user_stop`` leads to ``CancelRequested``, and a
  run settles ``cancelled`` only after a user stop;
- no transition starts work (``starts_work`` is always False): continuing after
  settlement needs a new, causally linked, independently admitted run (R6.4);
- after settlement nothing leads back to ``Running``, and the settlement outcome
  (R6.5) never changes: replaying never turns an old failure into a success.

Edges the diagram leaves implicit, decided here (at-least-once delivery makes
repeats normal, and a user's stop must never be lost):

- repeats are idempotent: disconnect while Detached, reconnect while Running,
  user stop while CancelRequested;
- a user stop while Detached (sent over the API while the stream is down) is still
  an explicit stop → CancelRequested;
- while CancelRequested, disconnect/reconnect only (un)subscribe: the stop stands;
- after settlement a disconnect just ends the subscription (→ Settled) and every
  reconnect replays the original events (→ ReplayOriginal).

Illegal: settling twice (R6.5 writes settlement once), a user stop after
settlement, and settling ``cancelled`` without a user stop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from governance.rules.publication import SettlementOutcome


class ConnectionState(StrEnum):
    RUNNING = "running"
    DETACHED = "detached"
    CANCEL_REQUESTED = "cancel_requested"
    SETTLED = "settled"
    REPLAY_ORIGINAL = "replay_original"


SETTLED_STATES = frozenset({ConnectionState.SETTLED, ConnectionState.REPLAY_ORIGINAL})


class ConnectionEventKind(StrEnum):
    DISCONNECT = "disconnect"  # the subscriber's transport went away
    RECONNECT = "reconnect"  # a subscriber (re)attached
    USER_STOP = "user_stop"  # an explicit user stop: the only cancel intent
    SETTLE = "settle"  # the lifecycle wrote the run's one settlement


class IllegalConnectionTransition(ValueError):
    """R7.1: the event is not allowed in this state. Names both."""

    def __init__(self, state: ConnectionState, event: ConnectionEvent, why: str) -> None:
        self.state = state
        self.event = event
        super().__init__(
            f"illegal connection transition: {event.describe()} in state {state}: {why}"
        )


@dataclass(frozen=True)
class ConnectionEvent:
    """R7.1: one event. ``outcome`` is required for ``settle`` and forbidden otherwise."""

    kind: ConnectionEventKind
    outcome: SettlementOutcome | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ConnectionEventKind(self.kind))
        if self.kind is ConnectionEventKind.SETTLE:
            if self.outcome is None:
                raise ValueError("a settle event needs its settlement outcome (R6.5)")
            object.__setattr__(self, "outcome", SettlementOutcome(self.outcome))
        elif self.outcome is not None:
            raise ValueError(f"a {self.kind} event carries no settlement outcome")

    @classmethod
    def disconnect(cls) -> ConnectionEvent:
        return cls(ConnectionEventKind.DISCONNECT)

    @classmethod
    def reconnect(cls) -> ConnectionEvent:
        return cls(ConnectionEventKind.RECONNECT)

    @classmethod
    def user_stop(cls) -> ConnectionEvent:
        return cls(ConnectionEventKind.USER_STOP)

    @classmethod
    def settle(cls, outcome: SettlementOutcome) -> ConnectionEvent:
        return cls(ConnectionEventKind.SETTLE, outcome)

    def describe(self) -> str:
        return f"settle({self.outcome})" if self.outcome is not None else str(self.kind)


@dataclass(frozen=True)
class RunConnection:
    """R7.1: a run as its connection sees it: state, settlement once written, stop intent."""

    state: ConnectionState = ConnectionState.RUNNING
    settlement: SettlementOutcome | None = None
    user_stop_requested: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", ConnectionState(self.state))
        if self.settlement is not None:
            object.__setattr__(self, "settlement", SettlementOutcome(self.settlement))
        settled = self.state in SETTLED_STATES
        if settled != (self.settlement is not None):
            raise ValueError(
                f"state {self.state} with settlement {self.settlement}: a settlement exists "
                "exactly when the run is settled"
            )
        if self.state is ConnectionState.CANCEL_REQUESTED and not self.user_stop_requested:
            raise ValueError("cancel_requested without a user stop: a disconnect never cancels")
        if self.settlement is SettlementOutcome.CANCELLED and not self.user_stop_requested:
            raise ValueError("settled cancelled without a user stop: a disconnect never cancels")


@dataclass(frozen=True)
class ConnectionTransition:
    """R7.1: the result of one event. ``starts_work`` is always False by construction."""

    before: RunConnection
    event: ConnectionEvent
    after: RunConnection
    starts_work: bool
    replays_original_events: bool

    @property
    def state(self) -> ConnectionState:
        return self.after.state


_S = ConnectionState
_E = ConnectionEventKind

# (state, event) → next state, for every event that is not settle.
_NEXT_STATE: dict[tuple[ConnectionState, ConnectionEventKind], ConnectionState] = {
    (_S.RUNNING, _E.DISCONNECT): _S.DETACHED,
    (_S.RUNNING, _E.RECONNECT): _S.RUNNING,
    (_S.RUNNING, _E.USER_STOP): _S.CANCEL_REQUESTED,
    (_S.DETACHED, _E.DISCONNECT): _S.DETACHED,
    (_S.DETACHED, _E.RECONNECT): _S.RUNNING,
    (_S.DETACHED, _E.USER_STOP): _S.CANCEL_REQUESTED,
    (_S.CANCEL_REQUESTED, _E.DISCONNECT): _S.CANCEL_REQUESTED,
    (_S.CANCEL_REQUESTED, _E.RECONNECT): _S.CANCEL_REQUESTED,
    (_S.CANCEL_REQUESTED, _E.USER_STOP): _S.CANCEL_REQUESTED,
    (_S.SETTLED, _E.DISCONNECT): _S.SETTLED,
    (_S.SETTLED, _E.RECONNECT): _S.REPLAY_ORIGINAL,
    (_S.REPLAY_ORIGINAL, _E.DISCONNECT): _S.SETTLED,
    (_S.REPLAY_ORIGINAL, _E.RECONNECT): _S.REPLAY_ORIGINAL,
}


def apply_connection_event(
    connection: RunConnection, event: ConnectionEvent
) -> ConnectionTransition:
    """R7.1: apply one event; raise ``IllegalConnectionTransition`` when it is not allowed."""
    if not isinstance(connection, RunConnection):
        raise ValueError(f"expected a RunConnection, got {connection!r}")
    if not isinstance(event, ConnectionEvent):
        raise ValueError(f"expected a ConnectionEvent, got {event!r}")
    state = connection.state
    settled = state in SETTLED_STATES

    if event.kind is ConnectionEventKind.SETTLE:
        if settled:
            raise IllegalConnectionTransition(
                state, event, f"the run already settled {connection.settlement}; R6.5 writes once"
            )
        if event.outcome is SettlementOutcome.CANCELLED and not connection.user_stop_requested:
            raise IllegalConnectionTransition(
                state, event, "only an explicit user stop cancels; a disconnect never does"
            )
        after = replace(connection, state=ConnectionState.SETTLED, settlement=event.outcome)
    else:
        next_state = _NEXT_STATE.get((state, event.kind))
        if next_state is None:
            # Only a user stop after settlement reaches here.
            raise IllegalConnectionTransition(
                state,
                event,
                f"the run already settled {connection.settlement}; a stop cannot change it",
            )
        after = replace(
            connection,
            state=next_state,
            user_stop_requested=connection.user_stop_requested
            or event.kind is ConnectionEventKind.USER_STOP,
        )

    return ConnectionTransition(
        before=connection,
        event=event,
        after=after,
        # The connection layer never dispatches: work only comes from the runner
        # under admission, and after settlement only from a new run (R6.4).
        starts_work=False,
        replays_original_events=settled and event.kind is ConnectionEventKind.RECONNECT,
    )
