"""Outbound URLs are safe: the pure rule behind the outbound calls of
R4.1 (the webhook tool), R7.3 (completion callbacks) and R8.2 (alert channels).

The rule judges the addresses a host resolved to; the allow-list and the https
requirement are parameters.
"""

from __future__ import annotations

import ipaddress

import pytest

from governance.rules.outbound import (
    AllowList,
    address_problem,
    judged_address,
    outbound_verdict,
    parse_allow_list,
)

NOTHING = AllowList()


def verdict(url_host: str, addresses, *, scheme="https", allow=NOTHING, require_https=False):
    return outbound_verdict(
        scheme=scheme, host=url_host, addresses=addresses, allow=allow, require_https=require_https
    )


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("169.254.169.254", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("127.0.0.1", "loopback"),
        ("127.3.4.5", "loopback"),
        ("::1", "loopback"),
        ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("10.0.0.1", "RFC 1918"),
        ("172.16.0.1", "RFC 1918"),
        ("172.31.255.255", "RFC 1918"),
        ("192.168.1.10", "RFC 1918"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("fc00::1", "unique-local"),
        ("fd12:3456::1", "unique-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("192.0.2.1", "reserved"),  # documentation
        ("198.18.0.1", "reserved"),  # benchmarking
        ("2001:db8::1", "reserved"),  # documentation
        ("fec0::1", "site-local"),
    ],
)
def test_r7_3_r8_2_r4_1_forbidden_addresses_are_named(address, kind):
    """R7.3, R8.2, R4.1 outbound calls: loopback, link-local with the metadata
    addresses, private, CGNAT, unique-local, unspecified, multicast, reserved."""
    problem = address_problem(ipaddress.ip_address(address))
    assert problem is not None and kind in problem
    refusal = verdict("hooks.example.com", [address])
    assert refusal is not None
    assert f"hooks.example.com resolves to {address}" in refusal
    assert "GOVERNANCE_OUTBOUND_ALLOW" in refusal


@pytest.mark.parametrize(
    ("address", "carried", "kind"),
    [
        ("::ffff:127.0.0.1", "127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "169.254.169.254", "metadata"),
        ("::ffff:10.1.2.3", "10.1.2.3", "RFC 1918"),
        ("64:ff9b::a9fe:a9fe", "169.254.169.254", "metadata"),  # NAT64
        ("2002:7f00:1::", "127.0.0.1", "loopback"),  # 6to4
    ],
)
def test_r7_3_ipv4_carried_in_ipv6_is_judged_as_its_ipv4(address, carried, kind):
    """R7.3 (and R8.2, R4.1): an IPv4-mapped, NAT64 or 6to4 address reaches the
    IPv4 address it carries, so it is judged as that address."""
    assert str(judged_address(ipaddress.ip_address(address))) == carried
    refusal = verdict(address, [address])
    assert refusal is not None and kind in address_problem(ipaddress.ip_address(address))
    assert refusal.startswith(f"{address} (carrying {carried})")


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111", "::ffff:8.8.8.8", "1.1.1.1"]
)
def test_r7_3_public_addresses_pass(address):
    """R7.3: a public address is reached (over https, or http in development)."""
    assert address_problem(ipaddress.ip_address(address)) is None
    assert verdict("hooks.example.com", [address]) is None
    assert verdict("hooks.example.com", [address], scheme="http") is None


def test_r7_3_every_resolved_address_must_pass():
    """R7.3: one forbidden answer among public ones refuses the host (the
    client could connect to any of them)."""
    assert verdict("mixed.example.com", ["93.184.215.14", "10.0.0.7"]) is not None
    assert verdict("mixed.example.com", ["93.184.215.14", "8.8.8.8"]) is None
    assert verdict("empty.example.com", []) == "empty.example.com resolves to no address"
    assert "not an IP address" in verdict("odd.example.com", ["not-an-ip"])


def test_r7_3_https_is_required_when_asked_unless_allow_listed():
    """R7.3, R8.2: with DJANGO_DEBUG=0 plain http is refused; an allow-listed
    host, or a host whose every address is allow-listed, may use it."""
    public = ["93.184.215.14"]
    refusal = verdict("hooks.example.com", public, scheme="http", require_https=True)
    assert refusal is not None and refusal.startswith("https is required (DJANGO_DEBUG=0)")
    assert verdict("hooks.example.com", public, scheme="https", require_https=True) is None
    by_host = parse_allow_list(["hooks.example.com"])
    assert (
        verdict("HOOKS.example.com.", public, scheme="http", allow=by_host, require_https=True)
        is None
    )
    by_net = parse_allow_list(["93.184.215.0/24"])
    assert (
        verdict("hooks.example.com", public, scheme="http", allow=by_net, require_https=True)
        is None
    )
    half = ["93.184.215.14", "8.8.8.8"]
    assert verdict("hooks.example.com", half, scheme="http", allow=by_net, require_https=True)
    # Not resolved (input time, a name that does not resolve now): scheme only.
    assert verdict("later.example.com", None, scheme="http", require_https=True) is not None
    assert verdict("later.example.com", None, scheme="http") is None


def test_r7_3_allow_list_lets_named_hosts_addresses_and_networks_through():
    """R7.3, R8.2, R4.1: GOVERNANCE_OUTBOUND_ALLOW names what may be reached anyway."""
    allow = parse_allow_list(
        ["localhost", " hooks.internal ", "10.20.0.0/16", "[fd00::5]", "192.168.1.9", ""]
    )
    assert allow.hosts == frozenset({"localhost", "hooks.internal"})
    assert verdict("localhost", ["127.0.0.1", "::1"], allow=allow) is None
    assert verdict("hooks.internal", ["10.99.0.1"], allow=allow) is None  # the host is trusted
    assert verdict("a.example.com", ["10.20.3.4"], allow=allow) is None
    assert verdict("a.example.com", ["10.21.3.4"], allow=allow) is not None
    assert verdict("a.example.com", ["fd00::5"], allow=allow) is None
    assert verdict("a.example.com", ["fd00::6"], allow=allow) is not None
    assert verdict("192.168.1.9", ["192.168.1.9"], allow=allow) is None
    # A mapped address is listed by its IPv4 network too.
    assert verdict("a.example.com", ["::ffff:10.20.0.1"], allow=allow) is None
    # The metadata address is not in any of these networks.
    assert verdict("a.example.com", ["169.254.169.254"], allow=allow) is not None


@pytest.mark.parametrize(
    "item", ["10.0.0.5/8", "999.1.1.1", "10.0.0.0/33", "ho st", "*.example.com", "a..b", "-x.com"]
)
def test_r7_3_a_bad_allow_list_item_is_named(item):
    """R7.3: a typo in GOVERNANCE_OUTBOUND_ALLOW stops start-up (settings) with the item."""
    with pytest.raises(ValueError, match="is not"):
        parse_allow_list([item])


@pytest.mark.parametrize(
    ("scheme", "host"), [("ftp", "hooks.example.com"), ("file", ""), ("", "x")]
)
def test_r4_1_only_http_and_https_with_a_host(scheme, host):
    """R4.1, R7.3: other schemes, or no host, are refused before anything else."""
    assert verdict(host, ["93.184.215.14"], scheme=scheme) is not None
    assert verdict("", ["93.184.215.14"]) == "the URL has no host"
