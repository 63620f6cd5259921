"""A process's stdout and stderr pipes, read on the event loop, kept within the cap and handed
to an :class:`~protolink.execution.output.OutputSink` in pieces.

Reading is paced, because a reader woken for every write costs more than the data (a command
writing 8 KiB at a time woke the sandbox server some 10,000 times per 100 MB):

- the pipes are read as soon as they are readable, each time until they are empty, as long as
  that finds something worth the wakeup (:data:`READ_CHUNK_BYTES` or more, or a full pipe);
- a read that finds less (a command writing a line or 8 KiB at a time, the reader woken for
  each write) is followed by a pause of :data:`READ_INTERVAL_SECONDS`, so that the next read
  finds the writes of that time together; what it found waits for that read too, so that the
  sink gets one piece instead of a few bytes and then the rest (a command writing fast wakes
  the reader with its first write after each read);
- a pipe found full is enlarged once to :data:`PIPE_BYTES`, so that a pause rarely makes the
  command wait;
- bytes past the cap are dropped as they are read, so a flood is drained at full speed;
- kept bytes wait for the sink in order, read straight into pieces of up to
  :data:`PIECE_BYTES` of one channel (what arrives while the sink is busy is read onto the end
  of the last piece, as much as the piece has room for at once); while more than
  :data:`PENDING_BYTES` wait, the pipes are not read at all: the command waits to write, as it
  would for a slow terminal, and memory stays bounded;
- once the process has ended (:meth:`OutputPipes.drain`), what is left is read as soon as it is
  there, without pauses, until the pipes reach their end or are closed.

A piece lives in a buffer of its own that leaves :data:`HEADROOM_BYTES` free in front of the
data: the sink is fed a view of the data (``data.obj`` is the buffer, the data starts
:data:`HEADROOM_BYTES` into it), and may write a header in that room to send the two as one
object, with no copy to join them. The view is the sink's until its ``feed`` returns; the
buffer is then used again (a few are kept for the next pieces and processes, so a piece costs
no allocation).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections import deque
from collections.abc import Mapping

from .output import Channel, OutputCap, OutputSink

#: The most read from a pipe in one call.
READ_CHUNK_BYTES = 64 * 1024
#: The pause after a read that found little (the event loop's timers are as coarse as 1 ms).
READ_INTERVAL_SECONDS = 0.001
#: What a pipe found full is enlarged to (Linux lets any user go up to 1 MiB).
PIPE_BYTES = 1024 * 1024
#: The most kept output handed to the sink at once.
PIECE_BYTES = 1024 * 1024
#: Kept output waiting for the sink beyond which the pipes are not read until it catches up.
PENDING_BYTES = 2 * PIECE_BYTES
#: The room left free in front of each piece's data, for a header the sink puts there.
HEADROOM_BYTES = 64
#: Piece buffers kept for reuse once fed (one per piece waiting or being fed, at most).
SPARE_BUFFERS = PENDING_BYTES // PIECE_BYTES + 1

_spares: list[bytearray] = []
_dropped: list[memoryview] = []  # where bytes past the cap are read, made when first needed


class _Piece:
    """Kept bytes of one channel waiting for the sink, in a buffer of their own: a spare whole
    one when there is one, else one of READ_CHUNK_BYTES, replaced by a whole one once full (so
    that many processes writing a little at once do not each take a mebibyte)."""

    __slots__ = ("channel", "buffer", "size")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.buffer = _spare(HEADROOM_BYTES + READ_CHUNK_BYTES)
        self.size = 0

    def room(self) -> memoryview:
        """The buffer after the data: where the channel's next bytes are read."""
        if HEADROOM_BYTES + self.size == len(self.buffer) < HEADROOM_BYTES + PIECE_BYTES:
            whole = _spare(HEADROOM_BYTES + PIECE_BYTES)
            whole[: len(self.buffer)] = self.buffer
            self.buffer = whole
        return memoryview(self.buffer)[HEADROOM_BYTES + self.size :]

    def data(self) -> memoryview:
        return memoryview(self.buffer)[HEADROOM_BYTES : HEADROOM_BYTES + self.size]

    def release(self) -> None:
        """The piece has been fed: a whole buffer serves another."""
        if len(self.buffer) == HEADROOM_BYTES + PIECE_BYTES and len(_spares) < SPARE_BUFFERS:
            _spares.append(self.buffer)


class OutputPipes:
    """The read ends of a process's stdout and stderr (``pipes``: descriptor -> channel), read as
    the module says, what is kept fed to ``sink``; ``closed`` completes once both pipes have
    reached their end (at once when there are none). Feeding runs in a task of its own, started with the first kept output."""

    def __init__(self, pipes: Mapping[int, Channel], cap: OutputCap, sink: OutputSink) -> None:
        self.cap = cap
        self._sink = sink
        self._delivery: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._pipes = dict(pipes)
        self._sizes: dict[int, int] = {}  # asked for when first needed: most commands never need it
        self._enlarged: set[int] = set()
        self._pending: deque[_Piece] = deque()
        self._pending_bytes = 0
        self._watching = False
        self._paused = False
        self._draining = False
        self._finished = False
        self._timer: asyncio.TimerHandle | None = None
        self._wakeup: asyncio.Future[None] | None = None
        for fd in self._pipes:
            os.set_blocking(fd, False)
        if not self._pipes:
            self.closed.set_result(None)
        self._watch()

    def drain(self) -> None:
        """The process has ended: read what is there now, and the rest as soon as it comes."""
        self._draining = True
        self._paused = False
        self._read_all()

    def close(self) -> None:
        """Read no more and close the pipes still open; feeding ends once nothing waits."""
        self._unwatch()
        for fd in list(self._pipes):
            self._close_pipe(fd)
        self._finished = True
        self._wake()

    async def delivered(self) -> None:
        """Wait until everything kept has been fed (after :meth:`close`); raises what the sink raised."""
        if self._delivery is not None:
            await self._delivery

    async def abandon(self) -> None:
        """Feed nothing more (the process was canceled)."""
        if self._delivery is not None:
            self._delivery.cancel()
            await asyncio.gather(self._delivery, return_exceptions=True)

    async def _deliver(self) -> None:
        """Feed the kept output in order, until it is all fed."""
        while self._pending or not self._finished:
            if self._pending:
                piece = self._next_piece()
                await self._sink.feed(piece.channel, piece.data())
                piece.release()
            else:
                self._wakeup = self._loop.create_future()
                await self._wakeup

    def _next_piece(self) -> _Piece:
        """The first waiting piece, no longer read into."""
        piece = self._pending.popleft()
        self._pending_bytes -= piece.size
        if self._paused and self._pending_bytes < PENDING_BYTES:
            self._paused = False
            self._watch()
        return piece

    def _read_all(self) -> None:
        """Read each pipe until it is empty (or the sink has enough waiting); then decide when
        to read next (when readable, after a pause, or once the sink catches up) and whether
        what waits goes to the sink now."""
        self._timer = None
        waited = bool(self._pending)
        read, full = 0, False
        for fd in list(self._pipes):
            if self._held_back():
                break
            got, filled = self._read(fd)
            read, full = read + got, full or filled
        if self._pipes:
            if self._held_back():
                self._paused = True
                self._unwatch()
            elif self._draining or full or not read or read >= READ_CHUNK_BYTES:
                self._watch()
            else:
                self._unwatch()
                self._timer = self._loop.call_later(READ_INTERVAL_SECONDS, self._read_all)
                if not waited and self._pending_bytes < READ_CHUNK_BYTES:
                    return  # a few bytes wait for the read after the pause, to go out with what comes meanwhile
        if self._pending:
            self._wake()

    def _read(self, fd: int) -> tuple[int, bool]:
        """Read ``fd`` until it is empty, at most PIPE_BYTES at once: (bytes read, whether it was full)."""
        channel = self._pipes[fd]
        total = 0
        while total < PIPE_BYTES:
            piece = self._piece(channel) if self.cap.kept_bytes < self.cap.max_bytes else None
            into = (piece.room() if piece is not None else _drop())[: PIPE_BYTES - total]
            try:
                count = os.readv(fd, (into,))
            except BlockingIOError:
                break
            except OSError:
                count = 0
            if not count:
                self._close_pipe(fd)
                break
            total += count
            kept = len(self.cap.take(into[:count]))  # also what marks the output truncated
            if piece is not None and kept:
                piece.size += kept
                self._pending_bytes += kept
                if self._held_back():
                    break
        if self._pending and not self._pending[-1].size:
            self._pending.pop().release()  # nothing came for it
        full = total > 0 and fd in self._pipes and total >= self._size(fd)
        if full and fd not in self._enlarged:
            self._enlarge(fd)
        return total, full

    def _piece(self, channel: Channel) -> _Piece:
        """The piece the next bytes of ``channel`` are read into: the last one waiting, while it
        is of that channel and has room; else a new one."""
        if self._pending and self._pending[-1].channel == channel and self._pending[-1].size < PIECE_BYTES:
            return self._pending[-1]
        piece = _Piece(channel)
        self._pending.append(piece)
        return piece

    def _held_back(self) -> bool:
        """Enough waits for the sink that reading stops until it takes some; never once the
        process has ended, nor when feeding failed (its error ends the call, not a stalled
        command)."""
        return (self._pending_bytes >= PENDING_BYTES and not self._draining
                and not (self._delivery is not None and self._delivery.done()))

    def _size(self, fd: int) -> int:
        if fd not in self._sizes:
            try:
                self._sizes[fd] = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
            except (AttributeError, OSError):  # not Linux: take it for the usual 64 KiB
                self._sizes[fd] = READ_CHUNK_BYTES
        return self._sizes[fd]

    def _enlarge(self, fd: int) -> None:
        self._enlarged.add(fd)
        try:
            self._sizes[fd] = fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # over the system's limits: the pipe keeps its size

    def _watch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._watching:
            self._watching = True
            for fd in self._pipes:
                self._loop.add_reader(fd, self._read_all)

    def _unwatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watching:
            self._watching = False
            for fd in self._pipes:
                self._loop.remove_reader(fd)

    def _wake(self) -> None:
        if self._delivery is None:
            if self._pending:
                self._delivery = self._loop.create_task(self._deliver())
                self._delivery.add_done_callback(self._fed)
        elif self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _fed(self, delivery: asyncio.Task[None]) -> None:
        """Feeding ended; if it failed, reading goes on (see :meth:`_held_back`)."""
        if self._paused:
            self._paused = False
            self._watch()

    def _close_pipe(self, fd: int) -> None:
        if self._watching:
            self._loop.remove_reader(fd)
        os.close(fd)
        del self._pipes[fd]
        if not self._pipes and not self.closed.done():
            self.closed.set_result(None)


def _spare(size: int) -> bytearray:
    """A spare whole buffer, else a new one of ``size`` bytes. (Event loops in other threads
    share the spares: taking one is a single step.)"""
    try:
        return _spares.pop()
    except IndexError:
        return bytearray(size)


def _drop() -> memoryview:
    """A buffer to read bytes past the cap into (one for all pipes: nothing keeps them)."""
    if not _dropped:
        _dropped.append(memoryview(bytearray(PIPE_BYTES)))
    return _dropped[0]
