"""SystemNetwork's connections on real loopback sockets: to exactly the address given, or a clear error."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import pytest

from protolink.net.network import SystemNetwork

GUARD = 30.0  # a hang, not a slow machine


async def test_connects_to_the_address_and_carries_bytes_both_ways():
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readexactly(4))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.wait_for(
            SystemNetwork().connect(ipaddress.ip_address("127.0.0.1"), port, server_name=None), GUARD)
        assert writer.get_extra_info("peername") == ("127.0.0.1", port)
        assert writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.read(), GUARD) == b"ping"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_port_nobody_listens_on_is_refused():
    with socket.socket() as probe:  # a port just freed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionRefusedError):
        await asyncio.wait_for(SystemNetwork().connect(ipaddress.ip_address("127.0.0.1"), port, server_name=None), GUARD)
