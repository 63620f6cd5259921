"""Two sockets joined, on real loopback connections: what goes first, half-close, who ends the
exchange, the up limit, back-pressure, the byte budget, abort, and a kernel that refuses to
splice."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from protolink.net.network import Streams
from protolink.net.tunnel import EndedBy, Tunnel

from .support import pipe_ends

GUARD = 30.0  # a hang, not a slow machine
PIPE = 64 * 1024
READ_CHUNK = 256 * 1024


async def within(awaitable):
    return await asyncio.wait_for(awaitable, GUARD)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(GUARD):
        while not condition():
            await asyncio.sleep(0.001)


@dataclass
class Pair:
    """A loopback connection: ``inner`` goes into the tunnel, ``outer`` is the test's end."""

    inner: socket.socket
    outer: Streams


@pytest.fixture
async def pairs() -> AsyncIterator[Callable[[], Awaitable[Pair]]]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    made: list[Pair] = []

    async def pair() -> Pair:
        outer = await asyncio.open_connection(*listener.getsockname())
        inner, _ = await within(asyncio.get_running_loop().sock_accept(listener))
        made.append(Pair(inner, outer))
        return made[-1]

    yield pair
    for each in made:
        each.outer[1].transport.abort()
        each.inner.close()
    listener.close()


Joined = Callable[..., Awaitable[tuple[Tunnel, Pair, Pair]]]


@pytest.fixture
async def joined(pairs) -> AsyncIterator[Joined]:
    """Makes a tunnel between two new pairs (``ended_by`` and options), aborted at the end as
    its owner would."""
    made: list[Tunnel] = []

    async def join(*, ended_by: EndedBy, **options) -> tuple[Tunnel, Pair, Pair]:
        client, server = await pairs(), await pairs()
        made.append(Tunnel(client.inner, server.inner, ended_by=ended_by, pipe_bytes=PIPE, **options))
        return made[-1], client, server

    yield join
    for tunnel in made:
        tunnel.abort()


async def test_what_goes_first_then_what_the_client_sent_before(joined):
    tunnel, client, server = await joined(ended_by="server")
    await within(tunnel.open(to_server=b"\x01", to_client=b"hello ", from_client=b"body "))
    client.outer[1].write(b"rest")
    assert await within(server.outer[0].readexactly(10)) == b"\x01body rest"
    assert await within(client.outer[0].readexactly(6)) == b"hello "
    server.outer[1].close()
    assert await within(tunnel.ended()) == "eof"


async def asked(joined: Joined, ended_by: EndedBy) -> tuple[Tunnel, Pair, Pair]:
    """An open tunnel whose client asked and half-closed, and whose server answered (not ended)."""
    tunnel, client, server = await joined(ended_by=ended_by)
    await within(tunnel.open())
    client.outer[1].write(b"question")
    client.outer[1].write_eof()
    assert await within(server.outer[0].read()) == b"question"  # the half-close arrived
    server.outer[1].write(b"answer")
    return tunnel, client, server


async def test_a_tunnel_passes_half_closes_on_and_ends_when_both_directions_did(joined):
    tunnel, client, server = await asked(joined, "both")
    ending = asyncio.ensure_future(tunnel.ended())
    await asyncio.sleep(0)
    assert not ending.done()  # the server's direction is still open
    server.outer[1].write_eof()
    assert await within(client.outer[0].read()) == b"answer"
    assert await within(ending) == "eof"


async def test_the_servers_end_ends_the_exchange_and_the_clients_half_close_is_passed_on(joined):
    tunnel, client, server = await asked(joined, "server")
    server.outer[1].write_eof()
    assert await within(tunnel.ended()) == "eof"  # though the client's side was never closed
    await within(tunnel.aclose(graceful=True, seconds=GUARD))
    client.inner.shutdown(socket.SHUT_WR)  # the caller's part, once the exchange ended
    assert await within(client.outer[0].read()) == b"answer"


async def test_an_up_limit_forwards_one_body_and_not_the_clients_half_close(joined):
    tunnel, client, server = await joined(ended_by="server", up_limit=4)
    await within(tunnel.open())
    client.outer[1].write(b"bodyAND MORE")
    client.outer[1].write_eof()
    assert await within(server.outer[0].readexactly(4)) == b"body"
    server.outer[1].write(b"answer")
    server.outer[1].write_eof()
    assert await within(tunnel.ended()) == "eof"
    await within(tunnel.aclose(graceful=True, seconds=GUARD))
    client.inner.shutdown(socket.SHUT_WR)
    server.inner.shutdown(socket.SHUT_WR)
    assert await within(client.outer[0].read()) == b"answer"
    assert await within(server.outer[0].read()) == b""  # nothing past the limit went up


async def test_a_slow_reader_holds_back_the_writer_and_gets_every_byte(joined):
    tunnel, client, server = await joined(ended_by="server")
    await within(tunnel.open())
    client.outer[1].transport.pause_reading()  # the reader reads nothing for now
    payload = os.urandom(96 << 20)  # far more than the pipe and the kernel's buffers

    async def send() -> None:
        server.outer[1].write(payload)
        await server.outer[1].drain()
        server.outer[1].write_eof()

    sending = asyncio.ensure_future(send())
    down = tunnel._flows[False]
    await until(lambda: not down._reading and down._writing)  # the pipe is full, its sink too
    assert not sending.done()  # the sender waits for the reader
    client.outer[1].transport.resume_reading()
    received = bytearray()
    while len(received) < len(payload):
        received += await within(client.outer[0].read(READ_CHUNK))
    assert received == payload
    await within(sending)
    assert await within(tunnel.ended()) == "eof"


async def test_a_budget_cuts_at_its_exact_byte_both_ways_counted(joined):
    left = 1000
    seen: list[tuple[int, bool]] = []

    def count(size: int, up: bool) -> int:
        nonlocal left
        passed = min(size, left)
        left -= passed
        seen.append((passed, up))
        return passed

    tunnel, client, server = await joined(ended_by="server", count=count)
    await within(tunnel.open(to_server=b"\x01"))  # not counted
    client.outer[1].write(b"u" * 100)
    assert await within(server.outer[0].readexactly(101)) == b"\x01" + b"u" * 100
    payload = os.urandom(5000)
    server.outer[1].write(payload)
    server.outer[1].write_eof()
    assert await within(client.outer[0].readexactly(900)) == payload[:900]
    await until(lambda: left == 0)
    tunnel.abort()  # the budget's owner ends the exchange
    assert await within(tunnel.ended()) == "eof"
    client.inner.shutdown(socket.SHUT_RDWR)
    assert await within(client.outer[0].read()) == b""  # nothing past the cut
    assert sum(size for size, up in seen if up) == 100 and sum(size for size, up in seen if not up) == 900


async def test_abort_ends_the_exchange_and_drops_what_the_pipes_hold(joined):
    before = pipe_ends()
    tunnel, client, server = await joined(ended_by="both")
    await within(tunnel.open())
    client.outer[1].write(b"x")
    assert await within(server.outer[0].readexactly(1)) == b"x"
    tunnel.abort()
    assert await within(tunnel.ended()) == "eof"
    assert not tunnel.spliced and pipe_ends() == before
    await within(tunnel.aclose(graceful=True, seconds=GUARD))  # closing again is harmless


async def exchange(joined: Joined, up_size: int, down_size: int) -> tuple[bool, list[int]]:
    """A tunnel carrying random bytes both ways at once, each side half-closing after its own:
    both arrive whole and in order, each side sees the other's EOF, and the count saw every
    byte. Whether the tunnel was spliced at the end, and the pipe ends this process held once it
    was spliced (if it was)."""
    counted = {True: 0, False: 0}

    def count(size: int, up: bool) -> int:
        counted[up] += size
        return size

    before = pipe_ends()
    tunnel, client, server = await joined(ended_by="both", count=count)
    up, down = os.urandom(up_size), os.urandom(down_size)
    await within(tunnel.open())
    spliced = [pipe_ends() - before] if tunnel.spliced else []

    async def send(writer: asyncio.StreamWriter, payload: bytes) -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    sending = asyncio.gather(send(client.outer[1], up), send(server.outer[1], down))
    got_up, got_down = await within(asyncio.gather(server.outer[0].read(), client.outer[0].read()))
    await within(sending)
    assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest() and len(got_up) == len(up)
    assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest() and len(got_down) == len(down)
    assert await within(tunnel.ended()) == "eof"
    assert counted == {True: len(up), False: len(down)}
    spliced_at_end = tunnel.spliced
    await within(tunnel.aclose(graceful=True, seconds=GUARD))
    assert not tunnel.spliced and pipe_ends() == before  # nothing left open
    return spliced_at_end, spliced


async def test_a_large_exchange_moves_in_the_kernel_whole_counted_and_half_closed(joined):
    spliced_at_end, spliced = await exchange(joined, 24 << 20, 40 << 20)
    assert spliced_at_end and spliced == [4]  # one pipe a direction (two ends each) while it ran


@pytest.mark.parametrize("refused", ["reading", "writing"])
async def test_a_kernel_that_refuses_to_splice_leaves_the_tunnel_to_copying(joined, monkeypatch, refused):
    """Some kernels refuse splice(2) between some descriptors (EINVAL); here os.splice is made
    to refuse, on its first read from a socket or its first write to one, bytes in the pipe."""
    real = os.splice
    refusals = []

    def refusing(source: int, sink: int, count: int, **flags) -> int:
        into_pipe = os.readlink(f"/proc/self/fd/{sink}").startswith("pipe:")
        if into_pipe == (refused == "reading"):
            refusals.append(count)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(source, sink, count, **flags)

    monkeypatch.setattr(os, "splice", refusing)
    spliced_at_end, _ = await exchange(joined, 3 << 20, 5 << 20)
    assert refusals and not spliced_at_end


TCP_CLOSE = 7  # linux/tcp_states.h: a connection reset by its peer


def tcp_state(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


async def test_a_client_that_closed_first_ends_the_exchange_without_an_error(joined):
    # As pip ends a connection: it closes it whole; the server answers the half-close with a last
    # message (TLS's close_notify), which the client's kernel answers with a reset; then it ends.
    tunnel, client, server = await joined(ended_by="both")
    await within(tunnel.open())
    client.outer[1].transport.close()
    assert await within(server.outer[0].read()) == b""  # the client's end, passed on
    server.outer[1].write(b"last words")
    await until(lambda: tcp_state(client.inner) == TCP_CLOSE)
    server.outer[1].write_eof()
    assert await within(tunnel.ended()) == "eof"
