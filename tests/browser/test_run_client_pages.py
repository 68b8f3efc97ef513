"""The run's client (the API token's name) and the door's thread, in real
Chromium on a desktop and a phone: read, and nothing wider than the screen."""

from __future__ import annotations

import json

import pytest

from governance.models import ApiToken, Provider, Run, Segment, Stage
from governance.services.tokens import token_digest
from tasks.stages import run_stage

pytestmark = pytest.mark.django_db(transaction=True)


def fits(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_the_door_runs_client_and_session_on_the_run_page_the_runs_and_the_segment(
    client, page_for, operator, make_user, shots
):
    Provider.objects.create(
        provider_id="fast", kind="scripted", model="fast-model",
        script={"default": {"answer": {"text": "Your refund is on its way."}}},
    )  # fmt: skip
    agent = make_user("support", "agent-client")
    ApiToken.objects.create(
        user=agent, name="support bot (prod)", key_digest=token_digest("door-browser-token-1"),
        scopes=["use_openai_door"],
    )  # fmt: skip
    # Streamed: its status comes at once; the stages are run by hand below.
    asked = {
        "model": "fast", "stream": True,
        "messages": [{"role": "user", "content": "Where is my refund?"}],
    }  # fmt: skip
    answer = client.post(
        "/v1/chat/completions",
        json.dumps(asked),
        content_type="application/json",
        headers={"Authorization": "Bearer door-browser-token-1", "X-Session-Id": "ticket-4711"},
    )  # fmt: skip
    assert answer.status_code == 200
    run = Run.objects.get()
    while (pending := Stage.objects.filter(run=run, finished_at__isnull=True).first()) is not None:
        run_stage(pending.id)
    segment = Segment.objects.get(thread_id=run.thread_id)

    for width, height, device in ((1280, 800, "desktop"), (390, 844, "phone")):
        page = page_for(operator.username, width=width, height=height)
        base = page.url.rstrip("/")

        page.goto(f"{base}/runs/{run.id}/")
        facts = page.locator("dl.facts").first
        assert "client: support bot (prod) (API token)" in facts.inner_text()
        assert "OpenAI door session ticket-4711" in facts.inner_text()
        assert fits(page), device
        folder = shots(page, f"run-page-{device}").parent
        facts.screenshot(path=str(folder / f"run-facts-{device}.png"))

        page.goto(f"{base}/runs/")
        row = page.locator(".runs-table tbody tr").first
        assert "client: support bot (prod)" in row.inner_text()
        assert row.get_by_text("OpenAI door").is_visible()
        assert fits(page), device
        shots(page, f"runs-{device}")
        row.screenshot(path=str(folder / f"runs-row-{device}.png"))

        page.goto(f"{base}/runs/?thread={run.thread_id}")
        summary = page.locator(".thread-summary")
        assert "session ticket-4711 · client: support bot (prod)" in summary.inner_text()
        assert fits(page), device
        shots(page, f"one-thread-{device}")
        summary.screenshot(path=str(folder / f"thread-summary-{device}.png"))

        page.goto(f"{base}/segments/{segment.id}/")
        facts = page.locator(".segment-facts dl.facts")
        assert "client: support bot (prod)" in facts.inner_text()
        assert fits(page), device
        shots(page, f"segment-{device}")
        facts.screenshot(path=str(folder / f"segment-facts-{device}.png"))
        page.context.close()
