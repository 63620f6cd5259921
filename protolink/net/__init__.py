"""Addresses, address rules, the network seam and joined connections: what fetch_url, the
egress proxy and the sandbox server's egress relay share.

``addresses``: URL and host parsing (an IP address in any spelling is a literal);
``rules``: :class:`~protolink.net.rules.AddressRules`, the one address deny-list;
``network``: name resolution and pinned connections behind a replaceable
:class:`~protolink.net.network.Network`; ``tunnel``: :class:`~protolink.net.tunnel.Tunnel`, two
sockets joined (``splice``: one direction of it inside the kernel); ``descriptors``: messages
with descriptors attached, as the host receives them; ``tasks``: a task that owns the connection
it is handed, released even when the task is canceled before it ran. Standard library only.
"""
