"""Tests for governance.rules.publication (R7.2, R7.3, R7.4, with R6.5 settlement outcomes)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from governance.rules import discrepancies as disc
from governance.rules import publication as pub
from governance.rules.discrepancies import DISCREPANCY_CODES, delivery_discrepancies
from governance.rules.publication import (
    AttachmentFacts,
    CallbackStatus,
    ChunkFacts,
    ChunkVersionConflict,
    DeliveryVerdict,
    Publication,
    PublicationError,
    SaveOutcome,
    SettlementOutcome,
    commit_chunk,
    declare_attachment,
    delivery_evidence,
    generate_chunk,
    mark_attachment_saved,
    mark_chunk_sent,
    record_client_ack,
    save_outcome,
    settlement_from_facts,
)

OUT = SettlementOutcome
CB = CallbackStatus


def body(total: int, *, committed: int | None = None, sent=None, ack: int = 0) -> Publication:
    """A body of ``total`` chunks (last one final), ``committed`` of them committed."""
    committed = total if committed is None else committed
    sent = range(1, committed + 1) if sent is None else sent
    p = Publication()
    for chunk_id in range(1, total + 1):
        p = generate_chunk(p, chunk_id, final=chunk_id == total)
    for chunk_id in range(1, committed + 1):
        p = commit_chunk(p, chunk_id, version=10 + chunk_id)
    for chunk_id in sent:
        p = mark_chunk_sent(p, chunk_id)
    return record_client_ack(p, ack) if ack else p


def codes(**kwargs) -> list[str]:
    return [d.code for d in delivery_discrepancies(**kwargs)]


# --- R7.2 ordering of the four facts ------------------------------------------------


def test_r7_2_four_separate_facts_per_chunk():
    p = generate_chunk(Publication(), 1)
    c = p.chunk(1)
    assert (c.generated, c.committed, c.sent, c.observed) == (True, False, False, False)
    p = commit_chunk(p, 1, version=3)
    c = p.chunk(1)
    assert (c.committed, c.committed_version, c.sent, c.observed) == (True, 3, False, False)
    p = mark_chunk_sent(p, 1)
    assert (p.chunk(1).sent, p.chunk(1).observed) == (True, False)
    p = record_client_ack(p, 1)
    assert p.chunk(1).observed is True


def test_r7_2_cannot_commit_what_was_not_generated():
    with pytest.raises(PublicationError, match="never generated"):
        commit_chunk(Publication(), 1, version=1)


def test_r7_2_cannot_send_what_was_not_committed():
    p = generate_chunk(Publication(), 1)
    with pytest.raises(PublicationError, match="not committed"):
        mark_chunk_sent(p, 1)


def test_r7_2_commit_follows_body_order():
    p = generate_chunk(generate_chunk(Publication(), 1), 2)
    with pytest.raises(PublicationError, match="before chunk 1"):
        commit_chunk(p, 2, version=1)


def test_r7_2_generation_follows_id_order_and_stops_at_final():
    with pytest.raises(PublicationError, match="next chunk id is 1"):
        generate_chunk(Publication(), 2)
    p = generate_chunk(Publication(), 1, final=True)
    with pytest.raises(PublicationError, match="ended the body"):
        generate_chunk(p, 2)


def test_r7_2_repeats_are_idempotent():
    p = body(2, ack=2)
    assert generate_chunk(p, 1) == p
    assert generate_chunk(p, 2, final=True) == p
    assert commit_chunk(p, 1, version=11) == p
    assert mark_chunk_sent(p, 2) == p
    assert record_client_ack(p, 2) == p
    q = declare_attachment(Publication(), "report.pdf")
    assert declare_attachment(q, "report.pdf") == q
    q = mark_attachment_saved(q, "report.pdf")
    assert mark_attachment_saved(q, "report.pdf") == q


def test_r7_2_r6_4_committed_version_is_never_reinvented():
    p = body(1)
    with pytest.raises(ChunkVersionConflict, match="version 11"):
        commit_chunk(p, 1, version=12)


def test_r7_2_final_flag_cannot_change_on_repeat():
    p = generate_chunk(Publication(), 1)
    with pytest.raises(PublicationError, match="final=False"):
        generate_chunk(p, 1, final=True)


def test_r7_2_observed_requires_committed_not_sent():
    # Decision: a client ack is stronger than our send bookkeeping; observed needs committed.
    p = body(2, sent=[])
    p = record_client_ack(p, 2)
    assert p.observed_ids == {1, 2}
    assert p.sent_ids == frozenset()
    p = body(2, committed=1)
    p = record_client_ack(p, 2)
    assert p.observed_ids == {1}


# --- R7.2/R7.3 acks ----------------------------------------------------------------------


def test_r7_3_ack_observes_every_committed_chunk_up_to_the_highest_contiguous_id():
    p = record_client_ack(body(5), 3)
    assert p.observed_ids == {1, 2, 3}
    assert p.client_ack_through == 3


def test_r7_3_stale_ack_changes_nothing():
    p = record_client_ack(body(5), 4)
    assert record_client_ack(p, 2) == p


def test_r7_3_ack_beyond_committed_is_kept_as_impossible_evidence():
    p = record_client_ack(body(3, committed=1), 3)
    assert p.observed_ids == {1}
    assert p.impossible_ack_through == 3
    # A later commit does not make the earlier (impossible) claim true retroactively.
    p = commit_chunk(p, 2, version=5)
    assert p.observed_ids == {1}
    assert p.impossible_ack_through == 3


@pytest.mark.parametrize("bad", [-1, True, 1.0, "3", None])
def test_r7_3_bad_ack_is_rejected(bad):
    with pytest.raises(PublicationError):
        record_client_ack(body(1), bad)


# --- R7.2 failures do not erase, first chunk is not the answer, attachments apart ---------


def test_r7_2_failing_second_chunk_does_not_erase_committed_first():
    p = body(2, committed=1)  # chunk 2 was generated, its commit failed
    assert p.committed_ids == {1}
    assert p.chunk(1).committed_version == 11
    assert save_outcome(p) is SaveOutcome.PARTIAL
    assert settlement_from_facts(precomputed=OUT.PARTIAL, publication=p).outcome is OUT.PARTIAL
    failed = settlement_from_facts(precomputed=OUT.FAILED, publication=p)
    assert failed.outcome is OUT.FAILED  # R4.1: publication narrows, never widens
    assert "1 chunk(s) were committed; they stay" in failed.reason
    assert p.chunk(1).committed_version == 11


def test_r7_2_first_chunk_does_not_make_the_answer_complete():
    p = body(3, committed=1)
    assert p.body_complete is False
    p = generate_chunk(commit_chunk(generate_chunk(Publication(), 1), 1, 1), 2)
    assert p.body_complete is False  # no final chunk yet
    assert settlement_from_facts(precomputed=OUT.COMPLETED, publication=p).outcome is OUT.PARTIAL


def test_r7_2_body_saved_is_not_attachments_saved():
    p = declare_attachment(body(2), "chart.png")
    assert p.body_complete is True
    assert p.attachments_saved is False
    assert save_outcome(p) is SaveOutcome.PARTIAL
    assert save_outcome(mark_attachment_saved(p, "chart.png")) is SaveOutcome.COMPLETE


def test_r7_2_saving_an_undeclared_attachment_is_rejected():
    with pytest.raises(PublicationError, match="never declared"):
        mark_attachment_saved(Publication(), "x.csv")


def test_r7_2_attachment_id_must_be_a_nonempty_string():
    with pytest.raises(PublicationError):
        declare_attachment(Publication(), "")
    with pytest.raises(PublicationError):
        AttachmentFacts(attachment_id=7)  # type: ignore[arg-type]


# --- bad values --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "1"])
def test_r7_2_chunk_ids_and_versions_must_be_positive_integers(bad):
    with pytest.raises(PublicationError):
        generate_chunk(Publication(), bad)
    with pytest.raises(PublicationError):
        commit_chunk(generate_chunk(Publication(), 1), 1, version=bad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: ChunkFacts(1, sent=True),
        lambda: ChunkFacts(1, observed=True),
        lambda: Publication(chunks=(ChunkFacts(2),)),
        lambda: Publication(chunks=(ChunkFacts(1), ChunkFacts(2, committed_version=1))),
        lambda: Publication(chunks=(ChunkFacts(1),), final_chunk_id=2),
        lambda: Publication(chunks=(ChunkFacts(1, 1, observed=True),), client_ack_through=0),
        lambda: Publication(client_ack_through=1, impossible_ack_through=2),
        lambda: Publication(client_ack_through=-1),
        lambda: Publication(attachments=(AttachmentFacts("a"), AttachmentFacts("a"))),
        lambda: Publication(chunks=("chunk",)),  # type: ignore[arg-type]
    ],
)
def test_r7_2_contradictory_fact_values_are_rejected(make):
    with pytest.raises(PublicationError):
        make()


# --- R7.3 settlement from committed facts ----------------------------------------------


def test_r7_3_partial_save_overrides_the_pre_save_complete():
    decision = settlement_from_facts(precomputed=OUT.COMPLETED, publication=body(3, committed=2))
    assert decision.outcome is OUT.PARTIAL
    assert decision.save is SaveOutcome.PARTIAL
    assert "does not stand" in decision.reason


def test_r7_3_complete_save_keeps_completed():
    decision = settlement_from_facts(precomputed=OUT.COMPLETED, publication=body(3))
    assert decision.outcome is OUT.COMPLETED
    assert decision.save is SaveOutcome.COMPLETE


def test_r7_3_r4_4_nothing_saved_settles_failed():
    for precomputed in (OUT.COMPLETED, OUT.PARTIAL, OUT.FAILED):
        decision = settlement_from_facts(precomputed=precomputed, publication=Publication())
        assert decision.outcome is OUT.FAILED


def test_r7_3_cancelled_stays_cancelled_whatever_was_saved():
    for p in (Publication(), body(2, committed=1), body(2)):
        assert (
            settlement_from_facts(precomputed=OUT.CANCELLED, publication=p).outcome is OUT.CANCELLED
        )


def test_r7_3_partial_is_never_upgraded_by_a_complete_save():
    assert (
        settlement_from_facts(precomputed=OUT.PARTIAL, publication=body(2)).outcome is OUT.PARTIAL
    )


def test_r7_3_unreadable_chunk_facts_prove_no_complete_body():
    """No publication (rows that break R7.2): 'completed' cannot stand; the rest stands."""
    decision = settlement_from_facts(precomputed=OUT.COMPLETED, publication=None)
    assert decision.outcome is OUT.PARTIAL and decision.save is None
    assert "unreadable" in decision.reason
    for precomputed in (OUT.PARTIAL, OUT.FAILED, OUT.CANCELLED):
        decision = settlement_from_facts(precomputed=precomputed, publication=None)
        assert decision.outcome is precomputed and decision.save is None


def test_r7_3_settlement_rejects_unknown_precomputed_outcome():
    with pytest.raises(ValueError):
        settlement_from_facts(precomputed="complete", publication=body(1))  # type: ignore[arg-type]


# --- R7.3 delivery evidence -------------------------------------------------------------


def test_r7_3_no_acks_means_no_client_evidence():
    evidence = delivery_evidence(body(2))
    assert evidence.verdict is DeliveryVerdict.NO_CLIENT_EVIDENCE
    assert evidence.client_received_everything is None
    assert "no client evidence" in evidence.text
    assert (evidence.committed, evidence.sent, evidence.observed) == (2, 2, 0)


def test_r7_3_all_committed_observed_on_a_complete_body_is_everything():
    evidence = delivery_evidence(body(2, ack=2))
    assert evidence.verdict is DeliveryVerdict.CLIENT_RECEIVED_ALL_COMMITTED
    assert evidence.client_received_everything is True


def test_r7_3_all_committed_observed_on_an_incomplete_body_is_not_everything():
    evidence = delivery_evidence(body(3, committed=2, ack=2))
    assert evidence.verdict is DeliveryVerdict.CLIENT_RECEIVED_ALL_COMMITTED
    assert evidence.client_received_everything is False
    assert "not complete" in evidence.text


def test_r7_3_part_observed():
    evidence = delivery_evidence(body(3, ack=1))
    assert evidence.verdict is DeliveryVerdict.CLIENT_RECEIVED_PART
    assert evidence.client_received_everything is False
    assert evidence.observed == 1


def test_r7_3_nothing_committed_has_nothing_to_deliver():
    evidence = delivery_evidence(Publication())
    assert evidence.verdict is DeliveryVerdict.NOTHING_COMMITTED
    assert evidence.client_received_everything is None


def test_r7_3_evidence_says_attachment_downloads_are_not_tracked():
    assert "not tracked" in delivery_evidence(declare_attachment(body(1), "a")).text


# --- R7.4 discrepancy list ---------------------------------------------------------------


def test_r7_4_everything_agrees_gives_no_discrepancy():
    assert (
        codes(settlement=OUT.COMPLETED, publication=body(3, ack=3), callback=CB.DELIVERED_COMPLETED)
        == []
    )
    assert (
        codes(settlement=OUT.FAILED, publication=Publication(), callback=CB.DELIVERED_FAILED) == []
    )
    assert codes(settlement=None, publication=body(2, committed=1), callback=CB.PENDING) == []


def test_r7_4_completed_with_chunks_never_observed():
    assert codes(settlement=OUT.COMPLETED, publication=body(3, ack=2), callback=CB.NONE) == [
        disc.CHUNKS_NEVER_OBSERVED
    ]


def test_r7_4_completed_with_no_client_evidence():
    found = delivery_discrepancies(settlement=OUT.COMPLETED, publication=body(2), callback=CB.NONE)
    assert [d.code for d in found] == [disc.NO_CLIENT_EVIDENCE]
    assert "no client evidence" in found[0].text


def test_r7_4_committed_chunks_never_sent():
    found = delivery_discrepancies(
        settlement=OUT.PARTIAL, publication=body(3, committed=2, sent=[1], ack=1), callback=CB.NONE
    )
    assert [d.code for d in found] == [disc.COMMITTED_NEVER_SENT, disc.CHUNKS_NEVER_OBSERVED]
    assert found[0].text.endswith("never sent: 2")


def test_r7_4_callback_said_complete_while_settlement_partial():
    found = delivery_discrepancies(
        settlement=OUT.PARTIAL,
        publication=body(3, committed=2, ack=2),
        callback=CB.DELIVERED_COMPLETED,
    )
    assert [d.code for d in found] == [disc.CALLBACK_SAID_COMPLETED]
    assert "partial" in found[0].text


@pytest.mark.parametrize(
    ("settlement", "callback"),
    [
        (OUT.COMPLETED, CB.DELIVERED_PARTIAL),
        (OUT.PARTIAL, CB.DELIVERED_FAILED),
        (OUT.CANCELLED, CB.DELIVERED_FAILED),
    ],
)
def test_r7_4_any_other_callback_settlement_mismatch(settlement, callback):
    p = body(2, ack=2) if settlement is not OUT.PARTIAL else body(3, committed=2, ack=2)
    assert codes(settlement=settlement, publication=p, callback=callback) == [
        disc.CALLBACK_OUTCOME_MISMATCH
    ]


def test_r7_4_callback_before_settlement():
    assert codes(settlement=None, publication=body(1), callback=CB.DELIVERED_COMPLETED) == [
        disc.CALLBACK_BEFORE_SETTLEMENT
    ]


def test_r7_4_callback_delivery_failed():
    assert codes(
        settlement=OUT.COMPLETED, publication=body(1, ack=1), callback=CB.DELIVERY_FAILED
    ) == [disc.CALLBACK_DELIVERY_FAILED]


def test_r7_4_effects_left_unknown():
    found = delivery_discrepancies(
        settlement=OUT.FAILED,
        publication=Publication(),
        callback=CB.NONE,
        unknown_effects=("tool:send_mail#7",),
    )
    assert [d.code for d in found] == [disc.EFFECTS_UNKNOWN]
    assert "send_mail#7" in found[0].text


def test_r7_4_unknown_effects_while_unsettled_are_in_flight_not_flagged():
    assert (
        codes(settlement=None, publication=Publication(), callback=CB.NONE, unknown_effects=["e"])
        == []
    )


def test_r7_4_settled_completed_with_zero_committed_chunks():
    assert codes(settlement=OUT.COMPLETED, publication=Publication(), callback=CB.NONE) == [
        disc.COMPLETED_WITHOUT_COMMITTED_BODY
    ]


def test_r7_4_completed_with_incomplete_body_or_unsaved_attachments():
    assert codes(
        settlement=OUT.COMPLETED, publication=body(3, committed=2, ack=2), callback=CB.NONE
    ) == [disc.COMPLETED_BODY_INCOMPLETE]
    p = declare_attachment(body(1, ack=1), "a.pdf")
    assert codes(settlement=OUT.COMPLETED, publication=p, callback=CB.NONE) == [
        disc.COMPLETED_ATTACHMENTS_UNSAVED
    ]


def test_r7_4_partial_without_material_and_failed_with_material():
    assert codes(settlement=OUT.PARTIAL, publication=Publication(), callback=CB.NONE) == [
        disc.PARTIAL_WITHOUT_SAVED_MATERIAL
    ]
    assert codes(
        settlement=OUT.FAILED, publication=body(2, committed=1, ack=1), callback=CB.NONE
    ) == [disc.FAILED_WITH_SAVED_MATERIAL]


def test_r7_4_observed_exceeding_committed_is_impossible_evidence():
    p = record_client_ack(body(3, committed=1), 3)
    found = delivery_discrepancies(settlement=None, publication=p, callback=CB.NONE)
    assert [d.code for d in found] == [disc.OBSERVED_EXCEEDS_COMMITTED]
    assert "impossible" in found[0].text


def test_r7_4_observed_without_send_record():
    p = record_client_ack(body(2, sent=[1]), 2)
    assert codes(settlement=OUT.COMPLETED, publication=p, callback=CB.NONE) == [
        disc.COMMITTED_NEVER_SENT,
        disc.OBSERVED_WITHOUT_SEND_RECORD,
    ]


def test_r7_4_codes_are_stable_unique_snake_case():
    assert len(set(DISCREPANCY_CODES)) == len(DISCREPANCY_CODES)
    for code in DISCREPANCY_CODES:
        assert code.replace("_", "").isalpha() and code == code.lower(), code


def test_r7_4_bad_input_is_rejected():
    with pytest.raises(ValueError):
        delivery_discrepancies(settlement="done", publication=Publication(), callback=CB.NONE)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        delivery_discrepancies(settlement=None, publication=Publication(), callback="ok")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sequence"):
        delivery_discrepancies(
            settlement=OUT.FAILED, publication=Publication(), callback=CB.NONE, unknown_effects="e1"
        )


# --- properties ----------------------------------------------------------------------------

operation = st.one_of(
    st.tuples(st.just("generate"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("commit"), st.integers(1, 6), st.integers(1, 3)),
    st.tuples(st.just("send"), st.integers(1, 6), st.none()),
    st.tuples(st.just("ack"), st.integers(0, 7), st.none()),
    st.tuples(st.just("declare"), st.sampled_from(["a", "b"]), st.none()),
    st.tuples(st.just("save"), st.sampled_from(["a", "b"]), st.none()),
)


def apply(p: Publication, op: tuple) -> Publication:
    name, target, extra = op
    if name == "generate":
        return generate_chunk(p, target, final=extra)
    if name == "commit":
        return commit_chunk(p, target, version=extra)
    if name == "send":
        return mark_chunk_sent(p, target)
    if name == "ack":
        return record_client_ack(p, target)
    if name == "declare":
        return declare_attachment(p, target)
    return mark_attachment_saved(p, target)


def run_ops(ops) -> Publication:
    p = Publication()
    for op in ops:
        # Illegal operations raise and leave the facts as they were.
        with contextlib.suppress(PublicationError):
            p = apply(p, op)
    return p


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=40))
def test_r7_2_property_fact_inclusions_hold_and_facts_are_never_erased(ops):
    p = Publication()
    for op in ops:
        try:
            q = apply(p, op)
        except PublicationError:
            continue
        assert q.observed_ids <= q.committed_ids <= q.generated_ids
        assert q.sent_ids <= q.committed_ids
        # Nothing recorded is ever taken back (a failing later chunk erases nothing).
        assert p.generated_ids <= q.generated_ids
        assert p.committed_ids <= q.committed_ids
        assert p.sent_ids <= q.sent_ids
        assert p.observed_ids <= q.observed_ids
        for chunk in p.chunks:
            if chunk.committed:
                assert q.chunk(chunk.chunk_id).committed_version == chunk.committed_version
        # The committed body is a prefix 1 … k.
        assert q.committed_ids == set(range(1, q.committed_count + 1))
        p = q


@settings(max_examples=200, deadline=None)
@given(st.lists(operation, max_size=40), st.sampled_from(list(SettlementOutcome)))
def test_r7_3_property_never_completed_unless_save_complete(ops, precomputed):
    p = run_ops(ops)
    decision = settlement_from_facts(precomputed=precomputed, publication=p)
    if save_outcome(p) is not SaveOutcome.COMPLETE:
        assert decision.outcome is not OUT.COMPLETED
    if precomputed is not OUT.COMPLETED:
        assert decision.outcome is not OUT.COMPLETED
    # Publication only narrows: a pre-save failure stays failed (R4.1).
    if precomputed is OUT.FAILED:
        assert decision.outcome is OUT.FAILED
    # A settlement computed from the facts never disagrees with those facts in the
    # report. A failed run that left saved material is still flagged: a person
    # should see that text reached the store of a run that failed.
    settlement_codes = {
        disc.COMPLETED_WITHOUT_COMMITTED_BODY,
        disc.COMPLETED_BODY_INCOMPLETE,
        disc.COMPLETED_ATTACHMENTS_UNSAVED,
        disc.PARTIAL_WITHOUT_SAVED_MATERIAL,
    }
    found = codes(settlement=decision.outcome, publication=p, callback=CB.NONE)
    assert not settlement_codes & set(found)


def everything_agrees(settlement, p: Publication, callback, unknown_effects) -> bool:
    """Independent statement of "everything agrees" for R7.4."""
    if p.observed_ids - p.sent_ids or p.impossible_ack_through:
        return False
    if callback is CB.DELIVERY_FAILED:
        return False
    reported = callback.reported_outcome
    if settlement is None:
        return reported is None
    if reported is not None and reported is not settlement:
        return False
    if unknown_effects:
        return False
    if p.sent_ids != p.committed_ids or p.observed_ids != p.committed_ids:
        return False
    saved_anything = p.committed_count > 0 or any(a.saved for a in p.attachments)
    if settlement is OUT.COMPLETED:
        return p.body_complete and p.attachments_saved
    if settlement is OUT.PARTIAL:
        return saved_anything
    if settlement is OUT.FAILED:
        return not saved_anything
    return True


@st.composite
def orderly_publication(draw) -> Publication:
    """A body driven in order, so that full agreement is common (random ops rarely get there)."""
    total = draw(st.integers(1, 4))
    committed = draw(st.integers(0, total))
    # Weighted towards the agreeing case: all committed sent, ack through the last commit.
    everything = range(1, committed + 1)
    sent = draw(st.sampled_from([everything, everything, everything, range(1, committed)]))
    ack = draw(st.sampled_from([committed] * 4 + [0, max(committed - 1, 0), committed + 1]))
    p = body(total, committed=committed, sent=sent, ack=ack)
    for attachment_id in draw(st.lists(st.sampled_from(["a", "b"]), max_size=2, unique=True)):
        p = declare_attachment(p, attachment_id)
        if draw(st.booleans()):
            p = mark_attachment_saved(p, attachment_id)
    return p


DELIVERED = {
    OUT.COMPLETED: CB.DELIVERED_COMPLETED,
    OUT.PARTIAL: CB.DELIVERED_PARTIAL,
    OUT.FAILED: CB.DELIVERED_FAILED,
    OUT.CANCELLED: CB.DELIVERED_CANCELLED,
}


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.lists(operation, max_size=40).map(run_ops), orderly_publication()),
    st.booleans(),
    st.data(),
)
def test_r7_4_property_empty_only_when_everything_agrees(p, honest, data):
    if honest:
        # Settle from the facts and report it faithfully: agreement is then common.
        precomputed = data.draw(st.sampled_from(list(SettlementOutcome)))
        settlement = settlement_from_facts(precomputed=precomputed, publication=p).outcome
        callback = data.draw(st.sampled_from([CB.NONE, CB.PENDING, DELIVERED[settlement]]))
        effects = data.draw(st.lists(st.just("fx1"), max_size=1))
    else:
        settlement = data.draw(st.one_of(st.none(), st.sampled_from(list(SettlementOutcome))))
        callback = data.draw(st.sampled_from(list(CallbackStatus)))
        effects = data.draw(st.lists(st.sampled_from(["fx1", "fx2"]), max_size=2))
    found = delivery_discrepancies(
        settlement=settlement, publication=p, callback=callback, unknown_effects=effects
    )
    assert (found == ()) == everything_agrees(settlement, p, callback, effects)
    assert all(d.code in DISCREPANCY_CODES for d in found)
    assert len({d.code for d in found}) == len(found)


# --- R7.2 commit_body / newly_sent: the chunks of one answered turn ------------------


def test_r7_2_commit_body_generates_then_commits_the_next_chunks_the_last_final():
    p, ids = pub.commit_body(Publication(), 3)
    assert ids == (1, 2, 3)
    assert p.generated_ids == p.committed_ids == {1, 2, 3}
    assert p.final_chunk_id == 3 and p.body_complete
    assert [p.chunk(i).committed_version for i in ids] == [1, 2, 3]
    assert p.sent_ids == set() and p.observed_ids == set()  # committed is not sent


def test_r7_2_commit_body_continues_after_the_committed_prefix():
    before = commit_chunk(generate_chunk(Publication(), 1), 1, 1)
    after, ids = pub.commit_body(before, 2)
    assert ids == (2, 3)
    assert after.chunk(1) == before.chunk(1)  # the committed first chunk stays as it was
    assert after.final_chunk_id == 3 and after.committed_ids == {1, 2, 3}


@pytest.mark.parametrize("count", [0, -1, True, 1.0, None])
def test_r7_2_a_body_has_at_least_one_chunk(count):
    with pytest.raises(PublicationError):
        pub.commit_body(Publication(), count)


def test_r7_2_a_body_that_ended_takes_no_more_chunks():
    done, _ids = pub.commit_body(Publication(), 1)
    with pytest.raises(PublicationError):
        pub.commit_body(done, 1)


def test_r7_2_newly_sent_names_committed_chunks_not_sent_before():
    p = body(4, committed=3, sent=[1])
    assert pub.newly_sent(p, [3, 2, 2, 1, 4, 9, 0]) == (2, 3)
    assert pub.newly_sent(p, []) == ()
    assert pub.newly_sent(p, [1]) == ()  # a repeat changes nothing
    assert pub.newly_sent(p, [4]) == ()  # never committed: cannot be sent
    assert p.sent_ids == {1}  # newly_sent reads the facts; it records nothing


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.data())
def test_r7_2_newly_sent_is_the_committed_chunks_not_yet_sent(total, data):
    committed = data.draw(st.integers(0, total))
    sent = data.draw(st.sets(st.integers(1, committed))) if committed else set()
    p = body(total, committed=committed, sent=sorted(sent))
    ids = data.draw(st.lists(st.integers(-2, total + 2), max_size=10))
    assert pub.newly_sent(p, ids) == tuple(sorted(set(ids) & (p.committed_ids - p.sent_ids)))


def test_r7_4_a_delivered_callback_is_read_by_the_outcome_it_told():
    from governance.rules.publication import CallbackStatus, delivered_status

    for outcome in OUT:
        status = delivered_status(outcome.value)
        assert status.reported_outcome is outcome
    assert delivered_status("complete") is CallbackStatus.DELIVERY_FAILED
    assert delivered_status("") is CallbackStatus.DELIVERY_FAILED
