"""R7.2–R7.3 (with the R6.5 settlement outcomes): publication owns the body.

Four separate facts per body chunk (R7.2):

- **generated** — a candidate exists (a ``ChunkFacts`` is recorded at generation);
- **committed** — the server persisted it, with a version;
- **sent** — it was written to a subscriber's transport;
- **observed** — the client acknowledged receipt.

Ordering rules (the transitions below enforce them, repeats are idempotent):

- a chunk is generated in id order (1, 2, 3 …) and never after the final chunk;
- a chunk is committed only once generated, and only after every earlier chunk
  is committed: the committed body is always a prefix, so a failing second chunk
  leaves the committed first one in place and ends the body there;
- a chunk is sent only once committed;
- a chunk is observed only once committed. Observed does *not* require the
  ``sent`` record: a client acknowledgement is stronger evidence than our own
  transport bookkeeping (the record can be lost when a worker dies between the
  write and the bookkeeping). Such a chunk is kept as observed and the R7.4
  report flags ``observed_without_send_record`` (``rules.discrepancies``).

So at all times: observed ⊆ committed, sent ⊆ committed, committed ⊆ generated.

Body saved is not attachments saved: attachments are separate facts, and a
complete save needs both (R7.2). The settlement is computed from committed facts
*after* the save, so a save that ended partial is settled partial, never the
``completed`` computed before it (R7.3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

# One outcome vocabulary: the lifecycle owns settlement (R6.5).
from governance.rules.settlement import Outcome as SettlementOutcome


class SaveOutcome(StrEnum):
    """R7.3: how the background save of body and attachments ended."""

    COMPLETE = "complete"  # whole body (final chunk and all before it) and every attachment
    PARTIAL = "partial"  # something committed, but not all of it
    NOTHING_SAVED = "nothing_saved"  # no chunk committed and no attachment saved


class CallbackStatus(StrEnum):
    """R7.4: what the completion callback told the outside world, if anything."""

    NONE = "none"  # no callback configured for the run
    PENDING = "pending"  # in flight: not yet a disagreement
    DELIVERED_COMPLETED = "delivered_completed"
    DELIVERED_PARTIAL = "delivered_partial"
    DELIVERED_FAILED = "delivered_failed"
    DELIVERED_CANCELLED = "delivered_cancelled"
    DELIVERY_FAILED = "delivery_failed"  # we tried and the receiver never got it

    @property
    def reported_outcome(self) -> SettlementOutcome | None:
        """The outcome the receiver was told, or None when it was told nothing."""
        return _CALLBACK_OUTCOMES.get(self)


_CALLBACK_OUTCOMES = {
    CallbackStatus.DELIVERED_COMPLETED: SettlementOutcome.COMPLETED,
    CallbackStatus.DELIVERED_PARTIAL: SettlementOutcome.PARTIAL,
    CallbackStatus.DELIVERED_FAILED: SettlementOutcome.FAILED,
    CallbackStatus.DELIVERED_CANCELLED: SettlementOutcome.CANCELLED,
}


def delivered_status(told: str) -> CallbackStatus:
    """R7.4: the status of a callback the receiver got, by the outcome it was told.
    An outcome outside R6.5 tells the receiver nothing it can act on: as good as
    never delivered (``DELIVERY_FAILED``)."""
    for status, outcome in _CALLBACK_OUTCOMES.items():
        if outcome.value == told:
            return status
    return CallbackStatus.DELIVERY_FAILED


class PublicationError(ValueError):
    """R7.2: a publication fact was recorded out of order or contradicts an earlier one."""


class ChunkVersionConflict(PublicationError):
    """R7.2/R6.4: a committed chunk is read back by its version, never re-committed as another."""


def _require_positive_int(value: object, what: str) -> int:
    # bool is an int subclass; True as a chunk id is a bug, not chunk 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PublicationError(f"{what} must be a positive integer, got {value!r}")
    return value


# ---------------------------------------------------------------------------
# Facts


@dataclass(frozen=True)
class ChunkFacts:
    """R7.2: the four facts of one body chunk. Exists only once its candidate was generated."""

    chunk_id: int
    committed_version: int | None = None
    sent: bool = False
    observed: bool = False

    def __post_init__(self) -> None:
        _require_positive_int(self.chunk_id, "chunk_id")
        if self.committed_version is not None:
            _require_positive_int(self.committed_version, "committed_version")
        if self.sent and self.committed_version is None:
            raise PublicationError(f"chunk {self.chunk_id}: sent requires committed")
        if self.observed and self.committed_version is None:
            raise PublicationError(f"chunk {self.chunk_id}: observed requires committed")

    @property
    def generated(self) -> bool:
        """Always True: a chunk is recorded when its candidate is generated."""
        return True

    @property
    def committed(self) -> bool:
        return self.committed_version is not None


@dataclass(frozen=True)
class AttachmentFacts:
    """R7.2: an attachment the answer declares, and whether it was saved (not implied by body)."""

    attachment_id: str
    saved: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.attachment_id, str) or not self.attachment_id:
            raise PublicationError(
                f"attachment_id must be a non-empty string, got {self.attachment_id!r}"
            )


@dataclass(frozen=True)
class Publication:
    """R7.2: every publication fact of one run's body.

    ``chunks[i]`` is chunk ``i + 1``. ``final_chunk_id`` is set when the candidate
    that ends the body was generated. ``client_ack_through`` is the highest
    contiguous chunk id the client ever claimed; ``impossible_ack_through`` is the
    highest claim that named a chunk not yet committed when it arrived (0: none) —
    impossible evidence, kept for the R7.4 report rather than believed.
    """

    chunks: tuple[ChunkFacts, ...] = ()
    final_chunk_id: int | None = None
    client_ack_through: int = 0
    impossible_ack_through: int = 0
    attachments: tuple[AttachmentFacts, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "chunks", tuple(self.chunks))
        object.__setattr__(self, "attachments", tuple(self.attachments))
        for index, chunk in enumerate(self.chunks, start=1):
            if not isinstance(chunk, ChunkFacts):
                raise PublicationError(f"chunks must hold ChunkFacts, got {chunk!r}")
            if chunk.chunk_id != index:
                raise PublicationError(
                    f"chunk ids must run 1, 2, 3 … in order; position {index} "
                    f"holds chunk {chunk.chunk_id}"
                )
        committed_flags = [chunk.committed for chunk in self.chunks]
        if committed_flags != sorted(committed_flags, reverse=True):
            raise PublicationError("committed chunks must form a prefix (1 … k) of the body")
        if self.final_chunk_id is not None:
            _require_positive_int(self.final_chunk_id, "final_chunk_id")
            if self.final_chunk_id != len(self.chunks):
                raise PublicationError(
                    f"final chunk {self.final_chunk_id} must be the last generated chunk "
                    f"({len(self.chunks)} generated)"
                )
        for name in ("client_ack_through", "impossible_ack_through"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PublicationError(f"{name} must be an integer >= 0, got {value!r}")
        if self.impossible_ack_through > self.client_ack_through:
            raise PublicationError("impossible_ack_through cannot exceed client_ack_through")
        for chunk in self.chunks:
            if chunk.observed and chunk.chunk_id > self.client_ack_through:
                raise PublicationError(
                    f"chunk {chunk.chunk_id} is observed but the client only acknowledged "
                    f"through {self.client_ack_through}"
                )
        ids = [attachment.attachment_id for attachment in self.attachments]
        for attachment in self.attachments:
            if not isinstance(attachment, AttachmentFacts):
                raise PublicationError(f"attachments must hold AttachmentFacts, got {attachment!r}")
        if len(set(ids)) != len(ids):
            raise PublicationError(f"attachment ids must be unique, got {ids!r}")

    @property
    def generated_ids(self) -> frozenset[int]:
        return frozenset(chunk.chunk_id for chunk in self.chunks)

    @property
    def committed_ids(self) -> frozenset[int]:
        return frozenset(chunk.chunk_id for chunk in self.chunks if chunk.committed)

    @property
    def sent_ids(self) -> frozenset[int]:
        return frozenset(chunk.chunk_id for chunk in self.chunks if chunk.sent)

    @property
    def observed_ids(self) -> frozenset[int]:
        return frozenset(chunk.chunk_id for chunk in self.chunks if chunk.observed)

    @property
    def committed_count(self) -> int:
        return len(self.committed_ids)

    @property
    def body_complete(self) -> bool:
        """R7.2: the final chunk and all before it are committed. Chunk 1 alone is not enough."""
        return self.final_chunk_id is not None and self.committed_count == self.final_chunk_id

    @property
    def attachments_saved(self) -> bool:
        """R7.2: every declared attachment is saved (vacuously true when none are declared)."""
        return all(attachment.saved for attachment in self.attachments)

    def chunk(self, chunk_id: int) -> ChunkFacts:
        _require_positive_int(chunk_id, "chunk_id")
        if chunk_id > len(self.chunks):
            raise PublicationError(f"chunk {chunk_id} was never generated")
        return self.chunks[chunk_id - 1]


# ---------------------------------------------------------------------------
# Transitions (pure: each returns a new Publication or raises PublicationError)


def _with_chunk(publication: Publication, chunk: ChunkFacts) -> Publication:
    chunks = list(publication.chunks)
    chunks[chunk.chunk_id - 1] = chunk
    return replace(publication, chunks=tuple(chunks))


def generate_chunk(publication: Publication, chunk_id: int, *, final: bool = False) -> Publication:
    """R7.2: record a generated candidate. Ids come in order; a repeat is a no-op.

    ``final=True`` marks the candidate that ends the body; nothing is generated after it.
    """
    _require_positive_int(chunk_id, "chunk_id")
    generated = len(publication.chunks)
    if chunk_id <= generated:
        is_final = publication.final_chunk_id == chunk_id
        if final != is_final:
            raise PublicationError(
                f"chunk {chunk_id} was generated with final={is_final}; cannot repeat it "
                f"with final={final}"
            )
        return publication
    if publication.final_chunk_id is not None:
        raise PublicationError(
            f"cannot generate chunk {chunk_id}: chunk {publication.final_chunk_id} ended the body"
        )
    if chunk_id != generated + 1:
        raise PublicationError(
            f"cannot generate chunk {chunk_id}: the next chunk id is {generated + 1}"
        )
    return replace(
        publication,
        chunks=(*publication.chunks, ChunkFacts(chunk_id=chunk_id)),
        final_chunk_id=chunk_id if final else None,
    )


def commit_chunk(publication: Publication, chunk_id: int, version: int) -> Publication:
    """R7.2: the server persisted a generated chunk with a version.

    Requires the chunk generated and every earlier chunk committed. Repeating the
    same version is a no-op; another version raises ``ChunkVersionConflict``.
    """
    _require_positive_int(version, "version")
    chunk = publication.chunk(chunk_id)
    if chunk.committed:
        if chunk.committed_version != version:
            raise ChunkVersionConflict(
                f"chunk {chunk_id} is committed as version {chunk.committed_version}; "
                f"it cannot be committed again as version {version}"
            )
        return publication
    if chunk_id > 1 and not publication.chunk(chunk_id - 1).committed:
        raise PublicationError(
            f"cannot commit chunk {chunk_id} before chunk {chunk_id - 1} is committed"
        )
    return _with_chunk(publication, replace(chunk, committed_version=version))


def mark_chunk_sent(publication: Publication, chunk_id: int) -> Publication:
    """R7.2: the chunk was written to a subscriber's transport. Requires committed."""
    chunk = publication.chunk(chunk_id)
    if not chunk.committed:
        raise PublicationError(f"cannot send chunk {chunk_id}: it is not committed")
    if chunk.sent:
        return publication
    return _with_chunk(publication, replace(chunk, sent=True))


def commit_body(publication: Publication, count: int) -> tuple[Publication, tuple[int, ...]]:
    """R7.2: generate, then commit, the next ``count`` chunks of the body, the
    last one final; each is committed with its chunk id as version. Returns the
    new facts and the ids committed."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise PublicationError(f"a body has at least one chunk, got {count!r}")
    first = len(publication.chunks) + 1
    ids = tuple(range(first, first + count))
    for chunk_id in ids:
        publication = generate_chunk(publication, chunk_id, final=chunk_id == ids[-1])
        publication = commit_chunk(publication, chunk_id, chunk_id)
    return publication, ids


def newly_sent(publication: Publication, chunk_ids: Sequence[int]) -> tuple[int, ...]:
    """R7.2: which of ``chunk_ids`` become *sent* now: committed ones not sent
    before (a chunk never committed cannot be sent; a repeat changes nothing)."""
    fresh = []
    for chunk_id in sorted(set(chunk_ids)):
        if not 1 <= chunk_id <= len(publication.chunks):
            continue
        if not publication.chunk(chunk_id).committed:
            continue
        before = publication
        publication = mark_chunk_sent(publication, chunk_id)
        if publication is not before:
            fresh.append(chunk_id)
    return tuple(fresh)


def record_client_ack(publication: Publication, through_chunk_id: int) -> Publication:
    """R7.2/R7.3: the client acknowledged every chunk up to ``through_chunk_id``.

    Chunks 1 … through that are committed become observed. Acks are cumulative, so a
    lower (stale) ack changes nothing. A claim naming chunks not committed when it
    arrives cannot be true: those chunks stay unobserved (a later commit does not
    make them observed retroactively) and the claim is kept as
    ``impossible_ack_through`` for the report. ``0`` means "nothing received".
    """
    if isinstance(through_chunk_id, bool) or not isinstance(through_chunk_id, int):
        raise PublicationError(f"ack must be an integer chunk id, got {through_chunk_id!r}")
    if through_chunk_id < 0:
        raise PublicationError(f"ack must be >= 0, got {through_chunk_id}")
    chunks = tuple(
        replace(chunk, observed=True)
        if chunk.committed and chunk.chunk_id <= through_chunk_id
        else chunk
        for chunk in publication.chunks
    )
    impossible = publication.impossible_ack_through
    if through_chunk_id > publication.committed_count:
        impossible = max(impossible, through_chunk_id)
    return replace(
        publication,
        chunks=chunks,
        client_ack_through=max(publication.client_ack_through, through_chunk_id),
        impossible_ack_through=impossible,
    )


def declare_attachment(publication: Publication, attachment_id: str) -> Publication:
    """R7.2: the answer has this attachment; it starts unsaved. A repeat is a no-op."""
    attachment = AttachmentFacts(attachment_id=attachment_id)
    if any(a.attachment_id == attachment_id for a in publication.attachments):
        return publication
    return replace(publication, attachments=(*publication.attachments, attachment))


def mark_attachment_saved(publication: Publication, attachment_id: str) -> Publication:
    """R7.2: a declared attachment was saved. Saving the body never does this."""
    for index, attachment in enumerate(publication.attachments):
        if attachment.attachment_id == attachment_id:
            if attachment.saved:
                return publication
            attachments = list(publication.attachments)
            attachments[index] = replace(attachment, saved=True)
            return replace(publication, attachments=tuple(attachments))
    raise PublicationError(f"cannot save attachment {attachment_id!r}: it was never declared")


# ---------------------------------------------------------------------------
# Save outcome and settlement (R7.3, R6.5)


def save_outcome(publication: Publication) -> SaveOutcome:
    """R7.3: how the save ended, read from committed facts only."""
    if publication.body_complete and publication.attachments_saved:
        return SaveOutcome.COMPLETE
    anything_saved = publication.committed_count > 0 or any(
        attachment.saved for attachment in publication.attachments
    )
    return SaveOutcome.PARTIAL if anything_saved else SaveOutcome.NOTHING_SAVED


@dataclass(frozen=True)
class SettlementDecision:
    """R6.5/R7.3: the outcome to settle with, and why. The callback must carry ``outcome``."""

    outcome: SettlementOutcome
    save: SaveOutcome | None  # None: the chunk facts are unreadable, the save unknown
    reason: str


def settlement_from_facts(
    *, precomputed: SettlementOutcome, publication: Publication | None
) -> SettlementDecision:
    """R7.3: settle from the facts the save left, not from what was computed before it.

    - no publication (chunk facts that break R7.2's rules prove nothing): a
      ``completed`` cannot stand and is ``partial``; any other outcome stands;
    - ``cancelled`` stays cancelled (an explicit user stop; committed chunks stay facts);
    - nothing saved → ``failed`` (no answer was produced, R4.4);
    - ``completed`` stands only when the save is complete;
    - ``failed`` stays failed: publication may only narrow an outcome, never widen
      it (R4.1 — a committed body does not prove the question was answered); the
      committed chunks stay facts all the same (R7.2);
    - otherwise ``partial``: a partial save overrides a pre-save ``completed``.
    """
    precomputed = SettlementOutcome(precomputed)
    if publication is None:
        if precomputed is SettlementOutcome.COMPLETED:
            return SettlementDecision(
                SettlementOutcome.PARTIAL, None, "body chunk facts are unreadable"
            )
        return SettlementDecision(precomputed, None, "body chunk facts are unreadable")
    save = save_outcome(publication)
    committed = publication.committed_count
    if precomputed is SettlementOutcome.CANCELLED:
        return SettlementDecision(
            SettlementOutcome.CANCELLED, save, f"user stop; {committed} chunk(s) committed"
        )
    if save is SaveOutcome.NOTHING_SAVED:
        return SettlementDecision(
            SettlementOutcome.FAILED, save, "no chunk committed and no attachment saved"
        )
    if precomputed is SettlementOutcome.COMPLETED and save is SaveOutcome.COMPLETE:
        return SettlementDecision(
            SettlementOutcome.COMPLETED, save, f"body complete in {committed} committed chunk(s)"
        )
    if precomputed is SettlementOutcome.COMPLETED:
        reason = (
            f"save ended partial ({save_gap(publication)}); the pre-save 'completed' does not stand"
        )
    elif precomputed is SettlementOutcome.FAILED:
        return SettlementDecision(
            SettlementOutcome.FAILED,
            save,
            f"run failed after {committed} chunk(s) were committed; they stay",
        )
    else:
        reason = f"partial: {save_gap(publication) or 'body saved, answer incomplete'}"
    return SettlementDecision(SettlementOutcome.PARTIAL, save, reason)


def save_gap(publication: Publication) -> str:
    gaps = []
    if not publication.body_complete:
        total = (
            f"of {publication.final_chunk_id}"
            if publication.final_chunk_id is not None
            else "with no final chunk"
        )
        gaps.append(f"{publication.committed_count} chunk(s) committed {total}")
    unsaved = [a.attachment_id for a in publication.attachments if not a.saved]
    if unsaved:
        gaps.append(f"attachment(s) not saved: {', '.join(unsaved)}")
    return "; ".join(gaps)


# ---------------------------------------------------------------------------
# Delivery evidence (R7.3)


class DeliveryVerdict(StrEnum):
    NOTHING_COMMITTED = "nothing_committed"
    NO_CLIENT_EVIDENCE = "no_client_evidence"
    CLIENT_RECEIVED_PART = "client_received_part"
    CLIENT_RECEIVED_ALL_COMMITTED = "client_received_all_committed"


@dataclass(frozen=True)
class DeliveryEvidence:
    """R7.3: what the client demonstrably received, counted from observed acks.

    ``client_received_everything`` is None when there is no client evidence (or
    nothing to receive); True only when the whole body is committed and observed.
    Attachment downloads are not tracked here, and the text says so.
    """

    committed: int
    sent: int
    observed: int
    verdict: DeliveryVerdict
    client_received_everything: bool | None
    text: str


def delivery_evidence(publication: Publication) -> DeliveryEvidence:
    """R7.3: summarise client evidence; say "no client evidence" when there are no acks."""
    committed = publication.committed_count
    sent = len(publication.sent_ids)
    observed = len(publication.observed_ids)
    if committed == 0:
        verdict, everything = DeliveryVerdict.NOTHING_COMMITTED, None
        text = "nothing committed, so nothing to deliver"
    elif observed == 0:
        verdict, everything = DeliveryVerdict.NO_CLIENT_EVIDENCE, None
        text = (
            f"no client evidence: {committed} chunk(s) committed, {sent} sent, none "
            "acknowledged; whether the client received them is unknown"
        )
    elif observed < committed:
        verdict, everything = DeliveryVerdict.CLIENT_RECEIVED_PART, False
        text = f"client acknowledged {observed} of {committed} committed chunk(s)"
    else:
        verdict = DeliveryVerdict.CLIENT_RECEIVED_ALL_COMMITTED
        everything = publication.body_complete
        text = f"client acknowledged all {committed} committed chunk(s)"
        if not publication.body_complete:
            text += ", but the body is not complete"
    if publication.attachments:
        text += "; attachment downloads are not tracked"
    return DeliveryEvidence(committed, sent, observed, verdict, everything, text)
