"""Addresses, address rules and the network seam: what fetch_url and the egress proxy share.

``addresses``: URL and host parsing (an IP address in any spelling is a literal);
``rules``: :class:`~protolink.net.rules.AddressRules`, the one address deny-list;
``network``: name resolution and pinned connections behind a replaceable
:class:`~protolink.net.network.Network`. Standard library only.
"""
