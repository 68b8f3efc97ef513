"""The audit log page: who, what, target, reason, when (R8.3, R1.4), readable by every role."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from governance import services, time_source
from governance.models import AuditEntry, Provider

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
def thread(db):
    Provider.objects.create(provider_id="alpha", kind="scripted", model="alpha-large", script=[])
    Provider.objects.create(provider_id="beta", kind="scripted", model="beta-small", script=[])
    return services.create_thread(
        provider_chain=["alpha", "beta"], now=T0 - timedelta(days=3), title="Invoices"
    )


@pytest.fixture
def history(thread, manager):
    """A boundary, a cancelled run and an acknowledged alert, on three different days."""
    old = services.open_segment(thread)
    opened, _ = services.apply_boundary(
        thread,
        "fresh_start",
        by="oscar-operator",
        reason="alpha frozen",
        now=T0 - timedelta(days=2),
        idempotency_key="key-1",
    )
    run, _, _ = services.submit_run(thread, input="hello", now=T0 - timedelta(days=1))
    services.request_cancel(run, by="olive-oncall", now=T0 - timedelta(days=1))
    services.audit(
        actor="mona-manager",
        action="alert.acknowledge",
        target_type="notification",
        target_id="7",
        reason="",
        detail={},
        now=T0,
    )
    return {"old": old, "opened": opened, "run": run}


def body_of(response) -> str:
    return response.content.decode()


def test_anonymous_is_sent_to_login(client):
    response = client.get(reverse("audit"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


@pytest.mark.parametrize("role", ["oncall", "operator", "manager", "outsider"])
def test_every_logged_in_role_reads_the_log(client, request, role, history):
    """R8.3: the audit log has its own page, for everyone who is logged in."""
    client.force_login(request.getfixturevalue(role))
    response = client.get(reverse("audit"))
    assert response.status_code == 200
    assert "Fresh start (boundary)" in body_of(response)


def test_audit_log_is_read_only(client, operator):
    client.force_login(operator)
    assert client.post(reverse("audit")).status_code == 405


def test_entries_say_who_what_target_reason_when_newest_first(client, oncall, history):
    """R8.3/R1.4: who, what, target (linked), reason, when."""
    client.force_login(oncall)
    body = body_of(client.get(reverse("audit"))).split('id="audit-results"', 1)[1]
    # newest first: acknowledge (T0), cancel (T0-1d), boundary (T0-2d)
    assert body.index("Acknowledge alert") < body.index("Cancel run") < body.index("Fresh start")
    old, opened, run = history["old"], history["opened"], history["run"]
    assert f'href="{reverse("segment", args=[old.id])}">{old.key}</a>' in body
    assert f'href="{reverse("segment", args=[opened.id])}">{opened.key}</a>' in body
    assert f'href="{reverse("run", args=[run.id])}">{run.id}</a>' in body
    assert "oscar-operator" in body and "alpha frozen" in body
    # The absolute time with its zone, the relative words beside it.
    assert (
        '<time datetime="2025-03-02T12:00:00+00:00" data-format="short" '
        'title="2025-03-02 12:00:00 UTC">Mar 02 12:00 UTC</time> '
        '<span class="relative">(2 d ago)</span>' in body
    )


@pytest.mark.parametrize(
    "params,present,absent",
    [
        (
            {"actor": "oscar-operator"},
            ["Fresh start (boundary)"],
            ["Cancel run", "Acknowledge alert"],
        ),
        (
            {"action": "run.cancel"},
            ["Cancel run"],
            ["Fresh start (boundary)<", "Acknowledge alert<"],
        ),
        ({"target_type": "segment"}, ["Fresh start (boundary)"], ["Cancel run<"]),
        (
            {"date_from": "2025-03-03", "date_to": "2025-03-03"},
            ["Cancel run"],
            ["Fresh start (boundary)<", "Acknowledge alert<"],
        ),
        ({"date_from": "2025-03-04"}, ["Acknowledge alert"], ["Cancel run<"]),
        ({"date_to": "2025-03-02"}, ["Fresh start (boundary)"], ["Cancel run<"]),
    ],
)
def test_filters(client, oncall, history, params, present, absent):
    client.force_login(oncall)
    response = client.get(reverse("audit"), params)
    results = body_of(response).split('id="audit-results"', 1)[1]
    assert response.status_code == 200
    for text in present:
        assert text in results
    for text in absent:
        assert text not in results


def test_bad_filters_are_a_form_error(client, oncall, history):
    client.force_login(oncall)
    response = client.get(reverse("audit"), {"date_from": "yesterday", "actor": "nobody"})
    assert response.status_code == 400
    body = body_of(response)
    assert "Enter a valid date" in body and "Select a valid choice" in body
    backwards = client.get(reverse("audit"), {"date_from": "2025-03-04", "date_to": "2025-03-01"})
    assert backwards.status_code == 400
    assert "The end date is before the start date" in body_of(backwards)


def test_htmx_gets_the_results_fragment_only(client, oncall, history):
    client.force_login(oncall)
    response = client.get(reverse("audit"), {"actor": "olive-oncall"}, headers=HTMX)
    body = body_of(response)
    assert body.lstrip().startswith('<section id="audit-results"')
    assert "<html" not in body and "Cancel run" in body


def test_empty_states(client, oncall, thread):
    client.force_login(oncall)
    assert "Nothing has been logged yet" in body_of(client.get(reverse("audit")))
    services.audit(
        actor="a",
        action="run.cancel",
        target_type="run",
        target_id="x",
        reason="",
        detail={},
        now=T0,
    )
    filtered = body_of(client.get(reverse("audit"), {"date_to": "2020-01-01"}))
    assert "No entries match these filters" in filtered


def test_paginates_and_keeps_the_query_count_flat(
    client, oncall, thread, django_assert_max_num_queries
):
    """25 a page; links resolved in one batch (no N+1)."""
    segment = services.open_segment(thread)
    for n in range(30):
        services.audit(
            actor=f"user-{n % 3}",
            action="boundary.compact",
            target_type="segment",
            target_id=segment.key,
            reason=f"reason {n}",
            detail={"closed": segment.key, "opened": segment.key},
            now=T0 - timedelta(minutes=n),
        )
    client.force_login(oncall)
    client.get(reverse("audit"))
    with django_assert_max_num_queries(10):
        response = client.get(reverse("audit"), {"action": "boundary.compact"})
    body = body_of(response)
    assert "Page 1 of 2 (30 in all)" in body
    assert body.count("<tr>") == 26  # header + 25
    page_two = body_of(client.get(reverse("audit"), {"action": "boundary.compact", "page": 2}))
    assert "reason 29" in page_two and "reason 0<" not in page_two
    assert "action=boundary.compact" in body.split('rel="next"')[0].rsplit("href=", 1)[1]


def test_a_boundary_through_the_dashboard_is_logged_once(client, operator, thread):
    """R8.3: the action lands in the audit log exactly once even on a double submit."""
    segment = services.open_segment(thread)
    client.force_login(operator)
    data = {"kind": "compact", "reason": "history too long", "idempotency_key": "z" * 32}
    url = reverse("segment-boundary", args=[segment.id])
    client.post(url, data)
    client.post(url, data)
    assert AuditEntry.objects.filter(action="boundary.compact").count() == 1
    body = body_of(client.get(reverse("audit")))
    assert body.count("Compact (boundary)</td>") + body.count("Compact (boundary)<br>") == 1
    assert "history too long" in body
