"""The delivery-versus-settlement report (R7.2–R7.4, R8.4), through the Django test client.

Runs are built with ``governance.services`` (thread, run) and the facts the
report reads (attempts, body chunks, receipts, settlements) as plain ORM rows,
so every discrepancy below comes from real rows judged by the rules in
``governance.rules.publication``. Expected totals are computed in the tests from the
specs that built the rows, never from the report's own code.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from html.parser import HTMLParser

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.pages.reports import csv_safe
from dashboard.queries import report as q
from governance import services, time_source
from governance.models import (
    BodyChunk,
    Provider,
    ProviderAttempt,
    Run,
    Settlement,
    ToolReceipt,
)
from governance.rules.discrepancies import DISCREPANCY_CODES
from governance.rules.publication import CallbackStatus
from governance.services import deliveries
from tests.conftest import streamed_body

pytestmark = pytest.mark.django_db

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)
TODAY = NOW.date()
REPORT = reverse("report")
CSV = reverse("report-csv")


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def fixed_clock():
    the_clock = time_source.ManualClock(NOW)
    time_source.install(the_clock)
    yield the_clock
    time_source.install(None)


@pytest.fixture
def providers():
    return {
        pid: Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-model")
        for pid in ("alpha", "beta")
    }


# A chunk spec: "C" committed, "S" sent, "O" observed, "F" final; "" = generated only.
@dataclass
class RunSpec:
    provider: str | None = "alpha"
    outcome: str = "completed"
    settled_at: datetime = NOW - timedelta(hours=1)
    chunks: tuple[str, ...] = ("CSOF",)
    receipts_unknown: tuple[str, ...] = ()
    settlement_unknown: tuple[str, ...] = ()
    callback_url: str = ""
    attempts: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (provider, result)


def make_run(spec: RunSpec) -> Run:
    chain = sorted({spec.provider or "alpha", *(p for p, _ in spec.attempts)})
    for pid in chain:
        Provider.objects.get_or_create(
            provider_id=pid, defaults={"kind": "scripted", "model": f"{pid}-model"}
        )
    created = spec.settled_at - timedelta(minutes=5)
    thread = services.create_thread(
        provider_chain=chain, now=created, callback_url=spec.callback_url
    )
    run, stage, _ = services.submit_run(thread, input="what is 6 x 7?", now=created)
    attempts = spec.attempts or (((spec.provider, "accepted"),) if spec.provider else ())
    for offset, (pid, result) in enumerate(attempts):
        ProviderAttempt.objects.create(
            run=run,
            stage=stage,
            segment=run.segment,
            provider=Provider.objects.get(provider_id=pid),
            model=f"{pid}-model",
            kind="original" if offset == 0 else "fallback",
            request_digest=f"d{offset}",
            started_at=created + timedelta(seconds=offset),
            result=result,
        )
    for number, flags in enumerate(spec.chunks, start=1):
        committed = "C" in flags
        BodyChunk.objects.create(
            run=run,
            chunk_no=number,
            version=number if committed else None,
            text=f"chunk {number}",
            final="F" in flags,
            generated_at=created,
            committed_at=created if committed else None,
            sent_at=created if "S" in flags else None,
            observed_at=created if "O" in flags else None,
        )
    for key in spec.receipts_unknown:
        ToolReceipt.objects.create(
            run=run,
            stage=stage,
            tool="webhook",
            idempotency_key=key,
            effect=ToolReceipt.Effect.UNKNOWN,
            created_at=created,
        )
    Settlement.objects.create(
        run=run,
        outcome=spec.outcome,
        reason_code="answered",
        reason="test",
        unknown_effects=list(spec.settlement_unknown),
        settled_at=spec.settled_at,
    )
    Run.objects.filter(id=run.id).update(status=Run.Status.SETTLED)
    return run


# --------------------------------------------------------------------------- reading the page


class _Tables(HTMLParser):
    """Rows of the tables by id: each cell's ``data-csv`` if present, else its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict[str, list[list[str]]]] = {}
        self._table = self._section = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._fixed: str | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("id"):
            self._table = attrs["id"]
            self.tables[self._table] = {"thead": [], "tbody": [], "tfoot": []}
        elif self._table and tag in ("thead", "tbody", "tfoot"):
            self._section = tag
        elif self._table and tag == "tr":
            self._row = []
        elif self._row is not None and tag in ("td", "th"):
            self._cell, self._fixed = [], attrs.get("data-csv")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            text = self._fixed if self._fixed is not None else " ".join("".join(self._cell).split())
            self._row.append(text)
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table][self._section].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables(response) -> dict[str, dict[str, list[list[str]]]]:
    parser = _Tables()
    parser.feed(response.content.decode())
    return parser.tables


def aggregate_rows(response) -> list[list[str]]:
    return tables(response)["aggregate"]["tbody"]


def discrepancy_rows(response) -> list[list[str]]:
    found = tables(response).get("discrepancy-table")
    return found["tbody"] if found else []


def codes_by_run(response) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for row in discrepancy_rows(response):
        result.setdefault(row[0], set()).add(row[8])
    return result


def get_report(client, **params):
    return client.get(REPORT, params)


def read_csv(response) -> tuple[list[str], list[list[str]], list[str], list[list[str]]]:
    assert response.streaming  # streamed, the header first
    rows = list(csv.reader(io.StringIO(streamed_body(response).decode())))
    blank = rows.index([])
    aggregate, discrepancies = rows[:blank], rows[blank + 1 :]
    return aggregate[0], aggregate[1:], discrepancies[0], discrepancies[1:]


# Expected aggregate, computed from the specs (not from the report's code).
def expected_rows(specs: list[RunSpec], group: str) -> dict[str, list[int]]:
    def key(spec: RunSpec) -> str:
        if group == "day":
            return spec.settled_at.date().isoformat()
        if group == "provider":
            return spec.provider or "no provider attempt"
        return spec.outcome

    out: dict[str, list[int]] = {}
    for spec in specs:
        row = out.setdefault(key(spec), [0] * 8)
        row[0] += 1
        row[1 + ("completed", "partial", "failed", "cancelled").index(spec.outcome)] += 1
        row[5] += sum("C" in c for c in spec.chunks)
        row[6] += sum("C" in c and "S" in c for c in spec.chunks)
        row[7] += sum("C" in c and "O" in c for c in spec.chunks)
    return out


# --------------------------------------------------------------------------- permission (R8.4)


@pytest.mark.parametrize("url", [REPORT, CSV])
def test_r84_anonymous_is_sent_to_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("role", ["oncall", "operator", "outsider"])
@pytest.mark.parametrize("url", [REPORT, CSV])
def test_r84_only_managers_see_the_report_others_get_403(client, request, role, url):
    """R8.4: the report and its CSV are for managers; every other role gets 403."""
    client.force_login(request.getfixturevalue(role))
    assert client.get(url).status_code == 403


@pytest.mark.parametrize("role", ["oncall", "operator", "outsider"])
def test_r84_the_nav_link_is_hidden_from_non_managers(client, request, role):
    client.force_login(request.getfixturevalue(role))
    assert f'href="{REPORT}"' not in client.get(reverse("overview")).content.decode()


def test_r84_manager_sees_the_nav_link_and_the_page(client, manager):
    """R8.4: a manager reaches the delivery-versus-settlement report from the nav."""
    client.force_login(manager)
    response = get_report(client)
    body = response.content.decode()
    assert response.status_code == 200
    assert f'href="{REPORT}" aria-current="page"' in body
    assert "<h1>Delivery vs settlement</h1>" in body


@pytest.mark.parametrize("url", [REPORT, CSV])
def test_r84_the_report_is_read_only(client, manager, url):
    client.force_login(manager)
    assert client.post(url).status_code == 405


# --------------------------------------------------------------------------- range and filters


def test_r84_default_range_is_the_last_7_days_ending_today_utc(client, manager, providers):
    inside = make_run(RunSpec(settled_at=datetime(2025, 3, 4, 0, 0, tzinfo=UTC)))
    today_late = make_run(RunSpec(settled_at=datetime(2025, 3, 10, 23, 59, 59, tzinfo=UTC)))
    before = make_run(RunSpec(settled_at=datetime(2025, 3, 3, 23, 59, 59, tzinfo=UTC)))
    client.force_login(manager)
    response = get_report(client)
    body = response.content.decode()
    assert 'name="from" type="date" value="2025-03-04"' in body
    assert 'name="to" type="date" value="2025-03-10"' in body
    assert [row[:2] for row in aggregate_rows(response)] == [
        ["2025-03-04", "1"],
        ["2025-03-10", "1"],
    ]
    listed = codes_by_run(response)
    assert str(inside.id) not in listed  # a clean run has no discrepancy
    assert str(before.id) not in listed
    assert today_late.id  # counted in the 2025-03-10 row above


def test_r84_to_day_is_inclusive_and_bounds_are_utc_days(client, manager, providers):
    for moment in (
        datetime(2025, 3, 1, 0, 0, tzinfo=UTC),
        datetime(2025, 3, 2, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2025, 3, 3, 0, 0, tzinfo=UTC),  # outside
        datetime(2025, 2, 28, 23, 59, 59, tzinfo=UTC),  # outside
    ):
        make_run(RunSpec(settled_at=moment))
    client.force_login(manager)
    response = get_report(client, **{"from": "2025-03-01", "to": "2025-03-02"})
    assert [row[:2] for row in aggregate_rows(response)] == [
        ["2025-03-01", "1"],
        ["2025-03-02", "1"],
    ]


def test_r84_quick_links_cover_24h_7_and_30_days_and_keep_the_grouping(client, manager, providers):
    make_run(RunSpec(settled_at=NOW - timedelta(hours=23)))
    make_run(RunSpec(settled_at=NOW - timedelta(hours=25)))
    client.force_login(manager)
    response = get_report(client, group="provider")
    body = response.content.decode()
    links = dict(re.findall(r'<a href="\?([^"]+)" hx-get="[^"]+"[^>]*>(last [^<]+)</a>', body))
    links = {label: href.replace("&amp;", "&") for href, label in links.items()}
    assert set(links) == {"last 24 h", "last 7 days", "last 30 days"}
    assert "from=2025-03-09T12%3A00&to=2025-03-10T12%3A00" in links["last 24 h"]
    assert "from=2025-03-04&to=2025-03-10" in links["last 7 days"]
    assert "from=2025-02-09&to=2025-03-10" in links["last 30 days"]
    assert all("group=provider" in href for href in links.values())
    day = client.get(f"{REPORT}?{links['last 24 h']}")
    assert day.status_code == 200
    assert 'name="from" type="datetime-local" value="2025-03-09T12:00"' in day.content.decode()
    # one completed run, one chunk committed, sent and observed, all acknowledged
    # (its one request reported no usage — the cost is unknown, not 0)
    assert aggregate_rows(day) == [
        ["alpha", "1", "1", "0", "0", "0", "1", "1", "1", "1"] + ["0"] * 4 + ["unknown", "—", "1"]
    ]


def test_r84_provider_and_outcome_filters_narrow_every_table(client, manager, providers):
    """R8.4: the provider and outcome filters narrow the aggregate and the discrepancies."""
    make_run(RunSpec(provider="alpha", outcome="completed", chunks=("CSF",)))
    make_run(RunSpec(provider="beta", outcome="completed", chunks=("CF",)))
    make_run(RunSpec(provider="beta", outcome="partial", chunks=("CSO", "C", "")))
    client.force_login(manager)
    response = get_report(client, provider="beta", group="outcome")
    assert [row[:2] for row in aggregate_rows(response)] == [["completed", "1"], ["partial", "1"]]
    assert {row[2] for row in discrepancy_rows(response)} == {"beta"}
    response = get_report(client, provider="beta", outcome="partial", group="provider")
    assert [row[:2] for row in aggregate_rows(response)] == [["beta", "1"]]
    assert {row[3] for row in discrepancy_rows(response)} == {"partial"}


def test_r74_a_runs_provider_is_the_one_that_answered_after_fallback(client, manager, providers):
    make_run(RunSpec(provider="beta", attempts=(("alpha", "refused"), ("beta", "accepted"))))
    make_run(RunSpec(provider="alpha", attempts=(("alpha", "failed"),)))
    make_run(RunSpec(provider=None, outcome="failed", chunks=()))
    client.force_login(manager)
    response = get_report(client, group="provider")
    assert [row[:3] for row in aggregate_rows(response)] == [
        ["alpha", "1", "1"],
        ["beta", "1", "1"],
        ["no provider attempt", "1", "0"],
    ]
    assert [row[:2] for row in aggregate_rows(get_report(client, provider="beta"))] == [
        [NOW.date().isoformat(), "1"]
    ]


# --------------------------------------------------------------------------- aggregate (R7.4)


def _mixed_specs() -> list[RunSpec]:
    days = [NOW - timedelta(days=d, hours=1) for d in (0, 1, 3)]
    shapes = [
        ("completed", ("CSO", "CSOF")),
        ("completed", ("CS", "CF")),
        ("partial", ("CSO", "C", "")),
        ("failed", ()),
        ("cancelled", ("CS",)),
        ("completed", ("CSOF",)),
    ]
    specs = []
    for (index, moment), provider in zip(
        enumerate(itertools.islice(itertools.cycle(days), 11)),
        itertools.cycle(["alpha", "beta", "alpha"]),
        strict=False,
    ):
        outcome, chunks = shapes[index % len(shapes)]
        specs.append(RunSpec(provider=provider, outcome=outcome, settled_at=moment, chunks=chunks))
    specs.append(RunSpec(provider=None, outcome="failed", chunks=(), settled_at=days[1]))
    return specs


@pytest.mark.parametrize("group", ["day", "provider", "outcome"])
def test_r74_aggregate_per_group_matches_totals_computed_from_the_rows(
    client, manager, providers, group
):
    specs = _mixed_specs()
    for spec in specs:
        make_run(spec)
    make_run(RunSpec(settled_at=NOW - timedelta(days=9)))  # outside the default week
    expected = expected_rows(specs, group)
    client.force_login(manager)
    response = get_report(client, group=group)
    rows = aggregate_rows(response)
    got = {row[0]: [int(cell) for cell in row[1:9]] for row in rows}
    assert got == expected
    order = [row[0] for row in rows]
    if group == "day":
        assert order == sorted(order)
    elif group == "outcome":
        assert order == [o for o in ("completed", "partial", "failed", "cancelled") if o in order]
    else:
        assert order == ["alpha", "beta", "no provider attempt"]
    total = tables(response)["aggregate"]["tfoot"][0]
    assert total[0] == "Total"
    assert [int(c) for c in total[1:9]] == [
        sum(col) for col in zip(*expected.values(), strict=True)
    ]
    # runs with discrepancies, per group, from the list on the same page
    flagged = Counter()
    seen = set()
    for row in discrepancy_rows(get_report(client, group=group)):
        if row[0] in seen:
            continue
        seen.add(row[0])
        if group == "day":
            flagged[row[1][:10]] += 1
        elif group == "provider":
            flagged[row[2]] += 1
        else:
            flagged[row[3]] += 1
    assert {row[0]: int(row[13]) for row in rows} == {k: flagged[k] for k in got}


def test_r73_client_evidence_columns_count_runs_by_acknowledgement(client, manager, providers):
    make_run(RunSpec(chunks=("CSO", "CSOF")))  # all acknowledged
    make_run(RunSpec(chunks=("CSO", "CSF")))  # part
    make_run(RunSpec(chunks=("CS", "CSF")))  # none acknowledged
    make_run(RunSpec(outcome="failed", chunks=("",)))  # nothing committed
    client.force_login(manager)
    (row,) = aggregate_rows(get_report(client))
    assert row[9:13] == ["1", "1", "1", "1"]
    assert row[13] == "2"  # part and none acknowledged; a failed run with nothing is honest
    body = get_report(client).content.decode()
    assert "all acknowledged" in body and "no acknowledgement" in body  # chart legend in words


# --------------------------------------------------------------------------- discrepancies (R7.4)

SCENARIOS = {
    "clean": (RunSpec(chunks=("CSO", "CSOF")), set()),
    "completed_never_observed": (
        RunSpec(chunks=("CS", "CSF")),
        {"no_client_evidence"},
    ),
    "completed_some_never_observed": (
        RunSpec(chunks=("CSO", "CSF")),
        {"chunks_never_observed"},
    ),
    "committed_never_sent": (
        RunSpec(chunks=("CSO", "COF")),
        {"committed_never_sent", "observed_without_send_record"},
    ),
    "committed_never_sent_nor_observed": (
        RunSpec(outcome="partial", chunks=("CSO", "C", "")),
        {"committed_never_sent", "chunks_never_observed"},
    ),
    "effects_unknown_from_receipts": (
        RunSpec(outcome="partial", chunks=("CSOF",), receipts_unknown=("hook-1",)),
        {"effects_unknown"},
    ),
    "effects_unknown_from_settlement": (
        RunSpec(chunks=("CSOF",), settlement_unknown=("hook-2",)),
        {"effects_unknown"},
    ),
    "completed_without_committed_body": (
        RunSpec(chunks=()),
        {"completed_without_committed_body"},
    ),
    "completed_body_incomplete": (
        RunSpec(chunks=("CSO", "")),
        {"completed_body_incomplete"},
    ),
    "partial_without_saved_material": (
        RunSpec(outcome="partial", chunks=("",)),
        {"partial_without_saved_material"},
    ),
    "failed_with_saved_material": (
        RunSpec(outcome="failed", chunks=("CSO",)),
        {"failed_with_saved_material"},
    ),
    "observed_exceeds_committed": (
        RunSpec(outcome="partial", chunks=("CSO", "O")),
        {"observed_exceeds_committed"},
    ),
    "cancelled_with_nothing": (RunSpec(outcome="cancelled", chunks=()), set()),
    "callback_configured_not_sent_is_no_disagreement": (
        RunSpec(chunks=("CSOF",), callback_url="https://example.test/hook"),
        set(),
    ),
    "facts_unreadable": (
        RunSpec(chunks=("CSOF", "CSO")),
        {q.FACTS_UNREADABLE},
    ),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_r74_each_discrepancy_comes_from_real_rows(client, manager, providers, name):
    spec, codes = SCENARIOS[name]
    run = make_run(spec)
    client.force_login(manager)
    response = get_report(client)
    assert codes_by_run(response).get(str(run.id), set()) == codes
    for row in discrepancy_rows(response):
        assert row[0] == str(run.id)
        assert row[9]  # the rule's plain words
    body = response.content.decode()
    if codes:
        assert f'href="{reverse("run", args=[run.id])}"' in body
    else:
        assert "No discrepancy: every settled run in this range agrees" in body


def test_r74_discrepancy_text_says_which_chunks_and_effects(client, manager, providers):
    make_run(RunSpec(outcome="partial", chunks=("CSO", "C", "CF"), receipts_unknown=("hook-9",)))
    client.force_login(manager)
    texts = {row[8]: row[9] for row in discrepancy_rows(get_report(client))}
    assert texts["committed_never_sent"].endswith("never sent: 2, 3")
    assert texts["chunks_never_observed"].endswith("never observed: 2, 3")
    assert "hook-9" in texts["effects_unknown"]
    assert "Committed, never sent" in get_report(client).content.decode()


def test_r74_unknown_effects_from_receipts_and_settlement_are_listed_once(
    client, manager, providers
):
    make_run(
        RunSpec(chunks=("CSOF",), receipts_unknown=("k1", "k2"), settlement_unknown=("k2", "k3"))
    )
    client.force_login(manager)
    (row,) = discrepancy_rows(get_report(client))
    assert row[8] == "effects_unknown"
    assert row[9].endswith("effect(s) left unknown: k1, k2, k3")


def test_r74_callback_status_is_none_or_not_sent_yet(client, manager, providers):
    with_hook = make_run(RunSpec(chunks=("CS", "CSF"), callback_url="https://example.test/h"))
    without = make_run(RunSpec(chunks=("CS", "CSF")))
    client.force_login(manager)
    response = get_report(client)
    callbacks = {row[0]: row[7] for row in discrepancy_rows(response)}
    assert callbacks == {str(with_hook.id): "not sent yet", str(without.id): "none"}
    assert "no callback configured" in response.content.decode()


def test_r74_callback_statuses_is_the_one_plug_point():
    a, b = uuid.uuid4(), uuid.uuid4()
    views = deliveries.callback_statuses({a: "", b: "https://example.test/h"})
    assert views[a].status is CallbackStatus.NONE and views[a].note == "no callback configured"
    assert views[b].status is CallbackStatus.PENDING and views[b].label == "not sent yet"


def test_r74_every_rule_code_has_plain_words():
    assert set(DISCREPANCY_CODES) <= set(q.CODE_TITLES)
    assert q.code_title("brand_new_code") == "Brand new code"


def test_r74_discrepancies_are_paginated_25_per_page(client, manager, providers):
    runs = [
        make_run(RunSpec(chunks=("CS", "CSF"), settled_at=NOW - timedelta(minutes=m + 1)))
        for m in range(30)
    ]
    client.force_login(manager)
    first = discrepancy_rows(get_report(client))
    second = discrepancy_rows(get_report(client, page=2))
    assert len(first) == 25 and len(second) == 5
    # newest settlement first; one no_client_evidence per run
    assert [row[0] for row in first + second] == [str(r.id) for r in runs]
    assert "Page 1 of 2 (30 in all)" in get_report(client).content.decode()


def test_r74_unsettled_runs_are_not_in_the_report(client, manager, providers):
    thread = services.create_thread(provider_chain=["alpha"], now=NOW - timedelta(hours=2))
    services.submit_run(thread, input="pending", now=NOW - timedelta(hours=2))
    client.force_login(manager)
    response = get_report(client)
    assert "No run settled in this range." in response.content.decode()
    assert "aggregate" not in tables(response)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"from": "last tuesday"}, "“last tuesday” is not a date"),
        ({"from": "2025-02-30"}, "“2025-02-30” is not a real date"),
        ({"to": "2025-03-10T25:00"}, "is not a real date and time"),
        ({"from": "2025-03-09", "to": "2025-03-01"}, "“From” must be before “To”."),
        ({"from": "2024-01-01", "to": "2025-03-01"}, "The range is longer than 366 days"),
        ({"group": "week"}, "Select a valid choice."),
        ({"provider": "nobody"}, "Select a valid choice."),
        ({"outcome": "great"}, "Select a valid choice."),
    ],
)
def test_r84_bad_filters_show_the_form_again_with_400(client, manager, providers, params, message):
    make_run(RunSpec(chunks=("CS", "CSF")))
    client.force_login(manager)
    response = get_report(client, **params)
    body = response.content.decode()
    assert response.status_code == 400
    assert message in body
    assert 'name="from"' in body and "Show report" in body
    assert "discrepancy-table" not in body and "aggregate" not in tables(response)
    csv_response = client.get(CSV, params)
    assert csv_response.status_code == 400
    assert message in csv_response.content.decode()


def test_r84_a_range_of_exactly_366_days_is_allowed(client, manager):
    client.force_login(manager)
    assert get_report(client, **{"from": "2024-03-10", "to": "2025-03-10"}).status_code == 200


def test_r84_a_bad_value_is_shown_as_typed_and_marked_invalid(client, manager):
    client.force_login(manager)
    body = get_report(client, **{"from": "soon"}).content.decode()
    assert 'name="from" type="text" value="soon"' in body
    assert 'aria-invalid="true" aria-describedby="from-error"' in body


# --------------------------------------------------------------------------- htmx


def test_r84_htmx_gets_the_report_fragment_only(client, manager, providers):
    make_run(RunSpec(chunks=("CS", "CSF")))
    client.force_login(manager)
    response = client.get(REPORT, {"group": "provider"}, headers={"HX-Request": "true"})
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="report"')
    assert "<html" not in body and "discrepancy-table" in body
    bad = client.get(REPORT, {"from": "x"}, headers={"HX-Request": "true"})
    assert bad.status_code == 400
    assert bad.content.decode().lstrip().startswith('<div id="report"')


def test_r84_htmx_history_restore_gets_the_whole_page(client, manager):
    client.force_login(manager)
    response = client.get(
        REPORT, headers={"HX-Request": "true", "HX-History-Restore-Request": "true"}
    )
    assert "<html" in response.content.decode()


# --------------------------------------------------------------------------- chart


def test_r84_chart_is_inline_svg_with_patterns_and_text_labels(client, manager, providers):
    """R8.4: the chart of outcomes and client evidence, inline SVG with text labels."""
    make_run(RunSpec(outcome="completed", chunks=("CSOF",)))
    make_run(RunSpec(outcome="partial", chunks=("CS", "")))
    client.force_login(manager)
    body = get_report(client, group="outcome").content.decode()
    assert '<svg class="bars"' in body and 'role="img"' in body
    assert 'fill="url(#rp-partial)"' in body and '<pattern id="rp-partial"' in body
    assert "Upper bar, settlement outcome:" in body and "Lower bar, client evidence:" in body
    assert 'partial<tspan class="row-meta"> · 1 run · 1 with discrepancies</tspan>' in body
    assert "<title>partial: 1 run settled partial</title>" in body
    assert "<title>partial: 1 run, client evidence: no acknowledgement</title>" in body
    assert "<script" not in body.split('<div id="report"')[1]  # no chart library
    assert "http://" not in body and "https://" not in body  # no CDN


def test_r84_too_many_groups_skip_the_chart_but_keep_the_table(client, manager, providers):
    for day in range(62):
        make_run(RunSpec(settled_at=NOW - timedelta(days=day)))
    client.force_login(manager)
    response = get_report(client, **{"from": "2024-12-01", "to": "2025-03-10"})
    body = response.content.decode()
    assert "Too many groups to draw (62" in body
    assert len(aggregate_rows(response)) == 62


# --------------------------------------------------------------------------- CSV (R8.4)


def _screen_rows(client, params) -> tuple[list[list[str]], list[list[str]]]:
    response = get_report(client, **params)
    found = tables(response)
    aggregate = found["aggregate"]["tbody"] + found["aggregate"]["tfoot"]
    listed = discrepancy_rows(response)
    page = 2
    while f"Page {page - 1} of" in response.content.decode() and 'rel="next"' in (
        response.content.decode()
    ):
        response = get_report(client, **params, page=page)
        listed += discrepancy_rows(response)
        page += 1
    return aggregate, listed


@pytest.mark.parametrize("group", ["day", "provider", "outcome"])
def test_r84_csv_holds_exactly_the_rows_on_screen(client, manager, providers, group):
    """R8.4: the CSV export holds exactly the aggregate and discrepancy rows on screen."""
    for spec in _mixed_specs():
        make_run(spec)
    for m in range(20):  # more than one page of discrepancies
        make_run(RunSpec(chunks=("CS", "CSF"), settled_at=NOW - timedelta(minutes=m + 1)))
    client.force_login(manager)
    params = {"group": group, "from": "2025-03-03", "to": "2025-03-10"}
    aggregate, listed = _screen_rows(client, params)
    assert len(listed) > 25
    response = client.get(CSV, params)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert (
        response["Content-Disposition"]
        == 'attachment; filename="delivery-report-2025-03-03-2025-03-10.csv"'
    )
    agg_header, agg_rows, disc_header, disc_rows = read_csv(response)
    assert agg_header[0] == f"group ({group})" and len(agg_header) == 17  # 3 of cost
    assert disc_header[:2] == ["run", "settled at (UTC)"] and len(disc_header) == 10
    assert agg_rows == aggregate
    assert [row[:1] + row[2:] for row in disc_rows] == [row[:1] + row[2:] for row in listed]
    on_screen_times = [row[1] for row in listed]
    assert [row[1] for row in disc_rows] == on_screen_times


def test_r84_csv_link_on_the_page_carries_the_same_filters(client, manager, providers):
    make_run(RunSpec(chunks=("CS", "CSF")))
    client.force_login(manager)
    body = get_report(client, group="provider", provider="alpha", page="1").content.decode()
    href = re.search(r'href="(/reports/delivery\.csv[^"]*)" download', body).group(1)
    assert "group=provider" in href and "provider=alpha" in href and "page=" not in href


def test_r84_csv_of_an_empty_range_has_headers_only(client, manager):
    client.force_login(manager)
    response = client.get(CSV, {"from": "2025-03-01T06:30", "to": "2025-03-02T06:30"})
    agg_header, agg_rows, disc_header, disc_rows = read_csv(response)
    assert agg_header[0] == "group (day)" and disc_header[0] == "run"
    assert agg_rows == [] and disc_rows == []
    assert (
        'filename="delivery-report-2025-03-01T0630-2025-03-02T0630.csv"'
        in (response["Content-Disposition"])
    )


@pytest.mark.parametrize("evil", ["=HYPERLINK(1)", "+1+1", "-2+3", "@SUM(A1)"])
def test_r84_csv_cells_cannot_start_a_formula(client, manager, evil):
    make_run(RunSpec(provider=evil, chunks=("CS", "CSF")))
    client.force_login(manager)
    response = client.get(CSV, {"group": "provider"})
    _, agg_rows, _, disc_rows = read_csv(response)
    assert agg_rows[0][0] == "'" + evil
    assert disc_rows[0][2] == "'" + evil
    for row in agg_rows + disc_rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "-", "@"))


def test_csv_safe_prefixes_only_formula_starts():
    assert csv_safe("=1") == "'=1" and csv_safe("\tx") == "'\tx" and csv_safe("a=1") == "a=1"
    assert csv_safe("") == "" and csv_safe("12") == "12"


# --------------------------------------------------------------------------- data volume


def _queries_for(client, params) -> int:
    with CaptureQueriesContext(connection) as captured:
        assert get_report(client, **params).status_code == 200
    return len(captured)


def test_r84_report_queries_do_not_grow_with_runs(
    client, manager, providers, django_assert_max_num_queries
):
    client.force_login(manager)
    make_run(RunSpec(chunks=("CS", "CSF"), receipts_unknown=("k-0",)))
    first = _queries_for(client, {})  # warms the session caches, judges the one run
    small = {group: _queries_for(client, {"group": group}) for group in q.GROUPS}
    for n in range(40):
        make_run(
            RunSpec(
                provider=("alpha", "beta")[n % 2],
                outcome=("completed", "partial", "failed")[n % 3],
                chunks=("CS", "CSO", "CF"),
                receipts_unknown=(f"k-{n + 1}",),
                settled_at=NOW - timedelta(days=n % 7, minutes=n),
            )
        )
    # The first request after them judges the 40 in as many queries as it judged one.
    assert _queries_for(client, {}) == first
    assert Settlement.objects.filter(deliveries.UNJUDGED).count() == 0
    for group in q.GROUPS:
        assert _queries_for(client, {"group": group}) == small[group]
        with django_assert_max_num_queries(12):
            get_report(client, group=group, page=2)
    with django_assert_max_num_queries(12):
        assert client.get(CSV).status_code == 200


def test_r84_grouping_happens_in_the_database(client, manager, providers):
    """Whole UTC days are summed from the day sums, in the database; only the part-days
    at either end of a window are counted from the settlements (the default window is
    whole days: no settlement is read for the sums)."""
    make_run(RunSpec())
    client.force_login(manager)

    def grouped(**params):
        with CaptureQueriesContext(connection) as captured:
            assert get_report(client, group="day", **params).status_code == 200
        found = [c["sql"] for c in captured if "GROUP BY" in c["sql"]]
        return (
            [sql for sql in found if 'FROM "governance_settledday"' in sql],
            [sql for sql in found if 'FROM "governance_settlement"' in sql and "COUNT(" in sql],
        )

    days, settlements = grouped()
    assert len(days) == 1 and settlements == []
    today = NOW.date()
    start = f"{(today - timedelta(days=2)).isoformat()}T06:00"
    days, settlements = grouped(**{"from": start, "to": today.isoformat()})
    assert len(days) == 1 and len(settlements) == 1


def test_r84_a_run_settled_late_in_the_utc_day_is_counted_on_that_day(providers):
    make_run(RunSpec(settled_at=datetime(2025, 3, 9, 23, 30, tzinfo=UTC)))
    deliveries.judge_unjudged()
    (row,) = q.grouped_counts(
        q.ReportQuery(start=datetime(2025, 3, 9, tzinfo=UTC), end=datetime(2025, 3, 11, tzinfo=UTC))
    )
    assert row.key == date(2025, 3, 9) and row.runs == 1


def test_r84_the_csv_sends_its_header_before_the_report_is_read(
    client, manager, providers, monkeypatch
):
    """Streamed with an asynchronous iterator (Django's ASGI handler would read a
    synchronous one to its end first): the header line comes before any row is read."""
    from asgiref.sync import async_to_sync

    read = []
    real = q.delivery_report
    monkeypatch.setattr(q, "delivery_report", lambda query: read.append(query) or real(query))
    make_run(RunSpec())
    client.force_login(manager)
    response = client.get(CSV)
    assert response.status_code == 200 and response.is_async

    async def consume():
        seen = []
        async for part in response.streaming_content:
            seen.append((part, len(read)))  # how often the report was read by then
        return seen

    seen = async_to_sync(consume)()
    assert seen[0][0].decode().startswith("group (day),runs,") and seen[0][1] == 0
    assert seen[-1][1] == 1 and len(seen) > 3


def test_r84_discrepancy_rows_are_written_with_every_value_escaped():
    """The page's discrepancy rows are written in Python (dashboard/pages/report_html.py): the
    CSV's cells, the run linked by its first 8 characters, every value escaped."""
    from dashboard.pages import report_html
    from governance.services.deliveries import CallbackView

    run_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    run = q.RunDelivery(
        run_id=run_id, settled_at=datetime(2025, 3, 1, 12, 0, tzinfo=UTC), outcome="partial",
        provider="<b>p</b>", committed=2, sent=1, observed=0,
        callback=CallbackView(CallbackStatus.PENDING, "pending", 'said "x" & <y>'),
        verdict="", unknown_effects=(), discrepancies=(),
    )  # fmt: skip
    row = q.DiscrepancyRow(run, "odd_code", "Odd <title>", "it said <script>")
    cells = [str(run_id), "2025-03-01 12:00:00", "<b>p</b>", "partial", "2", "1", "0",
             "pending", "odd_code", "it said <script>"]  # fmt: skip
    html = str(report_html.discrepancy_rows([(row, cells)], UTC))
    assert "<script>" not in html and "<b>" not in html and "<title>" not in html
    assert f'href="{reverse("run", args=[run_id])}" title="Run {run_id}">12345678</a>' in html
    assert '<td class="c-provider" data-label="Provider">&lt;b&gt;p&lt;/b&gt;</td>' in html
    assert 'title="said &quot;x&quot; &amp; &lt;y&gt;">pending</td>' in html
    assert "<strong>Odd &lt;title&gt;</strong>" in html
    assert '<td class="c-text">it said &lt;script&gt;</td>' in html
    assert 'data-csv="2025-03-01 12:00:00"><time datetime="2025-03-01T12:00:00+00:00"' in html
