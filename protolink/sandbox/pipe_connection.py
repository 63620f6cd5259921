"""The host's side of the command channel (:mod:`protolink.wire.pipe_passing`): the Execute call
of a sandbox on this host as datagrams on a local socket, without gRPC, and the output pipes of
its commands received to be read here as the host backend reads its own.

:class:`ChannelCalls` makes :class:`ChannelCall` s while the server offers the channel, and the
``fallback``'s gRPC calls once it does not (TCP has no channel; a server whose kernel cannot pass
descriptors, gVisor's, greets without the proof), or for one call when the server refuses a
connection at its limit: a request written on a channel that was never greeted is
:class:`~.process_stream.Unsent`, and goes once more on the call the fallback makes.

While a call is open it pings every :data:`~protolink.wire.keepalive.PING_SECONDS`; a server that
sends nothing, its answer included, for :data:`PING_TIMEOUT_SECONDS` while
the call's reader waits fails the call, as :mod:`.aio_call`'s keepalives do, unless this loop was
too busy to read.

Everything the server sends is untrusted. The greeting must be :data:`~protolink.wire.pipe_passing.GREETING` and a key
with exactly one pipe's read end attached (an older server's, a bare key, is no offer). Each datagram after it must be whole and of a known kind: an event (no
descriptor attached), a hand-off (one request id, exactly two descriptors, each the read end of
a pipe or FIFO, ``fstat`` and ``O_RDONLY``, received close-on-exec) or the call's failure (a wire
error). Anything else closes every descriptor it carried and fails the call. What the events say
and what is read from the pipes is :mod:`.process_stream`'s to check and bound, as on gRPC. The
datagrams are read only as the call's reader asks: a server that floods the channel waits in the
kernel's bounded queue.
"""

from __future__ import annotations

import array
import asyncio
import enum
import fcntl
import os
import socket
import stat
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from protolink.errors import SandboxProtocolError, SandboxUnavailableError
from protolink.net.descriptors import receive_next
from protolink.wire import convert
from protolink.wire._pb import errors_pb2, process_pb2
from protolink.wire.pipe_passing import (
    AT_LIMIT,
    DATAGRAM_BYTES,
    EVENT,
    FAILURE,
    GREETING,
    HANDED_FDS,
    HANDOFF,
    HANDOFF_KIND,
    KEY_BYTES,
    PING,
    PONG,
    SOCKET_NAME,
    first_datagram,
)
from protolink.wire.keepalive import PING_SECONDS
from protolink.wire.status import checked_answer, from_wire

from .addresses import socket_path

#: How long the reader waits, pinging, for anything from the server before the call fails. Longer
#: than gRPC's 6 s: its pings are answered by its transport's threads, the channel's pongs by the
#: server's event loop, which a sandbox busy on a loaded machine (a document bomb beside two CPU
#: hogs) has kept from answering for more than 6 s. A frozen sandbox is found within half a minute.
PING_TIMEOUT_SECONDS = 20.0
#: How long a connection may take to be greeted.
GREETING_SECONDS = 5.0
#: How long a call with no process left on it stays open for the next (its connection and
#: greeting cost a command about 1 ms more): an agent's commands come seconds apart, a model's
#: turn between them. Bounded: one idle connection a backend, pinged every PING_SECONDS, and a
#: server at its limit of connections refuses a new one for that call alone.
CHANNEL_IDLE_SECONDS = 30.0


class PassedPipes(NamedTuple):
    """The read ends of a process's stdout and stderr, received for the request ``request_id``."""

    request_id: int
    stdout: int
    stderr: int

    def close(self) -> None:
        os.close(self.stdout)
        os.close(self.stderr)


class Greeting(enum.Enum):
    """How the server answered a connection: with the channel's proof; not at all, the
    connection closed (a server whose kernel cannot pass the proof, or an older one at its limit
    of connections); refused (the server said it is at its limit, or the socket's queue is full);
    not offering it (no socket, or a greeting of another protocol or without its proof)."""

    PROVEN = "proven"
    CLOSED = "closed"
    REFUSED = "refused"
    NOT_OFFERED = "not offered"


class Unsent(Exception):
    """A request written on a call that had ended, or never began: it never reached the server.
    ``error`` is what the call's end says."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class ChannelCalls:
    """Execute calls on the command channel at ``path`` (each call a connection of its own), or
    ``fallback()``'s where the server does not take one. ``pipes_above``: a process that may keep
    more output than this asks for its pipes (None: never).

    A server that does not offer the channel (no socket: an older server, TCP's; a greeting of
    another protocol, or one without its proof: gVisor's) is not asked again: every later call is
    the fallback's. A server that answers it is at its limit of connections, or whose socket's
    queue refuses, sends the next call alone to the fallback; so does a connection closed
    ungreeted by one that has greeted a connection of this backend before (an older server at its
    limit said nothing).
    """

    def __init__(self, path: str, metadata: Sequence[tuple[str, str]], fallback: Callable[[], Any], *,
                 pipes_above: int | None) -> None:
        self._path = path
        self._authorization = first_datagram(metadata)
        self._fallback = fallback
        self._pipes_above = pipes_above
        #: False once the server has shown it does not offer the channel: every later call is the fallback's.
        self.offered = True
        #: True once the server has greeted a connection with the channel's proof.
        self.proven = False
        self._refused = False  # the last connection was refused at the limit: the next call is the fallback's

    def __call__(self) -> Any:
        if not self.offered or self._refused:
            self._refused = False
            return self._fallback()
        return ChannelCall(self._path, self._authorization, self._pipes_above, self._greeted)

    def _greeted(self, greeting: Greeting) -> None:
        if greeting is Greeting.PROVEN:
            self.proven = True
        elif greeting is Greeting.REFUSED or (greeting is Greeting.CLOSED and self.proven):
            self._refused = True
        else:
            self.offered = False


class ChannelCall:
    """An Execute call on one channel connection, with :class:`~.aio_call.AsyncCall`'s ways:
    :meth:`write` requests, iterate over what comes (each event's bytes, or the
    :class:`PassedPipes` of a hand-off; the call's failure raises), :meth:`cancel`. Idle, it
    stays open :attr:`idle_seconds`."""

    idle_seconds = CHANNEL_IDLE_SECONDS

    def __init__(self, path: str, authorization: bytes, pipes_above: int | None,
                 greeted: Callable[[Greeting], None]) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.setblocking(False)
        self._pipes_above = pipes_above
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray(DATAGRAM_BYTES)
        self._ancillary = socket.CMSG_SPACE(HANDED_FDS * array.array("i").itemsize)
        self._key = b""
        self._done = False
        self._broken = False
        #: While the reader waits for a datagram ("read"), or a request for room to be sent ("write").
        self._waits: dict[str, asyncio.Future[None]] = {}
        self._waiting_since = 0.0  # when the reader began to wait, or this loop last had time to ping
        self._pinging: asyncio.TimerHandle | None = None
        self._failure: Exception | None = None
        self._greeted = asyncio.ensure_future(self._greeting(path, authorization, greeted))

    async def write(self, request: process_pb2.ExecuteRequest, *, pipes: bool = False) -> None:
        """Send ``request``, naming this connection for its pipes when its output may be large,
        or ``pipes`` asks for them whatever its size (:class:`Unsent` when the channel is not,
        or no longer, there); one write at a time, as
        :class:`~.process_stream.ProcessStream` writes. A burst the server has not read yet waits
        here for room."""
        if not await asyncio.shield(self._greeted) or self._done:
            # A server may end the call before it reads a request (a refusal of the connection's
            # authorization): its failure is the request's too.
            raise Unsent(self._failure or SandboxUnavailableError("the sandbox offers no command channel"))
        if pipes or (self._pipes_above is not None and request.max_output_bytes > self._pipes_above):
            request.pipe_connection = self._key
        data = request.SerializeToString()
        if len(data) > DATAGRAM_BYTES:
            raise ValueError(f"a request of {len(data)} bytes does not fit the command channel")
        try:
            await self._send(data)
        except OSError as error:
            request.ClearField("pipe_connection")
            self._broken = True  # the reader learns why from the connection; a new call is made
            raise Unsent(SandboxUnavailableError(f"the sandbox's command channel has closed: {error}")) from None

    async def _send(self, data: bytes) -> None:
        """Send one datagram, waiting while the socket's send buffer is full (a burst of requests
        the server has not read yet); OSError once the connection is gone."""
        while True:
            try:
                self._sock.send(data)
                return
            except BlockingIOError:
                pass
            await self._ready("write")
            if self._done:
                raise ConnectionResetError("the call was cancelled")

    def __aiter__(self) -> ChannelCall:
        return self

    async def __anext__(self) -> bytes | PassedPipes:
        if not await asyncio.shield(self._greeted):
            raise SandboxUnavailableError("the sandbox offers no command channel")
        while not self._done:
            if (item := self.arrived()) is not None:
                return item
            if not self._done:
                self._waiting_since = self._loop.time()
                await self._ready("read")
        raise self._failure or SandboxUnavailableError("the sandbox's process stream was cancelled")

    def arrived(self) -> bytes | PassedPipes | None:
        """The next item if its datagram has arrived already, without waiting; None if none has
        (or the call was canceled). A datagram that ends the call raises as iterating does."""
        if not self._greeted.done() or not self._greeted.result():
            return None
        while not self._done:
            try:
                size, ancillary, flags, _ = self._sock.recvmsg_into([self._buffer], self._ancillary,
                                                                    socket.MSG_CMSG_CLOEXEC)
            except BlockingIOError:
                return None
            except OSError as error:
                self.cancel()
                raise SandboxUnavailableError(f"the sandbox's command channel failed: {error}") from None
            if (item := self._datagram(size, _descriptors(ancillary), flags)) is not None:
                return item  # None: a pong
        return None

    def done(self) -> bool:
        return self._done or self._broken

    def cancel(self) -> bool:
        """Close the connection (the server kills and reaps what the call ran), at once or when
        the greeting has ended (within GREETING_SECONDS); False if over already."""
        if self._done:
            return False
        self._done = True
        if self._greeted.done():
            self._close()
        else:
            self._greeted.add_done_callback(lambda _: self._close())
        return True

    def _close(self) -> None:
        if self._pinging is not None:
            self._pinging.cancel()
        for direction, ready in self._waits.items():
            # Unwatched even when the wait was just answered and its task has not run yet: a
            # watch left on the closed descriptor would pass to the next socket of that number,
            # which the loop's selector then never watches (its registration looks unchanged).
            getattr(self._loop, _WATCHES[direction][1])(self._sock.fileno())
            if not ready.done():
                ready.set_result(None)
        self._sock.close()

    async def _greeting(self, path: str, authorization: bytes, greeted: Callable[[Greeting], None]) -> bool:
        """Connect and take the greeting: True once the channel is proven and authorization sent;
        ``greeted`` learns how the server answered."""
        greeting, fds = b"", []
        try:
            async with asyncio.timeout(GREETING_SECONDS):
                self._sock.connect(path)  # a Unix socket's connect does not wait: it is made, or refused
                greeting, fds, _ = await receive_next(self._sock, len(GREETING) + KEY_BYTES + 1, 1)
        except (BlockingIOError, TimeoutError):
            answer = Greeting.REFUSED  # the queue of connections is full, or the server too busy to answer
        except OSError:
            answer = Greeting.NOT_OFFERED  # no socket, or no server on it
        else:
            if not greeting and not fds:
                answer = Greeting.CLOSED
            elif greeting == AT_LIMIT and not fds:
                answer = Greeting.REFUSED
            else:
                answer = Greeting.NOT_OFFERED
        key = greeting.removeprefix(GREETING)
        proven = (greeting.startswith(GREETING) and len(key) == KEY_BYTES and len(fds) == 1
                  and _is_read_end(fds[0]))
        for fd in fds:
            os.close(fd)
        if proven:
            try:
                self._sock.send(authorization)
                answer = Greeting.PROVEN
            except OSError:
                proven = False
                answer = Greeting.CLOSED
        greeted(answer)
        if not proven:
            self.cancel()
            return False
        self._key = key
        self._pinging = self._loop.call_later(PING_SECONDS, self._ping, self._loop.time() + PING_SECONDS)
        return True

    def _ping(self, due: float) -> None:
        """Ping; fail the call when the reader has waited, pinging, PING_TIMEOUT_SECONDS for nothing."""
        now = self._loop.time()
        if now - due > PING_SECONDS / 2:
            self._waiting_since = now  # late: this loop was busy, and an answer may wait unread
        elif "read" in self._waits and not self._waits["read"].done() and (
                now - self._waiting_since >= PING_TIMEOUT_SECONDS + PING_SECONDS):
            self._failure = SandboxUnavailableError(
                f"the sandbox did not answer a ping within {PING_TIMEOUT_SECONDS:g} s")
            self.cancel()
            return
        try:
            self._sock.send(PING)
        except OSError:
            pass  # full (the server is behind: its answers tell), or closed (the reader learns it)
        self._pinging = self._loop.call_later(PING_SECONDS, self._ping, now + PING_SECONDS)

    def _datagram(self, size: int, fds: list[int], flags: int) -> bytes | PassedPipes | None:
        """What one datagram says, checked (None: a pong); every descriptor it carried is closed
        unless taken."""
        kind = bytes(self._buffer[:1]) if size else b""
        taken = False
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise SandboxProtocolError("the sandbox sent a datagram too long for its command channel")
            if not size:
                raise SandboxUnavailableError("the sandbox closed its command channel")
            if kind == HANDOFF_KIND:
                if size != HANDOFF.size or len(fds) != HANDED_FDS or not all(_is_read_end(fd) for fd in fds):
                    raise SandboxProtocolError("the sandbox passed something other than a process's two pipes")
                taken = True
                return PassedPipes(HANDOFF.unpack_from(self._buffer)[1], *fds)
            if fds:
                raise SandboxProtocolError("the sandbox attached descriptors to a message of its command channel")
            if kind == EVENT:
                return bytes(memoryview(self._buffer)[1:size])
            if kind == PONG and size == len(PONG):
                return None
            if kind == FAILURE:
                raise from_wire(checked_answer(convert.parse, errors_pb2.Error, bytes(memoryview(self._buffer)[1:size])))
            raise SandboxProtocolError(f"the sandbox sent a datagram of unknown kind {kind!r}")
        except Exception as error:
            self._failure = self._failure or error
            self.cancel()
            raise
        finally:
            if not taken:
                for fd in fds:
                    os.close(fd)

    async def _ready(self, direction: str) -> None:
        """Wait until the socket is readable (``direction`` "read") or writable ("write"), or the
        call is canceled."""
        watch, unwatch = (getattr(self._loop, name) for name in _WATCHES[direction])
        self._waits[direction] = ready = self._loop.create_future()
        watch(self._sock.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            if not self._done:
                unwatch(self._sock.fileno())


#: The loop's methods that watch a socket, by direction: the callback's registration and its removal.
_WATCHES = {"read": ("add_reader", "remove_reader"), "write": ("add_writer", "remove_writer")}


def channel_socket(address: str) -> str | None:
    """Where the server at ``address`` offers its command channel: beside a Unix socket (a
    sandbox on this host); None for TCP."""
    path = socket_path(address)
    return None if path is None else os.path.join(os.path.dirname(path), SOCKET_NAME)


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors ``SCM_RIGHTS`` attached."""
    fds = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return list(fds)


def _is_read_end(fd: int) -> bool:
    """Whether ``fd`` is a pipe's (or FIFO's) read end."""
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode) and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
    except OSError:
        return False
