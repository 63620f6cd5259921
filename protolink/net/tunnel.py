"""Two connected sockets joined until their exchange ends: the egress proxy's relay (a client and
its upstream server) and the in-container relay's (a command and the host), one mechanism.

Both are plain non-blocking sockets, with no transport or stream: making none for either side
keeps a connection's set-up short (the client's next bytes find the join ready). What the
caller gives to send first goes out with plain sends; then each direction is a
:class:`~protolink.net.splice.Flow` (one pipe a direction, no byte copied into Python). Where the
kernel refuses to splice between the two (EINVAL), a direction goes on from where its flow was by
copying through a buffer of its own, one chunk at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Callable
from typing import Literal

from . import splice

#: Who ends the exchange. ``"both"``: a tunnel, which passes each side's half-close on and ends
#: when both directions have ended. ``"server"``: the server's EOF ends it; the client's
#: half-close is still passed on. (With an ``up_limit`` the client's half-close is not passed on.)
EndedBy = Literal["both", "server"]
#: ``count(size, up)`` sees the size of every chunk first and returns how many of its bytes go on.
Count = Callable[[int, bool], int]


class Tunnel:
    """Moves bytes between ``client`` and ``server`` (connected non-blocking stream sockets, which
    the caller owns, shuts down and closes) until the exchange ends (:data:`EndedBy` says who ends
    it). :meth:`open`, then :meth:`ended`, then :meth:`aclose`; :meth:`abort` at any time.

    ``count``, when given, sees every chunk first and says how many of its bytes go on (a byte
    budget may cut it; once it cuts, that side is read no more). With ``up_limit`` (one request
    and its body), at most that many bytes go up: the client is no longer read once they have, and
    its half-close is not passed on. A direction holds at most about ``pipe_bytes`` for a slow
    reader (its pipe, or its copy buffer) before its writer is no longer read.
    """

    def __init__(self, client: socket.socket, server: socket.socket, *, ended_by: EndedBy, pipe_bytes: int,
                 count: Count | None = None, up_limit: int | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._client, self._server = client, server
        for sock in (client, server):
            if sock.family in (socket.AF_INET, socket.AF_INET6):  # small writes go at once
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._ended_by = ended_by
        self._pipe_bytes = pipe_bytes
        self._count = count
        self._up_limit = up_limit
        self._flows: dict[bool, splice.Flow] = {}  # by direction (up: True), while spliced
        self._copies: dict[bool, asyncio.Task[None]] = {}  # by direction, where the kernel refused
        self._ended: set[bool] = set()  # directions whose source's EOF has been passed on
        self._done: asyncio.Future[str] = self._loop.create_future()

    @property
    def spliced(self) -> bool:
        """Whether a direction moves inside the kernel now."""
        return bool(self._flows)

    async def open(self, *, to_client: bytes = b"", to_server: bytes = b"", from_client: bytes = b"") -> None:
        """Send ``to_client`` and ``to_server`` (not counted), then ``from_client`` (what the client
        sent before the join, past a request head) as if just received; then move the rest.
        Aborted before, it sends nothing."""
        if self._done.done():
            return
        up = self._passed(from_client, up=True)
        try:
            for sock, data in ((self._client, to_client), (self._server, to_server + up)):
                if data:
                    await self._loop.sock_sendall(sock, data)
        except OSError as error:
            self._finish(f"error: {error}")
        if self._done.done():  # lost, or aborted meanwhile
            return
        directions = [False]
        if self._up_limit != 0 and len(up) == len(from_client):  # not cut: the client is read on
            directions.append(True)
        for direction in directions:
            if splice.AVAILABLE:
                self._flows[direction] = self._flow(up=direction)
            else:
                self._copy(up=direction, first=b"", reading=True, eof=False)
        for flow in list(self._flows.values()):
            flow.start()

    async def ended(self) -> str:
        """Wait for the exchange to end: how it ended (``"eof"`` or ``"error: ..."``)."""
        return await self._done

    def abort(self) -> None:
        """Stop at once, dropping what the pipes and buffers hold (the exchange ends)."""
        for flow in self._flows.values():
            flow.close()
        self._flows = {}
        for task in self._copies.values():
            task.cancel()
        self._finish("eof")

    async def aclose(self, *, graceful: bool, seconds: float) -> None:
        """Stop moving bytes: when ``graceful``, after what the pipes hold is sent (within
        ``seconds``); otherwise, and after that, at once."""
        if graceful:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    for flow in self._flows.values():
                        flow.stop()
                    await asyncio.gather(*(flow.flushed() for flow in self._flows.values()))
        self.abort()
        copies = list(self._copies.values())
        if copies:
            await asyncio.wait(copies)

    def _sockets(self, *, up: bool) -> tuple[socket.socket, socket.socket]:
        """A direction's source and sink."""
        return (self._client, self._server) if up else (self._server, self._client)

    def _flow(self, *, up: bool) -> splice.Flow:
        source, sink = self._sockets(up=up)
        count = self._count
        return splice.Flow(
            source.fileno(), sink.fileno(), pipe_bytes=self._pipe_bytes, limit=self._up_limit if up else None,
            count=None if count is None else lambda size: count(size, up),
            ended=lambda: self._direction_ended(up=up), failed=lambda error: self._flow_failed(error, up=up))

    def _flow_failed(self, error: OSError, *, up: bool) -> None:
        """A splice failed: where the kernel refuses, the direction goes on by copying from where
        its flow was; otherwise the exchange ends."""
        flow = self._flows.pop(up)
        if error.errno not in splice.UNSUPPORTED:
            flow.close()
            self._finish(f"error: {error}")
            return
        if up:
            self._up_limit = flow.limit
        unsent, eof, reading = flow.unsent(), flow.eof_pending, flow.open
        flow.close()
        self._copy(up=up, first=unsent, reading=reading, eof=eof)

    def _copy(self, *, up: bool, first: bytes, reading: bool, eof: bool) -> None:
        task = self._loop.create_task(self._copying(up=up, first=first, reading=reading, eof=eof))
        self._copies[up] = task
        task.add_done_callback(lambda _: self._copies.pop(up, None))

    async def _copying(self, *, up: bool, first: bytes, reading: bool, eof: bool) -> None:
        """One direction through a buffer: ``first`` (taken out of its pipe), then what its source
        sends while ``reading``; its EOF passed on when it came (``eof``: it had already)."""
        source, sink = self._sockets(up=up)
        buffer = memoryview(bytearray(self._pipe_bytes))
        try:
            if first:
                await self._loop.sock_sendall(sink, first)
            while reading and not eof:
                room = self._pipe_bytes if not up or self._up_limit is None else min(self._pipe_bytes, self._up_limit)
                received = await self._loop.sock_recv_into(source, buffer[:room])
                if received == 0:
                    eof = True
                    break
                passed = len(self._passed(buffer[:received], up=up))
                await self._loop.sock_sendall(sink, buffer[:passed])
                reading = passed == received and not (up and self._up_limit == 0)
        except OSError as error:
            self._finish(f"error: {error}")
            return
        if eof:
            self._direction_ended(up=up)

    def _passed(self, data: bytes | memoryview, *, up: bool) -> bytes | memoryview:
        """What of ``data``, received from one side outside a flow, goes on (the up limit, then
        the count)."""
        if up and self._up_limit is not None:
            data = data[:self._up_limit]
            self._up_limit -= len(data)
        return data[:self._count(len(data), up)] if data and self._count is not None else data

    def _direction_ended(self, *, up: bool) -> None:
        """A direction's source ended and every byte before its end was sent: pass the end on."""
        if self._ended_by == "server" and not up:
            self._finish("eof")
            return
        if up and self._up_limit is not None:
            return  # one request, bounded by its length: the client's half-close is not the server's business
        try:
            self._sockets(up=up)[1].shutdown(socket.SHUT_WR)
        except OSError as error:
            # Not connected: its peer closed first, and its kernel reset the connection when the
            # last bytes reached it (as a TLS server's farewell reaches a client that closed
            # whole): nobody is left to tell. Anything else is a failure.
            if error.errno != errno.ENOTCONN:
                self._finish(f"error: {error}")
                return
        self._ended.add(up)
        if self._ended_by == "both" and len(self._ended) == 2:
            self._finish("eof")

    def _finish(self, reason: str) -> None:
        if not self._done.done():
            self._done.set_result(reason)
