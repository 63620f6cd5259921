"""Two connections joined at the transport level, on real loopback sockets: what goes first,
half-close, who ends the exchange, the up limit, back-pressure, the byte budget, abort."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from protolink.net.join import EndedBy, Join
from protolink.net.network import Streams

from .support import pipe_ends

GUARD = 30.0  # a hang, not a slow machine
BUFFER = 64 * 1024
READ_CHUNK = 256 * 1024  # the most a selector transport reads at once


async def within(awaitable):
    return await asyncio.wait_for(awaitable, GUARD)


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(GUARD):
        while not condition():
            await asyncio.sleep(0.001)


@dataclass
class Pair:
    """A loopback connection: ``inner`` goes into the join, ``outer`` is the test's end."""

    inner: Streams
    outer: Streams


@pytest.fixture
async def pairs() -> AsyncIterator[Callable[[], Awaitable[Pair]]]:
    accepted: asyncio.Queue[Streams] = asyncio.Queue()
    writers: list[asyncio.StreamWriter] = []

    async def arrived(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accepted.put((reader, writer))

    server = await asyncio.start_server(arrived, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def pair() -> Pair:
        outer = await asyncio.open_connection("127.0.0.1", port)
        inner = await within(accepted.get())
        writers.extend((outer[1], inner[1]))
        return Pair(inner, outer)

    yield pair
    for writer in writers:
        writer.transport.abort()
    server.close()
    await server.wait_closed()


async def joined(pairs, *, ended_by: EndedBy, **options) -> tuple[Join, Pair, Pair]:
    client, server = await pairs(), await pairs()
    return Join(client.inner, server.inner, ended_by=ended_by, write_buffer_bytes=BUFFER, **options), client, server


async def test_what_goes_first_then_what_was_read_ahead(pairs):
    join, client, server = await joined(pairs, ended_by="server")
    client.outer[1].write(b"HEAD rest")
    assert await within(client.inner[0].readexactly(5)) == b"HEAD "  # the caller's own reading
    await until(lambda: len(client.inner[0]._buffer) == 4)  # "rest" read ahead by the stream
    running = asyncio.ensure_future(join.run(to_server=b"\x01", to_client=b"hello ", from_client=b"body "))
    assert await within(server.outer[0].readexactly(10)) == b"\x01body rest"
    assert await within(client.outer[0].readexactly(6)) == b"hello "
    server.outer[1].close()
    assert await within(running) == "eof"


async def asked(pairs, ended_by: EndedBy) -> tuple[Join, asyncio.Future[str], Pair, Pair]:
    """A running join whose client asked and half-closed, and whose server answered (not ended)."""
    join, client, server = await joined(pairs, ended_by=ended_by)
    running = asyncio.ensure_future(join.run())
    client.outer[1].write(b"question")
    client.outer[1].write_eof()
    assert await within(server.outer[0].read()) == b"question"  # the half-close arrived
    server.outer[1].write(b"answer")
    return join, running, client, server


async def test_a_tunnel_passes_half_closes_on_and_ends_when_both_directions_did(pairs):
    join, running, client, server = await asked(pairs, "both")
    await asyncio.sleep(0)
    assert not running.done()  # the server's direction is still open
    server.outer[1].write_eof()
    assert await within(client.outer[0].read()) == b"answer"
    assert await within(running) == "eof"


async def test_the_servers_end_ends_the_exchange_and_the_clients_half_close_is_passed_on(pairs):
    join, running, client, server = await asked(pairs, "server")
    server.outer[1].write_eof()
    assert await within(running) == "eof"  # though the client's side was never closed
    await within(join.aclose(graceful=True, seconds=GUARD))
    assert await within(client.outer[0].read()) == b"answer"


async def test_an_up_limit_forwards_one_body_and_not_the_clients_half_close(pairs):
    join, client, server = await joined(pairs, ended_by="server", up_limit=4)
    running = asyncio.ensure_future(join.run())
    client.outer[1].write(b"bodyAND MORE")
    client.outer[1].write_eof()
    assert await within(server.outer[0].readexactly(4)) == b"body"
    server.outer[1].write(b"answer")
    server.outer[1].write_eof()
    assert await within(running) == "eof"
    await within(join.aclose(graceful=True, seconds=GUARD))
    assert await within(client.outer[0].read()) == b"answer"
    assert await within(server.outer[0].read()) == b""  # nothing past the limit went up


async def test_a_slow_reader_holds_back_the_writer_and_gets_every_byte(pairs):
    join, client, server = await joined(pairs, ended_by="server")
    running = asyncio.ensure_future(join.run())
    payload = os.urandom(32 << 20)  # far more than the buffer and the kernel's

    async def send() -> None:
        server.outer[1].write(payload)
        await server.outer[1].drain()
        server.outer[1].write_eof()

    sending = asyncio.ensure_future(send())
    await until(lambda: not server.inner[1].transport.is_reading())  # the client's buffer is full
    assert client.inner[1].transport.get_write_buffer_size() <= BUFFER + READ_CHUNK
    assert not sending.done()  # the sender waits for the reader
    received = bytearray()
    while len(received) < len(payload):
        received += await within(client.outer[0].read(READ_CHUNK))
        await asyncio.sleep(0)  # slowly
    assert received == payload
    await within(sending)
    assert await within(running) == "eof"


async def test_a_budget_cuts_at_its_exact_byte_both_ways_counted(pairs):
    left = 1000
    seen: list[tuple[int, bool]] = []

    def count(size: int, up: bool) -> int:
        nonlocal left
        passed = min(size, left)
        left -= passed
        seen.append((passed, up))
        return passed

    join, client, server = await joined(pairs, ended_by="server", count=count)
    running = asyncio.ensure_future(join.run(to_server=b"\x01"))  # not counted
    client.outer[1].write(b"u" * 100)
    assert await within(server.outer[0].readexactly(101)) == b"\x01" + b"u" * 100
    payload = os.urandom(5000)
    server.outer[1].write(payload)
    server.outer[1].write_eof()
    assert await within(client.outer[0].readexactly(900)) == payload[:900]
    await until(lambda: left == 0)
    join.abort()  # the budget's owner ends the exchange
    assert await within(running) == "eof"
    assert await within(client.outer[0].read()) == b""  # nothing past the cut
    assert sum(size for size, up in seen if up) == 100 and sum(size for size, up in seen if not up) == 900


async def test_abort_ends_the_exchange_and_both_connections_at_once(pairs):
    join, client, server = await joined(pairs, ended_by="both")
    running = asyncio.ensure_future(join.run())
    client.outer[1].write(b"x")
    assert await within(server.outer[0].readexactly(1)) == b"x"
    join.abort()
    assert await within(running) == "eof"
    for pair in (client, server):
        try:
            assert await within(pair.outer[0].read()) == b""
        except ConnectionResetError:
            pass  # an abort may reset: the end either way
    await within(join.aclose(graceful=True, seconds=GUARD))  # closing again is harmless


async def exchange(pairs, up_size: int, down_size: int) -> tuple[bool, list[int]]:
    """A tunnel carrying random bytes both ways at once, each side half-closing after its own:
    both arrive whole and in order, each side sees the other's EOF, and the count saw every
    byte. Whether the join was spliced at the end, and the pipe ends this process held once it
    was spliced (if it was)."""
    counted = {True: 0, False: 0}

    def count(size: int, up: bool) -> int:
        counted[up] += size
        return size

    before = pipe_ends()
    join, client, server = await joined(pairs, ended_by="both", count=count)
    up, down = os.urandom(up_size), os.urandom(down_size)
    running = asyncio.ensure_future(join.run())
    spliced: list[int] = []
    watching = asyncio.ensure_future(until(lambda: join.spliced and not spliced.append(pipe_ends() - before)))

    async def send(writer: asyncio.StreamWriter, payload: bytes) -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    sending = asyncio.gather(send(client.outer[1], up), send(server.outer[1], down))
    got_up, got_down = await within(asyncio.gather(server.outer[0].read(), client.outer[0].read()))
    await within(sending)
    assert hashlib.sha256(got_up).digest() == hashlib.sha256(up).digest() and len(got_up) == len(up)
    assert hashlib.sha256(got_down).digest() == hashlib.sha256(down).digest() and len(got_down) == len(down)
    assert await within(running) == "eof"
    assert counted == {True: len(up), False: len(down)}
    watching.cancel()
    spliced_at_end = join.spliced
    await within(join.aclose(graceful=True, seconds=GUARD))
    assert not join.spliced and pipe_ends() == before  # nothing left open
    return spliced_at_end, spliced


async def test_a_large_exchange_moves_in_the_kernel_whole_counted_and_half_closed(pairs):
    spliced_at_end, spliced = await exchange(pairs, 24 << 20, 40 << 20)
    assert spliced_at_end and spliced == [4]  # one pipe a direction (two ends each) while it ran


@pytest.mark.parametrize("refused", ["reading", "writing"])
async def test_a_kernel_that_refuses_to_splice_leaves_the_join_to_the_transports(pairs, monkeypatch, refused):
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
    spliced_at_end, _ = await exchange(pairs, 3 << 20, 5 << 20)
    assert refusals and not spliced_at_end
