"""Egress rules as text, and what the allow-list decides before any resolution."""

from __future__ import annotations

import ipaddress

import pytest

from protolink.net.rules import EGRESS_ADDRESS_RULES
from protolink.sandbox.egress import DENY_ALL, CidrRule, EgressLimits, EgressPolicy, HostRule


def test_rule_texts():
    policy = EgressPolicy.parse(["PyPI.org", "files.example:443", "*.pythonhosted.org:443", "git.example:80,443",
                                 "203.0.113.0/24:443", "[2001:db8::]/32:443", "198.51.100.7", "bücher.example"])
    assert policy.allow == (
        HostRule("pypi.org", frozenset({80, 443})), HostRule("files.example", frozenset({443})),
        HostRule("*.pythonhosted.org", frozenset({443})), HostRule("git.example", frozenset({80, 443})),
        CidrRule(ipaddress.ip_network("203.0.113.0/24"), frozenset({443})),
        CidrRule(ipaddress.ip_network("2001:db8::/32"), frozenset({443})),
        CidrRule(ipaddress.ip_network("198.51.100.7/32"), frozenset({80, 443})),
        HostRule("xn--bcher-kva.example", frozenset({80, 443})),
    )
    assert policy.addresses is EGRESS_ADDRESS_RULES and policy.limits == EgressLimits()
    assert str(policy.allow[2]) == "*.pythonhosted.org:443" and str(policy.allow[5]) == "[2001:db8::]/32:443"


@pytest.mark.parametrize("text", ["", "*", "*.", "a.*.example", "pypi.org:", "pypi.org:0", "pypi.org:65536",
                                  "pypi.org:https", "2001:db8::/32", "[2001:db8::", "10.0.0.0/33", "*.10.0.0.1",
                                  "bad host", "user@pypi.org"])
def test_bad_rule_texts_name_themselves(text):
    with pytest.raises(ValueError, match="invalid egress rule"):
        EgressPolicy.parse([text])


def test_parse_wants_a_list_not_a_string():
    with pytest.raises(TypeError):
        EgressPolicy.parse("pypi.org")


def test_names_wildcards_and_ports():
    policy = EgressPolicy.parse(["pypi.org:443", "*.pythonhosted.org"])
    assert policy.denial("pypi.org", 443, None) is None
    assert policy.denial("pypi.org.", 443, None) is None
    assert "port 80 is not allowed" in policy.denial("pypi.org", 80, None)
    assert policy.denial("files.pythonhosted.org", 443, None) is None
    assert policy.denial("a.b.pythonhosted.org", 80, None) is None
    # A wildcard matches names below the suffix, never the suffix itself or a look-alike.
    assert "not on the allow-list" in policy.denial("pythonhosted.org", 443, None)
    assert "not on the allow-list" in policy.denial("evilpythonhosted.org", 443, None)
    assert "not on the allow-list" in policy.denial("pypi.org.evil.example", 443, None)
    assert "not on the allow-list" in policy.denial("example.com", 443, None)


def test_ip_literals_only_through_network_rules_and_still_under_the_address_rules():
    policy = EgressPolicy.parse(["pypi.org", "203.0.113.0/24:443", "10.0.0.0/8:443"])
    literal = ipaddress.ip_address("203.0.113.9")
    assert policy.denial(str(literal), 443, literal) is None
    assert "port 80" in policy.denial(str(literal), 80, literal)
    other = ipaddress.ip_address("151.101.0.223")
    assert "not in any allowed network" in policy.denial(str(other), 443, other)
    private = ipaddress.ip_address("10.1.2.3")
    assert "private" in policy.denial(str(private), 443, private)
    opened = EgressPolicy.parse(["10.0.0.0/8:443"], addresses=EGRESS_ADDRESS_RULES.allowing("10.0.0.0/8"))
    assert opened.denial(str(private), 443, private) is None


def test_deny_all():
    assert DENY_ALL.denies_all and EgressPolicy().denies_all and EgressPolicy.parse([]).denies_all
    assert DENY_ALL.denial("pypi.org", 443, None) == "deny-all"
    assert not EgressPolicy.parse(["pypi.org"]).denies_all


def test_limits_are_checked():
    with pytest.raises(ValueError, match="max_connections"):
        EgressLimits(max_connections=0)
    with pytest.raises(ValueError, match="max_bytes"):
        EgressLimits(max_bytes=-1)
