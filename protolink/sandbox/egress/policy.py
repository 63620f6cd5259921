"""A sandbox's egress policy: the allow-list, the address rules and the limits.

Rules are written as text (:meth:`EgressPolicy.parse`)::

    pypi.org                  the name pypi.org on ports 80 and 443
    pypi.org:443              that name on port 443 only
    *.pythonhosted.org:443    any name below pythonhosted.org (not pythonhosted.org itself)
    pypi.org:80,443           several ports
    203.0.113.0/24:443        IP literals in that network (an address alone means /32 or /128)
    [2001:db8::]/32:443       IPv6 networks and addresses are written in brackets

Names are matched exactly, without case and without a trailing dot; ``*.`` matches one or more
labels in front of the suffix. IP literals are allowed only by network rules, and a name rule
never allows an address. Every address, resolved or literal, must also pass the policy's
:class:`~protolink.net.rules.AddressRules` unless those rules were built to allow it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from protolink.net.addresses import IPAddress, parse_host
from protolink.net.rules import EGRESS_ADDRESS_RULES, AddressRules, IPNetwork

DEFAULT_PORTS = frozenset({80, 443})
_PORTS = re.compile(r"[0-9]{1,5}(?:,[0-9]{1,5})*\Z")


@dataclass(frozen=True)
class EgressLimits:
    """Limits of one sandbox's egress (one :class:`~protolink.sandbox.egress.proxy.EgressProxy`).

    ``max_connections`` open at once and ``max_connections_per_second`` (a token bucket holding
    one second's worth) are checked before a request is read; beyond the first a connection is
    refused (503); beyond the bucket it waits for its token when that is due within a second
    (counted as open meanwhile), and is refused (429) otherwise. ``max_bytes`` is the sandbox's byte budget: payload relayed in both
    directions, summed over every connection for the proxy's whole life (None: unlimited); when
    it is spent, open connections close and new ones are refused. A connection that moves no byte
    either way for ``idle_seconds`` is closed. The request head must arrive whole within
    ``head_seconds`` and ``max_head_bytes``; resolving and connecting get ``connect_seconds``.
    """

    max_connections: int = 64
    max_connections_per_second: float = 50.0
    max_bytes: int | None = None
    idle_seconds: float = 60.0
    head_seconds: float = 10.0
    max_head_bytes: int = 16 * 1024
    connect_seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_connections_per_second", "idle_seconds", "head_seconds",
                     "max_head_bytes", "connect_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"EgressLimits.{name} must be positive, not {getattr(self, name)!r}")
        if self.max_bytes is not None and self.max_bytes < 0:
            raise ValueError(f"EgressLimits.max_bytes must be None or >= 0, not {self.max_bytes!r}")


@dataclass(frozen=True)
class HostRule:
    """Names allowed on ``ports``: ``pattern`` is a lower-case name or ``*.suffix``."""

    pattern: str
    ports: frozenset[int] = DEFAULT_PORTS

    def matches(self, host: str) -> bool:
        """True when the (normalized) name ``host`` is this rule's name or, for ``*.``, below it."""
        host = host.removesuffix(".")
        if self.pattern.startswith("*."):
            return host.endswith(self.pattern[1:])
        return host == self.pattern

    def __str__(self) -> str:
        return f"{self.pattern}:{','.join(map(str, sorted(self.ports)))}"


@dataclass(frozen=True)
class CidrRule:
    """IP literals inside ``network`` allowed on ``ports``."""

    network: IPNetwork
    ports: frozenset[int] = DEFAULT_PORTS

    def matches(self, address: IPAddress) -> bool:
        return address in self.network

    def __str__(self) -> str:
        network = f"[{self.network.network_address}]/{self.network.prefixlen}" if self.network.version == 6 \
            else str(self.network)
        return f"{network}:{','.join(map(str, sorted(self.ports)))}"


Rule = HostRule | CidrRule


@dataclass(frozen=True)
class EgressPolicy:
    """What one sandbox may reach. No rules (the default, :data:`DENY_ALL`): nothing."""

    allow: tuple[Rule, ...] = ()
    addresses: AddressRules = EGRESS_ADDRESS_RULES
    limits: EgressLimits = field(default_factory=EgressLimits)

    @classmethod
    def parse(cls, allow: Iterable[str], **kwargs: object) -> EgressPolicy:
        """A policy from rule texts (see the module docstring); ValueError naming a bad one.

        ``kwargs`` are the other fields (``addresses``, ``limits``).
        """
        if isinstance(allow, str):
            raise TypeError("EgressPolicy.parse wants an iterable of rule texts, not one string")
        return cls(tuple(parse_rule(text) for text in allow), **kwargs)  # type: ignore[arg-type]

    @property
    def denies_all(self) -> bool:
        return not self.allow

    def denial(self, host: str, port: int, address: IPAddress | None) -> str | None:
        """Why the allow-list refuses ``host:port``, or None.

        ``host`` is a normalized name, or the text of ``address`` when the target is an IP
        literal; a literal must also pass :attr:`addresses`. Resolved addresses of a name are
        the caller's to check (with ``addresses.denial``), after resolving once.
        """
        if self.denies_all:
            return "deny-all"
        if address is not None:
            rules: list[Rule] = [r for r in self.allow if isinstance(r, CidrRule) and r.matches(address)]
            if not rules:
                return f"IP literal {address} is not in any allowed network"
        else:
            rules = [r for r in self.allow if isinstance(r, HostRule) and r.matches(host)]
            if not rules:
                return f"{host} is not on the allow-list"
        if not any(port in rule.ports for rule in rules):
            allowed = sorted({p for rule in rules for p in rule.ports})
            return f"port {port} is not allowed for {host} (allowed: {', '.join(map(str, allowed))})"
        return None if address is None else self.addresses.denial(address)


DENY_ALL = EgressPolicy()
#: Test-only: a policy from :func:`parse_policy` may reach loopback addresses.
TEST_ALLOW_LOOPBACK = "PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK"


def parse_policy(allow: Iterable[str]) -> EgressPolicy:
    """The policy of ``allow`` rules (none: deny all), as the command line gives them;
    ValueError naming a rule it cannot parse.

    ``PROTOLINK_EGRESS_TEST_ALLOW_LOOPBACK=1`` in this process's environment also lets it reach
    this host's loopback addresses. It is for tests and benchmarks, which serve on loopback;
    never set it otherwise: loopback is the host's own services.
    """
    if os.environ.get(TEST_ALLOW_LOOPBACK) == "1":
        return EgressPolicy.parse(allow, addresses=EGRESS_ADDRESS_RULES.allowing("127.0.0.0/8", "::1/128"))
    return EgressPolicy.parse(allow)


def parse_rule(text: str) -> Rule:
    """One rule from its text form; ValueError naming the text when it is not one."""
    try:
        return _parse_rule(text.strip().lower())
    except ValueError as error:
        raise ValueError(f"invalid egress rule {text!r}: {error}") from None


def _parse_rule(text: str) -> Rule:
    if not text:
        raise ValueError("empty rule")
    if text.startswith("["):
        address, bracket, rest = text[1:].partition("]")
        prefix, colon, ports = rest.partition(":")
        if not bracket or (prefix and not prefix.startswith("/")) or (colon and not ports):
            raise ValueError("expected [IPv6]/LENGTH:PORTS")
        return CidrRule(_network(address + prefix), _ports(ports))
    if text.count(":") > 1:
        raise ValueError("write IPv6 addresses in brackets: [2001:db8::]/32:443")
    where, colon, ports = text.partition(":")
    if colon and not ports:
        raise ValueError("empty port list")
    if "/" in where:
        return CidrRule(_network(where), _ports(ports))
    wildcard = where.startswith("*.")
    if "*" in where.removeprefix("*."):
        raise ValueError("'*' is only allowed as a leading '*.' label")
    name, literal = parse_host(where.removeprefix("*."), bracketed=False)
    if literal is not None:
        if wildcard:
            raise ValueError("a wildcard needs a name, not an address")
        return CidrRule(ipaddress.ip_network(literal), _ports(ports))
    return HostRule(("*." if wildcard else "") + name.removesuffix("."), _ports(ports))


def _ports(text: str) -> frozenset[int]:
    """The ports of a comma-separated list; 80 and 443 when there is none."""
    if not text:
        return DEFAULT_PORTS
    if not _PORTS.match(text):
        raise ValueError(f"bad port list {text!r}")
    ports = frozenset(int(port) for port in text.split(","))
    if not all(1 <= port <= 65535 for port in ports):
        raise ValueError("ports are 1-65535")
    return ports


def _network(text: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(text)
    except ValueError as error:
        raise ValueError(str(error)) from None
