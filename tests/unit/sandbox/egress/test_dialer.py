"""The host's dialer against the real relay (in this process, on real sockets), serving commands'
connections with a trivial handler: standby connections kept, replaced, retried and closed; and
with the proxy, a large tunnel through both hops."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from protolink_sandboxd.egress_relay import EgressRelay, RelayLimits

from protolink.sandbox.egress import dialer as dialer_module
from protolink.sandbox.egress.dialer import RelayDialer
from protolink.sandbox.egress.events import EgressEvent
from protolink.sandbox.egress.policy import EgressPolicy
from protolink.sandbox.egress.proxy import EgressProxy

from .support import Origin, ScriptedNetwork

pytestmark = pytest.mark.root  # the relay binds its socket as the directory's owner (setresuid)

GUARD = 30.0  # a hang, not a slow machine


class Echo:
    """Answers every connection with what it sends, then closes it; or fails when told."""

    def __init__(self) -> None:
        self.served = 0
        self.fail = False

    async def handle(self, sock: socket.socket) -> None:
        self.served += 1
        if self.fail:
            raise RuntimeError("a broken handler")
        loop = asyncio.get_running_loop()
        try:
            while data := await loop.sock_recv(sock, 65536):
                await loop.sock_sendall(sock, data)
        finally:
            sock.close()


async def until(condition, what: str) -> None:
    async with asyncio.timeout(GUARD):
        while not condition():
            await asyncio.sleep(0.002)


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    return channel / "egress.sock"


@pytest.fixture(params=[True, False], ids=["sockets passed", "piped"])
async def relay(socket_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[EgressRelay]:
    """A relay that passes sockets to the host, and one that pipes (as under gVisor)."""
    relay = EgressRelay(0, str(socket_path), command_uid=65534, limits=RelayLimits(standby_seconds=GUARD),
                        pass_descriptors=request.param)
    await relay.start()
    yield relay
    await relay.aclose()


async def echo_through(relay: EgressRelay, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    try:
        writer.write(payload)
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), GUARD)
    finally:
        writer.close()


async def test_commands_connections_reach_the_handler_and_standby_connections_are_replaced(relay, socket_path):
    handler = Echo()
    dialer = RelayDialer(socket_path, handler, standby=3)
    await dialer.start()
    try:
        await until(lambda: relay.standby == 3, "the relay holds the standby connections")
        payload = bytes(range(256)) * 8192  # 2 MiB
        assert await echo_through(relay, payload) == payload
        answers = await asyncio.gather(*(echo_through(relay, b"%d" % n) for n in range(50)))
        assert answers == [b"%d" % n for n in range(50)]
        assert handler.served == 51
        await until(lambda: relay.standby == 3, "the standby connections replaced")
    finally:
        await dialer.aclose()


async def test_a_failing_handler_ends_its_connection_only(relay, socket_path):
    handler = Echo()
    dialer = RelayDialer(socket_path, handler, standby=1)
    await dialer.start()
    try:
        handler.fail = True
        try:  # the handed-over connection ends: closed with its input unread, it may be reset
            assert await echo_through(relay, b"lost") == b""
        except ConnectionResetError:
            pass
        handler.fail = False
        assert await echo_through(relay, b"next") == b"next"
    finally:
        await dialer.aclose()


async def test_closing_ends_standby_and_served_connections(relay, socket_path):
    dialer = RelayDialer(socket_path, Echo(), standby=2)
    await dialer.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"held open")
    assert await asyncio.wait_for(reader.readexactly(9), GUARD) == b"held open"
    assert dialer.handling == 1
    await dialer.aclose()
    assert dialer.handling == 0
    assert await asyncio.wait_for(reader.read(), GUARD) == b""
    writer.close()
    await until(lambda: relay.standby == 0, "the relay sees the standby connections end")


async def test_connections_accepted_as_the_dialer_closes_are_closed(socket_path):
    """Accepted in the turn of the event loop before the one that closes the dialer, their tasks
    are canceled before they ran: once aclose returns, the commands see their connections ended
    all the same (not later, when the collector finds the sockets)."""
    relay = EgressRelay(0, str(socket_path), command_uid=65534, pass_descriptors=True)
    await relay.start()
    handler = Echo()
    dialer = RelayDialer(socket_path, handler, standby=1)
    try:
        await dialer.start()
        await until(lambda: relay.handed_over, "the dialer holds the listeners")
        assert await echo_through(relay, b"accepting") == b"accepting"
        commands = [socket.create_connection(("127.0.0.1", relay.port)) for _ in range(2)]  # both queued now
        await asyncio.sleep(0)  # the next turn: the dialer accepts both and makes their tasks
        await asyncio.sleep(0)  # the turn after: this step runs before their first ones
        await dialer.aclose()
        assert handler.served == 1  # neither task ran
        for command in commands:
            with command:
                command.setblocking(False)
                assert command.recv(1) == b""
    finally:
        await dialer.aclose()
        await relay.aclose()


async def test_the_dialer_dials_again_when_the_relay_comes_back(socket_path):
    first = EgressRelay(0, str(socket_path), command_uid=65534)
    await first.start()
    dialer = RelayDialer(socket_path, Echo(), standby=2)
    await dialer.start()
    try:
        await until(lambda: first.standby == 2, "the first relay holds the standby connections")
        await first.aclose()  # the server stopped: its standby connections end
        second = EgressRelay(0, str(socket_path), command_uid=65534)
        await second.start()
        try:
            await until(lambda: second.standby == 2, "the dialer dials the new relay")
            assert await echo_through(second, b"again") == b"again"
        finally:
            await second.aclose()
    finally:
        await dialer.aclose()


async def test_start_fails_when_the_relay_does_not_answer(socket_path, monkeypatch):
    monkeypatch.setattr(dialer_module, "START_SECONDS", 0.2)
    with pytest.raises(ConnectionError, match="egress relay does not answer"):
        await RelayDialer(socket_path, Echo()).start()


def test_a_dialer_keeps_at_least_one_standby_connection(socket_path):
    with pytest.raises(ValueError, match="standby"):
        RelayDialer(socket_path, Echo(), standby=0)


async def test_a_large_tunnel_through_both_hops_arrives_whole_and_counted_exactly(relay, socket_path):
    """command -> relay -> dialer -> EgressProxy -> an echoing origin and back: 48 MiB each way,
    half-closed by the command, byte for byte, and the proxy's closed event counts every byte."""
    events: list[EgressEvent] = []
    async with Origin() as origin:
        network = ScriptedNetwork(origin.port, {"files.example": [["151.101.0.223"]]})
        proxy = EgressProxy(EgressPolicy.parse(["files.example"]), sandbox="test", on_event=events.append,
                            network=network)
        dialer = RelayDialer(socket_path, proxy, standby=1)
        await dialer.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
            writer.write(b"CONNECT files.example:443 HTTP/1.1\r\n\r\n")
            assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)).startswith(b"HTTP/1.1 200")
            payload = os.urandom(48 << 20)

            async def send() -> None:
                writer.write(payload)
                await writer.drain()
                writer.write_eof()  # the half-close goes through both hops to the origin

            sending = asyncio.ensure_future(send())
            echoed = await asyncio.wait_for(reader.read(), GUARD)  # the origin's EOF comes back too
            await asyncio.wait_for(sending, GUARD)
            writer.close()
            assert len(echoed) == len(payload) and hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
            await until(lambda: any(event.kind == "closed" for event in events), "the closed event")
            closed = events[-1]
            assert (closed.reason, closed.bytes_up, closed.bytes_down) == ("eof", len(payload), len(payload))
            assert proxy.bytes_relayed == 2 * len(payload)
        finally:
            await dialer.aclose()
            await proxy.aclose()


async def test_a_command_that_connects_before_the_host_dials_in_is_served(relay, socket_path):
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"early")
    writer.write_eof()
    await until(lambda: relay.tunnels == 1, "the relay holds the command's connection")
    dialer = RelayDialer(socket_path, Echo(), standby=1)
    await dialer.start()
    try:
        assert await asyncio.wait_for(reader.read(), GUARD) == b"early"
        writer.close()
        assert await echo_through(relay, b"later") == b"later"
    finally:
        await dialer.aclose()
