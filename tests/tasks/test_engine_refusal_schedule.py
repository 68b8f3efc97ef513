"""R3.2 with a provider's own schedule, end to end on a real worker with
an injected clock: a refusal starts under its provider's schedule and keeps it when
the schedule changes — its verdicts never change — and the next refusal (after a
boundary) starts under the new one."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance import time_source
from governance.models import Notification, ProviderAttempt, SegmentRefusal
from governance.services.providers import update_provider
from tests.tasks.test_engine_refusal import BACKUP_SCRIPT, REFUSER_SCRIPT

pytestmark = pytest.mark.django_db(transaction=True)


def test_r3_2_a_refusal_keeps_the_schedule_it_started_under(
    api, worker, manual_clock, scripted_provider
):
    refuser = scripted_provider("refuser", REFUSER_SCRIPT)
    scripted_provider("backup", BACKUP_SCRIPT)
    update_provider(
        "refuser", by="t", now=time_source.now(), refusal_schedule={"delays_s": [600, 1800]}
    )
    thread = api.post(
        "/api/v1/threads",
        {"provider_chain": ["refuser", "backup"], "tool_surface": ["calculator"]},
        expect=201,
    ).json()
    segment_key = thread["segment"]["key"]

    def sent():
        return ProviderAttempt.objects.filter(provider=refuser).count()

    first = api.run_and_wait(thread["id"], "Please check the figures.")
    assert first["settlement"]["outcome"] == "completed", first["settlement"]
    baseline = sent() - 4  # the accepted first turn, then the refused quarantine (R3.1)
    state = SegmentRefusal.objects.get(segment__key=segment_key, provider_id="refuser")
    assert (state.refusals, state.delays_s) == (1, [600, 1800])

    # The schedule changes while the refusal is under way: it keeps its own.
    update_provider(
        "refuser", by="t", now=time_source.now(),
        refusal_schedule={"delays_s": [3600, 7200, 21600]},
    )  # fmt: skip
    for step in (timedelta(minutes=10), timedelta(minutes=30)):
        manual_clock.advance(step)
        run = api.run_and_wait(thread["id"], "And now?")
        assert [a["kind"] for a in run["attempts"] if a["provider_id"] == "refuser"] == ["re_probe"]
    assert sent() - baseline == 4 + 2
    view = api.get(f"/api/v1/threads/{thread['id']}/segment").json()
    assert {p["provider_id"]: p["state"] for p in view["providers"]}["refuser"] == "frozen"
    manual_clock.advance(hours=100)
    api.run_and_wait(thread["id"], "Still there?")
    assert sent() - baseline == 4 + 2  # frozen after its own two re-probes
    keys = sorted(
        Notification.objects.filter(dedupe_key__startswith="provider-refusal:").values_list(
            "dedupe_key", flat=True
        )
    )
    assert keys == [
        f"provider-refusal:{segment_key}:0:refuser",
        f"provider-refusal:{segment_key}:2:refuser",
    ]

    # A boundary: the next refusal starts under the provider's schedule of now.
    boundary = api.post(
        f"/api/v1/threads/{thread['id']}/boundaries",
        {"kind": "tool_surface_change", "tool_surface": ["calculator", "kb_search"],
         "reason": "new tools", "idempotency_key": "schedule-boundary"},
        expect=201,
    ).json()  # fmt: skip
    api.run_and_wait(thread["id"], "After the change?")
    state = SegmentRefusal.objects.get(segment__key=boundary["key"], provider_id="refuser")
    assert state.delays_s == [3600, 7200, 21600]
    manual_clock.advance(minutes=30)
    run = api.run_and_wait(thread["id"], "Half an hour later?")
    assert [a for a in run["attempts"] if a["provider_id"] == "refuser"] == []  # cooling to 1 h
