"""Which IP addresses may be reached: the address deny-list, implemented once.

An :class:`AddressRules` value names *categories* of addresses to refuse, extra denied networks,
and networks allowed in spite of both. :meth:`AddressRules.denial` gives the reason an address
is refused, or None. Two values are defined here:

- :data:`PUBLIC_ADDRESS_RULES` (fetch_url, web_search): only globally routable unicast
  addresses; private, loopback, link-local, shared, reserved, documentation, benchmarking,
  multicast and unspecified ranges are refused, and so are IPv6 site-local addresses.
- :data:`EGRESS_ADDRESS_RULES` (a sandbox's egress proxy): ``unspecified`` (0.0.0.0/8, ::),
  ``loopback``, ``private`` (10/8, 172.16/12, 192.168/16), ``link-local`` (169.254/16 with the
  cloud metadata address 169.254.169.254, fe80::/10), ``shared`` (100.64/10), ``unique-local``
  (fc00::/7), ``site-local`` (fec0::/10), ``multicast``, ``reserved`` (240/4 and the broadcast
  address) and ``host``: every address of this machine's interfaces, read from the kernel
  (``/proc/net/fib_trie`` and ``/proc/net/if_inet6``) and refreshed every few seconds.
  Documentation and benchmarking ranges are *not* refused by default: on some networks package
  indexes resolve there (for instance 203.0.113.0/24). Add them with
  ``AddressRules(deny=EGRESS_CATEGORIES + ("documentation",))`` or :meth:`AddressRules.denying`.

In every rule set, an IPv6 address that embeds an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``,
6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``) is refused when the IPv4 address is.
:meth:`AddressRules.allowing` opens ranges on purpose, for example loopback for a test server:
``EGRESS_ADDRESS_RULES.allowing("127.0.0.0/8", "::1/128")``.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from .addresses import IPAddress

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_RANGES: dict[str, tuple[str, ...]] = {
    "unspecified": ("0.0.0.0/8", "::/128"),
    "loopback": ("127.0.0.0/8", "::1/128"),
    "private": ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"),
    "link-local": ("169.254.0.0/16", "fe80::/10"),
    "shared": ("100.64.0.0/10",),
    "unique-local": ("fc00::/7",),
    "site-local": ("fec0::/10",),
    "multicast": ("224.0.0.0/4", "ff00::/8"),
    "reserved": ("240.0.0.0/4",),
    "documentation": ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"),
    "benchmarking": ("198.18.0.0/15", "2001:2::/48"),
}
_NETWORKS = {name: tuple(ipaddress.ip_network(cidr) for cidr in cidrs) for name, cidrs in _RANGES.items()}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = ipaddress.ip_address("169.254.169.254")

#: Every category an :class:`AddressRules` may deny, in the order they are checked.
CATEGORIES: tuple[str, ...] = (*_RANGES, "host", "non-public")
#: The categories the egress proxy denies by default.
EGRESS_CATEGORIES: tuple[str, ...] = (
    "unspecified", "loopback", "private", "link-local", "shared", "unique-local", "site-local", "multicast",
    "reserved", "host",
)
HOST_ADDRESSES_TTL_SECONDS = 5.0


def is_public_address(address: IPAddress) -> bool:
    """True for globally routable unicast addresses only (the ``non-public`` category's test).

    Private, loopback, link-local, shared, reserved (NAT64 and IPv4-compatible forms included),
    documentation, multicast and unspecified ranges are refused, and so are IPv6 site-local
    addresses and IPv6 forms that embed a refused IPv4 address (IPv4-mapped, 6to4).
    """
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if address.is_site_local or (embedded is not None and not is_public_address(embedded)):
            return False
    return address.is_global and not (
        address.is_private or address.is_loopback or address.is_link_local or address.is_multicast
        or address.is_reserved or address.is_unspecified
    )


def _network(cidr: str | IPNetwork) -> IPNetwork:
    try:
        return ipaddress.ip_network(cidr) if isinstance(cidr, str) else cidr
    except ValueError:
        raise ValueError(f"invalid network {cidr!r} (expected CIDR notation such as 10.0.0.0/8)") from None


@dataclass(frozen=True)
class AddressRules:
    """An address deny-list: categories (see :data:`CATEGORIES`), denied and allowed networks.

    ``allow`` wins over everything else: an address inside one of those networks is never
    refused. Networks may be given as CIDR text.
    """

    deny: tuple[str, ...] = EGRESS_CATEGORIES
    deny_networks: tuple[IPNetwork, ...] = ()
    allow: tuple[IPNetwork, ...] = ()

    def __post_init__(self) -> None:
        unknown = [name for name in self.deny if name not in CATEGORIES]
        if unknown:
            raise ValueError(f"unknown address categories {unknown}; known: {', '.join(CATEGORIES)}")
        object.__setattr__(self, "deny", tuple(dict.fromkeys(self.deny)))
        object.__setattr__(self, "deny_networks", tuple(_network(n) for n in self.deny_networks))
        object.__setattr__(self, "allow", tuple(_network(n) for n in self.allow))

    def allowing(self, *cidrs: str | IPNetwork) -> AddressRules:
        """These rules with ``cidrs`` allowed whatever else they deny."""
        return replace(self, allow=self.allow + tuple(_network(c) for c in cidrs))

    def denying(self, *cidrs: str | IPNetwork) -> AddressRules:
        """These rules with ``cidrs`` denied as well (an allowed network still wins)."""
        return replace(self, deny_networks=self.deny_networks + tuple(_network(c) for c in cidrs))

    def denied_networks(self) -> tuple[IPNetwork, ...]:
        """The fixed networks these rules deny, for a filter that takes networks only: the ranges
        of their categories (``non-public``: every range above) and ``deny_networks``. Not the
        ``host`` category's addresses, which change, nor the IPv6 forms that embed an IPv4
        address; ``allow`` is not taken out."""
        names = _RANGES if "non-public" in self.deny else [name for name in self.deny if name in _RANGES]
        return tuple(dict.fromkeys([*(net for name in names for net in _NETWORKS[name]), *self.deny_networks]))

    def denial(self, address: IPAddress | str) -> str | None:
        """Why ``address`` must not be reached, or None when it may be."""
        if isinstance(address, str):
            try:
                address = ipaddress.ip_address(address)
            except ValueError:
                return f"{address!r} is not an IP address"
        if any(address in network for network in self.allow):
            return None
        if isinstance(address, ipaddress.IPv6Address):
            embedded = _embedded_ipv4(address)
            reason = None if embedded is None else self.denial(embedded)
            if reason is not None:
                return f"{address} embeds an IPv4 address: {reason}"
        for category in self.deny:
            if _in_category(category, address):
                return f"{address} is {_DESCRIPTIONS.get(category, category)}" + (
                    " (the cloud metadata address)" if address == _METADATA else "")
        for network in self.deny_networks:
            if address in network:
                return f"{address} is in the denied network {network}"
        return None


_DESCRIPTIONS = {
    "unspecified": "unspecified (0.0.0.0/8 or ::)",
    "host": "one of this host's own addresses",
    "non-public": "not a globally routable unicast address",
    "reserved": "in a reserved range",
    "documentation": "in a documentation range",
    "benchmarking": "in the benchmarking range",
    "shared": "shared address space (carrier-grade NAT)",
}


def _in_category(category: str, address: IPAddress) -> bool:
    if category == "non-public":
        return not is_public_address(address)
    if category == "host":
        return address in host_addresses()
    return any(address in network for network in _NETWORKS[category])


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.ipv4_mapped or address.sixtofour


#: fetch_url's and web_search's rules: only globally routable unicast addresses.
PUBLIC_ADDRESS_RULES = AddressRules(deny=("non-public",))
#: The egress proxy's default rules (see the module docstring).
EGRESS_ADDRESS_RULES = AddressRules()


# -- the host's own addresses ----------------------------------------------------------------

_cache: tuple[float, frozenset[IPAddress]] = (float("-inf"), frozenset())


def host_addresses() -> frozenset[IPAddress]:
    """Every address assigned to this machine's interfaces (cached for a few seconds).

    Linux: the kernel's local routes (``/proc/net/fib_trie``) and IPv6 addresses
    (``/proc/net/if_inet6``). Elsewhere: what the host name resolves to, plus loopback.
    """
    global _cache
    now = time.monotonic()
    if now - _cache[0] > HOST_ADDRESSES_TTL_SECONDS:
        _cache = (now, _read_host_addresses())
    return _cache[1]


def _read_host_addresses() -> frozenset[IPAddress]:
    found: set[IPAddress] = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    try:
        found |= set(_local_ipv4(Path("/proc/net/fib_trie").read_text()))
    except OSError:
        found |= set(_resolved_host_name())
    try:
        found |= set(_local_ipv6(Path("/proc/net/if_inet6").read_text()))
    except OSError:
        pass
    return frozenset(found)


def _local_ipv4(fib_trie: str) -> Iterable[IPAddress]:
    """The addresses of ``/32 host LOCAL`` leaves: the kernel's table of this host's addresses."""
    last = None
    for line in fib_trie.splitlines():
        text = line.strip()
        if text.startswith("|--"):
            last = text[3:].strip()
        elif last is not None and text.split()[:3] == ["/32", "host", "LOCAL"]:
            yield ipaddress.IPv4Address(last)


def _local_ipv6(if_inet6: str) -> Iterable[IPAddress]:
    for line in if_inet6.splitlines():
        fields = line.split()
        if fields and len(fields[0]) == 32:
            yield ipaddress.IPv6Address(int(fields[0], 16))


def _resolved_host_name() -> Iterable[IPAddress]:
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except OSError:
        return ()
    return (ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos)
