"""Two connections joined at the transport level, on real loopback sockets: what goes first,
half-close, who ends the exchange, the up limit, back-pressure, the byte budget, abort."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from protolink.net.join import EndedBy, Join
from protolink.net.network import Streams

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

    def count(data: bytes, up: bool) -> bytes:
        nonlocal left
        data = data[:left]
        left -= len(data)
        seen.append((len(data), up))
        return data

    join, client, server = await joined(pairs, ended_by="server", count=count)
    running = asyncio.ensure_future(join.run(to_server=b"\x01"))  # not counted
    client.outer[1].write(b"u" * 100)
    assert await within(server.outer[0].readexactly(101)) == b"\x01" + b"u" * 100
    payload = os.urandom(5000)
    server.outer[1].write(payload)
    server.outer[1].write_eof()
    assert await within(running) == "eof"
    await within(join.aclose(graceful=True, seconds=GUARD))
    assert await within(client.outer[0].read()) == payload[:900]
    assert sum(size for size, up in seen if up) == 100 and left == 0


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
