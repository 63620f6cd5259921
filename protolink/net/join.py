"""Two connections joined: the egress proxy's relay and the in-container relay's tunnels, one
mechanism.

Each connection's transport is taken over from its stream. What the caller gives to send first,
and what the streams had read ahead, go through the transports; then, when both connections are
plain sockets, the rest moves inside the kernel (:mod:`protolink.net.splice`, one pipe a
direction). Otherwise, or when the kernel refuses to splice, the join goes on at the transport
level: what one side receives is written straight to the other, with no coroutine per chunk;
when the other side's write buffer is full, reading on this side pauses until it drains
(back-pressure both ways).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Callable
from typing import Literal

from . import splice
from .network import Streams

#: Who ends the exchange. ``"both"``: a tunnel, which passes each side's half-close on and ends
#: when both directions have ended. ``"server"``: the server's EOF ends it; the client's
#: half-close is still passed on. (With an ``up_limit`` the client's half-close is not passed on.)
EndedBy = Literal["both", "server"]
#: ``count(size, up)`` sees the size of every chunk first and returns how many of its bytes go on.
Count = Callable[[int, bool], int]


class _Side(asyncio.Protocol):
    """One connection of the pair, taken over from its stream; its callbacks go to the join."""

    def __init__(self, join: Join, stream: Streams, *, up: bool) -> None:
        self.join = join
        self.up = up  # True: the client's side, whose bytes go up to the server
        self.reader = stream[0]
        self.transport: asyncio.Transport = stream[1].transport  # type: ignore[assignment]
        self.previous = self.transport.get_protocol()
        self.peer: _Side
        self.eof = False
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent: asyncio.Future[None] | None = None  # see wait_sent

    def take_over(self, write_buffer_bytes: int) -> tuple[bytes, bool]:
        """Become the transport's protocol; what the stream had read and not handed out, and
        whether it had seen the end."""
        self.transport.set_protocol(self)
        self.transport.set_write_buffer_limits(high=write_buffer_bytes)
        pending = _take_buffer(self.reader)
        self.transport.resume_reading()  # the stream may have paused it, its buffer full
        return pending

    async def wait_sent(self) -> None:
        """Return once the transport has sent everything written to it (or is lost)."""
        if self.transport.get_write_buffer_size() and not self.lost.done():
            self.sent = asyncio.get_running_loop().create_future()
            self.transport.set_write_buffer_limits(high=0)  # resume_writing once the buffer is empty
            await asyncio.wait((self.sent, self.lost), return_when=asyncio.FIRST_COMPLETED)

    def socket(self) -> socket.socket | None:
        """The transport's socket, when it is a plain stream socket (no TLS)."""
        sock = self.transport.get_extra_info("socket")
        plain = self.transport.get_extra_info("sslcontext") is None and not self.transport.is_closing()
        return sock if plain and sock is not None and sock.type == socket.SOCK_STREAM else None

    def data_received(self, data: bytes) -> None:
        self.join._received(self, data)

    def eof_received(self) -> bool:
        self.join._ended(self)
        return True  # keep the transport open: the other direction may go on

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.join._lost(exc)
        self.previous.connection_lost(exc)  # the stream's own bookkeeping (wait_closed)

    def pause_writing(self) -> None:
        if self.sent is None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.sent is None:
            self.peer.transport.resume_reading()
        elif not self.sent.done():
            self.sent.set_result(None)


class Join:
    """Copies bytes between a client and a server connection until the exchange ends.

    ``ended_by`` says who ends it (:data:`EndedBy`). ``count``, when given, sees the size of
    every chunk first and returns how many of its bytes go on (a byte budget may cut it); once
    it cuts, that side is read no more. With
    ``up_limit`` (one request and its body), at most that many bytes go up: the client is no
    longer read once they have, and its half-close is not passed on. A direction holds at most
    about ``write_buffer_bytes`` for a slow reader (a write buffer, or a pipe) before its writer
    is no longer read.
    """

    def __init__(self, client: Streams, server: Streams, *, ended_by: EndedBy, write_buffer_bytes: int,
                 count: Count | None = None, up_limit: int | None = None) -> None:
        self._ended_by = ended_by
        self._write_buffer_bytes = write_buffer_bytes
        self._count = count
        self._up_limit = up_limit
        self._done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._client = _Side(self, client, up=True)
        self._server = _Side(self, server, up=False)
        self._client.peer, self._server.peer = self._server, self._client
        self._flows: dict[_Side, splice.Flow] = {}  # by source side, while spliced
        self._descriptors: list[int] = []  # the sockets' duplicates the flows use

    @property
    def spliced(self) -> bool:
        """Whether the bytes move inside the kernel now (not through the transports)."""
        return bool(self._descriptors)

    async def run(self, *, to_server: bytes = b"", to_client: bytes = b"", from_client: bytes = b"") -> str:
        """Join the two until the exchange ends; how it ended (``"eof"`` or ``"error: ..."``).

        ``to_server`` and ``to_client`` are written first, not counted; then ``from_client``,
        what the client sent before the join (past a request head), goes up as if just received;
        then what each stream had read ahead.
        """
        sides = (self._client, self._server)
        pending = [side.take_over(self._write_buffer_bytes) for side in sides]
        for side, first in ((self._server, to_server), (self._client, to_client)):
            if first and not side.transport.is_closing():
                side.transport.write(first)
        if from_client:
            self._received(self._client, from_client)
        for side, (buffered, eof) in zip(sides, pending, strict=True):
            if buffered:
                self._received(side, buffered)
            if eof:
                self._ended(side)
            if side.transport.is_closing():
                self._lost(None)
        if splice.AVAILABLE and not self._done.done() and all(side.socket() for side in sides):
            await self._splice()
        return await self._done

    def abort(self) -> None:
        """Close both connections at once, dropping unsent output (the exchange ends)."""
        self._unsplice()
        for side in (self._client, self._server):
            abort(side.transport)

    async def aclose(self, *, graceful: bool, seconds: float) -> None:
        """Close both connections: when ``graceful``, after their buffered output is sent (within
        ``seconds``); otherwise, and after that, at once."""
        sides = (self._client, self._server)
        if graceful:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    for flow in self._flows.values():
                        flow.stop()
                    await asyncio.gather(*(flow.flushed() for flow in self._flows.values()))
                    self._unsplice()
                    for side in sides:
                        side.transport.close()
                    await asyncio.gather(*(side.lost for side in sides))
        self.abort()

    async def _splice(self) -> None:
        """Once what the transports were given is sent, move the rest inside the kernel."""
        sides = (self._client, self._server)
        for side in sides:
            side.transport.pause_reading()  # what arrives from now on stays in the kernel
        for side in sides:
            await side.wait_sent()
        if self._done.done() or not all(side.socket() for side in sides):
            return
        self._descriptors = [os.dup(side.socket().fileno()) for side in sides]  # type: ignore[union-attr]
        for side, source, sink in ((self._client, *self._descriptors), (self._server, *self._descriptors[::-1])):
            if not side.eof and not (side.up and self._up_limit == 0):  # this direction goes on
                self._flows[side] = self._flow(side, source, sink)
        for flow in self._flows.values():
            flow.start()

    def _flow(self, side: _Side, source: int, sink: int) -> splice.Flow:
        count = self._count
        return splice.Flow(
            source, sink, pipe_bytes=self._write_buffer_bytes, limit=self._up_limit if side.up else None,
            count=None if count is None else lambda size: count(size, side.up),
            ended=lambda: self._ended(side), failed=self._splice_failed)

    def _splice_failed(self, error: OSError) -> None:
        if error.errno in splice.UNSUPPORTED:
            self._fall_back()
        else:
            self._lost(error)

    def _fall_back(self) -> None:
        """The kernel refused to splice: go on at the transport level, from where the flows were."""
        flows = self._flows
        self._flows = {}
        for side in (self._client, self._server):
            side.sent = None  # pause_writing and resume_writing steer the peer's reading again
            side.transport.set_write_buffer_limits(high=self._write_buffer_bytes)
        for side, flow in flows.items():
            unsent, eof_pending, still_open = flow.unsent(), flow.eof_pending, flow.open
            if side.up and self._up_limit is not None:
                self._up_limit = flow.limit
            flow.close()
            if unsent and not side.peer.transport.is_closing():
                side.peer.transport.write(unsent)
            if eof_pending:
                self._ended(side)
            elif still_open:
                side.transport.resume_reading()
        self._unsplice()

    def _unsplice(self) -> None:
        """Close the flows and the sockets' duplicates (the transports keep theirs)."""
        for flow in self._flows.values():
            flow.close()
        self._flows = {}
        for descriptor in self._descriptors:
            os.close(descriptor)
        self._descriptors = []

    def _received(self, side: _Side, data: bytes) -> None:
        if side.up and self._up_limit is not None:
            if self._up_limit == 0:
                return
            if len(data) >= self._up_limit:
                data = data[:self._up_limit]
                side.transport.pause_reading()  # one request: what follows its body is not read
            self._up_limit -= len(data)
        if self._count is not None and data:
            passed = self._count(len(data), side.up)
            if passed < len(data):
                data = data[:passed]
                side.transport.pause_reading()  # cut: nothing more of this side goes on
        sink = side.peer.transport
        if data and not sink.is_closing():
            sink.write(data)

    def _ended(self, side: _Side) -> None:
        side.eof = True
        if self._ended_by == "server" and not side.up:
            self._finish("eof")
            return
        if side.up and self._up_limit is not None:
            return  # one request, bounded by its length: the client's half-close is not the server's business
        peer = side.peer.transport
        if peer.can_write_eof() and not peer.is_closing():
            try:
                peer.write_eof()
            except OSError as error:  # reset by its peer while this side was not read (spliced)
                self._lost(error)
                return
        if side.peer.eof and self._ended_by == "both":
            self._finish("eof")

    def _lost(self, exc: Exception | None) -> None:
        self._unsplice()  # a duplicate must not keep a closed connection open
        self._finish("eof" if exc is None else f"error: {exc}")

    def _finish(self, reason: str) -> None:
        if not self._done.done():
            self._done.set_result(reason)


def abort(transport: asyncio.BaseTransport) -> None:
    """Close ``transport`` at once, dropping unsent output; nothing when it is closed already.

    (A selector transport that finished a graceful close fails when aborted afterwards.)
    """
    assert isinstance(transport, asyncio.WriteTransport)
    if not (transport.is_closing() and transport.get_write_buffer_size() == 0):
        transport.abort()


def _take_buffer(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """What a stream's reader holds unread, emptied, and whether it has seen EOF.

    StreamReader has no public way to take its buffer without awaiting; these two attributes
    have not changed since asyncio's first release.
    """
    buffered = bytes(reader._buffer)  # type: ignore[attr-defined]
    reader._buffer.clear()  # type: ignore[attr-defined]
    return buffered, bool(reader._eof)  # type: ignore[attr-defined]
