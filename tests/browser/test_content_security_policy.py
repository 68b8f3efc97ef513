"""Every page of the dashboard in real Chromium under its Content-Security-Policy.

An admin walks the pages on the demo data (``manage.py demo``) and clicks the
htmx interactions, so the fragments they swap in are covered too; the test
fails on any CSP violation (the ``securitypolicyviolation`` event and
Chromium's console report), any console error and any uncaught script error.
Screenshots (test-output/browser/) checked by eye: styles applied, the
waterfall's bars and the Insights bars placed.
"""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import Count

from dashboard.api import events as stream_views
from governance import services, time_source
from governance.models import Notification, Run, Segment, Thread
from tests.dashboard.test_content_security import PAGE_POLICY, directives

pytestmark = pytest.mark.django_db(transaction=True)

# Runs in every document before its own scripts; the binding reports to the test.
VIOLATION_LISTENER = """
document.addEventListener("securitypolicyviolation", function (e) {
  window.__reportViolation({
    directive: e.effectiveDirective, blocked: e.blockedURI, line: e.lineNumber,
    source: e.sourceFile, sample: e.sample,
    element: e.target && e.target.outerHTML ? e.target.outerHTML.slice(0, 300) : String(e.target),
  });
});
"""


@pytest.fixture(autouse=True)
def quick_stream(monkeypatch):
    # The live server runs in this process: a watch page left for the next page
    # ends its stream within the test, not after it (as tests/browser/test_watch.py).
    monkeypatch.setattr(stream_views, "POLL_S", 0.1)
    monkeypatch.setattr(stream_views, "KEEPALIVE_S", 0.3)


@pytest.fixture
def demo_data(settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("demo", stdout=StringIO())


@pytest.fixture
def admin(make_user):
    return make_user("ada-admin", is_staff=True, is_superuser=True)


@pytest.fixture
def watched(browser):
    """A new page whose CSP violations, console errors and script errors are collected."""
    contexts = []

    def open_page(width=1280, height=900):
        context = browser.new_context(viewport={"width": width, "height": height})
        contexts.append(context)
        problems: list[str] = []
        context.expose_binding(
            "__reportViolation",
            lambda source, v: problems.append(f"CSP violation on {source['page'].url}: {v}"),
        )
        context.add_init_script(VIOLATION_LISTENER)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on(
            "console",
            lambda m: (
                problems.append(f"console {m.type} on {page.url}: {m.text}")
                if m.type == "error" or "Content Security Policy" in m.text
                else None
            ),
        )
        page.on("pageerror", lambda e: problems.append(f"script error on {page.url}: {e}"))
        return page, problems

    yield open_page
    for context in contexts:
        context.close()


def visit(page, url: str):
    """Open a page and check that the strict policy came with it."""
    response = page.goto(url)
    assert response.ok, f"{url}: {response.status}"
    policy = response.headers.get("content-security-policy", "")
    assert directives(policy) == directives(PAGE_POLICY), policy
    page.wait_for_load_state("load")
    return response


def log_in(page, base: str, username: str, shots) -> None:
    visit(page, f"{base}/login/")
    shots(page, "login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw-for-tests-1")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")


def expected_bad_request(problems: list[str]) -> None:
    """Chromium logs the 400 a refused filter answers (its fragment is shown): expected."""
    refused = [p for p in problems if "status of 400 (Bad Request)" in p]
    assert refused, "the filter was expected to be refused with 400"
    for problem in refused:
        problems.remove(problem)


def an_unsettled_run() -> Run:
    """A run no worker takes: its page polls and its watch page may be stopped."""
    thread = Thread.objects.filter(title__contains="incident cost review").first()
    run, _stage, _ = services.submit_run(thread, input="Where are we?", now=time_source.now())
    return run


def test_every_page_and_fragment_passes_the_content_security_policy(
    watched, admin, demo_data, shots, live_server
):
    base = live_server.url
    page, problems = watched()
    log_in(page, base, admin.username, shots)

    # Overview: acknowledge an incident; the board refreshes itself.
    visit(page, f"{base}/")
    board = page.locator("#board")
    rows = board.locator("li[id^=overview-incident-]")
    assert rows.count() >= 2, "the demo leaves incidents needing a person"
    shots(page, "overview")
    first_row = rows.first.get_attribute("id")
    rows.first.get_by_role("button", name=re.compile("Acknowledge incident")).click()
    page.locator(f"#{first_row}").wait_for(state="detached")
    shots(page, "overview-after-ack")

    # Incidents: the list, one incident acknowledged with a note (the fragment swaps).
    visit(page, f"{base}/incidents/")
    page.locator("#incident-list article.triggered a").first.click()
    page.get_by_label("Note").fill("looking into it")
    page.get_by_role("button", name=re.compile("Acknowledge incident")).click()
    page.get_by_text("Acknowledged by you").wait_for()
    shots(page, "incident")

    # Alerts: a filter change swaps the inbox; acknowledging swaps the row.
    visit(page, f"{base}/alerts/")
    with page.expect_response(re.compile(r"/alerts/\?")):
        page.get_by_label("State").select_option("unacknowledged")
    unacked = page.locator("#alert-inbox article.unacked").first
    alert_id = unacked.get_attribute("id")
    unacked.get_by_role("button", name=re.compile("Acknowledge")).click()
    page.locator(f"#{alert_id} .state.acknowledged").wait_for()
    shots(page, "alerts")

    # Segments: a filter, then a frozen segment's boundary form, confirmed.
    visit(page, f"{base}/segments/")
    with page.expect_response(re.compile(r"/segments/\?")):
        page.get_by_label("State").select_option("frozen")
    shots(page, "segments")
    # The demo's "vendor breach triage" is frozen on both of its providers.
    frozen = Segment.objects.get(closed_at__isnull=True, thread__title__contains="breach triage")
    visit(page, f"{base}/segments/{frozen.id}/")
    page.locator("#boundary").get_by_role("link", name="Fresh start…").click()
    page.locator("#boundary-confirm").get_by_label("Reason").fill("both providers frozen")
    shots(page, "segment-boundary-confirm")
    page.get_by_role("button", name="Fresh start now").click()
    page.get_by_text("every provider is eligible again").first.wait_for()
    shots(page, "segment-after-boundary")

    # Runs: a filter the server cannot read answers 400 and its error is shown.
    visit(page, f"{base}/runs/")
    page.get_by_label("Thread id").fill("not-a-uuid")
    page.get_by_role("button", name="Filter").click()
    page.locator("#run-list").get_by_text("Some filters were not understood").wait_for()
    expected_bad_request(problems)
    shots(page, "runs-bad-filter")
    page.get_by_label("Thread id").fill("")
    page.get_by_label("Settlement").select_option("completed")
    page.get_by_role("button", name="Filter").click()
    page.locator("#run-list .runs-table").wait_for()
    shots(page, "runs")

    # A settled run drawn from the span store: its bars sit inside their track.
    settled = (
        Run.objects.filter(status=Run.Status.SETTLED)
        .annotate(tried=Count("attempts"))
        .filter(tried__gte=2)
        .order_by("-created_at")
        .first()
    )
    visit(page, f"{base}/runs/{settled.id}/")
    bars = page.locator(".waterfall .wf-bar")
    assert bars.count() >= 3
    for n in range(bars.count()):
        bar = bars.nth(n).bounding_box()
        track = page.locator(".waterfall ol .wf-track").nth(n).bounding_box()
        assert bar["width"] > 0 and bar["height"] > 0
        assert (
            track["x"] - 1 <= bar["x"]
            and bar["x"] + bar["width"] <= track["x"] + track["width"] + 1
        )
    run_bar = bars.first.bounding_box()
    run_track = page.locator(".waterfall ol .wf-track").first.bounding_box()
    assert run_bar["width"] > 0.5 * run_track["width"]  # the run spans most of its own time
    page.locator(".waterfall").scroll_into_view_if_needed()
    shots(page, "run-detail")

    # An unsettled run: its page polls; its watch page streams and Stop asks to stop.
    running = an_unsettled_run()
    visit(page, f"{base}/runs/{running.id}/")
    with page.expect_request(
        lambda r: r.url.endswith(f"/runs/{running.id}/") and r.headers.get("hx-request"),
        timeout=8_000,
    ):
        pass
    shots(page, "run-detail-polling")
    visit(page, f"{base}/runs/{running.id}/watch")
    page.get_by_text("streaming").wait_for()
    page.get_by_role("button", name="Stop").click()
    page.get_by_text("stop requested").wait_for()
    shots(page, "watch-stop")

    # Delivery report: a quick link (htmx), a range the server refuses (400 shown).
    visit(page, f"{base}/reports/delivery/")
    page.get_by_role("link", name="last 7 days").click()
    page.locator("#aggregate").wait_for()
    shots(page, "delivery-report")
    page.get_by_label("From (UTC)").fill("2025-03-08")
    page.get_by_label("To (UTC, inclusive)").fill("2025-03-01")
    page.get_by_role("button", name="Show report").click()
    page.locator("#report .form-error").wait_for()
    expected_bad_request(problems)
    shots(page, "delivery-report-bad-range")

    # Insights, with its what-if replay.
    visit(page, f"{base}/insights/")
    page.locator(".tier-chart .tier-plot").first.wait_for()
    shots(page, "insights")
    page.get_by_role("button", name="Replay").click()
    page.locator("#what-if").wait_for()

    # Providers: opening a form's <details> draws the form (htmx).
    visit(page, f"{base}/providers/")
    opened = page.locator("details.price-form").first
    opened.locator("summary").click()
    opened.locator(".form-slot form").wait_for()
    shots(page, "providers")

    visit(page, f"{base}/tools/")
    shots(page, "tools")

    # Audit: a filter change swaps the results.
    visit(page, f"{base}/audit/")
    with page.expect_response(re.compile(r"/audit/\?")):
        page.get_by_label("Who").select_option(index=1)
    shots(page, "audit")

    # Tokens: a new token is shown once.
    visit(page, f"{base}/tokens/")
    page.get_by_label("Name").fill("csp check")
    page.get_by_role("button", name="Create token").click()
    page.locator("#new-token").wait_for()
    shots(page, "tokens")

    visit(page, f"{base}/docs/api/")
    shots(page, "api-reference")

    # Django's admin, which the top bar links for staff.
    visit(page, f"{base}/admin/")
    visit(page, f"{base}/admin/governance/provider/")
    page.locator("#result_list tbody th a").first.click()
    page.wait_for_load_state("load")
    shots(page, "admin-provider")

    assert Notification.objects.filter(acked_by=admin).exists()
    assert problems == [], "\n".join(problems)


def test_the_run_page_poll_waits_while_a_details_is_open(watched, admin, shots, live_server):
    """The poll (every 5 s) skips its turn while the reader has a <details> open,
    which the swap would close (static/js/fragments.js: no eval under the CSP)."""
    from governance.models import Provider

    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    thread = services.create_thread(provider_chain=["p"], title="t", now=time_source.now())
    run, _stage, _ = services.submit_run(thread, input="hello", now=time_source.now())
    base = live_server.url
    page, problems = watched()
    log_in(page, base, admin.username, shots)
    polls: list[str] = []
    run_url = f"{base}/runs/{run.id}/"
    # The run's own poll (the nav's incident count polls on its own clock).
    page.on(
        "request",
        lambda r: polls.append(r.url) if r.headers.get("hx-request") and r.url == run_url else None,
    )
    visit(page, run_url)
    page.wait_for_timeout(5_600)
    assert len(polls) == 1  # polled once while everything was closed
    page.locator("details.ledger summary").click()
    page.wait_for_timeout(5_600)
    assert len(polls) == 1  # not while the ledger is open
    assert page.locator("details.ledger").get_attribute("open") is not None
    page.locator("details.ledger summary").click()
    page.wait_for_timeout(5_600)
    assert len(polls) == 2
    assert problems == [], "\n".join(problems)
