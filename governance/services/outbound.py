"""Outbound URLs are safe: resolve a URL's host and ask the rule.

``governance.rules.outbound`` decides; this module supplies what it needs —
the URL parsed the way the HTTP client parses it (httpx, so the check and the
request never disagree about the host), the addresses the host resolves to
(``socket.getaddrinfo``, or a resolver a test injects) and the settings
``GOVERNANCE_OUTBOUND_ALLOW`` and ``GOVERNANCE_OUTBOUND_REQUIRE_HTTPS``.

Two moments:

- input time (``check_outbound_url`` / ``require_outbound_url``): a
  ``callback_url`` given to the API, an alert channel's target. A readable
  refusal for the person who typed it. A name that does not resolve now is
  not refused here (it reaches nothing now); the send-time check decides.
- send time (``destination``): resolve again and check every address; the
  caller connects only to an address returned here (``tasks.outbound`` pins
  it), so a DNS answer that changed since the input check — rebinding —
  cannot reach a forbidden address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from governance.rules.outbound import outbound_verdict
from governance.services.errors import ServiceError

# host, port -> the IP addresses it resolves to (raises OSError when it does not)
Resolver = Callable[[str, int], Sequence[str]]
DEFAULT_PORTS = {"http": 80, "https": 443}


class OutboundRefused(Exception):
    """The URL may not be called: a permanent failure of that delivery."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnresolvedHost(Exception):
    """The host does not resolve (now): like a network error, nothing was sent."""


@dataclass(frozen=True)
class Destination:
    """A URL that passed the check, with the addresses that passed it (in the
    resolver's order). Connect only to one of these."""

    url: httpx.URL
    scheme: str
    host: str  # ASCII (IDNA) form; an IP literal without brackets
    port: int
    addresses: tuple[str, ...]
    host_is_address: bool


def require_http_url(value: str, field: str) -> None:
    """``value`` is an http:// or https:// URL with a host (and a port, if one,
    that is a number): a ServiceError naming ``field`` otherwise, never the
    parser's own ValueError (an unclosed IPv6 bracket, a port of letters)."""
    try:
        parts = urlsplit(value)
        well_formed = (
            parts.scheme in ("http", "https")
            and bool(parts.hostname)
            and not any(c.isspace() for c in value)
        )
        parts.port  # noqa: B018  (raises for a port that is not a number)
    except ValueError:
        well_formed = False
    if not well_formed:
        raise ServiceError(field, "must be an http:// or https:// URL with a host")


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, first answer first."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _parse(url: object) -> tuple[httpx.URL, str, str, int]:
    if not isinstance(url, str | httpx.URL) or not str(url):
        raise OutboundRefused("a URL is required")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise OutboundRefused(f"not a valid URL: {exc}") from None
    scheme = parsed.scheme.lower()
    host = parsed.raw_host.decode("ascii").lower()
    port = parsed.port or DEFAULT_PORTS.get(scheme, 0)
    return parsed, scheme, host, port


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return None


def _verdict(scheme: str, host: str, addresses: Sequence[str] | None) -> str | None:
    return outbound_verdict(
        scheme=scheme,
        host=host,
        addresses=addresses,
        allow=settings.GOVERNANCE_OUTBOUND_ALLOW,
        require_https=settings.GOVERNANCE_OUTBOUND_REQUIRE_HTTPS,
    )


def destination(url: str | httpx.URL, *, resolver: Resolver | None = None) -> Destination:
    """Send time: resolve the host, check every address (OutboundRefused, or
    UnresolvedHost when the name does not resolve) and return what passed."""
    parsed, scheme, host, port = _parse(url)
    if scheme not in DEFAULT_PORTS or not host:
        raise OutboundRefused(_verdict(scheme, host, None) or "not an http(s) URL")
    literal = _literal(host)
    if literal is not None:
        addresses: Sequence[str] = [literal]
    else:
        try:
            addresses = list((resolver or resolve)(host, port))
        except (OSError, UnicodeError) as exc:
            raise UnresolvedHost(f"{host} does not resolve: {exc}") from None
        if not addresses:
            raise UnresolvedHost(f"{host} resolves to no address")
    refusal = _verdict(scheme, host, addresses)
    if refusal:
        raise OutboundRefused(refusal)
    return Destination(parsed, scheme, host, port, tuple(addresses), literal is not None)


def check_outbound_url(url: str, *, resolver: Resolver | None = None) -> str | None:
    """Input time: why ``url`` would be refused, in words, or None.

    Resolves the host now (a name that resolves to a private or loopback
    address is refused at once); a name that does not resolve is judged on
    its scheme only — the send-time check resolves again and decides.
    """
    try:
        parsed, scheme, host, _port = _parse(url)
    except OutboundRefused as exc:
        return exc.reason
    try:
        destination(parsed, resolver=resolver)
    except OutboundRefused as exc:
        return exc.reason
    except UnresolvedHost:
        return _verdict(scheme, host, None)
    return None


def require_outbound_url(
    url: str, field: str = "callback_url", *, resolver: Resolver | None = None
) -> None:
    """Input time for a service: ServiceError(field, reason) when ``url`` is refused."""
    if url and (problem := check_outbound_url(url, resolver=resolver)):
        raise ServiceError(field, problem)
