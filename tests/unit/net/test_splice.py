"""One pipe fed from another inside the kernel (``pipe_to_pipe``): every byte in order and
counted, small writes as well as large; it ends at the source's end, and as soon as the sink's
reader has gone even while the source stays open and silent."""

from __future__ import annotations

import asyncio
import contextlib
import os

from protolink.net.splice import pipe_to_pipe

#: Generous bound on what takes milliseconds, for a loaded machine.
GUARD_SECONDS = 30.0


def fed(source: int, sink: int, counts: list[int]) -> asyncio.Task[None]:
    return asyncio.ensure_future(pipe_to_pipe(source, sink, pipe_bytes=1 << 20, worth_bytes=64 * 1024,
                                              pause_seconds=0.001, counted=counts.append))


async def write_all(fd: int, data: bytes, piece: int) -> None:
    """Write ``data`` to the non-blocking ``fd`` in pieces of ``piece`` bytes, waiting for room."""
    loop = asyncio.get_running_loop()
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view[:piece]):]
        except BlockingIOError:
            room = loop.create_future()
            loop.add_writer(fd, lambda: room.done() or room.set_result(None))
            try:
                await room
            finally:
                loop.remove_writer(fd)


async def read_all(fd: int) -> bytes:
    loop = asyncio.get_running_loop()
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            readable = loop.create_future()
            loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
            try:
                await readable
            finally:
                loop.remove_reader(fd)
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


async def test_every_byte_goes_on_in_order_and_counted():
    data = os.urandom(3 << 20)
    for piece in (100, 8192, 1 << 20):  # a writer of lines, of stdio buffers, of large blocks
        source_read, source_write = os.pipe2(os.O_NONBLOCK)
        sink_read, sink_write = os.pipe2(os.O_NONBLOCK)
        counts: list[int] = []
        moving = fed(source_read, sink_write, counts)
        reading = asyncio.ensure_future(read_all(sink_read))
        await write_all(source_write, data[: len(data) // (64 if piece == 100 else 1)], piece)
        os.close(source_write)
        await asyncio.wait_for(moving, GUARD_SECONDS)
        os.close(sink_write)
        received = await asyncio.wait_for(reading, GUARD_SECONDS)
        os.close(source_read)
        os.close(sink_read)
        assert received == data[: len(received)] and len(received) == sum(counts) > 0
        assert len(received) == len(data) // (64 if piece == 100 else 1)


async def test_it_ends_once_the_sinks_reader_has_gone_though_the_source_stays_open():
    source_read, source_write = os.pipe2(os.O_NONBLOCK)
    sink_read, sink_write = os.pipe2(os.O_NONBLOCK)
    counts: list[int] = []
    moving = fed(source_read, sink_write, counts)
    os.write(source_write, b"before")
    while not counts:
        await asyncio.sleep(0.01)
    os.close(sink_read)  # the client stopped reading; the command keeps its end open, silent
    await asyncio.wait_for(moving, GUARD_SECONDS)
    for fd in (source_read, source_write, sink_write):
        os.close(fd)
    assert counts == [len(b"before")]


async def test_it_ends_when_the_sinks_reader_goes_while_the_sink_is_full():
    source_read, source_write = os.pipe2(os.O_NONBLOCK)
    sink_read, sink_write = os.pipe2(os.O_NONBLOCK)
    counts: list[int] = []
    moving = fed(source_read, sink_write, counts)
    deadline = asyncio.get_running_loop().time() + GUARD_SECONDS
    while sum(counts) < 1 << 20:  # until the sink (1 MiB) is full
        assert asyncio.get_running_loop().time() < deadline, "the sink never filled"
        with contextlib.suppress(BlockingIOError):
            os.write(source_write, bytes(1 << 16))
        await asyncio.sleep(0.001)
    os.write(source_write, b"more")  # waiting in the source, for room in the sink
    await asyncio.sleep(0.01)
    assert not moving.done()
    os.close(sink_read)
    await asyncio.wait_for(moving, GUARD_SECONDS)
    for fd in (source_read, source_write, sink_write):
        os.close(fd)
