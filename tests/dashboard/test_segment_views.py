"""Segments list and page (R8.1, R3.7) and the operator's boundary actions (R8.3, R3.8, R1.4)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from dashboard.pages import segments as segment_views
from dashboard.queries import segments as queries
from governance import services, time_source
from governance.models import (
    AuditEntry,
    HistoryItem,
    Notification,
    Provider,
    ProviderAttempt,
    RunEvent,
    Segment,
    SegmentRefusal,
    Stage,
    ThreadSession,
)
from governance.rules.refusal import RULE_TEXT, ProviderRefusal, refusal_notices
from governance.rules.routing import fallback_card

pytestmark = pytest.mark.django_db

T0 = datetime(2025, 3, 4, 12, 0, tzinfo=UTC)
HTMX = {"HX-Request": "true"}


@pytest.fixture(autouse=True)
def manual_clock():
    the_clock = time_source.ManualClock(T0)
    time_source.install(the_clock)
    yield the_clock
    time_source.install(None)


@pytest.fixture
def providers(db):
    return [
        Provider.objects.create(provider_id=pid, kind="scripted", model=model, script=[])
        for pid, model in (
            ("alpha", "alpha-large"),
            ("beta", "beta-small"),
            ("gamma", "gamma-pro"),
        )
    ]


def make_thread(title="Invoice assistant", chain=("alpha", "beta", "gamma"), at=T0):
    thread = services.create_thread(provider_chain=list(chain), now=at, title=title)
    return thread, services.open_segment(thread)


def refuse(segment, provider_id, refusals, refused_at, category="content_filter"):
    return SegmentRefusal.objects.create(
        segment=segment,
        provider_id=provider_id,
        model=f"{provider_id}-model",
        category=category,
        refusals=refusals,
        refused_at=refused_at,
    )


@pytest.fixture
def thread_with_states(providers):
    """alpha frozen (4 refusals), beta cooling (2 refusals, re-probe at 12:30), gamma eligible."""
    thread, segment = make_thread()
    refuse(segment, "alpha", 4, T0 - timedelta(hours=3))  # frozen since 09:00
    refuse(segment, "beta", 2, T0 - timedelta(minutes=30))  # cooling until 12:30 (1 h delay)
    return thread, segment


def full_turn(thread, segment, at=T0):
    """A turn with every attempt kind, a fallback card, a notification (R3.1–R3.6)."""
    run, stage, _ = services.submit_run(thread, input="Summarise the invoice", now=at)
    alpha, beta = (
        Provider.objects.get(provider_id="alpha"),
        Provider.objects.get(provider_id="beta"),
    )
    kinds = [
        (alpha, "original", "refused"),
        (alpha, "re_render", "refused"),
        (alpha, "re_render", "refused"),
        (alpha, "history_only", "refused"),
        (beta, "fallback", "accepted"),
        (alpha, "re_probe", "refused"),
    ]
    for offset, (provider, kind, result) in enumerate(kinds):
        ProviderAttempt.objects.create(
            run=run,
            stage=stage,
            segment=segment,
            provider=provider,
            model=provider.model,
            kind=kind,
            request_digest=f"d{offset}",
            started_at=at + timedelta(seconds=offset),
            latency_ms=120 + offset,
            result=result,
            refusal_category="content_filter" if result == "refused" else "",
        )
    # The segment refusal is the last request's (the re-probe): the notice carries its time.
    refusal = ProviderRefusal(
        "alpha", "alpha-large", "content_filter", 1, at + timedelta(seconds=5)
    )
    RunEvent.objects.create(
        run=run,
        segment=segment,
        stage=stage,
        kind="llm-fallback",
        at=at + timedelta(seconds=10),
        metadata=fallback_card([], [refusal], "beta", at + timedelta(seconds=10)),
    )
    notice = refusal_notices(segment.key, [refusal], at + timedelta(seconds=10))[0]
    notification, _ = services.emit_notice(notice, segment)
    return run, stage, notification


def login(client, user):
    client.force_login(user)
    return client


def html(response) -> str:
    return response.content.decode()


# --------------------------------------------------------------------------- access


@pytest.mark.parametrize(
    "name,method",
    [
        ("segments", "get"),
        ("segment", "get"),
        ("segment-boundary", "get"),
        ("segment-boundary", "post"),
    ],
)
def test_anonymous_is_sent_to_login(client, thread_with_states, name, method):
    """Login required everywhere (R8)."""
    _, segment = thread_with_states
    url = reverse(name) if name == "segments" else reverse(name, args=[segment.id])
    response = getattr(client, method)(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))
    assert Segment.objects.count() == 1


# --------------------------------------------------------------------------- list (R8.1)


def test_list_shows_each_provider_state_in_words_and_numbers(client, oncall, thread_with_states):
    """R8.1: 'cooling until 12:30 (refusals 2 of 4)', 'frozen since 09:00', 'eligible';
    R3.7: the copy is the rule's own text."""
    response = login(client, oncall).get(reverse("segments"))
    body = html(response)
    assert response.status_code == 200
    assert '<span class="state cooling">cooling</span> until <time' in body
    assert (
        '12:30 UTC</time> <span class="relative">(in 30 min)</span> '
        '<span class="counts">(refusals 2 of 4)</span>' in body
    )
    assert '<span class="state frozen">frozen</span> since <time' in body
    assert (
        '09:00 UTC</time> <span class="relative">(3 h ago)</span> '
        '<span class="counts">(refusals 4 of 4)</span>' in body
    )
    assert '<span class="mono">gamma</span>: <span class="state eligible">eligible</span>' in body
    assert RULE_TEXT in body  # R3.7: the rule's one voice


def test_list_state_is_the_worst_provider_state(client, oncall, providers):
    """R8.1: the segment's state filter reads its worst provider."""
    _, frozen = make_thread("frozen one")
    refuse(frozen, "alpha", 4, T0 - timedelta(hours=8))
    _, cooling = make_thread("cooling one")
    refuse(cooling, "beta", 1, T0 - timedelta(minutes=5))
    _, due = make_thread("reprobe due")
    refuse(due, "beta", 1, T0 - timedelta(minutes=20))  # 15 min passed: eligible, re-probe due
    _, clean = make_thread("clean one")
    client = login(client, oncall)

    def keys(**params):
        body = html(client.get(reverse("segments"), params))
        return {s.key for s in (frozen, cooling, due, clean) if s.key in body}

    assert keys(state="frozen") == {frozen.key}
    assert keys(state="cooling") == {cooling.key}
    assert keys(state="eligible") == {due.key, clean.key}
    assert keys() == {frozen.key, cooling.key, due.key, clean.key}
    assert "re-probe due on the next turn" in html(client.get(reverse("segments")))


def test_list_filters_by_provider_thread_age_and_open_or_closed(client, oncall, providers):
    thread_a, seg_a = make_thread("Invoice assistant", chain=("alpha", "beta"))
    _, seg_b = make_thread("Travel planner", chain=("gamma",), at=T0 - timedelta(days=2))
    refuse(seg_a, "alpha", 4, T0)
    closed_a = seg_a
    new_a, _ = services.apply_boundary(
        thread_a, "fresh_start", by="ops", reason="frozen", now=T0 + timedelta(seconds=1)
    )
    client = login(client, oncall)

    def keys(**params):
        body = html(client.get(reverse("segments"), params))
        return {s.key for s in (closed_a, new_a, seg_b) if f">{s.key}</a>" in body}

    assert keys() == {new_a.key, seg_b.key}  # default: open only
    assert keys(status="closed") == {closed_a.key}
    assert keys(status="all") == {closed_a.key, new_a.key, seg_b.key}
    assert keys(provider="gamma") == {seg_b.key}
    assert keys(provider="alpha", status="all") == {closed_a.key, new_a.key}
    assert keys(provider="alpha", state="frozen", status="all") == {closed_a.key}
    assert keys(thread="travel") == {seg_b.key}
    assert keys(thread=str(thread_a.id), status="all") == {closed_a.key, new_a.key}
    assert keys(age="24h") == {new_a.key}
    assert keys(age="7d") == {new_a.key, seg_b.key}


def test_list_bad_filter_is_a_form_error(client, oncall, thread_with_states):
    response = login(client, oncall).get(reverse("segments"), {"state": "melting", "age": "1y"})
    body = html(response)
    assert response.status_code == 400
    assert "Select a valid choice" in body
    assert thread_with_states[1].key in body  # the valid rest still applies


def test_list_htmx_returns_the_results_fragment_only(client, oncall, thread_with_states):
    response = login(client, oncall).get(reverse("segments"), {"state": "frozen"}, headers=HTMX)
    body = html(response)
    assert response.status_code == 200
    assert body.lstrip().startswith('<section id="segment-results"')
    assert "<html" not in body
    assert thread_with_states[1].key in body


def test_list_empty_states(client, oncall, providers):
    client = login(client, oncall)
    assert "No open segments yet" in html(client.get(reverse("segments")))
    make_thread()
    body = html(client.get(reverse("segments"), {"state": "frozen"}))
    assert "No segment matches these filters" in body


def test_list_paginates_25_a_page(client, oncall, providers):
    for n in range(27):
        make_thread(f"thread {n}", at=T0 - timedelta(minutes=n))
    client = login(client, oncall)
    first = html(client.get(reverse("segments")))
    assert "Page 1 of 2 (27 in all)" in first
    assert first.count('<tr class="worst-') == 25
    second = html(client.get(reverse("segments"), {"page": 2}))
    assert second.count('<tr class="worst-') == 2
    assert "thread 26" in second


@pytest.mark.parametrize("params", [{}, {"state": "cooling", "provider": "beta"}])
def test_list_query_count_does_not_grow_with_segments(
    client, oncall, providers, django_assert_max_num_queries, params
):
    """No N+1: 25 segments with refusal rows cost what 1 does."""
    for n in range(30):
        _, segment = make_thread(f"thread {n}", at=T0 - timedelta(minutes=n))
        refuse(segment, "alpha", 4, T0)
        refuse(segment, "beta", 2, T0 - timedelta(minutes=1))
    client = login(client, oncall)
    client.get(reverse("segments"))  # warm the session
    with django_assert_max_num_queries(10):  # one of them: the nav's incident count
        response = client.get(reverse("segments"), params)
    assert html(response).count('<tr class="worst-') == 25


# --------------------------------------------------------------------------- segment page


def test_segment_page_header_and_provider_table(client, oncall, thread_with_states):
    """R8.1 state per provider with the R3.7 rule text as the page's copy."""
    _, segment = thread_with_states
    body = html(login(client, oncall).get(reverse("segment", args=[segment.id])))
    assert segment.key in body
    assert "Invoice assistant" in body
    assert "alpha-large" in body  # model
    assert "<dt>Mode</dt><dd>default</dd>" in body
    assert f"A provider that refuses this segment's content is {RULE_TEXT}." in body
    assert "(refusals 2 of 4)" in body and "(refusals 4 of 4)" in body
    assert '<section id="segment-providers" class="card critical"' in body  # frozen: critical
    assert '<span class="state eligible">eligible</span>' in body


def test_segment_timeline_shows_every_attempt_kind_fallback_cards_and_notifications(
    client, oncall, manager, thread_with_states
):
    """R8.1: the timeline of requests (original / re-render / history-only / re-probe /
    fallback), fallback cards with per-provider state, notifications with ack."""
    thread, segment = thread_with_states
    run, _, notification = full_turn(thread, segment)
    services.acknowledge_notification(notification.id, user=manager, now=T0 + timedelta(minutes=1))
    body = html(login(client, oncall).get(reverse("segment", args=[segment.id])))
    for word in ("original", "re-render", "history-only", "re-probe", "fallback"):
        assert f"<strong>{word}</strong>" in body, word
    assert body.count('class="tl tl-attempt"') == 6
    assert '<span class="state frozen">refused</span>' in body
    assert '<span class="state completed">accepted</span>' in body
    assert 'Fallback card</span> → fell back to <span class="mono">beta</span>' in body
    assert (
        '<span class="mono">alpha</span>: <span class="state cooling">cooling</span> until' in body
    )
    assert '<span class="state normal">normal</span>' in body
    assert notification.dedupe_key in body
    assert "acknowledged</span> by mona-manager" in body
    assert RULE_TEXT in notification.text and notification.text in body
    assert "queued" in body and reverse("run", args=[run.id]) in body
    # Newest first: the notification (T0+10s) above the first original attempt (T0).
    assert body.index(notification.dedupe_key) < body.index("<strong>original</strong>")


def test_segment_timeline_requests_and_stages_are_written_escaped(
    client, oncall, thread_with_states
):
    """Requests and stages are written in Python (dashboard/pages/segment_html.py): each
    part as the template wrote it, every value escaped."""
    thread, segment = thread_with_states
    run, stage, _ = full_turn(thread, segment)
    ProviderAttempt.objects.filter(segment=segment, kind="original").update(
        model="<script>alert(1)</script>", refusal_category="a&b", status_code=451,
        failure_class="refusal",
    )  # fmt: skip
    Stage.objects.filter(id=stage.id).update(
        finished_at=T0 + timedelta(seconds=20), outcome="<b>odd</b>", timeout_name="stage_timeout"
    )
    body = html(login(client, oncall).get(reverse("segment", args=[segment.id])))
    entries = body.split('class="tl tl-')[1:]
    original = next(c for c in entries if "<strong>original</strong>" in c)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in original and "<script>" not in original
    assert '<span class="muted">category</span> a&amp;b' in original
    assert '<span class="muted">failure</span> refusal' in original
    assert '<span class="muted">HTTP</span> 451' in original
    assert '<span class="state frozen">refused</span>' in original
    assert f'<a href="{reverse("run", args=[run.id])}">run</a> stage {stage.seq}' in original
    assert 'class="tl-when"><time datetime="' in original
    finished = next(c for c in entries if "model turn finished" in c)
    assert ": <strong>&lt;b&gt;odd&lt;/b&gt;</strong>" in finished
    assert '<span class="state failed">stage_timeout</span>' in finished
    queued = next(c for c in entries if "model turn queued" in c)
    assert queued.startswith('stage">') and "<strong>" not in queued


@pytest.mark.parametrize("page_size", [1, 2, 3, 4, 5])
def test_segment_timeline_pages_without_losing_same_instant_rows(
    client, oncall, thread_with_states, monkeypatch, page_size
):
    """The timeline is capped; 'show older' continues strictly before the oldest
    instant shown, and rows that share an instant are never split or lost."""
    thread, segment = thread_with_states
    full_turn(thread, segment)  # 6 attempts, 1 queued stage event, 1 card, 1 notification
    monkeypatch.setattr(segment_views, "TIMELINE_PAGE", page_size)
    client = login(client, oncall)
    seen = []
    url = reverse("segment", args=[segment.id])
    body = html(client.get(url))
    assert "Show older" in body
    assert "Opened</span> segment" not in body
    pages = 0
    while True:
        pages += 1
        seen += [chunk.split('"', 1)[0] for chunk in body.split('class="tl tl-')[1:]]
        if "Show older" not in body:
            break
        before = body.split("?before=", 1)[1].split("#", 1)[0]
        fragment = client.get(f"{url}?before={before}", headers=HTMX)
        body = html(fragment)
        assert "<html" not in body
    assert pages >= 2
    # Newest first, each row exactly once; the notification shares the instant of the
    # refusal it reports (the re-probe), and so do the first attempt and the queued stage.
    assert seen == ["fallback", "notification", *["attempt"] * 6, "stage", "opened"]


def test_segment_timeline_reads_one_page_per_source_without_asking_again(thread_with_states):
    """At scale (bench/scale.py): the timeline reads one page of each of its five
    sources (the stages by the segment's runs' ids, in the same statement); a source
    whose page reached below the oldest instant shown already holds that instant and
    says whether older rows exist, so it is not asked again (before: two more
    statements per source on every full page)."""
    thread, segment = thread_with_states
    for n in range(8):  # 72 rows over 8 instants' worth of turns: more than a page
        full_turn(thread, segment, at=T0 + timedelta(minutes=n))
    with CaptureQueriesContext(connection) as ctx:
        timeline = queries.segment_timeline(segment, before=None, limit=50)
    # One more: the fallback cards that number the re-probes shown (R8.1).
    assert len(ctx.captured_queries) == 5 + 1
    assert timeline.older is not None
    assert 50 <= len(timeline.items) <= 60
    with CaptureQueriesContext(connection) as ctx:
        rest = queries.segment_timeline(segment, before=timeline.older, limit=50)
    assert len(ctx.captured_queries) == 5 + 1
    assert rest.older is None and rest.items[-1].kind == "opened"
    shown = [(i.kind, i.id, i.label) for i in timeline.items + rest.items if i.kind != "opened"]
    stages = Stage.objects.filter(run__segment=segment)
    rows = (
        ProviderAttempt.objects.filter(segment=segment).count()
        + RunEvent.objects.filter(segment=segment, kind="llm-fallback").count()
        + Notification.objects.filter(segment=segment).count()
        + stages.count()
        + stages.filter(finished_at__isnull=False).count()
    )
    assert len(shown) == len(set(shown)) == rows  # every row once, none lost


def test_segment_timeline_reads_the_same_stages_without_postgresql(thread_with_states, monkeypatch):
    """Elsewhere the segment's runs are read first and their stages by a list of ids:
    the same timeline."""
    thread, segment = thread_with_states
    for n in range(3):
        full_turn(thread, segment, at=T0 + timedelta(minutes=n))

    def shown():
        timeline = queries.segment_timeline(segment, before=None, limit=50)
        return [(item.kind, item.id, item.label, item.at) for item in timeline.items]

    on_postgresql = shown()
    assert sum(1 for kind, *_ in on_postgresql if kind == "stage") >= 3
    monkeypatch.setattr(queries.connection, "vendor", "other")
    assert shown() == on_postgresql


def test_segment_timeline_keeps_an_instant_whole_when_one_source_fills_the_page(
    client, oncall, thread_with_states, monkeypatch
):
    """More rows of one source in one instant than a page: that source is asked for the
    whole instant, and the next page starts strictly before it."""
    thread, segment = thread_with_states
    run, stage, _ = services.submit_run(thread, input="burst", now=T0)
    alpha = Provider.objects.get(provider_id="alpha")
    at = T0 + timedelta(minutes=5)
    for n in range(7):  # seven requests in one instant
        ProviderAttempt.objects.create(
            run=run, stage=stage, segment=segment, provider=alpha, model="alpha-large",
            kind="re_probe", request_digest=f"burst-{n}", started_at=at, result="refused",
        )  # fmt: skip
    monkeypatch.setattr(segment_views, "TIMELINE_PAGE", 3)
    client = login(client, oncall)
    url = reverse("segment", args=[segment.id])
    body = html(client.get(url))
    assert body.count('class="tl tl-attempt"') == 7
    before = body.split("?before=", 1)[1].split("#", 1)[0]
    rest = html(client.get(f"{url}?before={before}", headers=HTMX))
    assert 'class="tl tl-attempt"' not in rest
    assert [chunk.split('"', 1)[0] for chunk in rest.split('class="tl tl-')[1:]] == [
        "stage", "opened",
    ]  # fmt: skip


def test_segment_timeline_bad_cursor_is_400_with_newest(client, oncall, thread_with_states):
    _, segment = thread_with_states
    response = login(client, oncall).get(reverse("segment", args=[segment.id]), {"before": "soon"})
    assert response.status_code == 400
    assert "could not be read" in html(response)


def test_segment_page_query_count_is_bounded(
    client, operator, thread_with_states, django_assert_max_num_queries
):
    thread, segment = thread_with_states
    for n in range(8):  # 72 timeline rows: more than a page
        full_turn(thread, segment, at=T0 + timedelta(minutes=n))
    client = login(client, operator)
    client.get(reverse("segment", args=[segment.id]))
    # Bounded whatever the segment's size: a fixed set of sources, each one page, asked
    # once (19 before, when every source was asked again about the oldest
    # instant shown and about older rows); one more for the API tokens that ran on the
    # thread, one for the nav's count of incidents needing a person, one for the cards
    # that number the re-probes shown.
    with django_assert_max_num_queries(16):
        response = client.get(reverse("segment", args=[segment.id]))
    body = html(response)
    assert "Show older" in body
    assert 50 <= body.count('class="tl tl-') <= 60


def test_segment_page_404_for_unknown_segment(client, oncall, providers):
    assert login(client, oncall).get(reverse("segment", args=[999999])).status_code == 404


# --------------------------------------------------------------------------- who sees buttons


def test_operator_sees_the_three_boundary_buttons_on_the_open_segment(
    client, operator, thread_with_states
):
    """R8.3: Compact, Fresh start, Switch model on the open segment, each opening a confirm step."""
    _, segment = thread_with_states
    body = html(login(client, operator).get(reverse("segment", args=[segment.id])))
    confirm = reverse("segment-boundary", args=[segment.id])
    for kind, name in (
        ("compact", "Compact"),
        ("fresh_start", "Fresh start"),
        ("model_switch", "Switch model"),
    ):
        assert f'href="{confirm}?kind={kind}"' in body
        assert f'hx-get="{confirm}?kind={kind}"' in body
        assert f"{name}…</a>" in body
    assert 'id="boundary-confirm"' in body


@pytest.mark.parametrize("role", ["oncall", "manager", "outsider"])
def test_users_without_the_permission_never_see_the_buttons(
    client, request, role, thread_with_states
):
    """R8.3: on-call, manager and a user with no role see no boundary button."""
    _, segment = thread_with_states
    user = request.getfixturevalue(role)
    body = html(login(client, user).get(reverse("segment", args=[segment.id])))
    assert reverse("segment-boundary", args=[segment.id]) not in body
    assert "needs the operator role" in body


def test_closed_segment_shows_who_why_when_and_no_buttons(client, operator, thread_with_states):
    """R1.4: the closed segment keeps its records and says who closed it, why and when."""
    thread, segment = thread_with_states
    opened, _ = services.apply_boundary(
        thread,
        "fresh_start",
        by="oscar-operator",
        reason="alpha frozen",
        now=T0 + timedelta(minutes=2),
    )
    body = html(login(client, operator).get(reverse("segment", args=[segment.id])))
    assert "by <strong>oscar-operator</strong>: fresh start — “alpha frozen”" in body
    assert f'href="{reverse("segment", args=[opened.id])}"' in body
    assert reverse("segment-boundary", args=[segment.id]) not in body
    assert (
        "closed by oscar-operator</strong> (fresh start): alpha frozen" in body
    )  # in the timeline
    assert "(refusals 4 of 4)" in body  # the state as it stood when it closed


# --------------------------------------------------------------------------- confirm step


def test_confirm_step_is_an_htmx_fragment_with_a_required_reason_and_a_key(
    client, operator, thread_with_states
):
    """R8.3: one click opens the confirm step: what will change, reason, hidden idempotency key."""
    _, segment = thread_with_states
    HistoryItem.objects.create(
        session=segment.session, seq=1, role="user", content="hi", accepted_at=T0
    )
    url = reverse("segment-boundary", args=[segment.id])
    response = login(client, operator).get(url, {"kind": "fresh_start"}, headers=HTMX)
    body = html(response)
    assert response.status_code == 200
    assert body.lstrip().startswith('<div class="confirm"')
    assert "<html" not in body
    assert "New session</strong> (generation 2)" in body
    assert (
        "History dropped:</strong> the 1 accepted message of this session is not sent again" in body
    )
    assert "Every provider eligible again</strong> in the new segment (R3.8)" in body
    assert '<span class="mono">alpha</span> (now frozen)' in body
    assert '<span class="mono">beta</span> (now cooling)' in body
    assert 'name="reason"' in body and "required" in body.split('name="reason"')[1].split(">")[0]
    assert 'type="hidden" name="idempotency_key"' in body
    assert Segment.objects.count() == 1  # a confirm step writes nothing


def test_confirm_step_full_page_fallback_and_keys_differ(client, operator, thread_with_states):
    _, segment = thread_with_states
    client = login(client, operator)
    url = reverse("segment-boundary", args=[segment.id])

    def key(body):
        return body.split('name="idempotency_key" value="', 1)[1].split('"', 1)[0]

    first = html(client.get(url, {"kind": "compact"}))
    second = html(client.get(url, {"kind": "compact"}))
    assert "<html" in first and "Compact: confirm" in first
    assert "History summarized:" in first
    assert key(first) != key(second) and len(key(first)) == 32


def test_confirm_step_for_model_switch_lists_the_configured_models(
    client, operator, thread_with_states
):
    _, segment = thread_with_states
    Provider.objects.create(provider_id="delta", kind="scripted", model="delta-xl", enabled=False)
    body = html(
        login(client, operator).get(
            reverse("segment-boundary", args=[segment.id]), {"kind": "model_switch"}
        )
    )
    assert "Same session</strong> (generation 1); segment 2 opens" in body
    assert "History kept:" in body
    assert '<option value="beta-small">' in body and '<option value="gamma-pro">' in body
    assert '<option value="alpha-large">' not in body  # the current model is no switch
    assert "delta-xl" not in body  # a disabled provider outside the chain is not configured


def test_confirm_step_with_an_unknown_kind_is_400(client, operator, thread_with_states):
    _, segment = thread_with_states
    response = login(client, operator).get(
        reverse("segment-boundary", args=[segment.id]), {"kind": "reboot"}
    )
    assert response.status_code == 400
    assert "Choose one of the boundary actions" in html(response)


# --------------------------------------------------------------------------- apply (R8.3)


def post_boundary(client, segment, **data):
    payload = {"kind": "fresh_start", "reason": "alpha frozen", "idempotency_key": "k" * 32}
    payload.update(data)
    return client.post(reverse("segment-boundary", args=[segment.id]), payload)


@pytest.mark.parametrize("role", ["oncall", "manager", "outsider"])
def test_forged_boundary_is_403_and_changes_nothing(client, request, role, thread_with_states):
    """R8.3: on-call cannot force a boundary; neither can a manager or a user with no role."""
    _, segment = thread_with_states
    client = login(client, request.getfixturevalue(role))
    assert (
        client.get(reverse("segment-boundary", args=[segment.id]), {"kind": "compact"}).status_code
        == 403
    )
    response = post_boundary(client, segment)
    assert response.status_code == 403
    assert Segment.objects.count() == 1 and AuditEntry.objects.count() == 0
    segment.refresh_from_db()
    assert segment.closed_at is None


def test_boundary_post_needs_csrf(operator, thread_with_states):
    from django.test import Client

    _, segment = thread_with_states
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    assert post_boundary(client, segment).status_code == 403
    assert Segment.objects.count() == 1


def test_missing_reason_is_a_form_error_and_writes_nothing(client, operator, thread_with_states):
    """R8.3: the reason is required."""
    _, segment = thread_with_states
    response = post_boundary(login(client, operator), segment, reason="   ")
    body = html(response)
    assert response.status_code == 400
    assert "the reason is required" in body
    assert 'value="' + "k" * 32 + '"' in body  # the same key survives the retry
    assert Segment.objects.count() == 1 and AuditEntry.objects.count() == 0


def test_model_switch_needs_a_configured_model(client, operator, thread_with_states):
    _, segment = thread_with_states
    client = login(client, operator)
    missing = post_boundary(client, segment, kind="model_switch")
    assert missing.status_code == 400 and "Choose the model to switch to" in html(missing)
    unknown = post_boundary(client, segment, kind="model_switch", model="gpt-unknown")
    assert unknown.status_code == 400 and "Select a valid choice" in html(unknown)
    forged_kind = post_boundary(client, segment, kind="mode_change")
    assert forged_kind.status_code == 400
    assert Segment.objects.count() == 1 and AuditEntry.objects.count() == 0


def test_fresh_start_opens_a_new_segment_where_every_provider_is_eligible(
    client, operator, thread_with_states
):
    """R8.3 + R3.8: after the boundary the page shows the new segment, every provider eligible."""
    thread, segment = thread_with_states
    client = login(client, operator)
    response = post_boundary(client, segment, reason="alpha frozen at 3 a.m.")
    new = Segment.objects.get(thread=thread, closed_at__isnull=True)
    assert response.status_code == 302
    assert response["Location"] == reverse("segment", args=[new.id])
    assert new.session.generation == 2 and new.segment_no == 1
    segment.refresh_from_db()
    assert (segment.closed_by, segment.closed_kind, segment.close_reason) == (
        "oscar-operator",
        "fresh_start",
        "alpha frozen at 3 a.m.",
    )
    assert SegmentRefusal.objects.filter(segment=segment).count() == 2  # R1.4: records stay
    body = html(client.get(response["Location"]))
    assert "Fresh start applied" in body and "every provider is eligible again" in body
    assert body.count('<td><span class="state eligible">eligible</span>') == 3
    assert "frozen</span>" not in body and "cooling</span>" not in body
    assert "Every provider is eligible again after the boundary (R3.8)" in body
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.target_id, entry.reason) == (
        "oscar-operator",
        "boundary.fresh_start",
        segment.key,
        "alpha frozen at 3 a.m.",
    )


def test_double_submit_with_one_key_makes_one_boundary(client, operator, thread_with_states):
    """R8.3: idempotent — a double click makes one boundary and one audit entry."""
    thread, segment = thread_with_states
    client = login(client, operator)
    first = post_boundary(client, segment)
    second = post_boundary(client, segment)  # lands after the first closed the segment
    assert first.status_code == second.status_code == 302
    assert first["Location"] == second["Location"]
    assert Segment.objects.filter(thread=thread).count() == 2
    assert ThreadSession.objects.filter(thread=thread).count() == 2
    assert AuditEntry.objects.count() == 1
    assert "already applied" in html(client.get(second["Location"]))


def test_a_new_key_on_a_closed_segment_is_409_with_a_link_to_the_open_one(
    client, operator, thread_with_states
):
    thread, segment = thread_with_states
    opened, _ = services.apply_boundary(
        thread, "compact", by="someone", reason="first", now=T0 + timedelta(seconds=5)
    )
    client = login(client, operator)
    response = post_boundary(client, segment, idempotency_key="f" * 32)
    body = html(response)
    assert response.status_code == 409
    assert f'href="{reverse("segment", args=[opened.id])}"' in body
    assert "Nothing was changed" in body
    confirm = client.get(reverse("segment-boundary", args=[segment.id]), {"kind": "compact"})
    assert confirm.status_code == 409
    assert post_boundary(client, segment, reason="", idempotency_key="").status_code == 409
    assert Segment.objects.filter(thread=thread).count() == 2 and AuditEntry.objects.count() == 1


def test_model_switch_keeps_the_session_and_history(client, operator, thread_with_states):
    thread, segment = thread_with_states
    HistoryItem.objects.create(
        session=segment.session, seq=1, role="user", content="hi", accepted_at=T0
    )
    response = post_boundary(
        login(client, operator), segment, kind="model_switch", model="gamma-pro", reason="try gamma"
    )
    new = Segment.objects.get(thread=thread, closed_at__isnull=True)
    assert response.status_code == 302
    assert (new.session_id, new.segment_no, new.model) == (segment.session_id, 2, "gamma-pro")
    assert HistoryItem.objects.filter(session=new.session).count() == 1
    assert AuditEntry.objects.get().detail["model"] == "gamma-pro"


def test_compact_summarizes_into_a_new_session(client, operator, thread_with_states):
    thread, segment = thread_with_states
    HistoryItem.objects.create(
        session=segment.session, seq=1, role="user", content="hi", accepted_at=T0
    )
    post_boundary(login(client, operator), segment, kind="compact", reason="too long")
    new = Segment.objects.get(thread=thread, closed_at__isnull=True)
    assert new.session.generation == 2 and new.session.opened_by == "compact"
    assert new.session.history.get().content.startswith("Summary of 1 earlier message")


def test_htmx_submit_redirects_the_browser(client, operator, thread_with_states):
    thread, segment = thread_with_states
    response = login(client, operator).post(
        reverse("segment-boundary", args=[segment.id]),
        {"kind": "fresh_start", "reason": "why", "idempotency_key": "h" * 32},
        headers=HTMX,
    )
    new = Segment.objects.get(thread=thread, closed_at__isnull=True)
    assert response["HX-Redirect"] == reverse("segment", args=[new.id])


def test_the_boundary_lands_in_the_audit_log_page(client, operator, oncall, thread_with_states):
    """R8.3: every action is in the audit log, readable by every role."""
    _, segment = thread_with_states
    post_boundary(login(client, operator), segment, reason="alpha frozen")
    body = html(login(client, oncall).get(reverse("audit")))
    assert "Fresh start (boundary)" in body
    assert "oscar-operator" in body and "alpha frozen" in body
    assert f'href="{reverse("segment", args=[segment.id])}"' in body


def test_a_notification_row_is_not_touched_by_the_boundary(client, operator, thread_with_states):
    """R1.4: notifications of the old segment stay with it."""
    thread, segment = thread_with_states
    _, _, notification = full_turn(thread, segment)
    post_boundary(login(client, operator), segment)
    assert Notification.objects.get(id=notification.id).segment_id == segment.id


def test_r8_3_boundary_on_a_segment_closed_meanwhile_is_409_and_does_nothing(
    client, operator, django_user_model
):
    """Two operators confirm on the same segment; the second must not close the new one."""
    from governance.models import AuditEntry, Provider, Segment

    Provider.objects.create(provider_id="solo", kind="scripted", model="solo-model")
    thread = services.create_thread(provider_chain=["solo"], now=time_source.now())
    looked_at = services.open_segment(thread)
    services.apply_boundary(
        thread,
        "fresh_start",
        by="someone",
        reason="first",
        now=time_source.now(),
        idempotency_key="a",
    )
    with pytest.raises(services.BoundaryConflict):
        services.apply_boundary(
            thread, "compact", by="other", reason="second", now=time_source.now(),
            idempotency_key="b", expected_segment=looked_at,
        )  # fmt: skip
    assert Segment.objects.filter(thread=thread).count() == 2
    assert AuditEntry.objects.filter(idempotency_key="boundary:b").count() == 0


def test_r3_4_a_card_entry_without_its_state_is_read_by_the_rule():
    """A card of an older vintage that stored no state: the rule's verdict at the
    refusal (cooling after one refusal), and a legacy entry (no count) frozen."""
    from dashboard.queries.segments import card_view

    at = "2026-03-02T09:00:00+00:00"
    entries = [
        {"provider_id": "alpha", "model": "a-1", "refusals": 1, "refused_at": at},
        {"provider_id": "beta", "model": "b-1", "refused_at": at},
    ]
    states = [e["state"] for e in card_view({"refusal": entries})["refusal"]]
    assert states == ["cooling", "frozen"]


def test_r8_1_each_reprobe_is_numbered_with_its_planned_and_actual_time(
    client, oncall, thread_with_states
):
    """The timeline says "re-probe 1 of 3 · planned 12:15, sent 12:17 (+2 min)", so a
    person can check the schedule (15 min, 1 h, 6 h) without hovering."""
    thread, segment = thread_with_states
    run, stage, _ = services.submit_run(thread, input="again", now=T0)
    gamma = Provider.objects.get(provider_id="gamma")
    refusal = ProviderRefusal("gamma", "gamma-m", "content_filter", 1, T0)
    RunEvent.objects.create(
        run=run, segment=segment, stage=stage, kind="llm-fallback", at=T0,
        metadata=fallback_card([], [refusal], "beta", T0),
    )  # fmt: skip
    sent = T0 + timedelta(minutes=17)
    ProviderAttempt.objects.create(
        run=run, stage=stage, segment=segment, provider=gamma, model="gamma-m",
        kind="re_probe", request_digest="probe-1", started_at=sent, result="refused",
    )  # fmt: skip
    body = html(login(client, oncall).get(reverse("segment", args=[segment.id])))
    entry = body.split("re-probe 1 of 3", 1)[1].split("</li>", 1)[0]
    assert 'planned</span> <time datetime="2025-03-04T12:15:00+00:00"' in entry
    assert 'sent</span> <time datetime="2025-03-04T12:17:00+00:00"' in entry
    assert "(+2 min)" in entry


def test_r8_1_an_open_segments_provider_states_refresh_themselves(
    client, oncall, operator, thread_with_states
):
    thread, segment = thread_with_states
    client = login(client, oncall)
    url = reverse("segment", args=[segment.id])
    page = html(client.get(url))
    assert f'hx-get="{url}?fragment=providers" hx-trigger="every 15s"' in page
    fragment = html(client.get(url, {"fragment": "providers"}, headers=HTMX))
    assert fragment.lstrip().startswith('<section id="segment-providers"')
    assert '<span class="state frozen">' in fragment and "<html" not in fragment
    services.apply_boundary(
        thread, "fresh_start", by=operator.username, reason="r", now=time_source.now()
    )
    closed = html(client.get(url))  # a closed segment never changes: no polling
    assert "?fragment=providers" not in closed
