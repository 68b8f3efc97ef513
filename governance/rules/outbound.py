"""Outbound URLs are safe: where the worker may POST.

The calls that go to URLs people give: completion callbacks
(``callback_url``, R7.3), webhook-type alert channels (R8.2), the built-in
``webhook`` tool (R4.1), registry tools and a provider's ``base_url`` (where
its key is sent). None of them may reach the machine's own network:
loopback, link-local (with the cloud metadata addresses 169.254.169.254 and
fd00:ec2::254), private (RFC 1918), shared (CGNAT), unique-local,
unspecified, multicast or otherwise reserved addresses — unless the operator
lists the host, address or network in ``GOVERNANCE_OUTBOUND_ALLOW``. Plain
``http`` is refused when https is required (``DJANGO_DEBUG=0``), again unless
the host or every address it resolves to is allow-listed.

The verdict is taken on the addresses a name *resolved to*, not on the name:
the caller resolves, asks here, and connects to an address this rule passed,
so a DNS answer that changes between check and connect (rebinding) cannot
reach a forbidden address. IPv4 addresses carried inside IPv6 (mapped
``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) are judged
as the IPv4 address they carry.

Pure: no network, no settings. The resolver, the allow-list and the https
requirement are parameters (``governance/services/outbound.py`` supplies them).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SETTING = "GOVERNANCE_OUTBOUND_ALLOW"
SCHEMES = frozenset({"http", "https"})

_net = ipaddress.ip_network

# Checked in order: the first match names the address. Anything else that
# Python's ``ipaddress`` does not call global is refused as "reserved".
_FORBIDDEN: tuple[tuple[IPNetwork, str], ...] = (
    (_net("169.254.169.254/32"), "link-local (the cloud metadata service)"),
    (_net("fd00:ec2::254/128"), "unique-local (the cloud metadata service)"),
    (_net("0.0.0.0/8"), "unspecified ('this network')"),
    (_net("127.0.0.0/8"), "loopback"),
    (_net("169.254.0.0/16"), "link-local"),
    (_net("10.0.0.0/8"), "private (RFC 1918)"),
    (_net("172.16.0.0/12"), "private (RFC 1918)"),
    (_net("192.168.0.0/16"), "private (RFC 1918)"),
    (_net("100.64.0.0/10"), "shared carrier-grade NAT (RFC 6598)"),
    (_net("224.0.0.0/4"), "multicast"),
    (_net("255.255.255.255/32"), "broadcast"),
    (_net("240.0.0.0/4"), "reserved"),
    (_net("::/128"), "unspecified"),
    (_net("::1/128"), "loopback"),
    (_net("fe80::/10"), "link-local"),
    (_net("fec0::/10"), "site-local (deprecated)"),
    (_net("fc00::/7"), "unique-local"),
    (_net("ff00::/8"), "multicast"),
)
_NAT64 = _net("64:ff9b::/96")

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


@dataclass(frozen=True)
class AllowList:
    """What may be reached anyway: exact host names and IP networks."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()

    @cached_property
    def canonical(self) -> str:
        """The list as text that is the same in every process (for fingerprints)."""
        return ",".join([*sorted(self.hosts), *sorted(str(n) for n in self.networks)])

    def lists_host(self, host: str) -> bool:
        return _host_key(host) in self.hosts

    def lists_address(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)


def _host_key(host: str) -> str:
    return host.strip().lower().rstrip(".")


def parse_allow_list(items: Iterable[str]) -> AllowList:
    """``GOVERNANCE_OUTBOUND_ALLOW``'s items: host names, IP addresses (``::1``
    or ``[::1]``) and CIDR networks (``10.20.0.0/16``). ValueError names a bad one."""
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for raw in items:
        item = raw.strip()
        if not item:
            continue
        bare = item[1:-1] if item.startswith("[") and item.endswith("]") else item
        try:
            network = ipaddress.ip_network(bare, strict=True)
        except ValueError as exc:
            if "/" in bare or ":" in bare or re.fullmatch(r"[0-9.]+", bare):
                raise ValueError(f"{item!r} is not an IP address or CIDR network ({exc})") from None
        else:
            networks.append(network)
            continue
        key = _host_key(bare)
        if not key or not all(_LABEL.fullmatch(label) for label in key.split(".")):
            raise ValueError(f"{item!r} is not a host name, IP address or CIDR network")
        hosts.add(key)
    return AllowList(frozenset(hosts), tuple(networks))


def judged_address(address: IPAddress) -> IPAddress:
    """The address a connection really reaches: the IPv4 inside an IPv4-mapped,
    NAT64 or 6to4 IPv6 address, else the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.sixtofour is not None:
            return address.sixtofour
    return address


def address_problem(address: IPAddress) -> str | None:
    """What kind of non-public address this is, or None for a public one."""
    judged = judged_address(address)
    for network, kind in _FORBIDDEN:
        if judged.version == network.version and judged in network:
            return kind
    if not judged.is_global:
        return "reserved (not a public address)"
    return None


def outbound_verdict(
    *,
    scheme: str,
    host: str,
    addresses: Sequence[str] | None,
    allow: AllowList,
    require_https: bool,
) -> str | None:
    """Why a call to ``scheme://host`` reaching ``addresses`` is refused, or None.

    ``host`` is the URL's host (an IP literal without brackets, or a name in
    its ASCII form); ``addresses`` are what it resolved to. None means "not
    resolved" (input time, a name that does not resolve now): only the scheme
    and the https requirement are judged, and the send-time check, which
    always resolves, decides the rest.
    """
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        return f"only http and https URLs are allowed, not {scheme or 'none'!r}"
    if not host:
        return "the URL has no host"
    host_listed = allow.lists_host(host)
    listed_addresses = True
    if addresses is not None:
        if not addresses:
            return f"{host} resolves to no address"
        for text in addresses:
            try:
                address = ipaddress.ip_address(text)
            except ValueError:
                return f"{host} resolved to {text!r}, which is not an IP address"
            judged = judged_address(address)
            if host_listed or allow.lists_address(address) or allow.lists_address(judged):
                continue
            listed_addresses = False
            kind = address_problem(address)
            if kind is None:
                continue
            literal = _host_key(host) == text.lower()
            where = text if literal else f"{host} resolves to {text}"
            carried = f" (carrying {judged})" if judged != address else ""
            add = text if literal else f"{_host_key(host)} or {text}"
            return (
                f"{where}{carried}, a {kind} address: outbound calls may not reach it "
                f"unless {SETTING} lists it (add {add})"
            )
    else:
        listed_addresses = False
    if scheme == "http" and require_https and not (host_listed or listed_addresses):
        return (
            "https is required (DJANGO_DEBUG=0): plain http is allowed only to hosts "
            f"{SETTING} lists (add {_host_key(host)}, or use https)"
        )
    return None
