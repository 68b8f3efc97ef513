"""The Tokens page in real Chromium: make one, see it once, revoke it."""

from __future__ import annotations

import pytest

from governance.models import ApiToken
from governance.services.tokens import token_digest

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_makes_a_scoped_token_sees_it_once_and_revokes_it(page_for, operator, shots):
    page = page_for(operator.username)
    page.get_by_role("link", name="Tokens").click()
    page.get_by_label("Name").fill("billing agent")
    page.get_by_label("submit runs").check()
    page.get_by_role("button", name="Create token").click()
    secret = page.locator("#new-token").inner_text()
    assert ApiToken.objects.get(name="billing agent").key_digest == token_digest(secret)
    shots(page, "1-new-token")
    page.reload()
    assert page.locator("#new-token").count() == 0  # shown once
    page.get_by_role("button", name="Revoke billing agent").click()
    page.get_by_text("revoked").first.wait_for()
    assert ApiToken.objects.get(name="billing agent").revoked_at is not None
    shots(page, "2-revoked")
