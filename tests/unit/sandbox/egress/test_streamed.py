"""One sandbox's egress carried through a gateway's streams, without Docker: the real relay (in
this process), a real gRPC server doing the gateway's part (a RelayDialer into the relay, each
command connection given to a waiting stream) and the service's end, whose EgressProxy decides."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from protolink_sandboxd.egress_relay import EgressRelay

from protolink.sandbox.egress import streamed
from protolink.sandbox.egress.dialer import RelayDialer
from protolink.sandbox.egress.events import EgressEvent
from protolink.sandbox.egress.policy import DENY_ALL, EgressPolicy
from protolink.sandbox.egress.service import EgressService
from tests.unit.sandbox.egress.test_service import GUARD, LOOPBACK, channel, connect_through, echo_port, relay  # noqa: F401

pytestmark = pytest.mark.root  # the relay binds its socket as the directory's owner (setresuid)


class _Gateway(grpc.GenericRpcHandler):
    """A gateway's egress part for one task: the relay dialed at the first stream."""

    def __init__(self, socket_path: Path) -> None:
        self.connections = streamed.StreamedConnections()
        self.relay = RelayDialer(socket_path, self.connections)
        self._dialed = False

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return grpc.stream_stream_rpc_method_handler(self._stand_by) if details.method == streamed.METHOD else None

    async def _stand_by(self, requests: object, context: grpc.aio.ServicerContext) -> None:
        if not self._dialed:
            self._dialed = True
            await self.relay.start()
        await self.connections.stand_by(context)


@pytest.fixture
async def gateway_channel(relay, channel: Path) -> AsyncIterator[grpc.aio.Channel]:  # noqa: F811
    gateway = _Gateway(channel / "egress.sock")
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((gateway,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield client
    await client.close()
    await server.stop(0)
    await gateway.relay.aclose()


async def test_a_tunnel_through_the_gateway_reaches_an_allowed_server_and_deny_all_closes_it(
        relay, gateway_channel, echo_port):  # noqa: F811
    events: list[EgressEvent] = []
    policy = EgressPolicy.parse([f"localhost:{echo_port}"], addresses=LOOPBACK)
    service = await EgressService.through_gateway(gateway_channel, policy, sandbox="box", on_event=events.append)
    try:
        for _ in range(6):  # more than the standby streams: each taken one is replaced
            head, reader, writer = await connect_through(relay, f"localhost:{echo_port}")
            assert head.startswith(b"HTTP/1.1 200 ")
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), GUARD) == b"ping"
            writer.close()
        head, reader, writer = await connect_through(relay, f"localhost:{echo_port}")
        writer.write(b"x" * 300_000)
        assert len(await asyncio.wait_for(reader.readexactly(300_000), GUARD)) == 300_000
        service.set_policy(DENY_ALL)
        assert await asyncio.wait_for(reader.read(), GUARD) == b""  # the open tunnel is closed
        writer.close()
        head, reader, writer = await connect_through(relay, "elsewhere.example:443")
        assert head.startswith(b"HTTP/1.1 403 ")
        writer.close()
        async with asyncio.timeout(GUARD):
            while [e.kind for e in events][-3:] != ["allowed", "closed", "denied"]:
                await asyncio.sleep(0.01)
        assert events[-2].reason == "deny-all" and events[-1].host == "elsewhere.example"
    finally:
        await service.aclose()


async def test_without_a_gateway_the_service_end_does_not_start(monkeypatch):
    monkeypatch.setattr(streamed, "START_SECONDS", 0.5)
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    try:
        with pytest.raises(ConnectionError, match="did not reach the sandbox's egress relay: UNAVAILABLE"):
            await EgressService.through_gateway(channel, DENY_ALL, sandbox="box")
    finally:
        await channel.close()


async def test_a_gateway_that_refuses_for_good_fails_the_start_at_once(monkeypatch):
    """Not after START_SECONDS (an hour here): a server without the method answers UNIMPLEMENTED."""
    monkeypatch.setattr(streamed, "START_SECONDS", 3600)
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        with pytest.raises(ConnectionError, match="UNIMPLEMENTED"):
            await EgressService.through_gateway(channel, DENY_ALL, sandbox="box")
    finally:
        await channel.close()
        await server.stop(0)
