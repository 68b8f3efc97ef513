"""A person approves the exact call (R4.1, R4.2, R6.1).

An approval is one more owner's fact: the person who may answer owns the
"yes" or "no" for one recorded call (tool, arguments as sent, idempotency
key), never the run. A "no", or no answer in time, is a local fact the model
reads as the call's result, not a veto on the run (R4.2). The wait for a
person is its own clock: the no-progress clock does not run while a person is
asked, the overall deadline does (R6.1).

Pure: no I/O, no clock; times are arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from governance.rules.refusal import Notice


class ApprovalPolicy(StrEnum):
    NEVER = "never"  # the default: no person is asked
    SIDE_EFFECTS = "side_effects"  # every call whose effect class is not read-only
    ALWAYS = "always"


class ApprovalState(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    EXPIRED = "expired"


POLICIES = tuple(p.value for p in ApprovalPolicy)
DEFAULT_APPROVER_ROLE = "operator"
DEFAULT_WAIT = timedelta(hours=1)
WAIT_RANGE_S = (60.0, 7 * 24 * 3600.0)  # a minute to a week
DECISIONS = ("approve", "deny")
REASON_MAX = 500


def policy_for(
    server_policy: str, overrides: Mapping[str, str] | None, tool: str
) -> ApprovalPolicy:
    """The policy of one tool: its own override, else its server's."""
    return ApprovalPolicy((overrides or {}).get(tool) or server_policy or ApprovalPolicy.NEVER)


def needs_approval(policy: ApprovalPolicy | str, effect_class: str) -> bool:
    """Whether a call must wait for a person's yes. An effect class that is not
    read-only (external, or not known) counts as a side effect."""
    policy = ApprovalPolicy(policy)
    if policy is ApprovalPolicy.ALWAYS:
        return True
    return policy is ApprovalPolicy.SIDE_EFFECTS and effect_class != "read_only"


ApprovalStep = Literal["ask", "wait", "perform", "refused"]


def approval_step(required: bool, state: ApprovalState | str | None) -> ApprovalStep:
    """What a delivery of a tool call does about approval.

    - ``perform``: none needed, or a person said yes (the recorded call, once:
      its receipt then guards it like any call, R6.4);
    - ``ask``: needed and not asked yet — record the exact call and wait;
    - ``wait``: asked, nobody answered yet (a repeated delivery);
    - ``refused``: a person said no, or nobody answered in time (R4.2: the
      model reads it as the call's result and the run goes on).
    """
    if state is None:
        return "ask" if required else "perform"
    state = ApprovalState(state)
    if state is ApprovalState.PENDING:
        return "wait"
    if state is ApprovalState.APPROVED:
        return "perform"
    return "refused"


def refusal_words(
    state: ApprovalState | str, *, decided_by: str, reason: str, wait: timedelta
) -> str:
    """The call's result the model reads after a no or no answer."""
    if ApprovalState(state) is ApprovalState.EXPIRED:
        return f"not approved: no answer within {wait_words(wait)}; the call was not made"
    said = f": {reason}" if reason else ""
    return f"not approved by {decided_by}{said}; the call was not made"


def wait_words(wait: timedelta) -> str:
    """'1 h', '30 min', '1 h 30 min'."""
    minutes = round(wait.total_seconds() / 60)
    hours, minutes = divmod(minutes, 60)
    parts = [f"{hours} h"] if hours else []
    if minutes or not parts:
        parts.append(f"{minutes} min")
    return " ".join(parts)


@dataclass(frozen=True)
class DecisionFacts:
    """What decides whether one person's answer to one request counts."""

    state: ApprovalState | str
    expires_at: datetime
    approver_in_role: bool
    approver_submitted_run: bool
    four_eyes: bool
    run_settled: bool = False


def decision_refusal(facts: DecisionFacts, now: datetime) -> tuple[int, str] | None:
    """None when the answer counts; else (HTTP status, why) and nothing changes.

    409: the request is no longer open (decided, past its wait — the expiry
    stands — or its run settled meanwhile); 403: this person may not answer it (not in the role the
    policy names, or four eyes and they submitted the run themselves)."""
    state = ApprovalState(facts.state)
    if state is not ApprovalState.PENDING:
        return 409, f"already {state.value}"
    if not waits_for_answer(state, run_settled=facts.run_settled):
        return 409, "its run has settled (stopped, or past its deadline): nothing waits for it"
    if now >= facts.expires_at:
        return 409, "already expired: nobody answered within the wait"
    if not facts.approver_in_role:
        return 403, "only the role the tool's approval policy names has permission to answer"
    if facts.four_eyes and facts.approver_submitted_run:
        return 403, "four eyes: a call in a run you submitted needs someone else's answer"
    return None


def waits_for_answer(state: ApprovalState | str, *, run_settled: bool) -> bool:
    """A request a person can still answer: open, and its run not settled."""
    return ApprovalState(state) is ApprovalState.PENDING and not run_settled


def stage_awaits_person(
    kind: str, parked_at: datetime | None, finished_at: datetime | None
) -> bool:
    """A tool call parked and not finished waits for a person's answer (only
    an approval request parks a tool call; a model turn parks behind its
    thread's turn in flight)."""
    return kind == "tool_call" and parked_at is not None and finished_at is None


def expired(state: ApprovalState | str, expires_at: datetime, now: datetime) -> bool:
    """A pending request nobody answered within its wait."""
    return ApprovalState(state) is ApprovalState.PENDING and now >= expires_at


def approval_notice(
    *, key: str, tool: str, run_id: str, segment_key: str, role: str,
    requested_at: datetime, expires_at: datetime,
) -> Notice:  # fmt: skip
    """R3.6's notice for a request: the channels reach the people who may answer.
    Its dedupe key is the call's key: one notice per recorded call."""
    return Notice(
        dedupe_key=f"approval:{key}",
        severity="normal",
        text=(
            f"Approval needed: {tool} in run {run_id} waits for a yes or no from the {role} role "
            f"until {expires_at:%Y-%m-%d %H:%M} UTC; without an answer the call is not made."
        ),
        segment_key=segment_key,
        provider_ids=(),
        reprobes=0,
        created_at=requested_at,
    )
