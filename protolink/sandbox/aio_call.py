"""A gRPC call with a stream of requests and a stream of answers, on an asyncio connection of its
own: the ``Execute`` call of :mod:`.process_stream`, received without grpcio (whose receive costs
the client about twice the CPU per megabyte of output).

The protocol is :class:`~.grpc_call.CallState`'s, the one the blocking client runs: every frame the
server sends is checked there. Here the connection is read as it fills (into the state's one
receive buffer, :class:`asyncio.BufferedProtocol`), while the server's window, granted again as
each message is taken, holds back a server that a slow consumer does not keep up with. A ping
goes out every :data:`~protolink.wire.keepalive.PING_SECONDS` while the call is open; a server
that sends nothing, its answer included, for :data:`~protolink.wire.keepalive.PING_TIMEOUT_SECONDS`
fails the call, as the grpcio channel's keepalives (the same figures) do, unless this loop was too
busy to read.
Cancelling resets the stream and closes the connection: the server then kills and reaps whatever
the call ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from protolink.errors import SandboxError, SandboxNotReachedError, SandboxUnavailableError
from protolink.wire.keepalive import PING_SECONDS, PING_TIMEOUT_SECONDS

from .addresses import socket_path
from .grpc_call import CallState, authority, host_and_port

CONNECT_SECONDS = 5.0
#: What the server may send beyond the messages taken: a few of its largest output events.
WINDOW_BYTES = 1 << 22


class Message(Protocol):
    def SerializeToString(self) -> bytes: ...  # noqa: N802 (protobuf's name)


class AsyncCall(asyncio.BufferedProtocol):
    """A call of ``method`` at ``address`` (``unix:///path`` or ``[tcp://]host:port``): :meth:`write`
    requests, iterate over the answer's messages (the call's status raises at its end), :meth:`cancel`."""

    def __init__(self, address: str, method: str, metadata: Sequence[tuple[str, str]], *,
                 max_message_bytes: int) -> None:
        self._state = CallState(authority(address), method, metadata, max_message_bytes=max_message_bytes,
                                window_bytes=WINDOW_BYTES)
        self._transport: asyncio.Transport | None = None
        self._arrived = asyncio.Event()  # set when there is news for the reader
        self._done = False
        self._pinging: asyncio.TimerHandle | None = None
        self._ping_due = 0.0
        self._waiting_since = 0.0  # when the unanswered ping went out, or bytes last came
        self._heard = False  # bytes arrived since the last ping went out
        self._flush_scheduled = False
        self._connected = asyncio.ensure_future(self._connect(address))

    # The call ----------------------------------------------------------------------------

    async def write(self, request: Message) -> None:
        """Send ``request`` (SandboxError once the call failed)."""
        await self._connected
        if self._state.failure is not None:
            raise self._state.failure
        if self._done:
            raise SandboxUnavailableError("the sandbox's process stream has ended")
        self._state.send(request.SerializeToString())
        self._flush_soon()

    def __aiter__(self) -> AsyncCall:
        return self

    async def __anext__(self) -> bytes | memoryview:
        state = self._state
        while True:
            if (message := state.take()) is not None:
                self._flush_soon()  # the room it took, granted again
                return message
            if state.failure is not None or state.ended:
                self._close()
                if (error := state.finished()) is not None:
                    raise error
                raise StopAsyncIteration
            self._arrived.clear()
            await self._arrived.wait()

    def done(self) -> bool:
        return self._done or self._state.failure is not None or self._state.ended

    def cancel(self) -> bool:
        """Reset the stream and close the connection; False if the call was over already."""
        if self.done():
            return False
        self._state.connection_lost(SandboxUnavailableError("the sandbox's process stream was cancelled"))
        self._state.cancel()
        self._flush()
        self._close()
        return True

    # The connection ----------------------------------------------------------------------

    async def _connect(self, address: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                if (path := socket_path(address)) is not None:
                    await loop.create_unix_connection(lambda: self, path)
                else:
                    host, port = host_and_port(address)
                    await loop.create_connection(lambda: self, host, port)
        except (OSError, ValueError, TimeoutError) as error:
            self._fail(SandboxNotReachedError(f"no sandbox answers at {address}: {error or 'timed out'}"))
        except asyncio.CancelledError:
            self._fail(SandboxUnavailableError("the sandbox's process stream was cancelled"))
            raise

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        if self._done:  # cancelled while connecting
            transport.close()
            return
        self._state.open()
        self._flush()
        self._arm_ping(asyncio.get_running_loop())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._state.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._heard = True
        self._state.received(nbytes)
        self._flush()
        self._arrived.set()
        if self._state.failure is not None:
            self._close()

    def eof_received(self) -> bool:
        self._fail(SandboxUnavailableError("the sandbox closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self._fail(SandboxUnavailableError(f"the connection to the sandbox failed{reason}" if exc
                                           else "the sandbox closed the connection"))

    def _ping(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        # Late by half an interval: this loop was busy, and the answer may wait unread.
        if self._heard or now - self._ping_due > PING_SECONDS / 2:
            self._waiting_since = now
        if not self._state.unanswered_pings:
            self._state.ping()
            self._flush()
            self._waiting_since = now
        elif now - self._waiting_since >= PING_TIMEOUT_SECONDS:
            self._fail(SandboxUnavailableError(f"the sandbox did not answer a ping within {PING_TIMEOUT_SECONDS:g} s"))
            return
        self._heard = False
        self._arm_ping(loop)

    def _arm_ping(self, loop: asyncio.AbstractEventLoop) -> None:
        self._ping_due = loop.time() + PING_SECONDS
        self._pinging = loop.call_at(self._ping_due, self._ping)

    def _flush_soon(self) -> None:
        """Send what is queued once this turn of the loop is over: the requests and grants of many
        processes go out in one write (the server reads them in one wakeup)."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._state.outgoing and self._transport is not None and not self._transport.is_closing():
            self._transport.write(bytes(self._state.outgoing))
        self._state.outgoing.clear()

    def _fail(self, error: SandboxError) -> None:
        self._state.connection_lost(error)
        self._close()

    def _close(self) -> None:
        """Close the connection (the reader learns why from the state)."""
        self._done = True
        self._arrived.set()
        if self._pinging is not None:
            self._pinging.cancel()
            self._pinging = None
        if self._transport is not None:
            self._transport.close()
