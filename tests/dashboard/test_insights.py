"""Re-probe outcomes (R3.1–R3.3, R3.8): a hand-made refusal timeline,
recorded through the real refusal protocol (``rules.routing.drive_turn``) and
the real recording service (``services.refusals.record_turn``), read back by
the Insights page, its CSV and ``GET /api/v1/insights/reprobes``.

Every expected count and interval below is computed by hand from the
timeline, never from the code under test.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from governance import services, time_source
from governance.models import ApiToken, Provider, SegmentRefusal, Thread
from governance.rules.routing import AttemptOutcome, ChainEntry, drive_turn, route_turn
from governance.services.refusals import record_turn, segment_refusals
from governance.services.tokens import token_digest
from tests.conftest import streamed_body

pytestmark = pytest.mark.django_db

DAY0 = datetime(2025, 3, 3, 8, 0, tzinfo=UTC)
NOW = DAY0 + timedelta(days=6)
MIN, HOUR = timedelta(minutes=1), timedelta(hours=1)
A0, B0, C0, D0 = (DAY0 + timedelta(days=n) for n in range(4))


@pytest.fixture(autouse=True)
def fixed_clock():
    clock = time_source.ManualClock(NOW)
    time_source.install(clock)
    yield clock
    time_source.install(None)


def turn(thread, at, alpha, *, increment=False, finish=True):
    """One model turn at ``at``: ``alpha`` lists alpha's answers in order
    ("accepted", "refused", "timeout"); beta (the backup) accepts. The sends
    are one second apart; each answer comes at its send's start (latency 0).
    ``finish=False`` leaves its stage running."""
    segment = services.open_segment(thread)
    refusals = segment_refusals(segment)
    route = route_turn(
        [ChainEntry("alpha", "alpha-model"), ChainEntry("beta", "beta-model")],
        now=at, health={}, refusals=refusals,
    )  # fmt: skip
    answers = list(alpha)
    sent = []

    def send(candidate, kind):
        moment = at + timedelta(seconds=len(sent))
        answer = answers.pop(0) if candidate.provider_id == "alpha" else "accepted"
        if answer == "timeout":
            outcome = AttemptOutcome("failed", failure_class="timeout", at=moment)
        elif answer == "refused":
            outcome = AttemptOutcome("refused", refusal_category="policy", at=moment)
        else:
            outcome = AttemptOutcome("accepted", at=moment)
        sent.append((candidate, kind, outcome, moment))
        return outcome

    outcome = drive_turn(
        route, send, segment_key=segment.key, refusals=refusals,
        has_unaccepted_increment=increment, now=at,
    )  # fmt: skip
    assert not answers, "the protocol sent fewer requests to alpha than the timeline says"
    run, stage, _ = services.submit_run(thread, input="next", now=at)
    providers = {p.provider_id: p for p in Provider.objects.all()}
    rows = [
        {
            "provider": providers[candidate.provider_id],
            "model": candidate.model,
            "kind": kind,
            "request_digest": f"{kind}-{n}",
            "started_at": moment,
            "latency_ms": 0,
            "result": result.result,
            "failure_class": result.failure_class or "",
            "refusal_category": result.refusal_category or "",
        }
        for n, (candidate, kind, result, moment) in enumerate(sent)
    ]
    record_turn(run=run, stage=stage, segment=segment, outcome=outcome, attempts=rows, now=at)
    # The turn is over, as services.stages.close_stage records it with its attempts: only
    # then are its sends tiered (services.insight_tiers).
    if finish:
        services.finish_stage(stage, outcome="answered", now=at + timedelta(seconds=len(sent)))
    return [kind for candidate, kind, _, _ in sent if candidate.provider_id == "alpha"]


@pytest.fixture
def timeline(db):
    for pid in ("alpha", "beta"):
        Provider.objects.create(provider_id=pid, kind="scripted", model=f"{pid}-model", script=[])

    def thread(title):
        return services.create_thread(provider_chain=["alpha", "beta"], now=DAY0, title=title)

    # A: quarantine refused in full (segment refusal at +3 s), re-probes 1 and 2
    # refused, re-probe 3 accepted.
    a = thread("A")
    r = "refused"
    assert turn(a, A0, [r, r, r, r], increment=True) == [
        "original", "re_render", "re_render", "history_only",
    ]  # fmt: skip
    assert turn(a, A0 + 3 * timedelta(seconds=1) + 15 * MIN, [r]) == ["re_probe"]
    assert turn(a, A0 + 3 * timedelta(seconds=1) + 75 * MIN, [r]) == ["re_probe"]
    assert turn(a, A0 + 3 * timedelta(seconds=1) + 435 * MIN, ["accepted"]) == ["re_probe"]
    assert not SegmentRefusal.objects.filter(segment__thread=a).exists()  # cleared
    # B: original refused (no increment: a segment refusal at once); re-probe 1
    # times out (no answer, nothing recorded), then re-probe 1 is accepted.
    b = thread("B")
    assert turn(b, B0, [r]) == ["original"]
    assert turn(b, B0 + 15 * MIN, ["timeout"]) == ["re_probe"]
    assert turn(b, B0 + 20 * MIN, ["accepted"]) == ["re_probe"]
    # C: the R3.2 life: refused, three re-probes refused, frozen; a fresh start;
    # the first send of the new segment is accepted (R3.8).
    c = thread("C")
    assert turn(c, C0, [r]) == ["original"]
    assert turn(c, C0 + 15 * MIN, [r]) == ["re_probe"]
    assert turn(c, C0 + 75 * MIN, [r]) == ["re_probe"]
    assert turn(c, C0 + 435 * MIN, [r]) == ["re_probe"]
    assert turn(c, C0 + 460 * MIN, []) == []  # frozen: not one more byte
    services.apply_boundary(c, "fresh_start", by="oscar", reason="frozen", now=C0 + 470 * MIN)
    assert turn(c, C0 + 480 * MIN, ["accepted"]) == ["original"]
    # D: original refused, the first re-render accepted.
    d = thread("D")
    assert turn(d, D0, [r, "accepted"], increment=True) == ["original", "re_render"]


# Wilson 95 % intervals by hand: centre (p + z²/2n)/(1 + z²/n), half-width
# z·sqrt(p(1-p)/n + z²/4n²)/(1 + z²/n), z = 1.96.
WILSON = {
    (0, 4): (0.0, 0.4899),
    (1, 3): (0.0615, 0.7923),
    (0, 1): (0.0, 0.7935),
    (0, 2): (0.0, 0.6576),
    (1, 2): (0.0945, 0.9055),
    (1, 1): (0.2065, 1.0),
}
# tier label: sends, accepted, refused, failed, (accepted, answered), median since last refusal
EXPECTED = {
    "original refused send": (4, 0, 4, 0, (0, 4), None),
    # A's two re-renders came 1 s and 2 s after a refused send; D's 1 s after.
    "re-render": (3, 1, 2, 0, (1, 3), timedelta(seconds=1)),
    "history-only": (1, 0, 1, 0, (0, 1), timedelta(seconds=1)),
    # A 15 min, B 15 min (timeout) and 20 min, C 15 min after the refusal.
    "re-probe 1": (4, 1, 2, 1, (1, 3), 15 * MIN),
    "re-probe 2": (2, 0, 2, 0, (0, 2), HOUR),
    "re-probe 3": (2, 1, 1, 0, (1, 2), 6 * HOUR),
    # C's last refusal at +435 min, the first send after the boundary at +480 min.
    "first send after fresh start": (1, 1, 0, 0, (1, 1), 45 * MIN),
}


def api_client(client, user):
    token = "insights-token-" + "y" * 20
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(token))
    return lambda path: client.get(path, headers={"Authorization": f"Bearer {token}"})


def check_rows(rows):
    by_label = {row["label"]: row for row in rows}
    assert list(by_label) == list(EXPECTED)
    for label, (sends, accepted, refused, failed, (k, n), since) in EXPECTED.items():
        row = by_label[label]
        assert (row["sends"], row["accepted"], row["refused"], row["failed"]) == (
            sends, accepted, refused, failed,
        ), label  # fmt: skip
        assert row["acceptance_rate"] == pytest.approx(k / n), label
        low, high = WILSON[(k, n)]
        assert row["interval"]["low"] == pytest.approx(low, abs=1e-4), label
        assert row["interval"]["high"] == pytest.approx(high, abs=1e-4), label
        expected_since = since.total_seconds() if since is not None else None
        assert row["median_seconds_since_refusal"] == expected_since, label


def test_tier_counts_and_wilson_intervals_of_a_hand_made_timeline(timeline, client, manager):
    """R3.1–R3.3, R3.8: each tier's sends, answers, interval and median wait."""
    get = api_client(client, manager)
    response = get(
        "/api/v1/insights/reprobes?since=2025-03-01T00:00:00Z&until=2025-03-09T00:00:00Z"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    check_rows(body["totals"])
    # Only alpha refused: the per-provider rows are alpha's, with its model and category.
    check_rows(body["rows"])
    assert {(r["provider_id"], r["model"], r["category"]) for r in body["rows"]} == {
        ("alpha", "alpha-model", "policy")
    }
    assert body["rows"][-1]["boundary_kind"] == "fresh_start"
    assert [r["step"] for r in body["rows"] if r["tier"] == "re_probe"] == [1, 2, 3]


def test_a_period_counts_its_own_sends_with_the_refusals_before_it(timeline, client, operator):
    """C's third re-probe is still re-probe 3 when the period starts after the refusals."""
    get = api_client(client, operator)
    since = (C0 + 7 * HOUR).strftime("%Y-%m-%dT%H:%M:%SZ")
    until = (C0 + 9 * HOUR).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = get(f"/api/v1/insights/reprobes?since={since}&until={until}").json()
    assert [(r["label"], r["sends"], r["accepted"]) for r in body["totals"]] == [
        ("re-probe 3", 1, 0),
        ("first send after fresh start", 1, 1),
    ]
    body = get(f"/api/v1/insights/reprobes?since={since}&until={until}&provider=beta").json()
    assert body["rows"] == [] and body["totals"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=yesterday", "since"),
        ("until=2025-03-01T00:00:00Z&since=2025-03-02T00:00:00Z", "since"),
        ("since=2020-01-01T00:00:00Z&until=2025-01-01T00:00:00Z", "since"),
        ("provider=no%20spaces", "provider"),
        ("colour=blue", "colour"),
    ],
)
def test_bad_parameters_answer_400_naming_the_field(client, manager, query, field):
    response = api_client(client, manager)(f"/api/v1/insights/reprobes?{query}")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_the_api_needs_the_view_insights_permission(client, oncall):
    response = api_client(client, oncall)("/api/v1/insights/reprobes")
    assert response.status_code == 403
    assert "view_insights" in response.json()["error"]["message"]


def test_the_page_shows_the_same_numbers_as_the_api(timeline, client, operator):
    client.force_login(operator)
    response = client.get(reverse("insights"), {"from": "2025-03-01", "to": "2025-03-08"})
    assert response.status_code == 200
    page = response.content.decode()
    assert "17 refusal-related sends" in page  # 4 + 3 + 1 + 4 + 2 + 2 + 1
    for label in EXPECTED:
        assert label in page
    # re-probe 3: 1 of 2 answered, 50.0 %, interval 9.5 % – 90.5 %, median 6.0 h
    assert "50.0%" in page and "9.5% – 90.5%" in page and "6.0 h" in page
    assert 'href="/insights/reprobes.csv?' in page
    assert ">Insights</a>" in page  # in the navigation for operators


def test_the_default_period_is_the_last_7_days(timeline, client, manager, fixed_clock):
    client.force_login(manager)
    page = client.get(reverse("insights")).content.decode()
    assert "from 2025-03-03 to 2025-03-09 (UTC, both days included)" in page
    fixed_clock.advance(timedelta(days=30))
    page = client.get(reverse("insights")).content.decode()
    assert "no refusals" in page


def test_the_csv_holds_the_totals_then_every_row(timeline, client, manager):
    client.force_login(manager)
    response = client.get(reverse("insights-csv"), {"from": "2025-03-01", "to": "2025-03-08"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(streamed_body(response).decode())))
    assert rows[0][:5] == ["tier", "provider", "model", "category", "sends"]
    totals = [r for r in rows[1:] if r[1] == "all providers"]
    detail = [r for r in rows[1:] if r[1] == "alpha"]
    assert [r[0] for r in totals] == list(EXPECTED) == [r[0] for r in detail]
    reprobe_3 = detail[5]
    assert reprobe_3[4:8] == ["2", "1", "1", "0"]
    assert reprobe_3[8:12] == ["0.5000", "0.0945", "0.9055", "21600"]


def test_bad_dates_are_form_errors(client, manager):
    client.force_login(manager)
    response = client.get(reverse("insights"), {"from": "2025-03-09", "to": "2025-03-01"})
    assert response.status_code == 400
    assert "“From” must be before “To”." in response.content.decode()
    response = client.get(reverse("insights-csv"), {"from": "soon"})
    assert response.status_code == 400
    assert response.content.decode().startswith("Bad filters: from:")


def test_on_call_staff_and_outsiders_do_not_see_insights(client, oncall, outsider):
    for user in (oncall, outsider):
        client.force_login(user)
        assert client.get(reverse("insights")).status_code == 403
        assert client.get(reverse("insights-csv")).status_code == 403
        assert ">Insights</a>" not in client.get(reverse("overview")).content.decode()


# --------------------------------------------------------------------------- what if (R3.2)


def _cells(page: str, table_id: str) -> list[list[str]]:
    import re

    table = page.split(f'id="{table_id}"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
    return [
        [
            re.sub(r"<[^>]+>", "", cell).strip()
            for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, flags=re.S)
        ]
        for row in rows
    ]


def test_r3_2_what_if_replays_the_recorded_timelines_with_hand_computed_numbers(
    timeline, client, operator
):
    """A, B and C opened segment refusals (D did not); p1 = 1/3, p2 = 0, p3 = 1/2.
    As run (15 min, 1 h, 6 h): A and C re-probe at 15, 75 and 435 min, B at 15 min
    only — expected sends 17/3, answers 5/3, frozen 2/3. Proposed (10 min, 30
    min): A and C at 15 and 75 min, B at 15 min — sends 13/3, answers 1, frozen
    4/3. Recorded: 8 re-probe sends (3 + 2 + 3), 2 accepted (A, B), 1 frozen (C)."""
    client.force_login(operator)
    response = client.get(
        reverse("insights"),
        {"from": "2025-03-01", "to": "2025-03-08", "tiers": "2", "delays": "10m, 30m"},
    )
    assert response.status_code == 200, response.content
    page = response.content.decode()
    assert "An estimate from recorded data, not a measurement." in page
    assert "0.7 answers lost" in page
    assert "1.3 fewer re-probe sends to refusing providers" in page
    assert "(-0.7 answers, -1.3 sends)" in page
    assert "3 refusal timelines" in page
    rows = {row[0]: row[1:] for row in _cells(page, "what-if-table")}
    assert rows["Schedule"] == ["—", "15 min, 1 h, 6 h", "10 min, 30 min"]
    assert rows["Re-probe sends to refusing providers"] == ["8", "5.7", "4.3"]
    assert rows["Answers from re-probes (accepted)"] == ["2", "1.7", "1.0"]
    assert rows["Segments frozen (expected)"] == ["1", "0.7", "1.3"]
    assert rows["Timelines long enough to use every re-probe"] == ["—", "2", "2"]
    assert rows["Median time from the first refusal to the freeze"][2] == "75 min"
    # the sample sizes behind the chances
    assert "re-probe 1: <strong>33.3%</strong>" in page and "1 accepted of 3 answered" in page
    assert "re-probe 2: <strong>0.0%</strong>" in page and "0 accepted of 2 answered" in page
    assert "the 6 sends of the opening turns" in page
    assert len(_cells(page, "what-if-segments")) == 1 + 3  # header + A, B, C


@pytest.mark.parametrize(
    ("tiers", "delays", "words"),
    [
        ("3", "10m, 30m", "3 re-probes need 3 delays, one per re-probe; 2 given."),
        ("2", "30m, 10m", "re-probe 2&#x27;s delay must be longer than re-probe 1&#x27;s"),
        ("2", "1h, 7h", "the last delay must be at most 6 h"),
        ("6", "1m,2m,3m,4m,5m,6m", "Ensure this value is less than or equal to 5."),
        ("1", "soon", "not a duration"),
        ("0", "10m", "Ensure this value is greater than or equal to 1."),
    ],
)
def test_r3_2_a_bad_proposed_schedule_is_a_form_error(client, manager, tiers, delays, words):
    client.force_login(manager)
    response = client.get(
        reverse("insights"),
        {"from": "2025-03-01", "to": "2025-03-08", "tiers": tiers, "delays": delays},
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert words in page
    assert 'id="what-if-table"' not in page


def test_r3_2_without_a_proposal_the_what_if_form_shows_the_schedule_in_force(
    timeline, client, manager
):
    client.force_login(manager)
    page = client.get(reverse("insights"), {"from": "2025-03-01", "to": "2025-03-08"})
    body = page.content.decode()
    assert 'value="15m, 1h, 6h"' in body and 'value="3"' in body
    assert 'id="what-if-table"' not in body


def test_r3_8_a_first_send_after_a_boundary_counts_in_the_period_it_falls_in(
    timeline, client, operator
):
    """C's first send after the fresh start (C0 + 480 min) is the after-boundary tier of a
    period that holds it; a period that starts after it holds only the segment's later
    accepted send, which is no tier (the boundary's carried state is not re-read)."""
    assert turn(Thread.objects.get(title="C"), C0 + 500 * MIN, ["accepted"]) == ["original"]
    get = api_client(client, operator)

    def totals(since, until):
        fmt = "%Y-%m-%dT%H:%M:%SZ"
        url = f"/api/v1/insights/reprobes?since={since.strftime(fmt)}&until={until.strftime(fmt)}"
        return [(r["label"], r["sends"], r["accepted"]) for r in get(url).json()["totals"]]

    assert totals(C0 + 479 * MIN, C0 + 510 * MIN) == [("first send after fresh start", 1, 1)]
    assert totals(C0 + 481 * MIN, C0 + 510 * MIN) == []
