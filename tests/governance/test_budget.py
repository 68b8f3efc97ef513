"""Tests for governance.rules.budget: R5.1 (one ledger, a view of it), R5.2 (own
balances, output reserve), R5.3 (retries draw from the same balance), R5.4
(idempotent admission)."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules.budget import (
    Admission,
    Balance,
    BudgetError,
    BudgetLimits,
    EntryKind,
    IdempotencyConflict,
    Ledger,
    LedgerEntry,
    Purpose,
    RefusalReason,
    Resource,
    admit,
    balance,
    find_admission,
    release,
)

LIMITS = BudgetLimits(
    model_requests=5,
    tool_calls=4,
    web_searches=2,
    provider_concurrency=2,
    body_revisions=3,
    output_reserve=2,
)
ORDINARY = [r for r in Resource if r is not Resource.OUTPUT_RESERVE]


def fresh() -> Ledger:
    return Ledger.open(LIMITS)


def used(ledger: Ledger, resource: Resource) -> int:
    return balance(ledger)[resource].used


# --------------------------------------------------------------------------- R5.1 view


def test_r5_1_balance_view_of_a_fresh_ledger():
    """R5.1: every resource has a view with limit, used 0 and remaining = limit."""
    view = balance(fresh())
    assert set(view) == set(Resource)
    for resource in Resource:
        assert view[resource] == Balance(
            limit=LIMITS.of(resource), used=0, remaining=LIMITS.of(resource)
        )


def test_r5_1_view_is_read_from_the_one_ledger():
    """R5.1: the view is derived from the entries; admitting appends one entry."""
    ledger, admission = admit(fresh(), Resource.TOOL_CALLS, 3, "tool-1", Purpose.ORIGINAL)
    assert admission.admitted
    assert len(ledger.entries) == 1
    assert balance(ledger)[Resource.TOOL_CALLS] == Balance(limit=4, used=3, remaining=1)
    assert admission.remaining == balance(ledger)[Resource.TOOL_CALLS].remaining
    # Mutating the returned view cannot change the ledger: there is no second ledger.
    view = balance(ledger)
    view[Resource.TOOL_CALLS] = Balance(limit=4, used=0, remaining=4)
    assert balance(ledger)[Resource.TOOL_CALLS].used == 3


def test_r5_1_ledger_is_frozen_and_append_only():
    """R5.1: the ledger value is immutable; admission returns a new one."""
    original = fresh()
    ledger, _ = admit(original, Resource.MODEL_REQUESTS, 1, "m-1", Purpose.ORIGINAL)
    assert original.entries == ()
    assert ledger.entries[: len(original.entries)] == original.entries
    with pytest.raises(FrozenInstanceError):
        ledger.entries = ()  # type: ignore[misc]


def test_r5_1_ledger_rebuilt_from_rows_with_strings():
    """R5.1: a ledger rebuilt from stored rows (plain strings) reads the same balance."""
    entry = LedgerEntry(
        kind="admit",
        idempotency_key="m-1",
        resource="model_requests",
        pool="model_requests",
        amount=2,
        purpose="retry",
    )
    ledger = Ledger(LIMITS, (entry,))
    assert entry.kind is EntryKind.ADMIT
    assert entry.purpose is Purpose.RETRY
    assert used(ledger, Resource.MODEL_REQUESTS) == 2


@pytest.mark.parametrize(
    "entries",
    [
        # the same key admitted twice
        (
            LedgerEntry(
                EntryKind.ADMIT, "k", Resource.TOOL_CALLS, Resource.TOOL_CALLS, 1, "original"
            ),
            LedgerEntry(
                EntryKind.ADMIT, "k", Resource.TOOL_CALLS, Resource.TOOL_CALLS, 1, "original"
            ),
        ),
        # over the limit
        (
            LedgerEntry(
                EntryKind.ADMIT, "k", Resource.WEB_SEARCHES, Resource.WEB_SEARCHES, 3, "original"
            ),
        ),
        # release without an acquisition
        (
            LedgerEntry(
                EntryKind.RELEASE,
                "k",
                Resource.PROVIDER_CONCURRENCY,
                Resource.PROVIDER_CONCURRENCY,
                1,
                "original",
            ),
        ),
        # release of a cumulative resource
        (
            LedgerEntry(
                EntryKind.ADMIT, "k", Resource.TOOL_CALLS, Resource.TOOL_CALLS, 1, "original"
            ),
            LedgerEntry(
                EntryKind.RELEASE, "k", Resource.TOOL_CALLS, Resource.TOOL_CALLS, 1, "original"
            ),
        ),
    ],
)
def test_r5_1_inconsistent_ledger_rows_are_rejected(entries):
    """R5.1: a ledger whose entries break the rules cannot be built."""
    with pytest.raises(BudgetError):
        Ledger(LIMITS, entries)


def test_r5_1_bad_entries_and_limits_are_rejected():
    """R5.1: malformed entries, entry containers and limits raise ValueError."""
    with pytest.raises(ValueError, match="cannot draw from"):
        LedgerEntry(
            EntryKind.ADMIT, "k", Resource.MODEL_REQUESTS, Resource.TOOL_CALLS, 1, "original"
        )
    with pytest.raises(ValueError, match="kind"):
        LedgerEntry("refund", "k", Resource.TOOL_CALLS, Resource.TOOL_CALLS, 1, "original")
    with pytest.raises(ValueError, match="tuple"):
        Ledger(LIMITS, [])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="LedgerEntry"):
        Ledger(LIMITS, ("not an entry",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="BudgetLimits"):
        Ledger({"model_requests": 1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tool_calls"):
        replace(LIMITS, tool_calls=-1)
    with pytest.raises(ValueError, match="web_searches"):
        replace(LIMITS, web_searches=1.5)
    with pytest.raises(ValueError, match="body_revisions"):
        replace(LIMITS, body_revisions=True)


# --------------------------------------------------------------------------- R5.2 own balances


def test_r5_2_admission_within_balance_is_admitted():
    """R5.2: an admission within the pool is admitted and reports the remaining balance."""
    ledger, admission = admit(fresh(), "web_searches", 1, "search-1", "original")
    assert admission == Admission(
        admitted=True,
        resource=Resource.WEB_SEARCHES,
        pool=Resource.WEB_SEARCHES,
        amount=1,
        idempotency_key="search-1",
        purpose=Purpose.ORIGINAL,
        remaining=1,
    )
    assert used(ledger, Resource.WEB_SEARCHES) == 1


def test_r5_2_exhausted_resource_refuses_without_changing_the_ledger():
    """R5.2: a refusal is a fact: same ledger back, refused admission with a reason."""
    ledger, _ = admit(fresh(), Resource.WEB_SEARCHES, 2, "search-1", Purpose.ORIGINAL)
    after, refused = admit(ledger, Resource.WEB_SEARCHES, 1, "search-2", Purpose.ORIGINAL)
    assert after is ledger
    assert refused.admitted is False
    assert refused.reason is RefusalReason.EXHAUSTED
    assert refused.remaining == 0
    assert find_admission(after, "search-2") is None


def test_r5_2_insufficient_balance_refuses_the_whole_amount():
    """R5.2: asking for more than remains is refused, nothing partially consumed."""
    ledger, _ = admit(fresh(), Resource.TOOL_CALLS, 3, "t-1", Purpose.ORIGINAL)
    after, refused = admit(ledger, Resource.TOOL_CALLS, 2, "t-2", Purpose.ORIGINAL)
    assert after is ledger
    assert refused.reason is RefusalReason.INSUFFICIENT
    assert refused.remaining == 1
    after, admitted = admit(ledger, Resource.TOOL_CALLS, 1, "t-3", Purpose.ORIGINAL)
    assert admitted.admitted and admitted.remaining == 0


def test_r5_2_search_quota_exhausted_refuses_only_searches():
    """R5.2: search quota exhausted refuses new searches, not tool calls (reading
    fetched results), model requests or body revisions."""
    ledger, _ = admit(fresh(), Resource.WEB_SEARCHES, 2, "s-1", Purpose.ORIGINAL)
    _, refused = admit(ledger, Resource.WEB_SEARCHES, 1, "s-2", Purpose.ORIGINAL)
    assert not refused.admitted
    for i, resource in enumerate(
        [Resource.TOOL_CALLS, Resource.MODEL_REQUESTS, Resource.BODY_REVISIONS]
    ):
        ledger, admission = admit(ledger, resource, 1, f"other-{i}", Purpose.ORIGINAL)
        assert admission.admitted, resource


@pytest.mark.parametrize("exhausted", ORDINARY)
def test_r5_2_exhausting_one_resource_leaves_the_others(exhausted):
    """R5.2: exhausting any one resource refuses only new uses of that resource."""
    ledger, _ = admit(fresh(), exhausted, LIMITS.of(exhausted), "all", Purpose.ORIGINAL)
    _, refused = admit(ledger, exhausted, 1, "one-more", Purpose.ORIGINAL)
    assert not refused.admitted
    for resource in ORDINARY:
        if resource is not exhausted:
            _, admission = admit(ledger, resource, 1, f"x-{resource}", Purpose.ORIGINAL)
            assert admission.admitted, resource
    _, final = admit(
        ledger, Resource.MODEL_REQUESTS, 1, "final", Purpose.ORIGINAL, for_finalization=True
    )
    assert final.admitted


def test_r5_2_ordinary_model_requests_never_reach_the_output_reserve():
    """R5.2: ordinary research budget exhausted does not touch the output reserve."""
    ledger = fresh()
    for i in range(LIMITS.model_requests):
        ledger, admission = admit(ledger, Resource.MODEL_REQUESTS, 1, f"m-{i}", Purpose.ORIGINAL)
        assert admission.admitted
    after, refused = admit(ledger, Resource.MODEL_REQUESTS, 1, "m-extra", Purpose.RETRY)
    assert after is ledger and not refused.admitted
    assert refused.pool is Resource.MODEL_REQUESTS
    reserve = balance(ledger)[Resource.OUTPUT_RESERVE]
    assert reserve == Balance(limit=2, used=0, remaining=2)


def test_r5_2_finalization_draws_from_the_reserve_only():
    """R5.2: finalization model requests draw from the output reserve, not model_requests."""
    ledger, admission = admit(
        fresh(), Resource.MODEL_REQUESTS, 1, "fin-1", Purpose.ORIGINAL, for_finalization=True
    )
    assert admission.admitted
    assert admission.resource is Resource.MODEL_REQUESTS
    assert admission.pool is Resource.OUTPUT_RESERVE
    assert admission.remaining == 1
    assert used(ledger, Resource.OUTPUT_RESERVE) == 1
    assert used(ledger, Resource.MODEL_REQUESTS) == 0


def test_r5_2_exhausted_reserve_refuses_finalization_even_with_ordinary_balance_left():
    """R5.2/R6.3: finalization uses the original reserve, never the research budget."""
    ledger, _ = admit(
        fresh(), Resource.MODEL_REQUESTS, 2, "fin-1", Purpose.ORIGINAL, for_finalization=True
    )
    after, refused = admit(
        ledger, Resource.MODEL_REQUESTS, 1, "fin-2", Purpose.RETRY, for_finalization=True
    )
    assert after is ledger
    assert not refused.admitted and refused.reason is RefusalReason.EXHAUSTED
    assert balance(ledger)[Resource.MODEL_REQUESTS].remaining == LIMITS.model_requests


def test_r5_2_reserve_is_not_admitted_directly_nor_by_other_resources():
    """R5.2: only model requests marked for finalization may draw the reserve."""
    with pytest.raises(BudgetError, match="for_finalization"):
        admit(fresh(), Resource.OUTPUT_RESERVE, 1, "r-1", Purpose.ORIGINAL)
    with pytest.raises(BudgetError, match="only model_requests"):
        admit(fresh(), Resource.TOOL_CALLS, 1, "t-1", Purpose.ORIGINAL, for_finalization=True)


def test_r5_2_zero_limit_refuses_every_use():
    """R5.2: a resource not granted (limit 0) is refused as exhausted."""
    ledger = Ledger.open(replace(LIMITS, web_searches=0))
    after, refused = admit(ledger, Resource.WEB_SEARCHES, 1, "s-1", Purpose.ORIGINAL)
    assert after is ledger and refused.reason is RefusalReason.EXHAUSTED


def test_r5_2_provider_concurrency_acquire_and_release():
    """R5.2: provider concurrency has its own limit; a release frees a slot for a new key."""
    ledger, a = admit(fresh(), Resource.PROVIDER_CONCURRENCY, 1, "slot-1", Purpose.ORIGINAL)
    ledger, b = admit(ledger, Resource.PROVIDER_CONCURRENCY, 1, "slot-2", Purpose.ORIGINAL)
    assert a.admitted and b.admitted
    _, full = admit(ledger, Resource.PROVIDER_CONCURRENCY, 1, "slot-3", Purpose.ORIGINAL)
    assert not full.admitted and full.reason is RefusalReason.EXHAUSTED
    ledger = release(ledger, "slot-1")
    assert balance(ledger)[Resource.PROVIDER_CONCURRENCY] == Balance(limit=2, used=1, remaining=1)
    ledger, c = admit(ledger, Resource.PROVIDER_CONCURRENCY, 1, "slot-3", Purpose.ORIGINAL)
    assert c.admitted


def test_r5_2_release_is_idempotent_and_a_released_key_stays_spent():
    """R5.2/R5.4: releasing twice frees once; re-admitting a released key is a duplicate."""
    ledger, _ = admit(fresh(), Resource.PROVIDER_CONCURRENCY, 1, "slot-1", Purpose.ORIGINAL)
    once = release(ledger, "slot-1")
    twice = release(once, "slot-1")
    assert twice is once
    assert used(twice, Resource.PROVIDER_CONCURRENCY) == 0
    again, dup = admit(twice, Resource.PROVIDER_CONCURRENCY, 1, "slot-1", Purpose.ORIGINAL)
    assert again is twice and dup.duplicate
    assert used(again, Resource.PROVIDER_CONCURRENCY) == 0


def test_r5_2_only_concurrency_is_released():
    """R5.2/R5.3: cumulative uses are never refunded; unknown keys cannot be released."""
    ledger, _ = admit(fresh(), Resource.TOOL_CALLS, 1, "t-1", Purpose.ORIGINAL)
    with pytest.raises(BudgetError, match="provider_concurrency"):
        release(ledger, "t-1")
    with pytest.raises(BudgetError, match="no admission"):
        release(ledger, "never")
    with pytest.raises(BudgetError, match="non-empty"):
        release(ledger, "")


# --------------------------------------------------------------------------- R5.3 same balance


@pytest.mark.parametrize("purpose", list(Purpose))
def test_r5_3_every_purpose_draws_from_the_same_balance(purpose):
    """R5.3: retries, re-probes, re-renders, continuations, recoveries consume like the original."""
    ledger, _ = admit(fresh(), Resource.MODEL_REQUESTS, 1, "orig", Purpose.ORIGINAL)
    ledger, admission = admit(ledger, Resource.MODEL_REQUESTS, 1, "again", purpose)
    assert admission.admitted
    assert admission.pool is Resource.MODEL_REQUESTS
    assert used(ledger, Resource.MODEL_REQUESTS) == 2
    assert find_admission(ledger, "again").purpose is Purpose(purpose)


def test_r5_3_no_fresh_retry_allowance_once_the_balance_is_spent():
    """R5.3: after retries spend the balance, neither a retry nor an original is admitted."""
    ledger = fresh()
    purposes = [
        Purpose.ORIGINAL,
        Purpose.RETRY,
        Purpose.RERENDER,
        Purpose.REPROBE,
        Purpose.RECOVERY,
    ]
    for i, purpose in enumerate(purposes):
        ledger, admission = admit(ledger, Resource.MODEL_REQUESTS, 1, f"m-{i}", purpose)
        assert admission.admitted
    for purpose in Purpose:
        after, refused = admit(ledger, Resource.MODEL_REQUESTS, 1, f"late-{purpose}", purpose)
        assert after is ledger and not refused.admitted


def test_r5_3_read_only_tool_calls_are_not_free():
    """R5.3: a read-only tool call consumes tool_calls like any other; there is no free path."""
    ledger = fresh()
    for i in range(LIMITS.tool_calls):
        ledger, admission = admit(ledger, Resource.TOOL_CALLS, 1, f"read-{i}", Purpose.RETRY)
        assert admission.admitted
    _, refused = admit(ledger, Resource.TOOL_CALLS, 1, "read-more", Purpose.RETRY)
    assert not refused.admitted


def test_r5_3_unknown_purpose_is_rejected():
    """R5.3: purposes are a closed set; a typo is bad input, not a free pass."""
    with pytest.raises(BudgetError, match="unknown purpose"):
        admit(fresh(), Resource.MODEL_REQUESTS, 1, "m-1", "free_retry")


# --------------------------------------------------------------------------- R5.4 idempotency


def test_r5_4_same_key_consumes_once():
    """R5.4: admitting the same key twice consumes once and says duplicate."""
    ledger, first = admit(fresh(), Resource.TOOL_CALLS, 2, "call-1", Purpose.ORIGINAL)
    again, second = admit(ledger, Resource.TOOL_CALLS, 2, "call-1", Purpose.ORIGINAL)
    assert again is ledger
    assert first.admitted and not first.duplicate
    assert second.admitted and second.duplicate
    assert second.remaining == first.remaining == 2
    assert used(again, Resource.TOOL_CALLS) == 2


def test_r5_4_duplicate_is_answered_even_when_the_pool_is_now_empty():
    """R5.4: a redelivered admission of an already-admitted key is not refused."""
    ledger, _ = admit(fresh(), Resource.WEB_SEARCHES, 1, "s-1", Purpose.ORIGINAL)
    ledger, _ = admit(ledger, Resource.WEB_SEARCHES, 1, "s-2", Purpose.ORIGINAL)
    again, dup = admit(ledger, Resource.WEB_SEARCHES, 1, "s-1", Purpose.ORIGINAL)
    assert again is ledger
    assert dup.admitted and dup.duplicate and dup.remaining == 0


def test_r5_4_refused_key_may_be_admitted_later():
    """R5.4: a refusal records nothing, so the same key can be admitted when a slot frees."""
    ledger, _ = admit(fresh(), Resource.PROVIDER_CONCURRENCY, 2, "slots", Purpose.ORIGINAL)
    _, refused = admit(ledger, Resource.PROVIDER_CONCURRENCY, 1, "wait", Purpose.ORIGINAL)
    assert not refused.admitted
    ledger = release(ledger, "slots")
    ledger, admitted = admit(ledger, Resource.PROVIDER_CONCURRENCY, 1, "wait", Purpose.ORIGINAL)
    assert admitted.admitted and not admitted.duplicate


@pytest.mark.parametrize(
    ("resource", "amount", "purpose", "for_finalization"),
    [
        (Resource.TOOL_CALLS, 1, Purpose.ORIGINAL, False),
        (Resource.MODEL_REQUESTS, 2, Purpose.ORIGINAL, False),
        (Resource.MODEL_REQUESTS, 1, Purpose.RETRY, False),
        (Resource.MODEL_REQUESTS, 1, Purpose.ORIGINAL, True),
    ],
)
def test_r5_4_same_key_for_a_different_use_is_a_conflict(
    resource, amount, purpose, for_finalization
):
    """R5.4: one key names one use: reusing it for another use is an error."""
    ledger, _ = admit(fresh(), Resource.MODEL_REQUESTS, 1, "k", Purpose.ORIGINAL)
    with pytest.raises(IdempotencyConflict, match="'k'"):
        admit(ledger, resource, amount, "k", purpose, for_finalization=for_finalization)
    assert issubclass(IdempotencyConflict, ValueError)


@pytest.mark.parametrize(
    ("resource", "amount", "key", "message"),
    [
        ("gpu_seconds", 1, "k", "unknown resource"),
        (Resource.TOOL_CALLS, 0, "k", "positive"),
        (Resource.TOOL_CALLS, -1, "k", "positive"),
        (Resource.TOOL_CALLS, 1.0, "k", "positive"),
        (Resource.TOOL_CALLS, True, "k", "positive"),
        (Resource.TOOL_CALLS, 1, "", "non-empty"),
        (Resource.TOOL_CALLS, 1, "   ", "non-empty"),
        (Resource.TOOL_CALLS, 1, None, "non-empty"),
    ],
)
def test_r5_4_bad_admission_input_raises(resource, amount, key, message):
    """R5.4/R5.2: unknown resource, amount <= 0, empty key are ValueErrors, not refusals."""
    with pytest.raises(ValueError, match=message):
        admit(fresh(), resource, amount, key, Purpose.ORIGINAL)


def test_r5_4_for_finalization_must_be_bool():
    """R5.2: the finalization flag is a bool, not a truthy value."""
    with pytest.raises(ValueError, match="bool"):
        admit(fresh(), Resource.MODEL_REQUESTS, 1, "k", Purpose.ORIGINAL, for_finalization=1)


# --------------------------------------------------------------------------- properties

small_limits = st.builds(
    BudgetLimits,
    model_requests=st.integers(0, 6),
    tool_calls=st.integers(0, 6),
    web_searches=st.integers(0, 6),
    provider_concurrency=st.integers(0, 4),
    body_revisions=st.integers(0, 6),
    output_reserve=st.integers(0, 3),
)
# (resource, amount, key index, purpose, for_finalization, release?)
operations = st.lists(
    st.tuples(
        st.sampled_from(ORDINARY),
        st.integers(1, 3),
        st.integers(0, 8),
        st.sampled_from(list(Purpose)),
        st.booleans(),
        st.booleans(),
    ),
    max_size=40,
)


def run_operations(limits, ops):
    """Apply ops; keys are scoped per (resource, amount, purpose, finalization) so
    repeats are true duplicates. Returns the ledger and the admitted key -> (pool, amount)."""
    ledger = Ledger.open(limits)
    admitted: dict[str, tuple[Resource, int]] = {}
    ordinary_reserve_seen = []
    for resource, amount, key_no, purpose, for_finalization, do_release in ops:
        final = for_finalization and resource is Resource.MODEL_REQUESTS
        key = f"{resource}:{amount}:{purpose}:{final}:{key_no}"
        if do_release and resource is Resource.PROVIDER_CONCURRENCY and key in admitted:
            ledger = release(ledger, key)
            continue
        reserve_before = balance(ledger)[Resource.OUTPUT_RESERVE].used
        new, admission = admit(ledger, resource, amount, key, purpose, for_finalization=final)
        if not final:
            ordinary_reserve_seen.append(
                (reserve_before, balance(new)[Resource.OUTPUT_RESERVE].used)
            )
        if not admission.admitted:
            assert new is ledger
        elif not admission.duplicate:
            assert key not in admitted
            admitted[key] = (admission.pool, amount)
        else:
            assert new is ledger and key in admitted
        ledger = new
    return ledger, admitted, ordinary_reserve_seen


@settings(max_examples=200, deadline=None)
@given(limits=small_limits, ops=operations)
def test_r5_2_property_used_never_exceeds_limit(limits, ops):
    """R5.2: over any sequence of admissions and releases, used <= limit everywhere."""
    ledger, _, _ = run_operations(limits, ops)
    for view in balance(ledger).values():
        assert 0 <= view.used <= view.limit
        assert view.remaining == view.limit - view.used


@settings(max_examples=200, deadline=None)
@given(limits=small_limits, ops=operations)
def test_r5_2_property_ordinary_admissions_never_reduce_the_reserve(limits, ops):
    """R5.2: no ordinary admission changes the output reserve's usage."""
    _, _, seen = run_operations(limits, ops)
    for before, after in seen:
        assert before == after


@settings(max_examples=200, deadline=None)
@given(limits=small_limits, ops=operations)
def test_r5_4_property_consumed_equals_sum_over_distinct_admitted_keys(limits, ops):
    """R5.4: each key consumes once; consumption equals the sum over distinct admitted keys
    (minus released concurrency slots)."""
    ledger, admitted, _ = run_operations(limits, ops)
    released = {e.idempotency_key for e in ledger.entries if e.kind is EntryKind.RELEASE}
    view = balance(ledger)
    for resource in Resource:
        expected = sum(
            amount
            for key, (pool, amount) in admitted.items()
            if pool is resource and key not in released
        )
        assert view[resource].used == expected
    admit_keys = [e.idempotency_key for e in ledger.entries if e.kind is EntryKind.ADMIT]
    assert sorted(admit_keys) == sorted(admitted)
    # the ledger value always re-validates: it could be stored and rebuilt
    assert Ledger(ledger.limits, ledger.entries) == ledger


@settings(max_examples=200, deadline=None)
@given(
    resource=st.sampled_from(ORDINARY),
    amount=st.integers(1, 3),
    repeats=st.integers(1, 10),
)
def test_r5_4_property_same_key_n_times_consumes_once(resource, amount, repeats):
    """R5.4: the same key admitted N times consumes its amount exactly once."""
    ledger = Ledger.open(LIMITS)
    answers = []
    for _ in range(repeats):
        ledger, admission = admit(ledger, resource, amount, "the-key", Purpose.RETRY)
        answers.append(admission)
    consumed = amount if answers[0].admitted else 0
    assert used(ledger, resource) == consumed
    assert len(ledger.entries) == (1 if answers[0].admitted else 0)
    if answers[0].admitted:
        assert all(a.duplicate for a in answers[1:])
