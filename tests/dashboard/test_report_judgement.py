"""R7.4: each settled run's delivery is judged once and kept on its settlement
(``governance.services.deliveries``); any later write to its chunks, callback or
receipts makes the judgement stale (database triggers, migration 0015), and the
report never shows a stale one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboard.queries import report as q
from governance.models import BodyChunk, RunCallback, Settlement, ToolReceipt
from governance.services import deliveries
from tasks.jobs import judge_deliveries
from tests.dashboard.test_report_views import (
    NOW,
    REPORT,
    RunSpec,
    codes_by_run,
    fixed_clock,  # noqa: F401 (autouse fixture)
    get_report,
    make_run,
)

pytestmark = pytest.mark.django_db

WINDOW = q.ReportQuery(start=NOW - timedelta(days=30), end=NOW + timedelta(days=1))


def stale(run) -> bool:
    row = Settlement.objects.get(run=run)
    return row.judged_rev != row.delivery_rev


def test_a_settled_run_is_judged_once_with_the_rules_verdict():
    run = make_run(RunSpec(chunks=("CS", "CSF"), receipts_unknown=("k-1",)))
    assert stale(run)
    assert deliveries.judge_unjudged() == 1
    row = Settlement.objects.get(run=run)
    assert not stale(run) and row.provider_key == "alpha"
    assert (row.chunks_committed, row.chunks_sent, row.chunks_observed) == (2, 2, 0)
    assert row.delivery_verdict == "no_client_evidence"
    codes = {found["code"] for found in row.delivery["discrepancies"]}
    assert {"no_client_evidence", "effects_unknown"} <= codes
    assert row.discrepancy_count == len(row.delivery["discrepancies"])
    assert row.delivery["unknown_effects"] == ["k-1"]
    assert deliveries.judge_unjudged() == 0  # nothing changed: nothing judged again


@pytest.mark.parametrize("write", ["chunk acknowledged", "chunk deleted", "callback", "receipt"])
def test_any_write_to_the_runs_delivery_facts_makes_its_judgement_stale(write):
    run = make_run(
        RunSpec(chunks=("CS",), receipts_unknown=("k-1",), callback_url="https://x.test")
    )
    deliveries.judge_unjudged()
    assert not stale(run)
    if write == "chunk acknowledged":  # a plain ORM write, not through a service
        BodyChunk.objects.filter(run=run).update(observed_at=NOW)
    elif write == "chunk deleted":
        BodyChunk.objects.filter(run=run).delete()
    elif write == "callback":
        RunCallback.objects.create(
            run=run, url="https://x.test", idempotency_key=f"cb-{run.id}", payload={},
            next_attempt_at=NOW, created_at=NOW,
        )  # fmt: skip
    else:
        ToolReceipt.objects.filter(run=run).update(effect=ToolReceipt.Effect.SUCCEEDED)
    assert stale(run)
    other = make_run(RunSpec())
    deliveries.judge_unjudged()
    assert not stale(run) and not stale(other)


def test_the_report_never_shows_a_stale_judgement(client, manager):
    run = make_run(RunSpec(chunks=("CS", "CSF")))
    client.force_login(manager)
    assert "no_client_evidence" in codes_by_run(get_report(client))[str(run.id)]
    BodyChunk.objects.filter(run=run).update(observed_at=NOW)  # the viewer acknowledged all
    assert str(run.id) not in codes_by_run(get_report(client))
    assert Settlement.objects.get(run=run).delivery_verdict == "client_received_all_committed"


def test_a_judgement_made_while_the_facts_changed_is_not_written():
    run = make_run(RunSpec(chunks=("CS", "CSF")))
    rows = list(
        Settlement.objects.filter(run=run)
        .annotate(judged_provider=deliveries.run_provider())
        .values_list(
            "id", "run_id", "delivery_rev", "outcome", "unknown_effects",
            "run__callback_url", "judged_provider",
        )
    )  # fmt: skip
    judged = deliveries._judge_batch(rows)  # read before the viewer's acknowledgement…
    BodyChunk.objects.filter(run=run).update(observed_at=NOW)
    deliveries._write(judged)  # …so it loses to it
    assert stale(run)
    deliveries.judge_unjudged()
    assert Settlement.objects.get(run=run).delivery_verdict == "client_received_all_committed"


def test_the_beat_judges_what_is_pending(settings):
    assert settings.CELERY_BEAT_SCHEDULE["judge-deliveries"]["task"] == judge_deliveries.name
    runs = [make_run(RunSpec()) for _ in range(3)]
    assert judge_deliveries() == 3
    assert not any(stale(run) for run in runs)


def test_judging_in_batches_reaches_every_run_and_keeps_to_its_limit(monkeypatch):
    monkeypatch.setattr(deliveries, "BATCH", 2)
    runs = [make_run(RunSpec(settled_at=NOW - timedelta(minutes=n))) for n in range(5)]
    assert deliveries.judge_unjudged(limit=3) == 3
    assert sum(stale(run) for run in runs) == 2
    assert deliveries.judge_unjudged() == 2
    assert not any(stale(run) for run in runs)


def test_judging_a_period_leaves_the_other_runs_for_the_beat():
    inside = make_run(RunSpec(settled_at=NOW - timedelta(hours=1)))
    outside = make_run(RunSpec(settled_at=NOW - timedelta(days=40)))
    assert deliveries.judge_unjudged(start=WINDOW.start, end=WINDOW.end) == 1
    assert not stale(inside) and stale(outside)


def test_with_nothing_stale_judging_asks_one_short_question():
    """Each report view and each beat pass asks first; with nothing stale (the usual
    answer) that is all: the batch's query and its provider subquery are not sent."""
    make_run(RunSpec(settled_at=NOW - timedelta(hours=1)))
    assert deliveries.judge_unjudged() == 1
    with CaptureQueriesContext(connection) as captured:
        assert deliveries.judge_unjudged(start=WINDOW.start, end=WINDOW.end) == 0
    (only,) = captured.captured_queries
    assert "LIMIT 1" in only["sql"] and "governance_providerattempt" not in only["sql"]


def test_a_page_of_discrepancies_is_the_same_slice_as_the_whole_list():
    """Runs with one, two and three discrepancies: every slice read from the database
    (the running sum of counts) equals the same slice of the whole list."""
    specs = [
        RunSpec(chunks=("CS", "CSF")),  # no client evidence
        RunSpec(chunks=("CS", "CSF"), receipts_unknown=("k-a",)),  # + effects unknown
        RunSpec(outcome="completed", chunks=()),  # completed without a body
        RunSpec(chunks=("C", "CF"), receipts_unknown=("k-b",)),  # never sent, unknown
    ]
    for n in range(12):
        spec = specs[n % len(specs)]
        make_run(
            RunSpec(
                outcome=spec.outcome,
                chunks=spec.chunks,
                receipts_unknown=tuple(f"{k}-{n}" for k in spec.receipts_unknown),
                settled_at=NOW - timedelta(minutes=n),
            )
        )
    make_run(RunSpec(settled_at=NOW - timedelta(minutes=30)))  # no discrepancy
    deliveries.judge_unjudged()
    report = q.delivery_report(WINDOW)
    whole = list(report.discrepancies)
    assert len(whole) == len(report.discrepancies) == report.total.discrepancies
    assert len({row.run.run_id for row in whole}) == report.runs_with_discrepancies == 12
    assert max(len(row.run.discrepancies) for row in whole) >= 2
    keys = [(row.run.run_id, row.code) for row in whole]
    assert [row.run.settled_at for row in whole] == sorted(
        (row.run.settled_at for row in whole), reverse=True
    )
    for size in (1, 2, 3, 5, 25):
        for start in range(0, len(whole) + 2, size):
            page = report.discrepancies[start : start + size]
            assert [(row.run.run_id, row.code) for row in page] == keys[start : start + size]
    assert report.discrepancies[-1].code == whole[-1].code


def test_the_report_page_reads_only_the_runs_it_shows(client, manager):
    for n in range(30):
        make_run(RunSpec(chunks=("CS", "CSF"), settled_at=NOW - timedelta(minutes=n)))
    deliveries.judge_unjudged()
    client.force_login(manager)
    total = q.delivery_report(WINDOW).total.discrepancies
    assert total >= 30
    response = client.get(REPORT, {"page": 2})
    assert response.status_code == 200
    assert response.context["page_obj"].paginator.count == total
    shown = response.context["discrepancy_rows"]
    assert len(shown) == min(25, total - 25)
    whole = list(q.delivery_report(WINDOW).discrepancies)
    assert [(row.run.run_id, row.code) for row, _cells in shown] == [
        (row.run.run_id, row.code) for row in whole[25:50]
    ]


# --------------------------------------------------------------------------- cost by day


def _priced(provider_id: str, currency: str = "USD"):
    from governance.models import Provider

    provider, _ = Provider.objects.update_or_create(
        provider_id=provider_id,
        defaults={
            "kind": "scripted", "model": f"{provider_id}-model", "currency": currency,
            "price_input_per_mtok": "2", "price_output_per_mtok": "8",
        },
    )  # fmt: skip
    return provider


def _attempt(run, provider, usage, result="accepted", at=None):
    from governance.models import ProviderAttempt

    return ProviderAttempt.objects.create(
        run=run, stage=run.stages.first(), segment=run.segment, provider=provider,
        model="m", kind="original", request_digest=f"u{ProviderAttempt.objects.count()}",
        started_at=at or NOW, result=result, usage=usage,
    )  # fmt: skip


def _expected_cost(runs):
    from dashboard.queries.costs import prices_of
    from governance.models import ProviderAttempt
    from governance.rules.cost import attempt_cost, summarize_costs

    return summarize_costs(
        (a.result, attempt_cost(a.usage, prices_of(a.provider)))
        for a in ProviderAttempt.objects.filter(run__in=runs).select_related("provider")
    )


def test_the_cost_of_whole_days_and_part_days_adds_up_to_each_requests_cost():
    _priced("alpha"), _priced("beta", "EUR")
    runs = []
    for n in range(9):  # three days, three runs a day, at 01:00, 09:00 and 17:00
        day = NOW.replace(hour=1, minute=0) - timedelta(days=n // 3) + timedelta(hours=8 * (n % 3))
        run = make_run(RunSpec(provider=None, settled_at=day, chunks=("CSOF",)))
        _attempt(
            run, _priced(("alpha", "beta")[n % 2]), {"input_tokens": 100 + n, "output_tokens": 7}
        )
        _attempt(run, _priced("alpha"), {"prompt_tokens": 50}, result="refused")
        runs.append((day, run))
    deliveries.judge_unjudged()
    midnight = NOW.replace(hour=0, minute=0)
    windows = [
        (midnight - timedelta(days=2), midnight + timedelta(days=1)),  # three whole days
        (midnight - timedelta(days=2, hours=-5), midnight + timedelta(hours=12)),  # part days
        (midnight - timedelta(hours=3), midnight + timedelta(hours=4)),  # no whole day
    ]
    for start, end in windows:
        inside = [run for at, run in runs if start <= at < end]
        for group in q.GROUPS:
            report = q.delivery_report(q.ReportQuery(start=start, end=end, group=group))
            assert report.runs == len(inside)
            assert report.total.cost == _expected_cost(inside), (start, end, group)


def test_an_attempt_recorded_after_the_judgement_changes_the_days_cost_once():
    alpha = _priced("alpha")
    run = make_run(RunSpec(provider=None, settled_at=NOW - timedelta(hours=2)))
    _attempt(run, alpha, {"input_tokens": 1000})
    deliveries.judge_unjudged()
    day = q.ReportQuery(
        start=NOW.replace(hour=0, minute=0), end=NOW.replace(hour=0, minute=0) + timedelta(days=1)
    )
    assert q.delivery_report(day).total.cost == _expected_cost([run])
    late = _priced("beta", "EUR")
    _attempt(
        run, late, {"input_tokens": 500, "output_tokens": 20}, at=NOW
    )  # accepted: beta's run now
    assert stale(run)
    deliveries.judge_unjudged()
    deliveries.judge_unjudged()  # nothing pending: nothing added twice
    report = q.delivery_report(day)
    assert report.total.cost == _expected_cost([run])
    assert Settlement.objects.get(run=run).provider_key == "beta"
    by_provider = q.delivery_report(q.ReportQuery(start=day.start, end=day.end, group="provider"))
    assert [row.key for row in by_provider.groups] == ["beta"]
    assert by_provider.groups[0].cost == _expected_cost([run])


def _recount(group: str, start, end) -> dict:
    """The report's counts taken from each judged settlement, for comparison."""
    found: dict = {}
    for row in Settlement.objects.filter(settled_at__gte=start, settled_at__lt=end):
        key = {
            "day": row.settled_at.date(),
            "provider": row.provider_key,
            "outcome": q.OUTCOMES.index(row.outcome),
        }[group]
        counts = found.setdefault(key, [0] * 8)
        for i, value in enumerate(
            (1, row.chunks_committed, row.chunks_sent, row.chunks_observed,
             int(row.delivery_verdict == "client_received_all_committed"),
             int(row.delivery_verdict == "no_client_evidence"),
             int(row.discrepancy_count > 0), row.discrepancy_count)
        ):  # fmt: skip
            counts[i] += value
    return found


def test_day_counts_follow_every_new_judgement_of_a_run():
    """SettledDay takes each judgement's difference: after acknowledgements, a late
    attempt that changes the run's provider and a deleted chunk, whole days read from
    it still equal the judged settlements counted one by one."""
    runs = []
    for n in range(8):
        settled = NOW.replace(hour=2) - timedelta(days=n % 3, hours=-n)
        runs.append(make_run(RunSpec(chunks=("CS", "CSF"), settled_at=settled)))
    deliveries.judge_unjudged()
    BodyChunk.objects.filter(run__in=runs[:3]).update(observed_at=NOW)  # acknowledged
    _attempt(runs[3], _priced("beta"), {"input_tokens": 5}, at=NOW)  # now beta's run
    BodyChunk.objects.filter(run=runs[4], chunk_no=1).delete()
    deliveries.judge_unjudged()
    start = NOW.replace(hour=0) - timedelta(days=2)
    end = NOW.replace(hour=0) + timedelta(days=1)
    for group in q.GROUPS:
        rows = q.grouped_counts(q.ReportQuery(start=start, end=end, group=group))
        got = {
            row.key: [
                row.runs, row.committed, row.sent, row.observed,
                row.evidence["client_received_all_committed"],
                row.evidence["no_client_evidence"], row.with_discrepancies, row.discrepancies,
            ]
            for row in rows
        }  # fmt: skip
        assert got == _recount(group, start, end), group
    assert {
        row.key for row in q.grouped_counts(q.ReportQuery(start=start, end=end, group="provider"))
    } == {"alpha", "beta"}
