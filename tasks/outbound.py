"""Outbound calls to user-given URLs, pinned to the checked address.

Completion callbacks, webhook alert channels and the webhook tool send
through here. Each request is checked at send time
(``governance.services.outbound.destination``: resolve, every address
judged by ``governance.rules.outbound``) and then connects to one of the
addresses that passed — never to a fresh DNS answer:

- the request URL carries the checked IP in place of the host name, so the
  HTTP client does no resolution of its own (a rebinding DNS server gets
  one question, ours, and its second answer is never used);
- the ``Host`` header keeps the original host (and port), so virtual hosts
  and signatures over it are unchanged;
- for https the TLS server name (SNI) and the certificate check stay the
  original host name (httpx's ``sni_hostname`` request extension), so the
  certificate must still be valid for the name, not for the IP.

This works with any httpx transport (the tools take one for tests) and needs
no private httpx API; a proxy from the environment is handed the IP too, so
it cannot resolve the name again either. Redirects are not followed (the callers
keep ``follow_redirects=False``): a 3xx is an answer, never a second request
to an unchecked URL. A refused URL raises ``OutboundRefused`` before any
connection; a host that does not resolve raises ``httpx.ConnectError``
(nothing was sent — callers already treat that as a network failure).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx

from governance.services.outbound import (
    OutboundRefused,
    Resolver,
    UnresolvedHost,
    destination,
)

__all__ = ["OutboundRefused", "Resolver", "pinned_routes", "request", "stream"]


def pinned_routes(
    url: str | httpx.URL, *, resolver: Resolver | None = None
) -> list[tuple[httpx.URL, dict[str, str], dict[str, Any]]]:
    """(URL with the checked IP, extra headers, request extensions), one per
    checked address in the resolver's order. OutboundRefused when refused."""
    try:
        checked = destination(url, resolver=resolver)
    except UnresolvedHost as exc:
        raise httpx.ConnectError(str(exc)) from None
    original = checked.url
    headers = {"Host": original.netloc.decode("ascii")}
    extensions: dict[str, Any] = {}
    if checked.scheme == "https" and not checked.host_is_address:
        extensions["sni_hostname"] = checked.host
    return [(original.copy_with(host=ip), headers, extensions) for ip in checked.addresses]


def _merge(headers: Any, pinned: dict[str, str]) -> httpx.Headers:
    merged = httpx.Headers(headers)
    merged.update(pinned)  # our Host wins over a caller's
    return merged


def request(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    headers: Any = None,
    resolver: Resolver | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """``client.request`` to the checked address; the next checked address is
    tried only when connecting failed (nothing was sent)."""
    routes = pinned_routes(url, resolver=resolver)
    for n, (pinned, extra, extensions) in enumerate(routes):
        try:
            return client.request(
                method, pinned, headers=_merge(headers, extra), extensions=extensions, **kwargs
            )
        except httpx.ConnectError:
            if n == len(routes) - 1:
                raise
    raise AssertionError("unreachable: destination() returns at least one address")


@contextmanager
def stream(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    headers: Any = None,
    resolver: Resolver | None = None,
    **kwargs: Any,
) -> Iterator[httpx.Response]:
    """``client.stream`` to the checked address (same fallback as ``request``)."""
    routes = pinned_routes(url, resolver=resolver)
    for n, (pinned, extra, extensions) in enumerate(routes):
        stack = ExitStack()
        try:
            response = stack.enter_context(
                client.stream(
                    method, pinned, headers=_merge(headers, extra), extensions=extensions, **kwargs
                )
            )
        except httpx.ConnectError:
            if n == len(routes) - 1:
                raise
            continue
        with stack:
            yield response
        return
