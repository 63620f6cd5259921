"""OutputPipes: every kept byte reaches the sink once, in order; a sink that falls behind holds
the writer back instead of growing memory; bytes past the cap never hold it back."""

from __future__ import annotations

import array
import asyncio
import fcntl
import os
import random
import termios
import threading

from protolink.execution.output import OutputCap
from protolink.execution import output_pipes
from protolink.execution.output_pipes import HEADROOM_BYTES, PENDING_BYTES, PIECE_BYTES, READ_CHUNK_BYTES, OutputPipes


class Sink:
    """Keeps what it is fed; while ``held``, its next feed waits until released."""

    def __init__(self) -> None:
        self.fed: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
        self.pieces = 0
        self.held = asyncio.Event()
        self.held.set()
        self.waiting = asyncio.Event()

    async def feed(self, channel: str, data: memoryview) -> None:
        self.waiting.set()
        await self.held.wait()
        # The data lies HEADROOM_BYTES into a buffer of its own, where a sink may put a header.
        assert bytes(memoryview(data.obj)[HEADROOM_BYTES : HEADROOM_BYTES + len(data)]) == data
        self.fed[channel] += data
        self.pieces += 1


class Writer(threading.Thread):
    """Writes ``data`` to ``fd`` in chunks of random sizes with blocking writes, then closes it."""

    def __init__(self, fd: int, data: bytes, seed: int) -> None:
        super().__init__(daemon=True)
        self.fd, self.data, self.written = fd, data, 0
        self._random = random.Random(seed)

    def run(self) -> None:
        while self.written < len(self.data):
            size = self._random.choice([1, 100, 4096, 8192, 65536, 300_000])
            self.written += os.write(self.fd, self.data[self.written:self.written + size])
        os.close(self.fd)


def waiting_in(fd: int) -> int:
    count = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, count)
    return count[0]


def filled(fd: int) -> bool:
    """The pipe is (about) full: its last page may stay partly empty."""
    return waiting_in(fd) >= fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ) - READ_CHUNK_BYTES


async def until(condition, seconds: float = 30.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_every_byte_reaches_the_sink_once_in_order_whatever_the_writes():
    (out, out_w), (err, err_w) = os.pipe(), os.pipe()
    stdout, stderr = os.urandom(3_000_000), os.urandom(1_000_000)
    sink = Sink()
    pipes = OutputPipes({out: "stdout", err: "stderr"}, OutputCap(10**9), sink)
    writers = [Writer(out_w, stdout, 1), Writer(err_w, stderr, 2)]
    for writer in writers:
        writer.start()
    await asyncio.wait_for(pipes.closed, 30)
    pipes.close()
    await asyncio.wait_for(pipes.delivered(), 30)
    assert sink.fed == {"stdout": stdout, "stderr": stderr}
    assert not pipes.cap.truncated


class Held:
    """OutputPipes over one stdout pipe that a Writer fills with ``data``, feeding a Sink that
    takes nothing until :meth:`release`."""

    def __init__(self, data: bytes, cap: int) -> None:
        self.out, write = os.pipe()
        self.sink = Sink()
        self.sink.held.clear()
        self.pipes = OutputPipes({self.out: "stdout"}, OutputCap(cap), self.sink)
        self.writer = Writer(write, data, len(data))
        self.writer.start()

    async def release(self) -> bytes:
        """Let the sink take everything; what it was fed."""
        self.sink.held.set()
        await asyncio.wait_for(self.pipes.closed, 30)
        self.pipes.close()
        await asyncio.wait_for(self.pipes.delivered(), 30)
        return bytes(self.sink.fed["stdout"])


async def test_a_sink_that_falls_behind_holds_the_writer_back_and_loses_nothing():
    data = os.urandom(24 << 20)
    held = Held(data, 10**9)
    await until(lambda: filled(held.out))  # nobody reads it
    read = held.writer.written - waiting_in(held.out)
    assert read <= PIECE_BYTES + PENDING_BYTES + READ_CHUNK_BYTES  # one piece in the sink's hands, the rest waiting
    assert held.writer.is_alive()
    assert await held.release() == data


async def test_bytes_past_the_cap_never_hold_the_writer_back():
    held = Held(b"x" * (64 << 20), 65536)  # the cap is far below what may wait for the sink
    await asyncio.wait_for(held.pipes.closed, 60)  # the writer wrote everything and closed its end
    assert held.writer.written == 64 << 20 and held.pipes.cap.truncated
    assert await held.release() == b"x" * 65536


async def test_after_the_process_ends_what_is_left_is_read_even_while_the_sink_is_behind():
    data = os.urandom(8 << 20)
    held = Held(data, 10**9)
    await until(lambda: filled(held.out))
    held.pipes.drain()
    await asyncio.wait_for(held.pipes.closed, 30)  # read to the end although the sink has taken nothing
    assert held.sink.pieces == 0
    assert await held.release() == data


async def test_closing_stops_the_reading_and_closes_the_pipes():
    out, out_w = os.pipe()
    sink = Sink()
    pipes = OutputPipes({out: "stdout"}, OutputCap(100), sink)
    os.write(out_w, b"early")
    await until(lambda: bytes(sink.fed["stdout"]) == b"early")
    pipes.close()
    await asyncio.wait_for(pipes.delivered(), 5)
    try:
        os.write(out_w, b"late")
    except BrokenPipeError:
        pass
    else:
        raise AssertionError("the read end is still open")
    finally:
        os.close(out_w)
    assert bytes(sink.fed["stdout"]) == b"early"


async def test_a_few_bytes_wait_for_the_read_after_the_pause_and_go_out_with_what_came_meanwhile(monkeypatch):
    monkeypatch.setattr(output_pipes, "READ_INTERVAL_SECONDS", 60.0)  # the pause outlasts the test
    out, out_w = os.pipe()
    sink = Sink()
    pipes = OutputPipes({out: "stdout"}, OutputCap(10**9), sink)
    os.write(out_w, b"a" * 4096)  # a command's first write: the reader wakes for it
    await until(lambda: waiting_in(out) == 0)
    for _ in range(10):
        await asyncio.sleep(0)
    assert sink.pieces == 0  # not a piece of its own
    os.write(out_w, b"b" * READ_CHUNK_BYTES)  # written during the pause
    os.close(out_w)
    pipes.drain()
    await asyncio.wait_for(pipes.closed, 30)
    pipes.close()
    await asyncio.wait_for(pipes.delivered(), 30)
    assert sink.pieces == 1 and bytes(sink.fed["stdout"]) == b"a" * 4096 + b"b" * READ_CHUNK_BYTES


async def test_a_little_output_takes_no_whole_piece_and_a_lot_grows_into_one_intact(monkeypatch):
    spares: list[bytearray] = []
    monkeypatch.setattr(output_pipes, "_spares", spares)
    out, out_w = os.pipe()
    sink = Sink()
    pipes = OutputPipes({out: "stdout"}, OutputCap(10**9), sink)
    os.write(out_w, b"hello\n")
    await until(lambda: bytes(sink.fed["stdout"]) == b"hello\n")
    assert not spares  # its buffer was a small one, not kept
    data = os.urandom(3 * PIECE_BYTES)
    writer = Writer(out_w, data, 3)
    writer.start()
    await asyncio.wait_for(pipes.closed, 30)
    pipes.close()
    await asyncio.wait_for(pipes.delivered(), 30)
    assert bytes(sink.fed["stdout"]) == b"hello\n" + data
    assert spares and all(len(spare) == HEADROOM_BYTES + PIECE_BYTES for spare in spares)


async def test_bytes_read_after_the_cap_is_full_mark_the_output_truncated():
    out, out_w = os.pipe()
    sink = Sink()
    pipes = OutputPipes({out: "stdout"}, OutputCap(100), sink)
    os.write(out_w, b"a" * 100)  # exactly the cap
    await until(lambda: bytes(sink.fed["stdout"]) == b"a" * 100)
    assert not pipes.cap.truncated
    os.write(out_w, b"b")
    os.close(out_w)
    await asyncio.wait_for(pipes.closed, 30)
    pipes.close()
    await asyncio.wait_for(pipes.delivered(), 30)
    assert pipes.cap.truncated and bytes(sink.fed["stdout"]) == b"a" * 100
