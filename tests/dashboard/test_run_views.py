"""Runs pages (issue page 5): the list with its filters, and one run's story —
lifecycle reasons (R6.3), the four clocks (R6.1/R6.2) on a span waterfall,
provider attempts, the budget ledger (R5), tool receipts (R4.1), body chunks
(R7.2/R7.3) and the settlement (R6.5)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.queries import runs as run_queries
from governance import services, time_source
from governance.models import (
    BodyChunk,
    Provider,
    ProviderAttempt,
    Run,
    SpanRecord,
    Stage,
    ToolReceipt,
)
from governance.rules.decision_table import Decision, Path
from governance.rules.payloads import ToolCallPayload, TurnPayload
from governance.rules.settlement import Settlement
from tests import facts as written

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def fixed_clock():
    the_clock = time_source.ManualClock(T0 + timedelta(hours=1))
    time_source.install(the_clock)
    yield the_clock
    time_source.install(None)


@pytest.fixture
def providers():
    return {
        pid: Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-model")
        for pid in ("alpha", "beta")
    }


@pytest.fixture
def thread(providers):
    return services.create_thread(provider_chain=["alpha", "beta"], now=T0, title="Billing bot")


def make_run(
    thread,
    *,
    at=T0,
    input="What is the refund policy?",
    stages=1,
    attempts=("alpha",),
    outcome: str | None = "completed",
) -> Run:
    """A run through the services: admitted, stages run with clocks, attempts, decisions."""
    run, first, _ = services.submit_run(thread, input=input, now=at)
    stage = first
    for n in range(stages):
        if n:
            stage = services.enqueue_stage(
                run, Stage.Kind.MODEL_TURN, TurnPayload(), at + timedelta(seconds=n)
            )
        Stage.objects.filter(id=stage.id).update(
            started_at=at + timedelta(seconds=n, milliseconds=200)
        )
        stage.run = run
        services.finish_stage(
            stage,
            outcome="answered",
            now=at + timedelta(seconds=n + 1),
            clocks={
                "queue_ms": 200,
                "execution_ms": 800,
                "no_progress_ms": 1000,
                "deadline_remaining_ms": 1_799_000,
            },
        )
        for i, pid in enumerate(attempts):
            ProviderAttempt.objects.create(
                run=run,
                stage=stage,
                segment=run.segment,
                provider=Provider.objects.get(provider_id=pid),
                model=f"{pid}-model",
                kind="original" if i == 0 else "fallback",
                request_digest=f"d{n}{i}",
                started_at=at + timedelta(seconds=n, milliseconds=300),
                latency_ms=420,
                result="accepted",
            )
    written.record_decision(run, Decision(Path.CONTINUE, "the turn produced a body"), at)
    if outcome:
        code = {
            "completed": "answered",
            "partial": "answered_with_gaps",
            "failed": "no_answer_produced",
            "cancelled": "cancelled",
        }[outcome]
        settlement = Settlement(outcome, code, f"settled {outcome} for the test")
        written.record_decision(
            run, Decision(Path.SETTLE, f"settle: {outcome}", settlement=settlement), at
        )
        written.settle(run, settlement, at + timedelta(seconds=stages + 1))
    return run


def body_of(response) -> str:
    return response.content.decode()


def listed_ids(response) -> set[str]:
    return set(re.findall(r'href="/runs/([0-9a-f-]{36})/"', body_of(response)))


# --------------------------------------------------------------------------- access


def test_anonymous_is_redirected_to_login_from_list_and_run_page(client, thread):
    run = make_run(thread)
    for url in (reverse("runs"), reverse("run", args=[run.id])):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_without_see_all_runs_the_pages_show_only_ones_own_runs(client, outsider, thread):
    theirs = make_run(thread)
    client.force_login(outsider)
    listed = client.get(reverse("runs"))
    assert listed.status_code == 200 and str(theirs.id) not in body_of(listed)
    assert client.get(reverse("run", args=[theirs.id])).status_code == 404
    Run.objects.filter(id=theirs.id).update(owner=outsider)
    listed = client.get(reverse("runs"))
    assert str(theirs.id) in body_of(listed)
    assert client.get(reverse("run", args=[theirs.id])).status_code == 200


@pytest.mark.parametrize("role", ["oncall", "operator", "manager"])
def test_every_logged_in_role_reads_both_pages_and_finds_no_action(client, request, role, thread):
    run = make_run(thread)
    client.force_login(request.getfixturevalue(role))
    for url in (reverse("runs"), reverse("run", args=[run.id])):
        response = client.get(url)
        body = body_of(response)
        assert response.status_code == 200
        # Read-only pages: the only POST form is the log-out button of the top bar.
        assert body.count('method="post"') == 1
        assert "hx-post" not in body


def test_the_pages_answer_only_get(client, oncall, thread):
    run = make_run(thread)
    client.force_login(oncall)
    assert client.post(reverse("runs")).status_code == 405
    assert client.post(reverse("run", args=[run.id])).status_code == 405
    assert Run.objects.count() == 1


def test_unknown_run_is_404(client, oncall):
    client.force_login(oncall)
    assert client.get(reverse("run", args=[uuid.uuid4()])).status_code == 404


# --------------------------------------------------------------------------- list


def test_list_shows_the_columns_in_words(client, oncall, thread):
    """R6.3/R6.5 at a glance: status and settlement in words, last path, attempts, duration."""
    run = make_run(thread, stages=2, attempts=("alpha", "beta"), outcome="partial")
    client.force_login(oncall)
    body = body_of(client.get(reverse("runs")))
    (row,) = [r for r in re.findall(r"<tr>.*?</tr>", body, re.S) if str(run.id) in r]
    assert '<span class="state settled">settled</span>' in row
    assert '<span class="state partial">partial</span>' in row
    assert "answered_with_gaps" in row
    assert '<span class="state settled">settle</span>' in row  # the last decision's path
    assert 'data-label="Attempts">4</td>' in row  # 2 stages × 2 attempts, annotated
    assert 'data-label="Duration">3.0 s' in row  # created → settled
    assert "<time datetime=" in row  # created via {% when %}
    assert f'href="/segments/{run.segment_id}/"' in row
    assert f'href="/runs/?thread={thread.id}"' in row


def test_unsettled_run_says_not_settled_and_no_decision_yet(client, oncall, thread):
    run, _stage, _ = services.submit_run(thread, input="hello", now=T0)
    client.force_login(oncall)
    body = body_of(client.get(reverse("runs")))
    assert str(run.id) in body
    assert '<span class="state queued">queued</span>' in body
    assert "not settled" in body and "no decision yet" in body
    assert "so far" in body  # the duration still grows


def test_filter_by_status_narrows_the_list(client, oncall, thread):
    settled = make_run(thread)
    queued, _stage, _ = services.submit_run(thread, input="later", now=T0)
    client.force_login(oncall)
    assert listed_ids(client.get(reverse("runs"), {"status": "queued"})) == {str(queued.id)}
    assert listed_ids(client.get(reverse("runs"), {"status": "settled"})) == {str(settled.id)}


@pytest.mark.parametrize("outcome", ["completed", "partial", "failed", "cancelled"])
def test_filter_by_settlement_outcome_narrows_the_list(client, oncall, thread, outcome):
    """R6.5: each settlement outcome filters to its runs."""
    runs = {o: make_run(thread, outcome=o) for o in ("completed", "partial", "failed", "cancelled")}
    client.force_login(oncall)
    response = client.get(reverse("runs"), {"settlement": outcome})
    assert listed_ids(response) == {str(runs[outcome].id)}


def test_filter_settlement_none_lists_unsettled_runs(client, oncall, thread):
    make_run(thread)
    open_run, _stage, _ = services.submit_run(thread, input="open", now=T0)
    client.force_login(oncall)
    assert listed_ids(client.get(reverse("runs"), {"settlement": "none"})) == {str(open_run.id)}


def test_filter_by_provider_keeps_runs_with_an_attempt_by_it(client, oncall, thread):
    only_alpha = make_run(thread, attempts=("alpha",))
    both = make_run(thread, attempts=("alpha", "beta"))
    make_run(thread, attempts=())
    client.force_login(oncall)
    assert listed_ids(client.get(reverse("runs"), {"provider": "beta"})) == {str(both.id)}
    response = client.get(reverse("runs"), {"provider": "alpha"})
    assert listed_ids(response) == {str(only_alpha.id), str(both.id)}
    # the EXISTS filter does not multiply the annotated count
    assert 'data-label="Attempts">2</td>' in body_of(response)


def test_filter_by_thread_narrows_the_list(client, oncall, thread):
    other = services.create_thread(provider_chain=["beta"], now=T0, title="Other")
    mine = make_run(thread)
    make_run(other)
    client.force_login(oncall)
    assert listed_ids(client.get(reverse("runs"), {"thread": str(thread.id)})) == {str(mine.id)}


def test_filter_by_time_range_on_created_at(client, oncall, thread):
    early = make_run(thread, at=T0 - timedelta(days=3))
    middle = make_run(thread, at=T0 - timedelta(days=1))
    late = make_run(thread, at=T0)
    client.force_login(oncall)
    day = lambda d: d.date().isoformat()  # noqa: E731
    response = client.get(reverse("runs"), {"date_from": day(middle.created_at)})
    assert listed_ids(response) == {str(middle.id), str(late.id)}
    response = client.get(reverse("runs"), {"date_to": day(middle.created_at)})
    assert listed_ids(response) == {str(early.id), str(middle.id)}
    response = client.get(
        reverse("runs"),
        {"date_from": day(middle.created_at), "date_to": day(middle.created_at)},
    )
    assert listed_ids(response) == {str(middle.id)}


@pytest.mark.parametrize(
    "params, field",
    [
        ({"status": "exploded"}, "Status"),
        ({"thread": "not-a-uuid"}, "Thread id"),
        ({"date_from": "2026-03-05", "date_to": "2026-03-01"}, "Created to"),
        ({"date_from": "yesterday"}, "Created from"),
    ],
)
def test_bad_filter_is_a_400_form_error(client, oncall, thread, params, field):
    make_run(thread)
    client.force_login(oncall)
    response = client.get(reverse("runs"), params)
    body = body_of(response)
    assert response.status_code == 400
    assert 'role="alert"' in body and field in body
    assert Run.objects.count() == 1


def test_pagination_25_per_page_keeps_the_filters(client, oncall, thread):
    for n in range(30):
        make_run(thread, at=T0 + timedelta(minutes=n), stages=1, attempts=())
    client.force_login(oncall)
    first = client.get(reverse("runs"), {"status": "settled"})
    second = client.get(reverse("runs"), {"status": "settled", "page": 2})
    assert len(listed_ids(first)) == 25
    assert len(listed_ids(second)) == 5
    assert listed_ids(first).isdisjoint(listed_ids(second))
    assert "Page 1 of 2 (30 in all)" in body_of(first)
    assert 'href="?status=settled&amp;page=2"' in body_of(first)
    newest = Run.objects.order_by("-created_at").first()
    assert str(newest.id) in listed_ids(first)


def test_list_query_count_is_bounded(client, oncall, thread, django_assert_max_num_queries):
    """No N+1: 30 runs with several stages and attempts cost the same few queries."""
    for n in range(30):
        make_run(
            thread,
            at=T0 + timedelta(minutes=n),
            stages=2,
            attempts=("alpha", "beta"),
            outcome=("completed", "partial", None)[n % 3],
        )
    client.force_login(oncall)
    # session, user, the top bar's permission check (2), provider choices, count, the page
    with django_assert_max_num_queries(7):
        response = client.get(reverse("runs"), {"provider": "alpha"})
    assert len(listed_ids(response)) == 25


def test_list_htmx_request_gets_the_fragment_only(client, oncall, thread):
    make_run(thread)
    client.force_login(oncall)
    response = client.get(reverse("runs"), {"status": "settled"}, headers={"HX-Request": "true"})
    body = body_of(response)
    assert body.lstrip().startswith('<section id="run-list"')
    assert "<html" not in body and "<form" not in body


def test_list_empty_states(client, oncall, thread):
    client.force_login(oncall)
    assert "No runs yet" in body_of(client.get(reverse("runs")))
    make_run(thread)
    body = body_of(client.get(reverse("runs"), {"status": "verifying"}))
    assert "No run matches these filters" in body


# --------------------------------------------------------------------------- run page


def run_url(run) -> str:
    return reverse("run", args=[run.id])


def test_r6_5_header_shows_status_settlement_and_input(client, oncall, thread):
    run, _stage, _ = services.submit_run(thread, input="Call the webhook please", now=T0)
    settlement = Settlement(
        "partial", "body_save_partial", "the second chunk was not saved", ("hook:key-1",)
    )
    written.settle(run, settlement, T0 + timedelta(seconds=5))
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    assert '<span class="state settled">settled</span>' in body
    assert '<span class="state partial">partial</span>' in body
    assert "body_save_partial" in body and "the second chunk was not saved" in body
    assert "hook:key-1" in body and "1 effect never verified" in body
    assert "Call the webhook please" in body
    assert f'href="/segments/{run.segment_id}/"' in body
    assert f'href="/runs/?thread={thread.id}"' in body


def test_r6_3_lifecycle_path_shows_every_decision_with_its_reason_in_order(client, oncall, thread):
    run, _stage, _ = services.submit_run(thread, input="hi", now=T0)
    written.record_decision(
        run, Decision(Path.BOUNDED_RECOVERY, "transient 503; balance holds"), T0
    )
    written.record_decision(
        run, Decision(Path.FINALIZATION_ONLY, "model requests used up; reserve holds"), T0
    )
    settlement = Settlement("failed", "no_eligible_provider", "every provider frozen")
    written.record_decision(
        run,
        Decision(
            Path.SETTLE,
            "no provider eligible in this segment",
            settlement=settlement,
            critical_alert=True,
            boundary_action_needed="compact, fresh start or switch model",
        ),
        T0,
    )
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    reasons = [
        "transient 503; balance holds",
        "model requests used up; reserve holds",
        "no provider eligible in this segment",
    ]
    positions = [body.index(r) for r in reasons]
    assert positions == sorted(positions)
    assert "bounded recovery" in body and "finalization only" in body
    assert "Boundary action needed:</strong> compact, fresh start or switch model" in body


def test_r6_1_all_four_clocks_shown_for_a_stage_and_the_timeout_named(client, oncall, thread):
    run, stage, _ = services.submit_run(thread, input="hi", now=T0)
    stage.run = run
    services.finish_stage(
        stage,
        outcome="stopped",
        now=T0 + timedelta(minutes=6),
        timeout_name="no_progress",
        clocks={
            "queue_ms": 1500,
            "execution_ms": 62_000,
            "no_progress_ms": 300_000,
            "deadline_remaining_ms": 1_440_000,
        },
    )
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    table = body[body.index('<table class="stages">') :]
    table = table[: table.index("</table>")]
    for header in ("Queue", "Execution", "No progress", "Deadline remaining"):
        assert f">{header}</th>" in table
    cells = re.findall(r'<td class="num clock[^"]*"[^>]*>([^<]*)', table)
    assert cells == ["1.5 s", "1 min 02 s", "5 min 00 s", "24 min 00 s"]
    assert "timed out: no_progress" in table
    # R6.2: the clock that ran out is the one marked, in words
    assert re.search(r'class="num clock timed-out" data-label="No progress"', table)
    assert table.count("timed-out") == 1


def span_kind(name: str) -> str:
    """The ``governance.span.kind`` every stored span carries (tasks.instrumentation)."""
    if name == "governance.run" or name.startswith("invoke_agent "):
        return "run"
    if name.startswith("governance.stage."):
        return name.removeprefix("governance.")
    return "tool" if name.startswith("execute_tool ") else "attempt"


def test_r6_1_waterfall_from_span_store_rows(client, oncall, thread):
    """Bars are positioned by span start/end relative to the run span."""
    run, stage, _ = services.submit_run(thread, input="hi", now=T0)
    trace = "a" * 32

    def span(span_id, parent, name, start_s, end_s, **attrs):
        SpanRecord.objects.create(
            trace_id=trace,
            span_id=span_id,
            parent_span_id=parent,
            name=name,
            start=T0 + timedelta(seconds=start_s),
            end=T0 + timedelta(seconds=end_s),
            status="error" if attrs.get("governance.failure_class") else "unset",
            attributes={
                "governance.run_id": str(run.id),
                "governance.span.kind": span_kind(name),
                **attrs,
            },
            run_id=run.id,
        )

    # The run span as the latest GenAI conventions name it: the page goes by its kind.
    span("1" * 16, "", "invoke_agent agent-governance", 0, 100)
    span(
        "2" * 16, "1" * 16, "governance.stage.queue", 10, 30,
        **{"governance.stage_id": str(stage.id), "governance.clock.queue_ms": 20_000},
    )  # fmt: skip
    span(
        "3" * 16, "1" * 16, "governance.stage.execution", 30, 80,
        **{"governance.stage_id": str(stage.id), "governance.stage.timeout": "stage_timeout"},
    )  # fmt: skip
    span(
        "4" * 16, "3" * 16, "chat alpha-model", 35, 45,
        **{
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "alpha",
            "gen_ai.request.model": "alpha-model",
            "governance.attempt.kind": "re_probe",
            "governance.failure_class": "refusal",
            "gen_ai.usage.input_tokens": 120,
        },
    )  # fmt: skip
    # another run's span never shows here
    SpanRecord.objects.create(
        trace_id="b" * 32, span_id="5" * 16, name="governance.run", start=T0, end=T0,
        attributes={}, run_id=uuid.uuid4(),
    )  # fmt: skip
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    assert "Drawn from the embedded span store: 4 spans over 1 min 40 s" in body
    assert 'x="0.0%" width="100.0%"' in body  # the run span
    assert 'x="10.0%" width="20.0%"' in body  # queued 10 s → 30 s
    assert 'x="30.0%" width="50.0%"' in body  # execution 30 s → 80 s
    assert 'x="35.0%" width="10.0%"' in body  # the attempt
    assert "stage 1 · model turn · queued" in body and "queue 20.0 s" in body
    assert "timed out: stage_timeout" in body
    assert "alpha · re-probe" in body and "failed: refusal" in body and "tokens 120 in" in body
    assert 'wf-depth-2">alpha · re-probe' in body  # attempt under execution under run
    assert "No spans in the span store" not in body


def test_r6_1_waterfall_falls_back_to_stage_times_without_spans(client, oncall, thread):
    run, stage, _ = services.submit_run(thread, input="hi", now=T0)
    Stage.objects.filter(id=stage.id).update(started_at=T0 + timedelta(seconds=5))
    stage.refresh_from_db()
    stage.run = run
    services.finish_stage(stage, outcome="answered", now=T0 + timedelta(seconds=15))
    written.settle(run, Settlement("completed", "answered", "done"), T0 + timedelta(seconds=20))
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    assert "No spans in the span store for this run</strong> — drawn from the stages" in body
    assert 'x="0.0%" width="25.0%"' in body  # queued 0 → 5 s of 20 s
    assert 'x="25.0%" width="50.0%"' in body  # executed 5 → 15 s


def test_provider_attempts_table(client, oncall, thread, providers):
    run = make_run(thread, attempts=())
    stage = run.stages.get()
    for kind, result, failure, category, code in [
        ("original", "refused", "refusal", "content_filter", 400),
        ("re_render", "refused", "refusal", "content_filter", 400),
        ("history_only", "refused", "refusal", "policy", None),
        ("re_probe", "failed", "server_error", "", 503),
        ("fallback", "accepted", "", "", 200),
    ]:
        ProviderAttempt.objects.create(
            run=run, stage=stage, segment=run.segment,
            provider=providers["beta" if kind == "fallback" else "alpha"],
            model="m", kind=kind, request_digest=kind, started_at=T0, latency_ms=1234,
            result=result, failure_class=failure, refusal_category=category, status_code=code,
        )  # fmt: skip
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    section = body[body.index('id="attempts-h"') : body.index('id="budget-h"')]
    for words in ("Original", "Re Render", "History Only", "Re Probe", "Fallback"):
        assert f"<td>{words}</td>" in section
    assert '<span class="state refused">refused</span>' in section
    assert '<span class="state accepted">accepted</span>' in section
    assert "content_filter" in section and "policy" in section and "server_error" in section
    assert '<td class="num">503</td>' in section and '<td class="num">1234 ms</td>' in section


def test_r5_budget_balances_and_the_output_reserve_shown_apart(client, oncall, thread):
    run, _stage, _ = services.submit_run(
        thread, input="hi", now=T0, limits={"model_requests": 3, "output_reserve": 2}
    )
    for n in range(3):
        services.admit(run, "model_requests", 1, f"turn-{n}", now=T0)
    services.admit(run, "model_requests", 1, "final-1", for_finalization=True, now=T0)
    services.admit(run, "tool_calls", 1, "tool-1", purpose="retry", now=T0)
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    section = body[body.index('id="budget-h"') : body.index('id="receipts-h"')]
    table = section[: section.index('<div class="reserve">')]
    row = table[table.index("Model requests") :]
    row = row[: row.index("</tr>")]
    assert re.findall(r'<td class="num">(\d+)', row) == ["3", "3", "0"]
    assert "exhausted" in row
    assert "Output reserve" not in table  # shown separately, not as an ordinary resource
    reserve = section[section.index('<div class="reserve">') :]
    assert "set aside for finalization" in reserve
    assert re.findall(r'<dd class="num-dd">(\d+)', reserve)[:3] == ["2", "1", "1"]
    ledger = section[section.index("<details") :]
    assert "Ledger entries (5)" in ledger
    assert "final-1" in ledger and "output_reserve" in ledger and "retry" in ledger


def test_r5_3_a_use_whose_holder_stopped_is_shown_with_no_known_outcome(client, oncall, thread):
    """A worker died mid-call: its model request stays on the ledger, marked as
    having no known outcome, and the page says so before the table."""
    run, stage, _ = services.submit_run(thread, input="hi", now=T0)
    held = services.claim_stage(stage.id, T0, lease=timedelta(seconds=30))
    services.admit(run, "model_requests", 1, f"stage{stage.id}.1:a", now=T0, stage=held)
    later = T0 + timedelta(seconds=31)
    assert services.claim_stage(stage.id, later, lease=timedelta(seconds=30)) is not None
    services.admit(run, "model_requests", 1, f"stage{stage.id}.2:a", now=later, stage=held)
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    section = body[body.index('id="budget-h"') : body.index('id="receipts-h"')]
    notice = section[
        section.index('id="unknown-uses"') : section.index(
            "</p>", section.index('id="unknown-uses"')
        )
    ]
    assert "1 use with no known outcome" in notice
    assert "The worker holding stage 1 (model turn) stopped" in notice
    ledger = section[section.index("<details") :]
    assert '<details class="ledger" open>' in section
    rows = ledger[ledger.index("<tbody>") : ledger.index("</tbody>")].split("</tr>")[:-1]
    assert ["no known outcome" in r for r in rows] == [True, False]


def test_r4_1_tool_receipts_with_their_effect(client, oncall, thread):
    run = make_run(thread, outcome=None)
    stage = run.stages.get()
    effects = ["succeeded", "failed", "refused", "unknown", "pending"]
    for effect in effects:
        receipt, _ = services.open_receipt(
            run, stage, tool="webhook", key=f"hook-{effect}", arguments={}, call_id="c", now=T0
        )
        if effect != "pending":
            services.close_receipt(
                receipt,
                effect=effect,
                output={"ok": effect == "succeeded"},
                error="HTTP 500 from hook" if effect == "failed" else "",
                now=T0 + timedelta(seconds=2),
                verified=effect == "succeeded",
            )
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    section = body[body.index('id="receipts-h"') : body.index('id="body-h"')]
    for effect in effects:
        assert f'<span class="state {effect}">{effect}</span>' in section
    assert "HTTP 500 from hook" in section
    assert '<span class="state unknown">not verified</span>' in section
    assert ToolReceipt.objects.get(idempotency_key="hook-succeeded").verified_at is not None
    assert section.count("<time") >= 5


def test_r7_2_chunks_show_four_separate_delivery_facts(client, oncall, thread):
    run = make_run(thread)
    first, second = services.commit_chunks(run, ["Refunds take ", "5 days."], T0)
    BodyChunk.objects.filter(run=run).update(final=False)  # chunk 3 is still on its way
    BodyChunk.objects.filter(id=first.id).update(
        sent_at=T0 + timedelta(seconds=1), observed_at=T0 + timedelta(seconds=2)
    )
    BodyChunk.objects.filter(id=second.id).update(sent_at=T0 + timedelta(seconds=1))
    BodyChunk.objects.create(run=run, chunk_no=3, text="draft", generated_at=T0)
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    section = body[body.index('id="body-h"') :]
    table = section[section.index("<tbody>") : section.index("</tbody>")]
    rows = re.findall(r"<tr>.*?</tr>", table, re.S)
    assert [re.search(r"</span>(\d)", r).group(1) for r in rows] == ["1", "2", "3"]
    cells = [re.findall(r'data-label="(\w+)"', r) for r in rows]
    assert cells[0] == ["Version", "Generated", "Committed", "Sent", "Observed"]
    first_row, second_row, third_row = rows
    assert first_row.count("<time") == 4  # generated, committed, sent, observed
    assert second_row.count("<time") == 3 and "no client evidence" in second_row
    assert "not committed" in third_row and "not sent" in third_row
    assert "no client evidence" in third_row
    assert "partly observed" in section and "acknowledged 1 of 2 committed" in section
    assert "Refunds take 5 days." in section  # committed body; the candidate is left out
    assert "draft" not in section[section.index("Committed body") :]


def test_r7_3_no_client_evidence_is_said_plainly(client, oncall, thread):
    run = make_run(thread)
    services.commit_chunks(run, ["All done."], T0)
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    assert "no client evidence" in body
    assert "No client evidence: 1 chunk(s) committed, 0 sent, none acknowledged" in body


def test_r7_3_every_chunk_acknowledged_is_not_observed_while_the_body_is_incomplete(
    client, oncall, thread
):
    """The run page reads the chunks as rules.publication.delivery_evidence does:
    all committed chunks acknowledged, but no final chunk yet → not "observed"."""
    run = make_run(thread)
    services.commit_chunks(run, ["First part, ", "second part"], T0)
    BodyChunk.objects.filter(run=run).update(
        final=False, sent_at=T0 + timedelta(seconds=1), observed_at=T0 + timedelta(seconds=2)
    )
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    section = body[body.index('id="body-h"') :]
    assert '<span class="state completed">observed</span>' not in section
    assert "partly observed" in section and "but the body is not complete" in section


def test_r7_2_unreadable_chunk_facts_are_said_plainly(client, oncall, thread):
    run = make_run(thread)
    services.commit_chunks(run, ["a", "b"], T0)
    BodyChunk.objects.filter(run=run, chunk_no=1).update(version=None)  # 2 without 1
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    assert "facts unreadable" in body and "break the publication rules" in body


def test_run_page_query_count_does_not_grow_with_stages_or_attempts(
    client, oncall, thread, django_assert_max_num_queries
):
    small = make_run(thread, stages=1, attempts=("alpha",))
    big = make_run(thread, stages=12, attempts=("alpha", "beta"))
    for run in (small, big):
        services.commit_chunks(run, ["a", "b", "c"], T0)
        services.admit(run, "model_requests", 1, f"{run.id}-1", now=T0)
        services.open_receipt(
            run, run.stages.first(), tool="calculator", key=f"{run.id}-r",
            arguments={}, call_id="c", now=T0,
        )  # fmt: skip
        SpanRecord.objects.create(
            trace_id=run.id.hex, span_id="1" * 16, name="governance.run", start=T0,
            end=T0 + timedelta(seconds=3), attributes={}, run_id=run.id,
        )  # fmt: skip
    client.force_login(oncall)
    counts = []
    for run in (small, big):
        with CaptureQueriesContext(connection) as captured:
            assert client.get(run_url(run)).status_code == 200
        counts.append(len(captured))
    assert counts[0] == counts[1]
    # session, user, the top bar's permissions; run, stages, attempts with their
    # providers, receipts, chunks, spans, the ledger's balance view and its entries,
    # the calls a person was asked to approve
    with django_assert_max_num_queries(13):
        client.get(run_url(big))


def test_run_page_htmx_gets_the_fragment_and_polls_only_while_unsettled(client, oncall, thread):
    settled = make_run(thread)
    running, _stage, _ = services.submit_run(thread, input="hi", now=T0)
    client.force_login(oncall)
    body = body_of(client.get(run_url(running), headers={"HX-Request": "true"}))
    assert body.lstrip().startswith('<div id="run-body"')
    assert "<html" not in body
    assert 'hx-trigger="every 5s' in body
    settled_body = body_of(client.get(run_url(settled)))
    run_part = settled_body.split('<div id="run-body"', 1)[1]
    assert "hx-trigger" not in run_part  # only the nav's incident count polls


def test_r6_1_an_unsettled_run_past_its_deadline_says_so(client, oncall, thread):
    run, _stage, _ = services.submit_run(thread, input="hi", now=T0, deadline_s=60)
    client.force_login(oncall)
    assert "deadline passed, not settled" in body_of(client.get(run_url(run)))
    written.settle(run, Settlement("failed", "deadline_exceeded", "out of time"), T0)
    assert "deadline passed" not in body_of(client.get(run_url(run)))


def test_r6_1_waterfall_draws_queue_bars_from_the_stage_rows_when_no_queue_span_is_stored(
    client, oncall, thread
):
    """R6.1: the store keeps no queue span; each started stage's queue bar is drawn
    from its own row (enqueued_at → started_at) with its execution span's clocks,
    under the run span and just before that stage's execution bar."""
    run, first, _ = services.submit_run(thread, input="hi", now=T0)
    second = services.enqueue_stage(
        run, Stage.Kind.TOOL_CALL, ToolCallPayload(), T0 + timedelta(seconds=60)
    )
    Stage.objects.filter(id=first.id).update(
        enqueued_at=T0 + timedelta(seconds=10), started_at=T0 + timedelta(seconds=30)
    )
    Stage.objects.filter(id=second.id).update(started_at=T0 + timedelta(seconds=65))
    trace = "c" * 32

    def span(span_id, parent, name, start_s, end_s, **attrs):
        SpanRecord.objects.create(
            trace_id=trace,
            span_id=span_id,
            parent_span_id=parent,
            name=name,
            start=T0 + timedelta(seconds=start_s),
            end=T0 + timedelta(seconds=end_s),
            attributes={
                "governance.run_id": str(run.id),
                "governance.span.kind": span_kind(name),
                **attrs,
            },
            run_id=run.id,
        )

    def clocks(queue_ms, execution_ms):
        return {
            "governance.clock.queue_ms": queue_ms,
            "governance.clock.execution_ms": execution_ms,
            "governance.clock.no_progress_ms": execution_ms,
            "governance.clock.deadline_remaining_ms": 1_000_000,
        }

    span("1" * 16, "", "governance.run", 0, 100)
    span(
        "3" * 16, "1" * 16, "governance.stage.execution", 30, 60,
        **{"governance.stage_id": str(first.id), **clocks(20_000, 30_000)},
    )  # fmt: skip
    span(
        "4" * 16, "3" * 16, "chat alpha-model", 35, 45,
        **{
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "alpha",
            "gen_ai.request.model": "alpha-model",
            "governance.attempt.kind": "original",
            "governance.stage_id": str(first.id),
        },
    )  # fmt: skip
    span(
        "6" * 16, "1" * 16, "governance.stage.execution", 65, 80,
        **{"governance.stage_id": str(second.id), **clocks(5_000, 15_000)},
    )  # fmt: skip
    assert not SpanRecord.objects.filter(name="governance.stage.queue").exists()
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))

    assert "Drawn from the embedded span store: 6 spans over 1 min 40 s" in body
    rows = re.findall(r'<li class="wf-row wf-(\w+)[^"]*">(.*?)</li>', body, re.S)
    labels = [re.search(r'wf-depth-\d">([^<]*)', row).group(1) for _kind, row in rows]
    assert labels == [
        "Run",
        "stage 1 · model turn · queued",
        "stage 1 · model turn · execution",
        "alpha · original",
        "stage 2 · tool call · queued",
        "stage 2 · tool call · execution",
        "no progress",  # R6.1's third clock, after the spans
    ]
    queued = {
        label: row for (kind, row), label in zip(rows, labels, strict=True) if kind == "queue"
    }
    first_queue = queued["stage 1 · model turn · queued"]
    assert 'x="10.0%" width="20.0%"' in first_queue  # enqueued 10 s → started 30 s
    assert "queue 20.0 s" in first_queue  # the execution span's clocks
    assert 'wf-depth-1">stage 1' in first_queue  # under the run span
    second_queue = queued["stage 2 · tool call · queued"]
    assert 'x="60.0%" width="5.0%"' in second_queue  # enqueued 60 s → started 65 s
    assert "queue 5.0 s" in second_queue
    # Each queue bar ends where its stage's execution bar begins.
    assert 'x="30.0%" width="30.0%"' in body  # stage 1 execution 30 s → 60 s
    assert 'x="65.0%" width="15.0%"' in body  # stage 2 execution 65 s → 80 s


def test_run_page_times_and_stages_of_many_attempts(client, oncall, thread):
    """At scale (bench/scale.py): each attempt's time is written without a template per
    row — the same <time> element, UTC hover title and offset from the run's start —
    and its stage is one of the run's stages, not one joined copy per attempt."""
    run = make_run(thread, stages=3, attempts=("alpha", "beta"))
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    for n in range(3):
        at = T0 + timedelta(seconds=n, milliseconds=300)
        offset = "+300 ms" if n == 0 else f"+{n}.3 s"
        cell = f'<td><time datetime="{at.isoformat()}" title="{at:%Y-%m-%d %H:%M:%S} UTC">'
        assert body.count(f"{cell}{offset}</time></td>") == 2, offset
    page = run_queries.run_page(run.id, T0 + timedelta(minutes=1))
    stages = {id(row.stage) for row in page.stages}
    assert len(page.attempts) == 6 and all(id(a.stage) in stages for a in page.attempts)
    assert [a.stage.seq for a in page.attempts] == [1, 1, 2, 2, 3, 3]


def test_each_attempt_row_shows_its_cells_escaped(client, oncall, thread, providers):
    """The attempts table is written in Python (dashboard/pages/run_html.py): each cell as the
    template wrote it — a dash for what is missing — and every value escaped."""
    run = make_run(thread, attempts=("alpha", "beta"))
    ProviderAttempt.objects.filter(run=run, provider__provider_id="beta").update(
        model='<img src=x onerror="alert(1)">', result="refused", refusal_category="a&b's",
        status_code=400, failure_class="refusal", kind="re_render",
    )  # fmt: skip
    client.force_login(oncall)
    page = client.get(reverse("run", args=[run.id])).content.decode()
    rows = re.findall(r"<tr>\s*<td><time.*?</tr>", page, re.S)
    assert len(rows) == 2
    first, second = (re.sub(r"\s+", " ", row) for row in rows)
    assert 'alpha <div class="muted small">alpha-model</div>' in first
    assert '<span class="state accepted">accepted</span>' in first
    assert '<td>—</td> <td>—</td> <td class="num">—</td> <td class="num">420 ms</td>' in first
    assert "+300 ms</time>" in first
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in second and "<img" not in second
    assert "<td>a&amp;b&#x27;s</td>" in second and '<td class="num">400</td>' in second
    assert '<span class="state refused">refused</span>' in second and "<td>Re Render</td>" in second


def test_r6_1_the_waterfall_draws_no_progress_as_a_bar_and_the_deadline_as_a_marker(
    client, oncall, thread
):
    """All four clocks on one axis: queue and execution per stage, no progress
    from the last progress to the end, the overall deadline as a red line."""
    run, stage, _ = services.submit_run(thread, input="hi", now=T0, deadline_s=50)
    Stage.objects.filter(id=stage.id).update(
        started_at=T0 + timedelta(seconds=10), finished_at=T0 + timedelta(seconds=100)
    )
    Run.objects.filter(id=run.id).update(last_progress_at=T0 + timedelta(seconds=20))
    written.settle(
        run, Settlement("failed", "deadline_exceeded", "out of time"), T0 + timedelta(seconds=100)
    )
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    rows = re.findall(r'<li class="wf-row wf-(\w+)[^"]*">(.*?)</li>', body, re.S)
    kind, last = rows[-1]
    assert kind == "no_progress" and "no progress" in last
    assert 'x="20.0%" width="80.0%"' in last and "1 min 20 s" in last
    # The deadline (+50 s of a 100 s chart) is a line at 50 % on every row.
    assert all('class="wf-deadline" x1="50.0%"' in row for _kind, row in rows)
    assert "deadline at +50.0 s (the red line)" in body


def test_r6_1_a_deadline_after_the_chart_is_said_not_drawn(client, oncall, thread):
    run, stage, _ = services.submit_run(thread, input="hi", now=T0, deadline_s=3600)
    Stage.objects.filter(id=stage.id).update(
        started_at=T0 + timedelta(seconds=1), finished_at=T0 + timedelta(seconds=2)
    )
    written.settle(run, Settlement("completed", "answered", "ok"), T0 + timedelta(seconds=2))
    client.force_login(oncall)
    body = body_of(client.get(run_url(run)))
    assert "wf-deadline" not in body.split("<figcaption", 1)[0]
    assert "deadline at +1 h 00 min, after the chart&#x27;s end" in body
