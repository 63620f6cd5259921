"""The proxy's relay: a client's socket joined to its upstream socket inside the kernel.

Both connections are plain sockets, with no transport or stream: the proxy's answer and the
first bytes go out with plain sends, then each direction is a :class:`protolink.net.splice.Flow`
(one pipe a direction, no byte copied into Python). Making no stream and no protocol for either
side is what keeps a connection's set-up short: the client's next bytes, sent once it reads the
answer, find the join ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from protolink.net import splice
from protolink.net.join import Count, EndedBy


class Tunnel:
    """Moves bytes between ``client`` and ``server`` (connected non-blocking sockets, which the
    caller owns, shuts down and closes) until the exchange ends, as a
    :class:`~protolink.net.join.Join` does between two streams (:data:`~protolink.net.join.EndedBy`
    says who ends it; with ``"server"``, the client's half-close is never passed on). :meth:`open`, then
    :meth:`ended`, then :meth:`aclose`; :meth:`abort` at any time.

    ``count`` sees every chunk first and says how many of its bytes go on (a byte budget may cut
    it; once it cuts, that side is read no more). With ``up_limit``, at most that many bytes go
    up. A direction holds at most about ``pipe_bytes`` for a slow reader.
    """

    def __init__(self, client: socket.socket, server: socket.socket, *, ended_by: EndedBy, pipe_bytes: int,
                 count: Count, up_limit: int | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._client, self._server = client, server
        for sock in (client, server):
            if sock.family in (socket.AF_INET, socket.AF_INET6):  # small writes go at once, as asyncio's do
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._ended_by = ended_by
        self._pipe_bytes = pipe_bytes
        self._count = count
        self._up_limit = up_limit
        self._flows: list[splice.Flow] = []
        self._up_ended = self._down_ended = False
        self._done: asyncio.Future[str] = self._loop.create_future()

    async def open(self, *, to_client: bytes = b"", to_server: bytes = b"", from_client: bytes = b"") -> None:
        """Send ``to_client`` and ``to_server`` (not counted), then ``from_client`` (what the client
        sent past its request head) as if just received; then move the rest in the kernel."""
        up = self._passed(from_client)
        try:
            for sock, data in ((self._client, to_client), (self._server, to_server + up)):
                if data:
                    await self._loop.sock_sendall(sock, data)
        except OSError as error:
            self._finish(f"error: {error}")
        if self._done.done():  # lost, or aborted meanwhile
            return
        if self._up_limit != 0 and len(up) == len(from_client):  # not cut: the client is read on
            self._flows.append(self._flow(self._client, self._server, up=True))
        self._flows.append(self._flow(self._server, self._client, up=False))
        for flow in self._flows:
            flow.start()

    async def ended(self) -> str:
        """Wait for the exchange to end: how it ended (``"eof"`` or ``"error: ..."``)."""
        return await self._done

    def abort(self) -> None:
        """Stop at once, dropping what the pipes hold (the exchange ends)."""
        self._close_flows()
        self._finish("eof")

    async def aclose(self, *, graceful: bool, seconds: float) -> None:
        """Stop moving bytes: when ``graceful``, after what the pipes hold is sent (within
        ``seconds``); otherwise, and after that, at once."""
        if graceful:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    for flow in self._flows:
                        flow.stop()
                    await asyncio.gather(*(flow.flushed() for flow in self._flows))
        self.abort()

    def _flow(self, source: socket.socket, sink: socket.socket, *, up: bool) -> splice.Flow:
        return splice.Flow(
            source.fileno(), sink.fileno(), pipe_bytes=self._pipe_bytes, limit=self._up_limit if up else None,
            count=lambda size: self._count(size, up), ended=lambda: self._direction_ended(up=up),
            failed=lambda error: self._finish(f"error: {error}"))

    def _passed(self, data: bytes) -> bytes:
        """What of ``data``, received from the client before the flows, goes on (the up limit,
        then the count)."""
        if self._up_limit is not None:
            data = data[:self._up_limit]
            self._up_limit -= len(data)
        return data[:self._count(len(data), True)] if data else data

    def _direction_ended(self, *, up: bool) -> None:
        if self._ended_by == "server":
            if not up:
                self._finish("eof")
            return
        try:
            (self._server if up else self._client).shutdown(socket.SHUT_WR)
        except OSError as error:  # reset by its peer meanwhile
            self._finish(f"error: {error}")
            return
        if up:
            self._up_ended = True
        else:
            self._down_ended = True
        if self._up_ended and self._down_ended:
            self._finish("eof")

    def _finish(self, reason: str) -> None:
        if not self._done.done():
            self._done.set_result(reason)

    def _close_flows(self) -> None:
        for flow in self._flows:
            flow.close()
        self._flows = []
