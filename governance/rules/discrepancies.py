"""R7.4: every disagreement between a run's settlement, its publication facts,
its completion callback and its effects, as stable codes the delivery report
and its CSV show."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from governance.rules.publication import (
    CallbackStatus,
    Publication,
    SaveOutcome,
    SettlementOutcome,
    save_gap,
    save_outcome,
)


@dataclass(frozen=True)
class Discrepancy:
    """R7.4: one disagreement between settlement, delivery and callback. ``code`` is stable."""

    code: str
    text: str


# Stable snake_case codes for the dashboard and CSV, in the order they are checked.
COMPLETED_WITHOUT_COMMITTED_BODY = "completed_without_committed_body"
COMPLETED_BODY_INCOMPLETE = "completed_body_incomplete"
COMPLETED_ATTACHMENTS_UNSAVED = "completed_attachments_unsaved"
PARTIAL_WITHOUT_SAVED_MATERIAL = "partial_without_saved_material"
FAILED_WITH_SAVED_MATERIAL = "failed_with_saved_material"
COMMITTED_NEVER_SENT = "committed_never_sent"
NO_CLIENT_EVIDENCE = "no_client_evidence"
CHUNKS_NEVER_OBSERVED = "chunks_never_observed"
OBSERVED_WITHOUT_SEND_RECORD = "observed_without_send_record"
OBSERVED_EXCEEDS_COMMITTED = "observed_exceeds_committed"
CALLBACK_BEFORE_SETTLEMENT = "callback_before_settlement"
CALLBACK_SAID_COMPLETED = "callback_said_completed"
CALLBACK_OUTCOME_MISMATCH = "callback_outcome_mismatch"
CALLBACK_DELIVERY_FAILED = "callback_delivery_failed"
EFFECTS_UNKNOWN = "effects_unknown"

DISCREPANCY_CODES: tuple[str, ...] = (
    COMPLETED_WITHOUT_COMMITTED_BODY,
    COMPLETED_BODY_INCOMPLETE,
    COMPLETED_ATTACHMENTS_UNSAVED,
    PARTIAL_WITHOUT_SAVED_MATERIAL,
    FAILED_WITH_SAVED_MATERIAL,
    COMMITTED_NEVER_SENT,
    NO_CLIENT_EVIDENCE,
    CHUNKS_NEVER_OBSERVED,
    OBSERVED_WITHOUT_SEND_RECORD,
    OBSERVED_EXCEEDS_COMMITTED,
    CALLBACK_BEFORE_SETTLEMENT,
    CALLBACK_SAID_COMPLETED,
    CALLBACK_OUTCOME_MISMATCH,
    CALLBACK_DELIVERY_FAILED,
    EFFECTS_UNKNOWN,
)


def _ids(ids: frozenset[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def delivery_discrepancies(
    *,
    settlement: SettlementOutcome | None,
    publication: Publication,
    callback: CallbackStatus,
    unknown_effects: Sequence[str] = (),
) -> tuple[Discrepancy, ...]:
    """R7.4: every disagreement for one run; empty only when everything agrees.

    ``settlement`` is None while the run is unsettled: then only facts that are
    wrong at any time are flagged (impossible acks, observed without a send record,
    a callback before settlement); in-flight gaps are not. A ``pending`` callback
    and ``none`` (no callback configured) are not disagreements.
    """
    if settlement is not None:
        settlement = SettlementOutcome(settlement)
    callback = CallbackStatus(callback)
    if isinstance(unknown_effects, str):
        raise ValueError("unknown_effects must be a sequence of effect ids, not one string")
    found = [
        *_outcome_against_material(settlement, publication),
        *_delivery_at_settlement(settlement, publication),
        *_impossible_evidence(publication),
        *_callback_against_settlement(settlement, callback),
    ]
    if settlement is not None and unknown_effects:
        found.append(
            Discrepancy(
                EFFECTS_UNKNOWN,
                f"settled {settlement.value} with effect(s) left unknown: "
                f"{', '.join(str(e) for e in unknown_effects)}",
            )
        )
    return tuple(found)


def _outcome_against_material(
    settlement: SettlementOutcome | None, publication: Publication
) -> list[Discrepancy]:
    """The outcome claims what was saved: a body, attachments, or nothing."""
    committed = publication.committed_ids
    save = save_outcome(publication)
    found = []
    if settlement is SettlementOutcome.COMPLETED:
        if not committed:
            found.append(
                Discrepancy(
                    COMPLETED_WITHOUT_COMMITTED_BODY, "settled completed with no committed chunk"
                )
            )
        elif not publication.body_complete:
            found.append(
                Discrepancy(
                    COMPLETED_BODY_INCOMPLETE,
                    f"settled completed but the body is incomplete: {save_gap(publication)}",
                )
            )
        if not publication.attachments_saved:
            unsaved = [a.attachment_id for a in publication.attachments if not a.saved]
            found.append(
                Discrepancy(
                    COMPLETED_ATTACHMENTS_UNSAVED,
                    f"settled completed but attachment(s) not saved: {', '.join(unsaved)}",
                )
            )
    elif settlement is SettlementOutcome.PARTIAL and save is SaveOutcome.NOTHING_SAVED:
        found.append(
            Discrepancy(PARTIAL_WITHOUT_SAVED_MATERIAL, "settled partial but nothing was saved")
        )
    elif settlement is SettlementOutcome.FAILED and save is not SaveOutcome.NOTHING_SAVED:
        found.append(
            Discrepancy(
                FAILED_WITH_SAVED_MATERIAL,
                f"settled failed although {len(committed)} chunk(s) were committed or "
                "attachments saved; committed material is not erased (partial)",
            )
        )
    return found


def _delivery_at_settlement(
    settlement: SettlementOutcome | None, publication: Publication
) -> list[Discrepancy]:
    """Once settled, every committed chunk should have been sent and observed."""
    if settlement is None:
        return []  # in flight: gaps are not disagreements yet
    committed, observed = publication.committed_ids, publication.observed_ids
    unsent = committed - publication.sent_ids
    unobserved = committed - observed
    outcome = settlement.value
    found = []
    if unsent:
        found.append(
            Discrepancy(
                COMMITTED_NEVER_SENT,
                f"settled {outcome} with committed chunk(s) never sent: {_ids(unsent)}",
            )
        )
    if committed and not observed:
        found.append(
            Discrepancy(
                NO_CLIENT_EVIDENCE,
                f"settled {outcome} with {len(committed)} committed chunk(s) and no client "
                "evidence: none acknowledged",
            )
        )
    elif unobserved:
        found.append(
            Discrepancy(
                CHUNKS_NEVER_OBSERVED,
                f"settled {outcome} with committed chunk(s) never observed: {_ids(unobserved)}",
            )
        )
    return found


def _impossible_evidence(publication: Publication) -> list[Discrepancy]:
    """Client evidence that is wrong at any time: acks of what was never sent or committed."""
    found = []
    unsent_but_observed = publication.observed_ids - publication.sent_ids
    if unsent_but_observed:
        found.append(
            Discrepancy(
                OBSERVED_WITHOUT_SEND_RECORD,
                f"client acknowledged chunk(s) with no send record: {_ids(unsent_but_observed)}",
            )
        )
    if publication.impossible_ack_through:
        found.append(
            Discrepancy(
                OBSERVED_EXCEEDS_COMMITTED,
                f"client claimed chunks through {publication.impossible_ack_through} before "
                f"they were committed ({len(publication.committed_ids)} committed now): "
                "impossible evidence",
            )
        )
    return found


def _callback_against_settlement(
    settlement: SettlementOutcome | None, callback: CallbackStatus
) -> list[Discrepancy]:
    """What the completion callback told the client against the settlement."""
    found = []
    reported = callback.reported_outcome
    if reported is not None and settlement is None:
        found.append(
            Discrepancy(
                CALLBACK_BEFORE_SETTLEMENT,
                f"callback said {reported.value} but the run is not settled",
            )
        )
    elif reported is SettlementOutcome.COMPLETED and settlement is not reported:
        found.append(
            Discrepancy(
                CALLBACK_SAID_COMPLETED,
                f"callback said completed while the settlement is {settlement}",
            )
        )
    elif reported is not None and settlement is not reported:
        found.append(
            Discrepancy(
                CALLBACK_OUTCOME_MISMATCH,
                f"callback said {reported.value} while the settlement is {settlement}",
            )
        )
    if callback is CallbackStatus.DELIVERY_FAILED:
        found.append(
            Discrepancy(CALLBACK_DELIVERY_FAILED, "the completion callback was never delivered")
        )
    return found
