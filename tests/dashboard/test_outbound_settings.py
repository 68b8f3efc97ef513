"""Outbound URLs: the allow-list setting, read once at start-up, and
the providers page warning about alert channels whose target will be refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import reverse

from governance.models import AlertChannel
from governance.rules.outbound import AllowList
from tests.conftest import REPO_ROOT

SHOW = (
    "from django.conf import settings as s;"
    "a = s.GOVERNANCE_OUTBOUND_ALLOW;"
    "print(sorted(a.hosts), [str(n) for n in a.networks], s.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS)"
)
PRODUCTION = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": "q3Lr9v!Zp0sW7kT2mN8bX4cY6hJ1gF5dS-aE_uR+oI=lK^zV&Hy2Wc7Qe5Bn0Tm",
    "DJANGO_ALLOWED_HOSTS": "governance.example.com",
    "GOVERNANCE_CALLBACK_SECRET": "cb-9f2Kx7Lq3Vm8Rt1Wz5Yp0Hs4Nd6Jg2Ba",
}


def _shell(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "DATABASE_", "GOVERNANCE_OUTBOUND"))
    }
    clean.pop("REDIS_URL", None)
    clean.update({"GOVERNANCE_VAR_DIR": str(tmp_path / "var"), **env})
    return subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", SHOW],
        cwd=REPO_ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_r7_3_production_default_allows_nothing_and_requires_https(tmp_path):
    """R7.3, R8.2, R4.1 outbound calls: with DJANGO_DEBUG=0 the allow-list is empty."""
    result = _shell(PRODUCTION, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] [] True"


def test_r7_3_development_default_allows_loopback_only(tmp_path):
    """R7.3: with DJANGO_DEBUG=1 (``make run``) loopback is allowed, for the demo's receiver."""
    result = _shell({}, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['localhost'] ['127.0.0.0/8', '::1/128'] False"


def test_r7_3_allow_list_is_read_from_the_environment(tmp_path):
    """R7.3: hosts, IPs and CIDR networks, comma-separated; empty means nothing."""
    given = {**PRODUCTION, "GOVERNANCE_OUTBOUND_ALLOW": "Hooks.Internal, 10.20.0.0/16,[fd00::5]"}
    result = _shell(given, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['hooks.internal'] ['10.20.0.0/16', 'fd00::5/128'] True"
    empty = _shell({"GOVERNANCE_OUTBOUND_ALLOW": ""}, tmp_path)
    assert empty.stdout.strip() == "[] [] False"


@pytest.mark.parametrize("value", ["10.0.0.5/8", "not a host", "*.example.com"])
def test_r7_3_bad_allow_list_refuses_to_start(tmp_path, value):
    """R7.3: a typo stops start-up with the variable's name and the item."""
    result = _shell({"GOVERNANCE_OUTBOUND_ALLOW": value}, tmp_path)
    assert result.returncode != 0
    assert f"GOVERNANCE_OUTBOUND_ALLOW: {value!r} is not" in result.stderr


@pytest.mark.django_db
def test_r8_2_providers_page_warns_about_a_channel_target_that_will_be_refused(
    client, manager, settings
):
    """R8.2: an enabled channel aimed at the metadata service, loopback or plain
    http in production says, before any alert, that its sends will be refused."""
    settings.GOVERNANCE_OUTBOUND_ALLOW = AllowList()
    settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = True
    AlertChannel.objects.create(name="meta", kind="webhook", target="http://169.254.169.254/x")
    AlertChannel.objects.create(name="local", kind="slack", target="https://localhost:9/x")
    AlertChannel.objects.create(name="plain", kind="webhook", target="http://hooks.example.com/")
    AlertChannel.objects.create(name="fine", kind="webhook", target="https://hooks.example.com/")
    AlertChannel.objects.create(name="mail", kind="email", target="ops@example.com")
    client.force_login(manager)
    body = client.get(reverse("providers")).content.decode()

    def card(name: str) -> str:
        pk = AlertChannel.objects.get(name=name).pk
        start = body.index(f'id="alert-channel-{pk}"')
        return body[start : body.index("</li>", start)]

    assert "metadata" in card("meta") and "will be refused" in card("meta")
    assert "localhost resolves to 127.0.0.1" in card("local")
    assert "https is required" in card("plain")
    assert "will be refused" not in card("fine")
    assert "will be refused" not in card("mail")
