"""The host's side of the pipe connection (:mod:`protolink.wire.pipe_passing`): the output pipes
of commands in a sandbox on this host, received to be read here as the host backend reads its own.

Everything the server sends is untrusted. The greeting must be a key with exactly one pipe's
read end attached, else the connection is not used (the output stays on gRPC). A hand-off must
be one request id with exactly two descriptors, each the read end of a pipe or FIFO (``fstat``,
``O_RDONLY``), received close-on-exec; anything else is closed at once and ends the connection.
Descriptors for a request that is not waiting for them are closed. What is read from them, how
much and for how long is :mod:`.process_stream`'s to bound.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import stat
from collections.abc import Callable
from typing import NamedTuple

from protolink.net.descriptors import receive, receive_next
from protolink.wire.pipe_passing import HANDED_FDS, HANDOFF, KEY_BYTES

#: How long a connection may take to be greeted.
GREETING_SECONDS = 5.0
#: The most hand-offs taken in one go: a server that floods the connection cannot hold this
#: side's event loop (an honest one sends one per process, at most max_concurrency at once).
MAX_AT_ONCE = 256


class PassedPipes(NamedTuple):
    """The read ends of a process's stdout and stderr, received for the request ``request_id``."""

    request_id: int
    stdout: int
    stderr: int

    def close(self) -> None:
        os.close(self.stdout)
        os.close(self.stderr)


class PipeConnection:
    """An open pipe connection: ``key`` names it in requests; each hand-off goes to ``handed``
    (which closes what it does not take); ``closed`` completes once the connection has ended."""

    def __init__(self, sock: socket.socket, key: bytes, handed: Callable[[PassedPipes], None]) -> None:
        self.key = key
        self._sock = sock
        self._handed = handed
        self._loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._loop.add_reader(sock.fileno(), self.receive_queued)

    @classmethod
    async def open(cls, path: str, handed: Callable[[PassedPipes], None]) -> PipeConnection | None:
        """A connection to the pipe socket at ``path``, once greeted; None when the server offers
        none there (no socket: a server that passes no pipes; a refusal: its kernel cannot)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.setblocking(False)
        try:
            async with asyncio.timeout(GREETING_SECONDS):
                await asyncio.get_running_loop().sock_connect(sock, path)
                key, fds, _ = await receive_next(sock, KEY_BYTES + 1, 1)
        except (OSError, TimeoutError):
            sock.close()
            return None
        except BaseException:  # canceled
            sock.close()
            raise
        proven = len(key) == KEY_BYTES and len(fds) == 1 and _is_read_end(fds[0])
        for fd in fds:
            os.close(fd)
        if not proven:
            sock.close()
            return None
        return cls(sock, key, handed)

    def receive_queued(self) -> None:
        """Take the hand-offs the server has sent so far, at most :data:`MAX_AT_ONCE` (it sends a
        process's before that process's Finished: once that has come, its hand-off is here)."""
        for _ in range(MAX_AT_ONCE):
            if self.closed.done():
                return
            try:
                data, fds, flags = receive(self._sock, HANDOFF.size + 1, HANDED_FDS)
            except BlockingIOError:
                return
            except OSError:
                data, fds, flags = b"", [], 0
            if (len(data) != HANDOFF.size or len(fds) != HANDED_FDS or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC)
                    or not all(_is_read_end(fd) for fd in fds)):
                for fd in fds:
                    os.close(fd)
                self.close()  # the server closed it, or broke the protocol
                return
            self._handed(PassedPipes(HANDOFF.unpack(data)[0], *fds))

    def close(self) -> None:
        if not self.closed.done():
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self.closed.set_result(None)


def _is_read_end(fd: int) -> bool:
    """Whether ``fd`` is a pipe's (or FIFO's) read end."""
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except OSError:
        return False
