"""Fixtures of the API client tests: a token holder and a queued run."""

from __future__ import annotations

import pytest

from governance import services, time_source
from governance.models import ApiToken, Provider
from governance.services.tokens import token_digest

CLIENT_TOKEN = "client-token-" + "y" * 20
CLIENT_AUTH = {"Authorization": f"Bearer {CLIENT_TOKEN}"}


@pytest.fixture
def token_user(django_user_model):
    """An agent client holding ``CLIENT_TOKEN``."""
    from django.contrib.auth.models import Group

    from governance.roles import ensure_roles

    ensure_roles()  # a transactional test's flush removes the migration's groups
    user = django_user_model.objects.create_user("client", password="unused-password-1")
    user.groups.add(Group.objects.get(name="agent-client"))
    ApiToken.objects.create(user=user, name="t", key_digest=token_digest(CLIENT_TOKEN))
    return user


@pytest.fixture
def run(token_user):
    """A run of the token's user queued on a thread of one scripted provider (no
    worker takes it)."""
    Provider.objects.create(provider_id="p", kind="scripted", model="p-model")
    thread = services.create_thread(
        provider_chain=["p"], title="t", user=token_user, now=time_source.now()
    )
    the_run, _stage, _ = services.submit_run(
        thread, input="tell me", user=token_user, now=time_source.now()
    )
    return the_run
