"""Call time: a configuration stored before the secret and outbound checks
(or since refused by narrower settings) never sends a secret where it should
not go. The providers are real loopback servers that record what reaches
them (tests/tasks/test_adapter_wire.py); a refused attempt sends nothing and
fails as ``auth`` (R2.1: a configuration change re-enables the provider)."""

from __future__ import annotations

import json

import pytest

from governance.models import AlertChannel, Provider, ProviderAttempt, ToolServer
from governance.rules.classification import classify_attempt
from governance.rules.outbound import AllowList, parse_allow_list
from tasks import mcp_client, registry_tools
from tasks.adapters import AdjustableClock, call_provider
from tasks.adapters.base import ProviderConfig
from tasks.stages.model_turn import _config
from tests.tasks.test_adapter_wire import LIMITS, Reply, WireServer, sse, start, user
from tests.tool_servers import HttpToolServer

SIGNING_KEY = "the-django-signing-key-never-to-leave"
ANSWER = Reply(
    body=b"".join(
        [
            sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "fine"}}]}),
            sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            sse("[DONE]"),
        ]
    )
)


@pytest.fixture
def wire():
    with WireServer() as server:
        server.reply(ANSWER)
        yield server


@pytest.fixture
def production_outbound(settings):
    settings.GOVERNANCE_OUTBOUND_ALLOW = AllowList()
    settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS = True
    return settings


def authorizations(wire: WireServer) -> list[str | None]:
    return [r.headers.get("authorization") for r in wire.received]


def call(config: ProviderConfig):
    clock = AdjustableClock(start())
    response = call_provider(config, user("hello"), limits=LIMITS, clock=clock)
    return response, classify_attempt(response.evidence, clock())


# --------------------------------------------------------------------------- the whole turn


@pytest.mark.django_db(transaction=True)
def test_r2_5_a_stored_forbidden_key_variable_is_never_read_nor_sent(
    api, worker, manual_clock, wire, monkeypatch
):
    """A provider row naming DJANGO_SECRET_KEY (stored before the allow-list):
    its attempt fails as a configuration error and sends nothing; the next
    provider, whose key variable is allowed, is asked with its own key."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", SIGNING_KEY)
    monkeypatch.setenv("GOVERNANCE_KEY_BACKUP", "sk-backup-key")
    base_url = f"{wire.url}/v1"
    leaky = Provider.objects.create(
        provider_id="leaky", kind="openai", model="m", base_url=base_url,
        api_key_env="DJANGO_SECRET_KEY",
    )  # fmt: skip
    Provider.objects.create(
        provider_id="backup", kind="openai", model="m", base_url=base_url,
        api_key_env="GOVERNANCE_KEY_BACKUP",
    )  # fmt: skip
    thread = api.post(
        "/api/v1/threads", {"provider_chain": ["leaky", "backup"], "title": "keys"}, expect=201
    ).json()
    run = api.run_and_wait(thread["id"], "hello")
    assert run["settlement"]["outcome"] == "completed", run["settlement"]

    assert authorizations(wire) == ["Bearer sk-backup-key"]
    assert all(SIGNING_KEY not in json.dumps(r.headers) for r in wire.received)
    (attempt,) = ProviderAttempt.objects.filter(provider=leaky)
    assert attempt.result == "failed" and attempt.failure_class == "auth"
    assert attempt.error.startswith("configuration refused, nothing was sent: api_key_env:")
    assert "'DJANGO_SECRET_KEY' is not allowed" in attempt.error
    assert "GOVERNANCE_KEY_ENV_ALLOW" in attempt.error
    assert leaky.health.disabled_config == leaky.config_fingerprint()  # until it is fixed


@pytest.mark.django_db
def test_the_adapter_configuration_of_a_forbidden_row_carries_no_key(monkeypatch):
    monkeypatch.setenv("DATABASE_URL_COPY_FILE", "/etc/passwd")
    for name in ("DJANGO_SECRET_KEY", "DATABASE_URL", "DATABASE_URL_COPY_FILE"):
        config = _config(Provider(provider_id="p", kind="openai", model="m", api_key_env=name))
        assert config.api_key is None and "is not allowed" in config.refused, name


# --------------------------------------------------------------------------- the base URL


@pytest.mark.django_db
def test_a_stored_base_url_the_outbound_rules_refuse_gets_no_request(wire, production_outbound):
    config = ProviderConfig("local", "openai", "m", base_url=f"{wire.url}/v1", api_key="sk-local")
    response, verdict = call(config)
    assert wire.received == []
    assert verdict.failure_class == "auth"
    assert "127.0.0.1, a loopback address" in response.error
    assert "GOVERNANCE_OUTBOUND_ALLOW lists it (add 127.0.0.1)" in response.error

    # A local vLLM or Ollama is one setting away.
    production_outbound.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1"])
    response, verdict = call(config)
    assert verdict.failure_class is None and response.text == "fine"
    assert authorizations(wire) == ["Bearer sk-local"]


@pytest.mark.django_db
def test_a_name_that_resolves_to_the_metadata_address_at_call_time_gets_no_request(
    wire, monkeypatch
):
    """DNS may change after the URL was checked: the call resolves again, and
    connects only to an address that passed (tasks.outbound)."""
    from governance.services import outbound

    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["169.254.169.254"])
    port = wire.url.rsplit(":", 1)[1]
    config = ProviderConfig("p", "openai", "m", base_url=f"http://llm.example:{port}/v1")
    response, verdict = call(config)
    assert wire.received == [] and verdict.failure_class == "auth"
    assert "llm.example resolves to 169.254.169.254" in response.error


@pytest.mark.django_db
def test_a_call_goes_to_the_checked_address_with_the_original_host(wire, monkeypatch):
    from governance.services import outbound

    monkeypatch.setattr(outbound, "resolve", lambda host, port: ["127.0.0.1"])
    port = wire.url.rsplit(":", 1)[1]
    response, verdict = call(
        ProviderConfig("p", "openai", "m", base_url=f"http://llm.localhost:{port}/v1")
    )
    assert verdict.failure_class is None and response.text == "fine"
    assert wire.received[0].headers["host"] == f"llm.localhost:{port}"


@pytest.mark.django_db
def test_a_failed_connection_shows_a_stored_password_masked():
    response, verdict = call(
        ProviderConfig("p", "openai", "m", base_url="http://user:hunter2@127.0.0.1:9/v1")
    )
    assert verdict.failure_class == "network"
    assert "hunter2" not in response.error and "***@127.0.0.1:9" in response.error


@pytest.mark.django_db
def test_r2_5_widening_the_allow_lists_is_a_configuration_change(settings):
    """A provider an allow-list refused is disabled as by an auth failure;
    listing it re-enables it, as fixing its key would."""
    from governance.rules.secrets import key_env_policy

    provider = Provider(provider_id="p", kind="openai", model="m", base_url="https://h/v1")
    before = provider.config_fingerprint()
    settings.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["127.0.0.1", "10.0.0.0/8"])
    listed = provider.config_fingerprint()
    assert listed != before
    settings.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list(["10.0.0.0/8", "127.0.0.1"])
    assert provider.config_fingerprint() == listed  # the same list, whatever its order
    settings.GOVERNANCE_KEY_ENV_ALLOW = key_env_policy(["VENDOR_*"], ())
    assert provider.config_fingerprint() != listed


# --------------------------------------------------------------------------- tools and alerts


@pytest.mark.django_db
def test_a_stored_tool_token_variable_that_is_not_allowed_is_never_sent(monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", SIGNING_KEY)
    with HttpToolServer() as running:
        ToolServer.objects.create(
            name="weather", kind="http", url=f"{running.url}/weather", method="GET",
            description="weather", parameters={"type": "object"}, effect="read_only",
            token_env="DJANGO_SECRET_KEY",
        )  # fmt: skip
        from governance.services import tool_servers

        tool = tool_servers.registry_tool("weather")
        result = registry_tools.run(tool, {}, idempotency_key="k", now=start())
        assert running.handler.seen == []
    assert result.effect == "failed" and result.output == {"request_sent": False}
    assert "token_env: 'DJANGO_SECRET_KEY' is not allowed" in result.error


@pytest.mark.django_db
def test_an_mcp_server_with_a_forbidden_token_variable_is_not_contacted(wire):
    server = ToolServer(
        name="files", kind="mcp", url=f"{wire.url}/mcp", token_env="GOVERNANCE_CALLBACK_SECRET"
    )
    listing = mcp_client.list_tools(server)
    assert listing.tools is None and "is not allowed" in listing.error
    outcome = mcp_client.call_tool(server, "read", {}, timeout_s=1)
    assert outcome.end == "not_sent" and "is not allowed" in outcome.error
    assert wire.received == []


@pytest.mark.django_db
def test_r8_2_a_pagerduty_channel_naming_a_forbidden_variable_sends_nothing(wire, monkeypatch):
    from governance.models import NotificationDelivery
    from governance.services.alerts import DeliveryResult
    from tasks import alerts

    monkeypatch.setenv("DJANGO_SECRET_KEY", SIGNING_KEY)
    channel = AlertChannel.objects.create(
        name="pager", kind="pagerduty", target=f"{wire.url}/v2/enqueue",
        routing_key_env="DJANGO_SECRET_KEY",
    )  # fmt: skip
    delivery = NotificationDelivery(channel=channel)
    result = alerts.send(delivery)
    assert result.kind == DeliveryResult.PERMANENT
    assert "routing_key_env: 'DJANGO_SECRET_KEY' is not allowed" in result.error
    assert wire.received == []
