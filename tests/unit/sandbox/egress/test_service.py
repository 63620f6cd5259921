"""One sandbox's egress end to end without Docker: the real relay (in this process), the
dialer and the real EgressProxy, to a server on this host's loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from protolink_sandboxd.egress_relay import EgressRelay

from protolink.net.rules import EGRESS_ADDRESS_RULES
from protolink.sandbox.egress import dialer
from protolink.sandbox.egress.events import EgressEvent
from protolink.sandbox.egress.policy import DENY_ALL, EgressPolicy
from protolink.sandbox.egress.service import EgressService

pytestmark = pytest.mark.root  # the relay binds its socket as the directory's owner (setresuid)

GUARD = 30.0
LOOPBACK = EGRESS_ADDRESS_RULES.allowing("127.0.0.0/8")


@pytest.fixture
def channel(tmp_path: Path) -> Path:
    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    return channel


@pytest.fixture
async def relay(channel: Path) -> AsyncIterator[EgressRelay]:
    relay = EgressRelay(0, str(channel / "egress.sock"), command_uid=65534)
    await relay.start()
    yield relay
    await relay.aclose()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


async def connect_through(relay: EgressRelay, target: str) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    """A CONNECT through the relay; the proxy's answer head and the open tunnel."""
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
    return head, reader, writer


async def test_a_connect_reaches_an_allowed_server_and_deny_all_closes_it(relay, channel, echo_port):
    events: list[EgressEvent] = []
    policy = EgressPolicy.parse([f"localhost:{echo_port}"], addresses=LOOPBACK)
    service = await EgressService.start(channel, policy, sandbox="box", on_event=events.append)
    try:
        head, reader, writer = await connect_through(relay, f"localhost:{echo_port}")
        assert head.startswith(b"HTTP/1.1 200 ")
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), GUARD) == b"ping"
        service.set_policy(DENY_ALL)
        assert service.policy is DENY_ALL
        assert await asyncio.wait_for(reader.read(), GUARD) == b""  # the open tunnel is closed
        writer.close()
        head, reader, writer = await connect_through(relay, f"localhost:{echo_port}")
        assert head.startswith(b"HTTP/1.1 403 ")
        writer.close()
        async with asyncio.timeout(GUARD):
            while [e.kind for e in events] != ["allowed", "closed", "denied"]:
                await asyncio.sleep(0.01)
        assert events[1].reason == "deny-all" and events[2].reason == "deny-all"
    finally:
        await service.aclose()


async def test_loopback_is_refused_unless_the_rules_allow_it(relay, channel, echo_port):
    events: list[EgressEvent] = []
    service = await EgressService.start(channel, EgressPolicy.parse([f"localhost:{echo_port}"]), sandbox="box",
                                        on_event=events.append)
    try:
        head, _, writer = await connect_through(relay, f"localhost:{echo_port}")
        writer.close()
        assert head.startswith(b"HTTP/1.1 403 ")
        assert [e.kind for e in events] == ["denied"] and "loopback" in events[0].reason
    finally:
        await service.aclose()


async def test_closing_ends_open_tunnels_and_the_standby_connections(relay, channel, echo_port):
    policy = EgressPolicy.parse([f"localhost:{echo_port}"], addresses=LOOPBACK)
    service = await EgressService.start(channel, policy, sandbox="box")
    head, reader, writer = await connect_through(relay, f"localhost:{echo_port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    await service.aclose()
    assert await asyncio.wait_for(reader.read(), GUARD) == b""
    writer.close()
    async with asyncio.timeout(GUARD):
        while relay.standby or relay.tunnels:
            await asyncio.sleep(0.01)


async def test_without_a_relay_the_service_does_not_start(channel, monkeypatch):
    monkeypatch.setattr(dialer, "START_SECONDS", 0.2)
    with pytest.raises(ConnectionError, match="egress relay does not answer"):
        await EgressService.start(channel, DENY_ALL, sandbox="box")
