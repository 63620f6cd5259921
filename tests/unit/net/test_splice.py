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


async def ready(fd: int, writable: bool) -> None:
    loop = asyncio.get_running_loop()
    watch, unwatch = (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    done = loop.create_future()
    watch(fd, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        unwatch(fd)


async def write_all(fd: int, data: bytes, piece: int) -> None:
    """Write ``data`` to the non-blocking ``fd`` in pieces of ``piece`` bytes, waiting for room."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view[:piece]):]
        except BlockingIOError:
            await ready(fd, writable=True)


async def read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except BlockingIOError:
            await ready(fd, writable=False)
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


async def test_every_byte_goes_on_in_order_and_counted():
    data = os.urandom(3 << 20)
    for piece, size in ((100, 48 * 1024), (8192, len(data)), (1 << 20, len(data))):  # lines, stdio buffers, blocks
        source_read, source_write = os.pipe2(os.O_NONBLOCK)
        sink_read, sink_write = os.pipe2(os.O_NONBLOCK)
        counts: list[int] = []
        moving = fed(source_read, sink_write, counts)
        reading = asyncio.ensure_future(read_all(sink_read))
        await write_all(source_write, data[:size], piece)
        os.close(source_write)
        await asyncio.wait_for(moving, GUARD_SECONDS)
        os.close(sink_write)
        received = await asyncio.wait_for(reading, GUARD_SECONDS)
        os.close(source_read)
        os.close(sink_read)
        assert received == data[:size] and sum(counts) == size


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
