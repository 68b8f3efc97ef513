"""R4.1: owners speak only for their own effect (governance.rules.authority)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.answers import Answer
from governance.rules.authority import (
    AUTHORITY,
    FactKind,
    OutsideAuthorityError,
    Owner,
    OwnerFact,
    check_authority,
)
from tests.governance.owner_facts import GOAL, sample_fact

OWNED_KINDS = sorted(set().union(*AUTHORITY.values()))
CONCLUSIONS = (
    FactKind.RUN_FAILED,
    FactKind.RUN_COMPLETED,
    FactKind.ANSWER_CORRECT,
    FactKind.PERMISSION_GRANTED,
    FactKind.RECEIPT_REWRITTEN,
)

# ---------------------------------------------------------------------------
# R4.1 Owners speak only for their own effect


@pytest.mark.parametrize("kind", OWNED_KINDS)
def test_r4_1_each_owner_may_report_its_own_facts(kind: FactKind) -> None:
    fact = sample_fact(kind)
    assert fact.kind is kind
    assert kind in AUTHORITY[fact.owner]


def test_r4_1_every_fact_kind_has_at_most_one_owner() -> None:
    owners_of = {k: [o for o, kinds in AUTHORITY.items() if k in kinds] for k in FactKind}
    assert all(len(owners) <= 1 for owners in owners_of.values())
    assert {k for k, owners in owners_of.items() if not owners} == set(CONCLUSIONS)


def test_r4_1_tool_cannot_say_the_run_failed() -> None:
    with pytest.raises(OutsideAuthorityError, match="run lifecycle"):
        OwnerFact(Owner.EXECUTOR, FactKind.RUN_FAILED, "search#1")
    assert issubclass(OutsideAuthorityError, ValueError)


@pytest.mark.parametrize("owner", list(Owner))
@pytest.mark.parametrize("kind", CONCLUSIONS)
def test_r4_1_no_owner_may_report_a_run_level_conclusion(owner: Owner, kind: FactKind) -> None:
    with pytest.raises(OutsideAuthorityError):
        check_authority(owner, kind, "run-1")


@pytest.mark.parametrize(
    ("owner", "kind"),
    [
        (Owner.EXECUTOR, FactKind.CANCEL_REQUESTED),  # a tool is not the user
        (Owner.PUBLICATION, FactKind.ANSWER_CORRECT),  # committed is not correct
        (Owner.RESOURCE, FactKind.RUN_COMPLETED),  # a balance does not complete a task
        (Owner.PROVIDER, FactKind.RESOURCE_EXHAUSTED),
        (Owner.USER, FactKind.BODY_COMMITTED),
        (Owner.CLOCK, FactKind.IDENTITY_INVALID),
    ],
)
def test_r4_1_owner_cannot_report_another_owners_fact(owner: Owner, kind: FactKind) -> None:
    with pytest.raises(OutsideAuthorityError):
        check_authority(owner, kind, "x")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(Owner)), st.sampled_from(list(FactKind)))
def test_r4_1_authority_check_accepts_exactly_the_table(owner: Owner, kind: FactKind) -> None:
    try:
        check_authority(owner, kind, "tool_calls")
        accepted = True
    except OutsideAuthorityError:
        accepted = False
    assert accepted == (kind in AUTHORITY[owner])


def test_r4_1_resource_ledger_speaks_only_for_its_own_resource() -> None:
    with pytest.raises(OutsideAuthorityError, match="its own resource"):
        OwnerFact(
            Owner.RESOURCE, FactKind.RESOURCE_EXHAUSTED, "model_requests", reporter="web_searches"
        )
    fact = OwnerFact(
        Owner.RESOURCE, FactKind.RESOURCE_EXHAUSTED, "web_searches", reporter="web_searches"
    )
    assert fact.subject == "web_searches"


def test_r4_1_plain_strings_are_normalised_to_enums() -> None:
    fact = OwnerFact("executor", "operation_failed", "op-1")  # type: ignore[arg-type]
    assert fact.owner is Owner.EXECUTOR
    assert fact.kind is FactKind.OPERATION_FAILED


@pytest.mark.parametrize(
    "build",
    [
        lambda: OwnerFact("janitor", FactKind.OPERATION_FAILED, "op"),  # type: ignore[arg-type]
        lambda: OwnerFact(Owner.EXECUTOR, "exploded", "op"),  # type: ignore[arg-type]
        lambda: OwnerFact(Owner.EXECUTOR, FactKind.OPERATION_FAILED, "  "),
        lambda: OwnerFact(Owner.EXECUTOR, FactKind.EFFECT_UNKNOWN, "op"),  # no key
        lambda: OwnerFact(Owner.RESOURCE, FactKind.RESOURCE_EXHAUSTED, "gold_coins"),
        lambda: OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "b"),  # no version
        lambda: OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "b", version=0),
        lambda: OwnerFact(Owner.PUBLICATION, FactKind.BODY_COMMITTED, "b", version=True),
        lambda: OwnerFact(Owner.EXECUTOR, FactKind.OPERATION_FAILED, "op", version=2),
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TRANSIENT_FAILURE, "p"),  # no class
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TRANSIENT_FAILURE, "p", failure_class="refusal"),
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TRANSIENT_FAILURE, "p", failure_class="auth"),
        lambda: OwnerFact(
            Owner.PROVIDER, FactKind.NO_ELIGIBLE_PROVIDER, "p", failure_class="timeout"
        ),
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TURN_ANSWERED, "p"),  # no answer
        lambda: OwnerFact(Owner.PROVIDER, FactKind.TURN_CALLED_TOOLS, "p", answer=Answer(GOAL)),
    ],
)
def test_r4_1_malformed_facts_are_rejected(build) -> None:
    with pytest.raises(ValueError):
        build()
