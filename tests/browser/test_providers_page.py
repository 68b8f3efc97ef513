"""The providers page in real Chromium: a price form drawn when it is opened."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission

from governance import time_source
from governance.models import Provider
from governance.services.providers import create_provider

pytestmark = pytest.mark.django_db(transaction=True)


def test_one_click_opens_the_price_form_and_saving_it_sets_the_prices(page_for, make_user, shots):
    user = make_user("pat-prices", "operator")
    user.user_permissions.add(Permission.objects.get(codename="change_provider"))
    now = time_source.now()
    for provider_id in ("alpha", "beta"):
        create_provider(
            provider_id=provider_id, kind="scripted", model=f"{provider_id}-model", script={},
            by="t", now=now,
        )  # fmt: skip
    page = page_for(user.username)
    page.goto(page.url.rstrip("/") + "/providers/")
    card = page.locator("#provider-alpha")
    assert card.locator("input").count() == 0  # no form drawn before it is opened
    card.get_by_text("Change the prices of alpha").click()
    price = card.get_by_label("Input, per million tokens", exact=True)
    price.wait_for()
    shots(page, "price-form-open")
    price.fill("2.5")
    card.get_by_label("Output, per million tokens").fill("10")
    card.get_by_label("Currency (ISO 4217, e.g. USD)").fill("usd")
    card.get_by_label("Why (kept in the audit log)").fill("list price")
    card.get_by_role("button", name="Save prices").click()
    page.locator("#provider-alpha .prices").get_by_text("USD per million tokens").wait_for()
    alpha = Provider.objects.get(provider_id="alpha")
    assert (str(alpha.price_input_per_mtok), alpha.currency) == ("2.500000", "USD")
    assert page.locator("#provider-beta input").count() == 0  # beta's forms were never opened
    shots(page, "prices-saved")
