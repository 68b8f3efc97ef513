"""R5.1/R5.4: a model turn's first request is admitted from the run's ledger in
the claim's transaction (one commit fewer per turn); every other request is
admitted before it is sent, as before."""

from __future__ import annotations

import pytest

from governance import services
from governance.models import BudgetEntry, ProviderAttempt, Run, Stage, Thread
from governance.services import stages as stage_service
from tasks.stages import run_stage

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER = {"default": {"answer": {"text": "The answer is 42."}}}
FAILING = {"rules": [{"fail": {"status": 503}}]}


def _submit(manual_clock, chain, **kwargs) -> tuple[Run, Stage]:
    thread = services.create_thread(provider_chain=chain, now=manual_clock())
    run, stage, _ = services.submit_run(
        Thread.objects.get(id=thread.id), input="Hello", now=manual_clock(), **kwargs
    )
    return run, stage


def _entries(run: Run) -> list[tuple[str, str, int | None]]:
    return [
        (e.idempotency_key, e.purpose, e.stage_id)
        for e in BudgetEntry.objects.filter(account__run=run).order_by("id")
    ]


def test_r5_1_the_claim_admits_the_first_requests_draw_in_its_own_transaction(
    manual_clock, scripted_provider
):
    scripted_provider("p", ANSWER)
    run, stage = _submit(manual_clock, ["p"])
    start = stage_service.start_stage(stage.id, manual_clock())
    key = f"stage{stage.id}.1:p:original:1"
    # Committed with the claim, before anything was sent.
    assert _entries(run) == [(key, "original", stage.id)]
    assert ProviderAttempt.objects.filter(run=run).count() == 0
    admission = start.context.admitted[key]
    assert admission.admitted and not admission.duplicate
    assert services.budget_view(run)["model_requests"].used == 1


def test_r5_4_the_first_request_takes_the_claims_draw_and_draws_nothing_more(
    manual_clock, scripted_provider
):
    scripted_provider("p", ANSWER)
    run, stage = _submit(manual_clock, ["p"])
    assert run_stage(stage.id) == "accepted"
    assert _entries(run) == [(f"stage{stage.id}.1:p:original:1", "original", stage.id)]
    assert services.budget_view(run)["model_requests"].used == 1
    assert ProviderAttempt.objects.filter(run=run).count() == 1


def test_r5_3_a_fallback_request_is_admitted_before_it_is_sent(manual_clock, scripted_provider):
    """The first provider fails (time-based): the next one's request draws from
    the same ledger, admitted by the turn itself, after the claim's draw."""
    scripted_provider("down", FAILING)
    scripted_provider("up", ANSWER)
    run, stage = _submit(manual_clock, ["down", "up"])
    assert run_stage(stage.id) == "accepted"
    assert _entries(run) == [
        (f"stage{stage.id}.1:down:original:1", "original", stage.id),
        (f"stage{stage.id}.1:up:fallback:1", "original", stage.id),
    ]
    assert services.budget_view(run)["model_requests"].used == 2
    assert ProviderAttempt.objects.filter(run=run).count() == 2


def test_r5_2_a_spent_ledger_refuses_the_claims_draw_and_nothing_is_sent(
    manual_clock, scripted_provider
):
    scripted_provider("p", ANSWER)
    run, stage = _submit(manual_clock, ["p"], limits={"model_requests": 0})
    start = stage_service.start_stage(stage.id, manual_clock())
    refused = start.context.admitted[f"stage{stage.id}.1:p:original:1"]
    assert not refused.admitted
    assert _entries(run) == []
    result, _closed = stage_service_execute(run, start)
    assert result == "budget_exhausted"
    assert ProviderAttempt.objects.filter(run=run).count() == 0
    assert Stage.objects.get(id=stage.id).outcome == "budget_exhausted"


def stage_service_execute(run: Run, start: stage_service.StageStart):
    """Go on with the claimed stage as the task does after its claim."""
    from tasks.stages import model_turn

    return model_turn.execute(Run.objects.get(id=run.id), start.stage, start.context)
