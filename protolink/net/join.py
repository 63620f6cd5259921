"""Two connections joined at the transport level: the egress proxy's relay and the in-container
relay's tunnels, one mechanism.

Each connection's transport is taken over from its stream: what one side receives is written
straight to the other, with no coroutine per chunk; when the other side's write buffer is full,
reading on this side pauses until it drains (back-pressure both ways).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Literal

from .network import Streams

#: Who ends the exchange. ``"both"``: a tunnel, which passes each side's half-close on and ends
#: when both directions have ended. ``"server"``: the server's EOF ends it; the client's
#: half-close is still passed on. (With an ``up_limit`` the client's half-close is not passed on.)
EndedBy = Literal["both", "server"]
#: ``count(data, up)`` sees every chunk first and returns the part to forward.
Count = Callable[[bytes, bool], bytes]


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

    def take_over(self, write_buffer_bytes: int) -> tuple[bytes, bool]:
        """Become the transport's protocol; what the stream had read and not handed out, and
        whether it had seen the end."""
        self.transport.set_protocol(self)
        self.transport.set_write_buffer_limits(high=write_buffer_bytes)
        pending = _take_buffer(self.reader)
        self.transport.resume_reading()  # the stream may have paused it, its buffer full
        return pending

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
        self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.peer.transport.resume_reading()


class Join:
    """Copies bytes between a client and a server connection until the exchange ends.

    ``ended_by`` says who ends it (:data:`EndedBy`). ``count``, when given, sees every chunk
    first and returns the part to forward (a byte budget may cut it). With ``up_limit`` (one
    request and its body), at most that many bytes go up: the client is no longer read once they
    have, and its half-close is not passed on. A direction buffers at most about
    ``write_buffer_bytes`` for a slow reader before its writer is no longer read.
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
        return await self._done

    def abort(self) -> None:
        """Close both connections at once, dropping unsent output (the exchange ends)."""
        for side in (self._client, self._server):
            abort(side.transport)

    async def aclose(self, *, graceful: bool, seconds: float) -> None:
        """Close both connections: when ``graceful``, after their buffered output is sent (within
        ``seconds``); otherwise, and after that, at once."""
        sides = (self._client, self._server)
        if graceful:
            for side in sides:
                side.transport.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await asyncio.gather(*(side.lost for side in sides))
        self.abort()

    def _received(self, side: _Side, data: bytes) -> None:
        if side.up and self._up_limit is not None:
            if self._up_limit == 0:
                return
            if len(data) >= self._up_limit:
                data = data[:self._up_limit]
                side.transport.pause_reading()  # one request: what follows its body is not read
            self._up_limit -= len(data)
        if self._count is not None and data:
            data = self._count(data, side.up)
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
            peer.write_eof()
        if side.peer.eof and self._ended_by == "both":
            self._finish("eof")

    def _lost(self, exc: Exception | None) -> None:
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
