"""The demo providers that make `make run` useful with no API key."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from governance.models import KnowledgeDocument, Provider

pytestmark = pytest.mark.django_db


def test_seed_demo_providers_is_idempotent():
    call_command("seed_demo_providers", verbosity=0)
    call_command("seed_demo_providers", verbosity=0)
    assert set(Provider.objects.values_list("provider_id", flat=True)) == {
        "scripted-primary",
        "scripted-backup",
    }
    assert Provider.objects.get(provider_id="scripted-primary").kind == "scripted"
    assert KnowledgeDocument.objects.count() == 3


def test_create_api_token_prints_a_working_token(django_user_model, client, capsys):
    django_user_model.objects.create_user("ops", password="unused-password-1")
    call_command("create_api_token", "ops", "--name", "cli")
    token = capsys.readouterr().out.strip()
    response = client.get("/api/v1/runs/00000000-0000-0000-0000-000000000000",
                          headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert response.status_code == 404  # authenticated, and no such run


def test_create_api_token_for_unknown_user_fails_readably():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="no user named 'ghost'"):
        call_command("create_api_token", "ghost")


def test_clock_advance_moves_the_shared_clock_for_rehearsals(settings, capsys):
    from django.core.cache import cache

    from governance import time_source

    settings.GOVERNANCE_CLOCK_ADJUSTABLE = True
    cache.delete(time_source.OFFSET_CACHE_KEY)
    before = time_source.now()
    call_command("clock", "advance", "15m")
    assert "total offset 0:15:00" in capsys.readouterr().out
    assert (time_source.now() - before).total_seconds() >= 15 * 60
    cache.delete(time_source.OFFSET_CACHE_KEY)


def test_clock_advance_refuses_without_the_setting_and_bad_durations(settings):
    from django.core.management.base import CommandError

    settings.GOVERNANCE_CLOCK_ADJUSTABLE = False
    with pytest.raises(CommandError, match="GOVERNANCE_CLOCK_ADJUSTABLE"):
        call_command("clock", "advance", "15m")
    settings.GOVERNANCE_CLOCK_ADJUSTABLE = True
    with pytest.raises(CommandError, match="not a duration"):
        call_command("clock", "advance", "soon")
    with pytest.raises(CommandError, match="how far"):
        call_command("clock", "advance")
