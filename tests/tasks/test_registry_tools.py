"""Registry tools against real servers on loopback: the MCP client
on the official SDK and the HTTP tool executor, their outcomes as our facts
(R4.1, R6.2, R6.4), listings and list-changed notifications (R1.3)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from governance import services, time_source
from governance.models import Provider, Segment, ToolServer
from governance.services import tool_registry, tool_servers
from tasks import mcp_client, registry_tools
from tests.tool_servers import HttpToolServer, McpRecord, UvicornThread, files_server

pytestmark = pytest.mark.django_db

T0 = datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)


@pytest.fixture
def mcp_server():
    record = McpRecord()
    with UvicornThread(files_server(record, hang_s=5).streamable_http_app()) as running:
        yield f"http://127.0.0.1:{running.port}/mcp", record


@pytest.fixture
def http_server():
    with HttpToolServer() as running:
        yield running


def register_files(url: str, **extra) -> ToolServer:
    server = tool_servers.create_tool_server(
        name="files", kind="mcp", url=url, by="test", now=T0, timeout_s=1.0, **extra
    )
    listing = mcp_client.list_tools(server)
    assert listing.error == ""
    server, _ = tool_registry.record_listing("files", listing.tools, T0)
    return server


def tool(name: str):
    found = tool_servers.registry_tool(name)
    assert found is not None, name
    return found


def test_mcp_listing_exposes_tools_with_schemas_and_annotation_effects(mcp_server):
    url, _ = mcp_server
    server = register_files(url)
    names = [t["name"] for t in server.listed_tools]
    assert names == ["boom", "grow", "list_files", "read", "slow_send", "write"]
    assert server.schema_version == 1 and server.schema_fingerprint
    read = tool("files.read")
    assert read.parameters["properties"]["path"]["type"] == "string"
    assert read.effect_class == "read_only"  # readOnlyHint
    assert tool("files.write").effect_class == "external_effect"  # destructiveHint
    assert tool("files.boom").effect_class == "external_effect"  # no hints: may act


def test_r4_1_mcp_read_succeeds_and_an_error_result_is_the_tools_own_failure(mcp_server):
    url, record = mcp_server
    register_files(url)
    ok = registry_tools.run(tool("files.read"), {"path": "a.txt"}, idempotency_key="k1", now=T0)
    assert ok.effect == "succeeded" and ok.output["content"] == "contents of a.txt"
    assert record.reads == ["a.txt"]
    failed = registry_tools.run(tool("files.boom"), {"reason": "x"}, idempotency_key="k2", now=T0)
    assert failed.effect == "failed"  # isError: the tool's fact, not unknown, not a crash
    assert "reported an error" in failed.error


def test_invalid_arguments_are_a_failed_fact_and_nothing_is_sent(mcp_server):
    url, record = mcp_server
    register_files(url)
    result = registry_tools.run(tool("files.read"), {"path": 3}, idempotency_key="k", now=T0)
    assert result.effect == "failed" and "schema" in result.error and "path" in result.error
    assert result.output == {"request_sent": False}
    assert record.reads == []


def test_r6_2_a_timeout_after_sending_is_unknown_for_an_external_tool_failed_for_read_only(
    mcp_server,
):
    url, record = mcp_server
    register_files(url)
    unknown = registry_tools.run(tool("files.slow_send"), {"n": 1}, idempotency_key="k", now=T0)
    assert unknown.effect == "unknown" and unknown.external
    assert record.hangs == [1]  # the request did reach the server
    assert "not known" in unknown.error
    # The same tool declared read-only in the registry: a timeout is then a plain failure.
    tool_registry.update_server(
        "files", by="test", now=T0, effect_overrides={"slow_send": "read_only"}
    )
    failed = registry_tools.run(tool("files.slow_send"), {"n": 2}, idempotency_key="k2", now=T0)
    assert failed.effect == "failed" and not failed.external


def test_an_unreachable_server_is_a_failure_with_nothing_sent():
    server = tool_servers.create_tool_server(
        name="gone", kind="mcp", url="http://127.0.0.1:9/mcp", by="test", now=T0
    )
    listing = mcp_client.list_tools(server)
    assert listing.tools is None and "not listed" in listing.error
    outcome = mcp_client.call_tool(server, "write", {}, timeout_s=1)
    assert outcome.end == "not_sent" and outcome.output == {"request_sent": False}


def test_r1_3_list_changed_is_honoured_and_is_a_boundary_for_threads_that_see_it(mcp_server):
    url, _ = mcp_server
    register_files(url)
    Provider.objects.create(provider_id="p", kind="scripted", model="m", script={})
    sees = services.create_thread(provider_chain=["p"], tool_surface=["files.*"], now=T0)
    other = services.create_thread(provider_chain=["p"], tool_surface=["calculator"], now=T0)
    before = services.open_segment(sees)
    assert before.tool_schemas

    result = registry_tools.run(tool("files.grow"), {}, idempotency_key="g", now=T0)
    assert result.effect == "succeeded"
    server = ToolServer.objects.get(name="files")
    assert "extra" in [t["name"] for t in server.listed_tools]  # listed again
    assert server.schema_version == 2
    closed = Segment.objects.get(pk=before.pk)
    assert closed.closed_kind == "tool_surface_change"
    assert closed.closed_by == "tool registry (files)" and "schema version 2" in closed.close_reason
    after = services.open_segment(sees)
    assert after.segment_no == 2 and after.tool_surface == ["files.*"]
    assert after.tool_schemas != before.tool_schemas
    assert services.open_segment(other).segment_no == 1  # it sees no files tool
    # The same listing again is no change: no second boundary.
    tool_registry.record_listing("files", mcp_client.list_tools(server).tools, T0)
    assert services.open_segment(sees).segment_no == 2


def test_a_thread_naming_one_tool_gets_no_boundary_when_only_others_change(mcp_server):
    url, _ = mcp_server
    register_files(url)
    Provider.objects.create(provider_id="p", kind="scripted", model="m", script={})
    one = services.create_thread(provider_chain=["p"], tool_surface=["files.read"], now=T0)
    registry_tools.run(tool("files.grow"), {}, idempotency_key="g", now=T0)
    assert ToolServer.objects.get(name="files").schema_version == 2
    assert services.open_segment(one).segment_no == 1  # files.read's schema is the same


# --- HTTP tools ---------------------------------------------------------------------

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "minLength": 1}},
    "required": ["city"],
    "additionalProperties": False,
}
SEND_SCHEMA = {"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]}


def register_http(name, url, **extra):
    return tool_servers.create_tool_server(
        name=name, kind="http", url=url, by="test", now=T0, timeout_s=2.0, **extra
    )


def test_http_read_only_tool_gets_its_arguments_as_query_and_no_idempotency_key(http_server):
    register_http(
        "weather", http_server.url + "/weather", method="GET",
        description="Current weather", parameters=WEATHER_SCHEMA, effect="read_only",
    )  # fmt: skip
    result = registry_tools.run(tool("weather"), {"city": "Oslo"}, idempotency_key="k", now=T0)
    assert result.effect == "succeeded" and result.output["body"]["sky"] == "clear"
    (seen,) = http_server.handler.seen
    assert seen["query"] == {"city": "Oslo"} and "Idempotency-Key" not in seen["headers"]
    bad = registry_tools.run(tool("weather"), {"town": "Oslo"}, idempotency_key="k", now=T0)
    assert bad.effect == "failed" and "schema" in bad.error
    assert len(http_server.handler.seen) == 1  # nothing sent


def test_r6_4_http_external_tool_sends_the_key_and_a_lost_answer_is_unknown_then_verified(
    http_server,
):
    register_http("notify", http_server.url + "/send", method="POST", description="Notify",
                  parameters=SEND_SCHEMA, effect="external_effect",
                  verify_url=http_server.url + "/verify")  # fmt: skip
    http_server.handler.drop_first_answer = True
    result = registry_tools.run(tool("notify"), {"to": "ops"}, idempotency_key="key-1", now=T0)
    assert result.effect == "unknown" and result.external
    (post,) = http_server.handler.seen
    assert post["headers"]["Idempotency-Key"] == "key-1" and post["body"] == {"to": "ops"}
    receipt = type("R", (), {"server": "notify", "tool": "notify", "idempotency_key": "key-1"})
    verified, verifiable = registry_tools.verify(receipt)
    assert verifiable and verified.effect == "succeeded"
    unseen = type("R", (), {"server": "notify", "tool": "notify", "idempotency_key": "other"})
    answer, _ = registry_tools.verify(unseen)
    assert answer.effect == "failed" and answer.output["seen"] is False
    assert [s["method"] for s in http_server.handler.seen] == ["POST", "GET", "GET"]


def test_http_tool_500_is_the_tools_own_failure(http_server):
    register_http("broken", http_server.url + "/fail", method="POST", description="Fails",
                  parameters={"type": "object"}, effect="external_effect")  # fmt: skip
    result = registry_tools.run(tool("broken"), {}, idempotency_key="k", now=T0)
    assert result.effect == "failed" and "HTTP 500" in result.error


def test_an_mcp_tool_has_no_verification_contract():
    tool_servers.create_tool_server(
        name="files", kind="mcp", url="http://127.0.0.1:9/mcp", by="test", now=T0
    )
    receipt = type("R", (), {"server": "files", "tool": "files.write", "idempotency_key": "k"})
    result, verifiable = registry_tools.verify(receipt)
    assert result.effect == "unknown" and verifiable is False


def test_the_readme_example_server_registers_with_its_effect_classes():
    from tasks.example_mcp_server import build

    with UvicornThread(build().streamable_http_app()) as running:
        server = tool_servers.create_tool_server(
            name="example", kind="mcp", url=f"http://127.0.0.1:{running.port}/mcp",
            by="test", now=T0,
        )  # fmt: skip
        listing = mcp_client.list_tools(server)
        tool_registry.record_listing("example", listing.tools, T0)
        effects = {t.name: t.effect_class for t in tool_servers.surface_tools(["example.*"])}
        assert effects == {
            "example.add_note": "external_effect",
            "example.list_notes": "read_only",
            "example.read_note": "read_only",
        }
        read = registry_tools.run(
            tool("example.read_note"), {"title": "welcome"}, idempotency_key="k", now=T0
        )
        assert read.effect == "succeeded" and "example MCP server" in read.output["content"]


def test_bearer_tokens_are_named_by_their_variable_and_sent(http_server, monkeypatch):
    monkeypatch.setenv("GOVERNANCE_KEY_WEATHER", "s3cret-weather")
    register_http(
        "weather", http_server.url + "/weather", method="GET", description="Weather",
        parameters=WEATHER_SCHEMA, effect="read_only", token_env="GOVERNANCE_KEY_WEATHER",
    )  # fmt: skip
    result = registry_tools.run(tool("weather"), {"city": "Rome"}, idempotency_key="k", now=T0)
    assert result.effect == "succeeded"
    (seen,) = http_server.handler.seen
    assert seen["headers"]["Authorization"] == "Bearer s3cret-weather"


def test_the_mcp_client_sends_the_named_bearer_token(monkeypatch):
    monkeypatch.setenv("GOVERNANCE_KEY_FILES", "s3cret-files")
    seen: list[dict] = []
    app = files_server(McpRecord()).streamable_http_app()

    async def recording(scope, receive, send):
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    with UvicornThread(recording) as running:
        server = tool_servers.create_tool_server(
            name="files", kind="mcp", url=f"http://127.0.0.1:{running.port}/mcp",
            by="test", now=T0, token_env="GOVERNANCE_KEY_FILES",
        )  # fmt: skip
        assert mcp_client.list_tools(server).tools
    assert seen and all(h.get("authorization") == "Bearer s3cret-files" for h in seen)


def test_a_call_never_waits_longer_than_the_run_allows(mcp_server):
    url, record = mcp_server
    register_files(url)  # the server allows 1 s
    started = datetime.now(UTC)
    result = registry_tools.run(
        tool("files.slow_send"), {"n": 3}, idempotency_key="k", now=T0, limit_s=0.3
    )
    assert (datetime.now(UTC) - started).total_seconds() < 0.9
    assert result.effect in ("unknown", "failed")  # sent and cut, or cut before it left
    assert result.effect == "unknown" if record.hangs == [3] else result.effect == "failed"


def test_r1_3_the_scheduled_relisting_catches_a_change_made_between_sessions():
    record = McpRecord()
    server_app = files_server(record)
    with UvicornThread(server_app.streamable_http_app()) as running:
        register_files(f"http://127.0.0.1:{running.port}/mcp")
        Provider.objects.create(provider_id="p", kind="scripted", model="m", script={})
        thread = services.create_thread(
            provider_chain=["p"], tool_surface=["files.*"], now=time_source.now()
        )
        assert registry_tools.relist_tools() == {"changed": 0, "failed": 0}
        server_app.add_tool(lambda: "later", name="later", description="Added between calls")
        assert registry_tools.relist_tools() == {"changed": 1, "failed": 0}
    assert "later" in [t["name"] for t in ToolServer.objects.get(name="files").listed_tools]
    segment = services.open_segment(thread)
    assert segment.segment_no == 2
    assert "on schedule" in Segment.objects.get(next_segment=segment).close_reason
    # The server is gone now: its last listing stays, and the failure is said.
    assert registry_tools.relist_tools() == {"changed": 0, "failed": 1}
    assert ToolServer.objects.get(name="files").list_error


def test_mcp_sessions_go_to_the_checked_address_with_the_original_host(monkeypatch):
    from mcp.server.transport_security import TransportSecuritySettings

    seen: list[dict] = []
    app = files_server(McpRecord()).streamable_http_app(
        transport_security=TransportSecuritySettings(allowed_hosts=["files.invalid:*"])
    )

    async def recording(scope, receive, send):
        if scope["type"] == "http":
            seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    with UvicornThread(recording) as running:
        server = tool_servers.create_tool_server(
            name="files", kind="mcp", url=f"http://files.invalid:{running.port}/mcp",
            by="test", now=T0,
        )  # fmt: skip
        asked: list[str] = []

        def resolver(host, port):
            asked.append(host)
            return ["127.0.0.1"]

        monkeypatch.setattr("governance.services.outbound.resolve", resolver)
        assert mcp_client.list_tools(server).tools
    # .invalid never resolves (RFC 6761): only our checked answer could reach the server.
    assert asked == ["files.invalid"]
    assert seen and all(h["host"] == f"files.invalid:{running.port}" for h in seen)


def test_an_mcp_server_the_outbound_rules_refuse_is_never_contacted(settings, mcp_server):
    from governance.rules.outbound import parse_allow_list

    url, record = mcp_server
    register_files(url)
    settings.GOVERNANCE_OUTBOUND_ALLOW = parse_allow_list([])  # loopback refused now
    server = ToolServer.objects.get(name="files")
    listing = mcp_client.list_tools(server)
    assert listing.tools is None and "not listed" in listing.error
    result = registry_tools.run(tool("files.write"), {"path": "p", "text": "t"},
                                idempotency_key="k", now=T0)  # fmt: skip
    assert result.effect == "failed" and result.output == {"request_sent": False}
    assert record.writes == []
