"""The MCP client of the tool registry, on the official SDK.

The SDK (``mcp`` on PyPI) speaks the protocol: the Streamable HTTP transport
(``mcp.client.streamable_http.streamable_http_client``) and ``ClientSession``
(``initialize``, ``list_tools``, ``call_tool``). Nothing here frames JSON-RPC
or reads SSE. What this module adds is what the SDK's outcomes mean as our
facts (``rules.tools.call_effect``):

* a result with ``isError`` -> the tool's own failure (``tool_error``);
* a JSON-RPC error answered by the server (unknown tool, bad params) -> the
  server did not run it (``server_error``);
* anything that fails before the ``tools/call`` request was written (the
  outbound check, connecting, the ``initialize`` handshake) -> ``not_sent``;
* the SDK's request timeout, a closed connection or any transport failure
  after the request was written -> ``no_answer`` (unknown for an
  ``external_effect`` tool: verified, never replayed blindly, R6.2/R6.4).

Every request of a session goes to an address the outbound check passed,
never to a fresh DNS answer: ``_PinnedTransport`` (an httpx2
transport under the SDK's client) puts the checked IP in the URL and keeps
the original ``Host`` and, for https, the TLS server name and certificate
check — as ``tasks.outbound`` does for the webhook tool.

A ``notifications/tools/list_changed`` seen during a session is honoured: the
tools are listed again in the same session and handed back, for the registry
to record (``services.tool_registry.record_listing``).

Each call opens one session (connect, initialize, call, close). The worker is
synchronous; each operation runs its own event loop (``anyio.run``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import mcp.types as types
from django.core.exceptions import ImproperlyConfigured
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

from governance.models import ToolServer
from governance.rules.tools import CallEnd
from governance.services.outbound import (
    Destination,
    OutboundRefused,
    UnresolvedHost,
    destination,
)
from governance.services.secrets import named_secret

OUTPUT_MAX_CHARS = 16_000
LIST_TIMEOUT_S = 10.0
# Errors the SDK raises itself when no answer came (not the server's own words).
NO_ANSWER_CODES = frozenset({REQUEST_TIMEOUT, CONNECTION_CLOSED})


@dataclass
class McpOutcome:
    end: CallEnd
    output: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    relisted: list[dict[str, Any]] | None = None  # the tools, listed again after list_changed


@dataclass
class McpListing:
    tools: list[dict[str, Any]] | None
    error: str = ""


class _PinnedTransport(httpx2.AsyncBaseTransport):
    """Requests to the checked host go to its checked addresses (the next one
    only when connecting failed: nothing was sent); any other host is refused."""

    def __init__(self, checked: Destination) -> None:
        self.checked = checked
        self.inner = httpx2.AsyncHTTPTransport(retries=0)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        checked = self.checked
        if request.url.raw_host.decode("ascii").lower() != checked.host or (
            (request.url.port or checked.port) != checked.port
        ):
            raise httpx2.ConnectError(
                f"{request.url.host} is not the checked host", request=request
            )
        original = request.url
        request.headers["Host"] = checked.url.netloc.decode("ascii")
        if checked.scheme == "https" and not checked.host_is_address:
            request.extensions = {**request.extensions, "sni_hostname": checked.host}
        for n, address in enumerate(checked.addresses):
            request.url = original.copy_with(host=address)
            try:
                return await self.inner.handle_async_request(request)
            except httpx2.ConnectError:
                if n == len(checked.addresses) - 1:
                    raise
        raise AssertionError("unreachable: destination() returns at least one address")

    async def aclose(self) -> None:
        await self.inner.aclose()


def _headers(server: ToolServer) -> dict[str, str] | str:
    """The session's headers, or why its token may not be read (nothing is sent)."""
    headers = {"User-Agent": "agent-governance-tools/1"}
    if server.token_env:
        try:
            token = named_secret(server.token_env, "token_env")
        except ImproperlyConfigured as exc:
            return str(exc)
        if token:
            headers["Authorization"] = f"Bearer {token}"
    return headers


def tool_row(tool: types.Tool) -> dict[str, Any]:
    annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True) if (
        tool.annotations
    ) else {}  # fmt: skip
    return {
        "name": tool.name,
        "description": tool.description or "",
        "input_schema": dict(tool.input_schema or {"type": "object"}),
        "annotations": annotations,
    }


async def list_all(session: ClientSession) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    for _page in range(100):  # a paginator that never ends cannot hang the worker
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        rows.extend(tool_row(tool) for tool in result.tools)
        cursor = result.next_cursor
        if not cursor:
            break
    return rows


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (the SDK's task groups wrap them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def in_words(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def result_output(result: types.CallToolResult) -> dict[str, Any]:
    texts, other = [], []
    for block in result.content:
        if isinstance(block, types.TextContent):
            texts.append(block.text)
        else:
            other.append(block.model_dump(mode="json", by_alias=True, exclude_none=True))
    output: dict[str, Any] = {"content": "\n".join(texts)[:OUTPUT_MAX_CHARS]}
    if other:  # images, resources: kept whole when small, else only said
        fits = len(json.dumps(other)) <= OUTPUT_MAX_CHARS
        output["other_content"] = other if fits else {"blocks": len(other), "truncated": True}
    if result.structured_content is not None:
        output["structured"] = result.structured_content
    return output


async def _session_run(
    server: ToolServer,
    checked: Destination,
    headers: dict[str, str],
    timeout_s: float,
    work,
    state: dict,
) -> Any:
    """Open one session and run ``work(session)``; ``state["phase"]`` says how
    far it got ("connect", then "call" once the request may have left)."""
    changed = anyio.Event()

    async def on_message(message) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    state["changed"] = changed
    async with (
        httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(timeout_s),
            follow_redirects=False,
            transport=_PinnedTransport(checked),
        ) as http,
        streamable_http_client(server.url, http_client=http) as (read, write),
        ClientSession(
            read, write, read_timeout_seconds=timeout_s, message_handler=on_message
        ) as session,
    ):
        await session.initialize()
        return await work(session)


def _checked(server: ToolServer) -> tuple[Destination, dict[str, str]] | str:
    """The URL's checked destination and the session's headers, or why the
    server may not be called (nothing sent)."""
    headers = _headers(server)
    if isinstance(headers, str):
        return headers
    try:
        return destination(server.url), headers
    except OutboundRefused as exc:
        return exc.reason
    except UnresolvedHost as exc:
        return f"the host does not resolve: {exc}"


def list_tools(server: ToolServer, *, timeout_s: float = LIST_TIMEOUT_S) -> McpListing:
    """The server's ``tools/list`` (every page), or why it could not be listed."""
    checked = _checked(server)
    if isinstance(checked, str):
        return McpListing(None, f"not listed: {checked}")
    state: dict[str, Any] = {}
    try:
        tools = anyio.run(_guarded, server, *checked, timeout_s, list_all, state)
    except Exception as exc:
        return McpListing(None, f"not listed: {in_words(root_cause(exc))}")
    return McpListing(tools)


async def _guarded(
    server: ToolServer,
    checked: Destination,
    headers: dict[str, str],
    timeout_s: float,
    work,
    state: dict,
) -> Any:
    # The SDK bounds each request; this bounds the whole session (connect,
    # handshake, request, close) so no server can hold a worker longer.
    with anyio.fail_after(timeout_s * 2 + 5):
        return await _session_run(server, checked, headers, timeout_s, work, state)


def call_tool(
    server: ToolServer, tool: str, arguments: dict[str, Any], *, timeout_s: float
) -> McpOutcome:
    """One ``tools/call``; never raises (R4.2). See the module docstring for the outcome map."""
    checked = _checked(server)
    if isinstance(checked, str):
        return McpOutcome("not_sent", {"request_sent": False}, f"refused: {checked}")
    state: dict[str, Any] = {"phase": "connect"}

    async def work(session: ClientSession):
        state["phase"] = "call"
        result = await session.call_tool(tool, arguments, read_timeout_seconds=timeout_s)
        state["phase"], state["result"] = "answered", result
        await anyio.lowlevel.checkpoint()  # let a notification sent with the answer land
        if state["changed"].is_set():
            state["relisted"] = await list_all(session)
        return result

    try:
        anyio.run(_guarded, server, *checked, timeout_s, work, state)
    except Exception as exc:
        if "result" not in state:
            return failure_outcome(root_cause(exc), state["phase"], server, tool)
        # The answer came; only closing the session (or relisting) failed.
    return answered_outcome(f"{server.name}.{tool}", state["result"], state.get("relisted"))


def answered_outcome(
    name: str, result: types.CallToolResult, relisted: list[dict[str, Any]] | None
) -> McpOutcome:
    """The outcome of a call the server answered: its result, or the tool's own error."""
    output = result_output(result)
    if result.is_error:
        return McpOutcome(
            "tool_error", output,
            f"{name} reported an error: {output.get('content') or 'no detail'}"[:500], relisted,
        )  # fmt: skip
    return McpOutcome("result", output, "", relisted)


def failure_outcome(exc: BaseException, phase: str, server: ToolServer, tool: str) -> McpOutcome:
    """What a call that raised says: nothing sent (``phase`` "connect"), the
    server's own protocol error, or no answer to a request that left."""
    name = f"{server.name}.{tool}"
    if phase == "connect":
        return McpOutcome(
            "not_sent", {"request_sent": False},
            f"could not open an MCP session with {server.name} ({in_words(exc)}); nothing was sent",
        )  # fmt: skip
    if isinstance(exc, MCPError) and exc.code not in NO_ANSWER_CODES:
        return McpOutcome(
            "server_error", {"request_sent": True, "code": exc.code},
            f"{name}: the server answered with an error ({exc.code}: {exc.message})"[:500],
        )  # fmt: skip
    if isinstance(exc, httpx2.ConnectError):
        return McpOutcome(
            "not_sent", {"request_sent": False},
            f"{name}: could not reach the server ({in_words(exc)}); nothing was sent",
        )  # fmt: skip
    timed_out = isinstance(exc, TimeoutError) or (
        isinstance(exc, MCPError) and exc.code == REQUEST_TIMEOUT
    )
    words = (
        "no answer within the timeout" if timed_out else f"the answer was lost ({in_words(exc)})"
    )
    return McpOutcome(
        "no_answer", {"request_sent": True, "timed_out": timed_out},
        f"{name}: the request was sent but {words}; whether it acted is not known",
    )  # fmt: skip
