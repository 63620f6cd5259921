"""Bytes moved inside the kernel with ``os.splice``: one direction of a joined pair of sockets
through a pipe (:class:`Flow`), or one pipe into another (:func:`pipe_to_pipe`).

A :class:`Flow` passes what its source socket receives into a pipe, then from the pipe to its
sink socket; no byte is copied into Python. It runs on the event loop, from readiness callbacks
on non-blocking descriptors. The source is read while the pipe has room, so a slow sink holds
the source back (one pipe's worth in flight at most).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import select
from collections.abc import Callable

from .readiness import ready

#: Whether this system has splice(2) at all.
AVAILABLE = hasattr(os, "splice") and hasattr(fcntl, "F_SETPIPE_SZ")
#: errno values by which a kernel refuses to splice between these descriptors.
UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)


class Flow:
    """Bytes from the socket ``source`` to the socket ``sink`` (non-blocking descriptors that the
    caller owns and closes after :meth:`close`) through a pipe of about ``pipe_bytes``.

    At most ``limit`` bytes go on (None: no limit); then ``count(size)`` sees the size of every
    chunk and returns how many of its bytes go on. Once fewer than were read go on, the source
    is read no more (what was read past the cut is dropped, as a transport drops the rest of a
    read). ``ended()`` is called once the source's EOF has come and every byte before it has
    been sent; ``failed(error)`` once a splice fails (the flow has stopped, and :attr:`open`
    still says whether its source was to be read).
    """

    def __init__(self, source: int, sink: int, *, pipe_bytes: int, limit: int | None,
                 count: Callable[[int], int] | None, ended: Callable[[], None],
                 failed: Callable[[OSError], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._source, self._sink = source, sink
        self._limit = limit
        self._count = count
        self._ended, self._failed = ended, failed
        self._out, self._in = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # beyond the user's pipe limits the default size stays
            fcntl.fcntl(self._in, fcntl.F_SETPIPE_SZ, pipe_bytes)
        self._size = fcntl.fcntl(self._in, fcntl.F_GETPIPE_SZ)
        self._unsent = 0  # bytes in the pipe that go on to the sink
        self.open = True  # the source is still to be read (no EOF, limit, cut or stop)
        self.eof_pending = False  # the source's EOF came; ended() is not called yet
        self._reading = self._writing = self._closed = False
        self._flushed: asyncio.Future[None] | None = None

    @property
    def limit(self) -> int | None:
        """How many more bytes may be read from the source (None: no limit)."""
        return self._limit

    def start(self) -> None:
        """Begin reading the source."""
        self._read_when_ready()

    def stop(self) -> None:
        """Read no more from the source; what the pipe holds is still sent."""
        self.open = False
        self._read_no_more()
        self._settle()

    async def flushed(self) -> None:
        """Return once the pipe holds nothing more to send (or the flow failed or closed)."""
        if self._unsent and not self._closed and (self._reading or self._writing):
            self._flushed = self._loop.create_future()
            await self._flushed

    def unsent(self) -> bytes:
        """Take out of the pipe, into Python, what it holds to send (for the transport to send)."""
        chunks = []
        while self._unsent:
            chunks.append(os.read(self._out, self._unsent))
            self._unsent -= len(chunks[-1])
        return b"".join(chunks)

    def close(self) -> None:
        """Stop and close the pipe (what it holds is dropped); nothing when closed already."""
        if self._closed:
            return
        self.open = False
        self._read_no_more()
        self._write_no_more()
        self._closed = True
        os.close(self._in)
        os.close(self._out)
        self._settle(always=True)

    def _readable(self) -> None:
        try:
            moved = os.splice(self._source, self._in, self._size - self._unsent, flags=_FLAGS)
        except BlockingIOError:  # nothing to read, or no free slot in the pipe
            if self._unsent:
                self._read_no_more()  # until the sink has taken some
            return
        except OSError as error:
            self._fail(error)
            return
        if moved == 0:
            self.eof_pending = True
            self.open = False
            self._read_no_more()
        else:
            passed = moved if self._limit is None else min(moved, self._limit)
            if self._limit is not None:
                self._limit -= passed
            if self._count is not None:
                passed = self._count(passed)
            self._unsent += passed
            if passed < moved or self._limit == 0:
                self.open = False  # what was read past the cut stays in the pipe, dropped at close
            if not self.open or (self._writing and self._unsent >= self._size):
                self._read_no_more()
        if not self._writing:
            self._send()  # stops reading itself if the sink leaves the pipe full

    def _send(self) -> None:
        while self._unsent:
            try:
                moved = os.splice(self._out, self._sink, self._unsent, flags=_FLAGS)
            except BlockingIOError:  # the sink is full: wait for it, reading while the pipe has room
                if not self._writing:
                    self._loop.add_writer(self._sink, self._send)
                    self._writing = True
                if self._unsent < self._size:
                    self._read_when_ready()
                else:
                    self._read_no_more()
                return
            except OSError as error:
                self._fail(error)
                return
            self._unsent -= moved
        self._write_no_more()
        self._settle()
        if self.open:
            self._read_when_ready()
        elif self.eof_pending:
            self.eof_pending = False
            self._ended()

    def _read_when_ready(self) -> None:
        if not self._reading and self.open:
            self._loop.add_reader(self._source, self._readable)
            self._reading = True

    def _read_no_more(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._source)
            self._reading = False

    def _write_no_more(self) -> None:
        if self._writing:
            self._loop.remove_writer(self._sink)
            self._writing = False

    def _settle(self, *, always: bool = False) -> None:
        """Wake :meth:`flushed` when the pipe is empty, or ``always`` (closed or failed)."""
        if self._flushed is not None and not self._flushed.done() and (always or not self._unsent):
            self._flushed.set_result(None)

    def _fail(self, error: OSError) -> None:
        self._read_no_more()
        self._write_no_more()
        self._settle(always=True)
        self._failed(error)


async def pipe_to_pipe(source: int, sink: int, *, pipe_bytes: int, worth_bytes: int, pause_seconds: float,
                       counted: Callable[[int], None]) -> None:
    """Move what the pipe ``source`` holds into the pipe ``sink`` (each the caller's to close),
    inside the kernel, until the source's writers have all closed it; ``counted(size)`` sees
    each move. Returns early once the sink's reader has closed it (what the source still holds
    then goes nowhere, as for a reader that stopped). Both are made non-blocking and enlarged to
    about ``pipe_bytes``.

    Paced as :mod:`protolink.execution.output_pipes` reads: the source is emptied each time it
    is readable, and when that found less than ``worth_bytes`` (a writer of small pieces, each
    waking this side) the next look waits ``pause_seconds``, so that it finds them together."""
    for end in (source, sink):
        os.set_blocking(end, False)
        with contextlib.suppress(OSError):  # beyond the user's pipe limits the default size stays
            fcntl.fcntl(end, fcntl.F_SETPIPE_SZ, pipe_bytes)
    ends = select.poll()
    ends.register(source, select.POLLIN)
    ends.register(sink, 0)  # its errors only: its reader has gone
    while True:
        found = 0
        while True:
            try:
                moved = os.splice(source, sink, pipe_bytes, flags=_FLAGS)
            except BlockingIOError:  # nothing more to move, or no room for it
                break
            except BrokenPipeError:
                return
            if moved == 0:
                return
            counted(moved)
            found += moved
        if 0 < found < worth_bytes:
            await asyncio.sleep(pause_seconds)
        polled = dict(ends.poll(0))
        if polled.get(sink, 0) & select.POLLERR:
            return  # an empty source is not spliced far enough to find this out
        # Room in a full sink, else something in the source; either way the sink's reader
        # closing it (a pipe's write end is never readable: epoll reports that as an error,
        # which the loop gives its reader).
        if source in polled:
            await ready(read=(sink,), write=(sink,))
        else:
            await ready(read=(sink, source))
