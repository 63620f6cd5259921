"""Egress of a sandbox: an allow-list enforced by a proxy on the host, one per sandbox.

What is decided. A sandbox has no network interface. Its commands reach the network only through
their proxy variables, which lead to an :class:`EgressProxy` on the host. The proxy reads one
request head per connection, strictly and within a time and size bound: ``CONNECT host:port``
(any TLS or other protocol inside an opaque tunnel) or a plain-HTTP request in absolute form
(``GET http://host/path``), forwarded as one request with ``Connection: close``. Anything else is
refused. The target is decided by host name and port against the allow-list (exact names,
``*.suffix`` wildcards, ports; IP literals only through network rules). The proxy then resolves
the name once, refuses the connection if *any* resolved address is denied by the address rules
(loopback, private, link-local with the cloud metadata address, shared, unique-local, multicast,
unspecified, reserved, the host's own addresses; see :mod:`protolink.net.rules`), and connects to
one of the addresses it validated, never to the name, so a second DNS answer cannot redirect it
(DNS rebinding). Limits per sandbox: connections open at once, connections per second, a byte
budget over the sandbox's life, an idle timeout. Every decision and every end of a connection is
an :class:`EgressEvent`. A new policy applies to new connections at once and closes open ones it
no longer allows (all of them under deny-all).

What is not decided. TLS is not intercepted: the proxy sees the name in ``CONNECT``, not the TLS
server name (SNI) nor the HTTP ``Host`` inside the tunnel. A command can ``CONNECT`` to an allowed
name and then send any SNI or Host header; it still reaches only the addresses of the allowed
name, so this matters where one address serves many names (a CDN or a shared front end: a
domain-fronting request can reach another site that the same front end serves). Likewise, what
travels inside an allowed tunnel or request (uploads, the content of the requests) is neither
inspected nor limited beyond the byte budget, so data can leave through any allowed destination
that accepts it. DNS answers are judged only by the address rules: an allowed name whose owner
points it at another public address is reached there. The proxy resolves only names the
allow-list admits, but under a ``*.suffix`` rule a command chooses the names, so it can carry
data out in the lookups themselves (to whoever serves that suffix's DNS). A refusal tells the
command why, naming the denied address an allowed name resolved to.
"""

from __future__ import annotations

from protolink._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["EgressPolicy", "EgressLimits", "HostRule", "CidrRule", "DENY_ALL", "parse_rule"],
                    "protolink.sandbox.egress.policy"),
    "EgressEvent": "protolink.sandbox.egress.events",
    "EgressProxy": "protolink.sandbox.egress.proxy",
    **dict.fromkeys(["AddressRules", "EGRESS_ADDRESS_RULES", "EGRESS_CATEGORIES"], "protolink.net.rules"),
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
