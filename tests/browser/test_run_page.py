"""The run page after a worker died mid-call, in real Chromium (R5.3, R6.6)."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta

import pytest

from governance import services, time_source
from governance.models import Provider, Stage, Thread
from tasks.stages import run_stage

pytestmark = pytest.mark.django_db(transaction=True)


def test_r5_3_r6_6_on_call_sees_which_use_has_no_known_outcome(page_for, oncall, shots):
    Provider.objects.create(
        provider_id="primary", kind="scripted", model="primary-model",
        script={"default": {"answer": {"text": "Total: 1,234.50"}}},
    )  # fmt: skip
    now = time_source.now()
    created = services.create_thread(provider_chain=["primary"], title="Billing", now=now)
    run, stage, _ = services.submit_run(
        Thread.objects.get(id=created.id), input="Sum the invoices", now=now
    )
    held = services.claim_stage(stage.id, now, lease=timedelta(seconds=30))
    services.admit(
        run, "model_requests", 1, f"stage{stage.id}.1:primary:original:1", now=now, stage=held
    )
    # The holder's process is gone (a SIGKILLed worker): the redelivery takes over at once.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host, namespace, _pid, token = held.holder.split("/")
    Stage.objects.filter(id=stage.id).update(holder=f"{host}/{namespace}/{gone.pid}/{token}")
    assert run_stage(stage.id) == "accepted"

    page = page_for(oncall.username)
    page.goto(page.url.rstrip("/") + f"/runs/{run.id}/")
    notice = page.locator("#unknown-uses")
    notice.wait_for()
    text = notice.inner_text()
    assert "1 use with no known outcome" in text
    assert "stage 1 (model turn) stopped during the request" in text
    ledger = page.locator("details.ledger")
    assert ledger.get_attribute("open") is not None  # opened for the reader
    rows = ledger.locator("tbody tr")
    assert rows.count() == 2
    assert "no known outcome" in rows.nth(0).inner_text()
    assert "recorded" in rows.nth(1).inner_text()
    notice.scroll_into_view_if_needed()
    shots(page, "run-page-unknown-use")


def test_r6_2_an_interrupted_continuation_reads_interrupted_not_timed_out(page_for, oncall, shots):
    Provider.objects.create(
        provider_id="breaks", kind="scripted", model="breaks-model",
        script={
            "rules": [
                {"when": {"last_role_not": "tool", "has_tool": "calculator"},
                 "tool_call": {"name": "calculator", "arguments": {"expression": "6*7"}}},
                {"when": {"last_role": "tool"}, "stall": {}},
            ],
            "default": {"answer": {"text": "What was done so far."}},
        },
    )  # fmt: skip
    now = time_source.now()
    created = services.create_thread(
        provider_chain=["breaks"], title="Sums", tool_surface=["calculator"], now=now
    )
    run, _stage, _ = services.submit_run(
        Thread.objects.get(id=created.id), input="What is six times seven?", now=now,
        limits={"model_requests": 4},
    )  # fmt: skip
    while (pending := Stage.objects.filter(run=run, finished_at__isnull=True).first()) is not None:
        run_stage(pending.id)  # each retry and the finalization, in order
    # The first turn, then three interrupted continuations: two retries used the rest.
    assert Stage.objects.filter(run=run, failure_class="interrupted").count() == 3

    page = page_for(oncall.username)
    page.goto(page.url.rstrip("/") + f"/runs/{run.id}/")
    path = page.locator("ol.decisions")
    path.wait_for()
    assert "bounded recovery × 2" in path.inner_text()  # the retries on one line
    assert "retry 2, drawn from model_requests (1 left)" in path.inner_text()
    assert "it is not retried after 2 retries: the model_requests budget is used up" in (
        path.inner_text()
    )
    body = page.locator("main").inner_text()
    assert "interrupted (effect unknown)" in body
    assert "timed out" not in body and "network" not in body.lower()
    shots(page, "run-page-interrupted")
