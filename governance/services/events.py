"""A run's ordered event log: stage states, owners' facts, decisions, chunks (R6.3)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Any

from governance.models import (
    Run,
    RunEvent,
    Segment,
    Stage,
)
from governance.rules.answers import Answer
from governance.rules.authority import OwnerFact

FACTS = "facts"  # the event kind of owners' facts ("fact": one fact, an older log)
FACT_KINDS = (FACTS, "fact")


def record_event(
    run: Run,
    kind: str,
    at: datetime,
    metadata: dict[str, Any],
    *,
    segment: Segment,
    stage: Stage | None = None,
) -> RunEvent:
    """Append to the run's ordered event log (what the stream and timelines read)."""
    event = new_event(run, kind, at, metadata, segment=segment, stage=stage)
    event.save()
    return event


def new_event(
    run: Run,
    kind: str,
    at: datetime,
    metadata: dict[str, Any],
    *,
    segment: Segment,
    stage: Stage | None = None,
) -> RunEvent:
    """An event not yet written (a stage's close writes its events in one insert)."""
    return RunEvent(run=run, segment=segment, stage=stage, kind=kind, at=at, metadata=metadata)


def _fact_payload(fact: OwnerFact) -> dict[str, Any]:
    payload = {
        "owner": fact.owner.value,
        "kind": fact.kind.value,
        "subject": fact.subject,
        "detail": fact.detail,
        "idempotency_key": fact.idempotency_key,
        "version": fact.version,
        "failure_class": fact.failure_class,
    }
    if fact.answer is not None:
        payload["answer"] = asdict(fact.answer)
    return payload


def _fact_from(payload: dict[str, Any]) -> OwnerFact:
    answer = payload.get("answer")
    return OwnerFact(
        owner=payload["owner"],
        kind=payload["kind"],
        subject=payload["subject"],
        detail=payload.get("detail") or "",
        idempotency_key=payload.get("idempotency_key"),
        version=payload.get("version"),
        failure_class=payload.get("failure_class"),
        answer=(
            Answer(answer["goal"], tuple(answer["stated_gaps"]), answer["narrowed"])
            if answer
            else None
        ),
    )


def facts_event(
    run: Run, facts: Sequence[OwnerFact], now: datetime, stage: Stage | None = None
) -> RunEvent:
    """The owners' facts of one write as one event of the run's log (R4.1), not
    yet written: a stage's facts travel together, in order."""
    return new_event(
        run, FACTS, now, {"facts": [_fact_payload(f) for f in facts]}, segment=run.segment,
        stage=stage,
    )  # fmt: skip


def record_fact(run: Run, fact: OwnerFact, now: datetime, stage: Stage | None = None) -> None:
    facts_event(run, [fact], now, stage).save()


def facts_of(metadata: dict[str, Any]) -> list[OwnerFact]:
    """The facts one event holds (a single-fact event of an older log too)."""
    if "facts" in metadata:
        return [_fact_from(payload) for payload in metadata["facts"]]
    return [_fact_from(metadata)]
