"""The address deny-list: fetch_url's strict rules and the egress default, one implementation."""

from __future__ import annotations

import ipaddress

import pytest

from protolink.net.rules import (
    CATEGORIES,
    EGRESS_ADDRESS_RULES,
    PUBLIC_ADDRESS_RULES,
    AddressRules,
    host_addresses,
    is_public_address,
)

EGRESS_DENIED = {
    "0.0.0.0": "unspecified", "0.1.2.3": "unspecified", "::": "unspecified",
    "127.0.0.1": "loopback", "127.255.0.9": "loopback", "::1": "loopback",
    "10.1.2.3": "private", "172.16.0.1": "private", "172.31.255.255": "private", "192.168.1.1": "private",
    "169.254.169.254": "metadata", "169.254.1.1": "link-local", "fe80::1": "link-local",
    "100.64.0.1": "shared", "100.127.255.254": "shared",
    "fc00::1": "unique-local", "fd12:3456::1": "unique-local", "fec0::1": "site-local",
    "224.0.0.1": "multicast", "239.255.255.250": "multicast", "ff02::1": "multicast",
    "240.0.0.1": "reserved", "255.255.255.255": "reserved",
    "::ffff:127.0.0.1": "loopback", "::ffff:169.254.169.254": "metadata", "2002:a00:1::": "private",
    "64:ff9b::7f00:1": "loopback",
}
EGRESS_ALLOWED = ["8.8.8.8", "151.101.0.223", "203.0.113.7", "192.0.2.200", "198.18.0.1", "2001:db8::1",
                  "2606:4700::1111", "::ffff:8.8.8.8", "172.32.0.1", "100.128.0.1"]


@pytest.mark.parametrize("address", sorted(EGRESS_DENIED))
def test_the_egress_default_denies_the_named_categories(address):
    reason = EGRESS_ADDRESS_RULES.denial(address)
    assert reason is not None and str(ipaddress.ip_address(address)) in reason
    expected = EGRESS_DENIED[address]
    assert ("cloud metadata" if expected == "metadata" else expected.replace("-", "")) in reason.replace("-", "")


@pytest.mark.parametrize("address", EGRESS_ALLOWED)
def test_the_egress_default_allows_public_and_documentation_addresses(address):
    """Package indexes resolve into 203.0.113.0/24 on these machines: not denied by default
    (unless the address is this host's own here, which only the "host" category denies)."""
    if ipaddress.ip_address(address) in host_addresses():
        assert "this host's own" in (EGRESS_ADDRESS_RULES.denial(address) or "")
    else:
        assert EGRESS_ADDRESS_RULES.denial(address) is None


def test_the_hosts_own_addresses_are_denied():
    own = [a for a in host_addresses() if not a.is_loopback]
    assert ipaddress.ip_address("127.0.0.1") in host_addresses()
    for address in own:
        assert EGRESS_ADDRESS_RULES.denial(address) is not None
    public_own = [a for a in own if not (a.is_private or a.is_link_local)]
    for address in public_own:  # only the "host" category can deny these
        assert "this host's own" in (EGRESS_ADDRESS_RULES.denial(address) or "")


def test_allowing_opens_a_range_for_tests_and_wins_over_every_category():
    rules = EGRESS_ADDRESS_RULES.allowing("127.0.0.0/8", "::1/128")
    assert rules.denial("127.0.0.1") is None and rules.denial("::1") is None
    assert rules.denial("::ffff:127.0.0.1") is None  # the embedded address is allowed
    assert rules.denial("10.0.0.1") is not None and rules.denial("169.254.169.254") is not None
    assert EGRESS_ADDRESS_RULES.denial("127.0.0.1") is not None  # the default is unchanged


def test_rules_are_configurable_by_category_and_network():
    strict = AddressRules(deny=(*EGRESS_ADDRESS_RULES.deny, "documentation"))
    assert "documentation" in (strict.denial("203.0.113.7") or "")
    extra = EGRESS_ADDRESS_RULES.denying("8.8.8.0/24")
    assert "denied network 8.8.8.0/24" in (extra.denial("8.8.8.8") or "")
    with pytest.raises(ValueError, match="unknown address categories"):
        AddressRules(deny=("nowhere",))
    with pytest.raises(ValueError, match="invalid network"):
        EGRESS_ADDRESS_RULES.allowing("10.0.0.0/33")
    assert set(EGRESS_ADDRESS_RULES.deny) <= set(CATEGORIES)
    assert EGRESS_ADDRESS_RULES.denial("not an address") is not None


SAMPLE = ["8.8.8.8", "1.1.1.1", "10.0.0.1", "127.0.0.1", "169.254.169.254", "100.64.0.1", "192.0.2.1",
          "198.51.100.1", "203.0.113.1", "198.18.0.1", "240.0.0.1", "224.0.0.1", "0.0.0.0", "192.0.0.8",
          "2606:4700::1111", "::1", "::", "fe80::1", "fc00::1", "fec0::1", "2001:db8::1", "::ffff:8.8.8.8",
          "::ffff:10.0.0.1", "2002:808:808::", "2002:a00:1::", "64:ff9b::808:808", "ff02::1", "2001::1"]


@pytest.mark.parametrize("address", SAMPLE)
def test_fetch_urls_rules_are_exactly_globally_routable_unicast(address):
    parsed = ipaddress.ip_address(address)
    assert (PUBLIC_ADDRESS_RULES.denial(parsed) is None) == is_public_address(parsed)
