"""Two connections joined at the transport level, for the proxy's relay.

Each side's transport is taken over from its stream: what one side receives is written straight
to the other, with no coroutine per chunk; when the other side's write buffer is full, reading
on this side pauses until it drains (back-pressure both ways).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from protolink.net.network import Streams

WRITE_BUFFER_BYTES = 1024 * 1024


class _Side(asyncio.Protocol):
    """One socket of the pair; its callbacks go to the relay."""

    def __init__(self, relay: Relay, writer: asyncio.StreamWriter, *, up: bool) -> None:
        self.relay = relay
        self.up = up  # True: the client's side, whose bytes go up to the server
        self.transport = writer.transport
        self.previous = self.transport.get_protocol()
        self.peer: _Side
        self.eof = False
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.relay._received(self, data)

    def eof_received(self) -> bool:
        self.relay._ended(self)
        return True  # keep the transport open: the other direction may go on

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.relay._lost(exc)
        self.previous.connection_lost(exc)  # the stream's own bookkeeping (wait_closed)

    def pause_writing(self) -> None:
        self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.peer.transport.resume_reading()


class Relay:
    """Copies bytes between a client and a server connection until the exchange ends.

    ``count(data, up)`` sees every chunk first and returns the part to forward (the byte
    budget may cut it). A ``tunnel`` passes a half-close on and ends when both directions have;
    otherwise (one plain-HTTP request) at most ``up_limit`` bytes go up, and the server's EOF
    ends the exchange.
    """

    def __init__(self, client: Streams, server: Streams, *, count: Callable[[bytes, bool], bytes],
                 tunnel: bool, up_limit: int | None) -> None:
        self._count = count
        self._tunnel = tunnel
        self._up_limit = up_limit
        self._done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._client = _Side(self, client[1], up=True)
        self._server = _Side(self, server[1], up=False)
        self._client.peer, self._server.peer = self._server, self._client
        self._streams = (client, server)

    async def run(self, *, head: bytes, leftover: bytes, answer: bytes) -> str:
        """Relay until the exchange ends; how it ended (``"eof"`` or an error).

        ``head`` goes to the server first (counted), ``answer`` to the client (the proxy's own,
        not counted), then ``leftover``, what the client sent after its request head.
        """
        pending = []
        for side, (reader, writer) in zip((self._client, self._server), self._streams, strict=True):
            side.transport.set_protocol(side)
            side.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
            pending.append(_take_buffer(reader))
            side.transport.resume_reading()
        self._write(self._server, head, up=True)
        self._client.transport.write(answer)
        self._received(self._client, leftover)
        for side, (buffered, eof) in zip((self._client, self._server), pending, strict=True):
            if buffered:
                self._received(side, buffered)
            if eof:
                self._ended(side)
            if side.transport.is_closing():
                self._lost(None)
        return await self._done

    async def aclose(self, *, graceful: bool, seconds: float) -> None:
        """Close both sides: when ``graceful``, after their buffered output is sent (within
        ``seconds``); otherwise, and after that, at once."""
        sides = (self._client, self._server)
        if graceful:
            for side in sides:
                side.transport.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await asyncio.gather(*(side.lost for side in sides))
        for side in sides:
            abort(side.transport)

    def _write(self, sink: _Side, data: bytes, *, up: bool) -> None:
        data = self._count(data, up) if data else data
        if data and not sink.transport.is_closing():
            sink.transport.write(data)

    def _received(self, side: _Side, data: bytes) -> None:
        if side.up and self._up_limit == 0:
            return
        if side.up and self._up_limit is not None:
            if len(data) >= self._up_limit:
                data = data[:self._up_limit]
                side.transport.pause_reading()  # one request: what follows its body is not read
            self._up_limit -= len(data)
        self._write(side.peer, data, up=side.up)

    def _ended(self, side: _Side) -> None:
        side.eof = True
        if not self._tunnel:
            if not side.up:
                self._finish("eof")
            return
        peer = side.peer.transport
        if peer.can_write_eof() and not peer.is_closing():
            peer.write_eof()
        if side.peer.eof:
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
