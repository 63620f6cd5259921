"""The egress relay on real loopback and Unix sockets: handing commands' connections over,
pairing and piping (where sockets cannot be passed), bounds, closing."""

from __future__ import annotations

import array
import asyncio
import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from protolink_sandboxd.egress_relay import HANDOVER, EgressRelay, RelayLimits, proxy_environment

pytestmark = pytest.mark.root  # the relay binds its socket as the directory's owner (setresuid)

GUARD = 30.0  # a hang, not a slow machine


async def within(awaitable):
    return await asyncio.wait_for(awaitable, GUARD)


async def started(tmp_path: Path, *, pass_descriptors: bool) -> EgressRelay:
    channel = tmp_path / "channel"
    channel.mkdir(mode=0o700)
    relay = EgressRelay(0, str(channel / "egress.sock"), command_uid=65534, pass_descriptors=pass_descriptors,
                        limits=RelayLimits(max_standby=2, max_tunnels=3, standby_seconds=GUARD))
    await relay.start()
    return relay


@pytest.fixture
async def relay(tmp_path: Path) -> AsyncIterator[EgressRelay]:
    """A relay that pipes every connection, as where the kernel cannot pass sockets (gVisor)."""
    relay = await started(tmp_path, pass_descriptors=False)
    yield relay
    await relay.aclose()


@pytest.fixture
async def handing(tmp_path: Path) -> AsyncIterator[EgressRelay]:
    """A relay that hands commands' connections over."""
    relay = await started(tmp_path, pass_descriptors=True)
    yield relay
    await relay.aclose()


async def standby(relay: EgressRelay) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A host's standby connection, once the relay holds it."""
    held = relay.standby
    stream = await asyncio.open_unix_connection(relay._socket_path)
    while relay.standby == held:
        await asyncio.sleep(0.001)
    return stream


async def command(relay: EgressRelay) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", relay.port)


async def handed_over(host: socket.socket) -> list[socket.socket]:
    """The sockets the relay hands over next on the host's standby socket ``host``."""
    while True:
        try:
            data, ancillary, _, _ = host.recvmsg(1, socket.CMSG_SPACE(8))
            break
        except BlockingIOError:
            await asyncio.sleep(0.001)
    assert data == HANDOVER and len(ancillary) == 1
    socks = [socket.socket(fileno=descriptor) for descriptor in array.array("i", ancillary[0][2])]
    for sock in socks:
        sock.setblocking(False)
    return socks


async def standby_socket(relay: EgressRelay) -> socket.socket:
    """A host's standby connection as a plain socket, once the relay holds it."""
    held = relay.standby
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(relay._socket_path)
    sock.setblocking(False)
    while relay.standby == held:
        await asyncio.sleep(0.001)
    return sock


async def test_hands_its_listeners_to_the_host_which_accepts_commands_connections_itself(handing):
    host = await standby_socket(handing)
    (listener, *_) = await within(handed_over(host))
    assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) and listener.getsockname()[1] == handing.port
    assert handing.handed_over
    loop = asyncio.get_running_loop()
    for number in range(3):
        reader, writer = await command(handing)
        connection, _ = await within(loop.sock_accept(listener))
        writer.write(b"request %d" % number)
        assert await within(loop.sock_recv(connection, 100)) == b"request %d" % number
        await loop.sock_sendall(connection, b"answer")
        connection.close()  # the relay holds no copy: the command sees the end at once
        assert await within(reader.read()) == b"answer"
        writer.close()
        assert handing.tunnels == 0 and handing.standby == 1
    listener.close()
    host.close()


async def test_once_that_host_is_gone_the_relay_accepts_and_hands_over_to_the_next(handing):
    first = await standby_socket(handing)
    old_listeners = await within(handed_over(first))
    first.close()  # the daemon that held the listeners ended
    for listener in old_listeners:
        listener.close()
    while handing.handed_over:
        await asyncio.sleep(0.001)
    streams = [await command(handing) for _ in range(2)]
    while handing.tunnels < 2:  # accepted by the relay, waiting for a standby connection
        await asyncio.sleep(0.001)
    host = await standby_socket(handing)
    connections = [(await within(handed_over(host)))[0] for _ in streams]
    assert sorted(c.getpeername() for c in connections) == sorted(w.get_extra_info("sockname") for _, w in streams)
    (listener, *_) = await within(handed_over(host))  # then the listeners
    assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    assert handing.tunnels == 0 and handing.handed_over
    for connection, (_, writer) in zip(connections, streams, strict=True):
        connection.close()
        writer.close()
    listener.close()
    host.close()


async def test_pairs_a_command_with_a_standby_connection_and_pipes_both_ways(relay):
    host_reader, host_writer = await standby(relay)
    reader, writer = await command(relay)
    assert await within(host_reader.readexactly(1)) == HANDOVER
    payload = os.urandom(8 << 20)  # more than any buffer: back-pressure both ways

    async def echo() -> None:
        while data := await host_reader.read(65536):
            host_writer.write(data)
            await host_writer.drain()
        host_writer.close()

    echoing = asyncio.ensure_future(echo())
    writer.write(payload)
    writer.write_eof()  # a half-close reaches the host; its answer still comes back
    assert await within(reader.readexactly(len(payload))) == payload
    assert await within(reader.read()) == b""  # the host closed: so is the command's side
    await within(echoing)
    writer.close()
    while relay.tunnels:
        await asyncio.sleep(0.001)


async def test_host_closing_closes_the_command_connection(relay):
    host_reader, host_writer = await standby(relay)
    reader, writer = await command(relay)
    assert await within(host_reader.readexactly(1)) == HANDOVER
    host_writer.write(b"HTTP/1.1 403 Forbidden\r\n\r\n")
    host_writer.close()
    assert await within(reader.read()) == b"HTTP/1.1 403 Forbidden\r\n\r\n"
    writer.close()


async def test_a_command_waits_for_a_standby_connection_that_comes_late(relay):
    reader, writer = await command(relay)
    await asyncio.sleep(0.05)
    host_reader, host_writer = await asyncio.open_unix_connection(relay._socket_path)
    assert await within(host_reader.readexactly(1)) == HANDOVER
    writer.write(b"ping")
    assert await within(host_reader.readexactly(4)) == b"ping"
    writer.close()
    host_writer.close()


async def test_what_a_command_sent_before_the_pairing_follows_the_handover(relay):
    reader, writer = await command(relay)
    early = os.urandom(1 << 20)  # more than its stream reads ahead: reading it was paused
    writer.write(early)
    writer.write_eof()  # and the end, before any standby connection came
    while relay.tunnels == 0:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.05)
    host_reader, host_writer = await asyncio.open_unix_connection(relay._socket_path)
    assert await within(host_reader.readexactly(1)) == HANDOVER
    assert await within(host_reader.read()) == early  # in order, then the command's half-close
    host_writer.write(b"answer")
    host_writer.close()
    assert await within(reader.read()) == b"answer"
    writer.close()


async def test_without_a_standby_connection_the_command_connection_is_closed(tmp_path):
    relay = EgressRelay(0, str(tmp_path / "egress.sock"), command_uid=65534, limits=RelayLimits(standby_seconds=0.2))
    await relay.start()
    try:
        reader, writer = await command(relay)
        assert await within(reader.read()) == b""  # after standby_seconds
        writer.close()
        assert relay.tunnels == 0
    finally:
        await relay.aclose()


async def test_a_dead_standby_connection_is_skipped(relay):
    _, dead = await standby(relay)
    dead.close()
    host_reader, host_writer = await asyncio.open_unix_connection(relay._socket_path)
    await asyncio.sleep(0.05)
    reader, writer = await command(relay)
    assert await within(host_reader.readexactly(1)) == HANDOVER
    writer.close()
    host_writer.close()


async def test_standby_connections_beyond_the_bound_are_closed(relay):
    kept = [await standby(relay) for _ in range(2)]
    extra_reader, extra_writer = await asyncio.open_unix_connection(relay._socket_path)
    assert await within(extra_reader.read()) == b""
    assert relay.standby == 2
    for _, writer in (*kept, (None, extra_writer)):
        writer.close()


async def test_tunnels_beyond_the_bound_are_closed(tmp_path):
    relay = EgressRelay(0, str(tmp_path / "egress.sock"), command_uid=65534,
                        limits=RelayLimits(max_tunnels=3, standby_seconds=GUARD))
    await relay.start()
    try:
        waiting = [await command(relay) for _ in range(3)]  # no standby connection: they wait
        while relay.tunnels < 3:
            await asyncio.sleep(0.001)
        reader, writer = await command(relay)
        assert await within(reader.read()) == b""  # closed at once, not after standby_seconds
        assert relay.tunnels == 3
        for _, held in (*waiting, (None, writer)):
            held.close()
    finally:
        await relay.aclose()


async def test_closing_ends_every_connection(relay):
    host_reader, host_writer = await standby(relay)
    reader, writer = await command(relay)
    assert await within(host_reader.readexactly(1)) == HANDOVER
    idle_reader, idle_writer = await standby(relay)
    await relay.aclose()
    for stream in (reader, host_reader, idle_reader):
        assert await within(stream.read()) == b""
    assert relay.tunnels == 0
    with pytest.raises(OSError):
        await command(relay)
    for held in (writer, host_writer, idle_writer):
        held.close()


async def test_closing_as_a_command_is_paired_ends_its_tunnel(relay):
    """Paired in the turn of the event loop before the one that closes the relay, the tunnel has
    not run yet when aclose ends the tunnels: it ends all the same, and the host is handed nothing."""
    host = await standby_socket(relay)
    command = socket.create_connection(("127.0.0.1", relay.port))  # queued now
    await asyncio.sleep(0)  # the next turn: the relay accepts it and pairs it with the standby connection
    await asyncio.sleep(0)  # the turn after: this step runs before the tunnel's first one
    async with asyncio.timeout(GUARD):
        await relay.aclose()
    loop = asyncio.get_running_loop()
    with command, host:
        command.setblocking(False)
        assert await within(loop.sock_recv(command, 1)) == b""  # accepted, then closed (not reset)
        assert await within(loop.sock_recv(host, 1)) == b""  # no HANDOVER


async def test_the_socket_is_its_owners_alone(relay):
    mode = os.stat(relay._socket_path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


async def test_a_directory_of_the_command_user_is_refused(tmp_path):
    channel = tmp_path / "theirs"
    channel.mkdir()
    os.chown(channel, 65534, 65534)
    with pytest.raises(SystemExit, match="belongs to the command user"):
        await EgressRelay(0, str(channel / "egress.sock"), command_uid=65534).start()


def test_proxy_environment():
    env = proxy_environment(3128)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        assert env[name] == env[name.lower()] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert len(env) == 8
