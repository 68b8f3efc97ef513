"""The API reference page, from the same description a client generator reads."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_finds_the_submit_body_and_its_ranges_from_the_menu(page_for, operator, shots):
    page = page_for(operator.username)
    page.get_by_role("link", name="API", exact=True).click()
    page.get_by_role("heading", name="API reference").wait_for()
    submit = page.locator("section.endpoint", has_text="/api/v1/threads/{thread_id}/runs")
    text = submit.inner_text()
    assert "Submit a run" in text
    assert "deadline_s" in text and "≥ 1" in text and "≤ 604800" in text
    assert "model_requests: integer, ≥ 0, ≤ 1,000,000" in text  # the budget, spelled out
    assert "unknown fields are refused" in text
    assert "415" in text and "413" in text
    notifications = page.locator("section.endpoint", has_text="GET /api/v1/notifications").first
    assert "Query parameters" in notifications.inner_text()
    assert "cursor" in notifications.inner_text() and "severity" in notifications.inner_text()
    link = page.get_by_role("link", name="/api/v1/openapi.json")
    assert link.get_attribute("href") == "/api/v1/openapi.json"
    shots(page, "api-reference")
