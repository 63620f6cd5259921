"""A sandbox's egress carried over gRPC streams, for a sandbox on another machine (a Swarm node).

The node's gateway dials the task's relay (a :class:`~.dialer.RelayDialer`, as the host does on
one machine) and so accepts the commands' connections on the node; the service decides them.
The service keeps ``standby`` streams of :data:`METHOD` open to the gateway, each naming the
task (the channel's metadata: the gateway's token and the task's container). Each stream
carries one command connection:

- the gateway writes :data:`READY` once the task's relay answered and the stream waits;
- it writes :data:`STARTED` when it gives the stream a command's connection; the service then
  serves the stream with its :class:`~.proxy.EgressProxy` (one end of a socketpair whose other
  end the stream's bytes go through) and opens a new standby stream;
- then both ends write the connection's bytes, and an empty message when their side ends.

So the policy, its limits and its events are the service's own, as on one host; the side that
decides dials in (the service dials the gateway, the gateway dials the task); nothing listens
for a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from typing import Any, Protocol

import grpc

from protolink.net.tasks import owning_task

from .dialer import ConnectionHandler

log = logging.getLogger(__name__)

#: The gateway's streaming method that carries one command connection.
METHOD = "/protolink.sandbox.v1.Gateway/Egress"
#: The gateway's first message: the task's relay answered, the stream waits for a connection.
READY = b"\x00"
#: The gateway's second message: a command's connection starts on this stream.
STARTED = b"\x01"
#: The most bytes one message carries.
CHUNK_BYTES = 64 * 1024
#: How long a command's connection waits at the gateway for a stream of the service (then closed).
WAIT_SECONDS = 10.0
#: How long :meth:`GatewayStreams.start` waits for the gateway to reach the task's relay.
START_SECONDS = 30.0
#: Pauses between attempts while the gateway does not answer (doubling, then the most).
RETRY_SECONDS = (0.05, 2.0)


class Stream(Protocol):
    """One end of a call of :data:`METHOD`: a client's call, or a server's context."""

    async def read(self) -> Any: ...

    async def write(self, message: bytes) -> None: ...


async def pipe(sock: socket.socket, stream: Stream) -> None:
    """Copy bytes both ways between ``sock`` (non-blocking) and ``stream`` until both sides have
    ended (an empty message or the stream's end: ``sock``'s writing is shut down; ``sock``'s
    end: an empty message). Any error ends both. ``sock`` is left open."""
    loop = asyncio.get_running_loop()

    async def outward() -> None:
        while data := await loop.sock_recv(sock, CHUNK_BYTES):
            await stream.write(data)
        await stream.write(b"")

    async def inward() -> None:
        while (message := await stream.read()) not in (grpc.aio.EOF, b""):
            await loop.sock_sendall(sock, message)
        sock.shutdown(socket.SHUT_WR)

    directions = [asyncio.ensure_future(outward()), asyncio.ensure_future(inward())]
    try:
        for finished in asyncio.as_completed(directions):
            await finished
    finally:
        for direction in directions:
            direction.cancel()
        await asyncio.gather(*directions, return_exceptions=True)


class StreamedConnections:
    """The gateway's end: a :class:`~.dialer.ConnectionHandler` that gives each command connection
    to a stream waiting in :meth:`stand_by`; a connection that no stream takes within
    :data:`WAIT_SECONDS` is closed."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[tuple[socket.socket, asyncio.Future[None]]]] = deque()
        self._arrived = asyncio.Event()

    async def handle(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()
        deadline = loop.time() + WAIT_SECONDS
        given = False
        try:
            while not given:
                given = self._give(sock, finished)
                if not given:
                    self._arrived.clear()
                    await asyncio.wait_for(self._arrived.wait(), deadline - loop.time())
            await finished
        except TimeoutError:
            log.warning("a command's egress connection found no stream of the service within %g s; closed",
                        WAIT_SECONDS)
        finally:
            if finished.done() or not given:
                sock.close()
            else:  # stopped while a stream carries it: end it there, close it once that stream let go
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                finished.add_done_callback(lambda _: sock.close())

    async def stand_by(self, context: grpc.aio.ServicerContext) -> None:
        """Serve ``context``'s stream: wait for a command's connection, then carry it to its end."""
        given: asyncio.Future[tuple[socket.socket, asyncio.Future[None]]] = asyncio.get_running_loop().create_future()
        self._waiting.append(given)
        self._arrived.set()
        try:
            await context.write(READY)
            sock, finished = await given
        except BaseException:
            if given.done() and not given.cancelled():  # given a connection as this stream ended
                given.result()[1].set_result(None)
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiting.remove(given)
        try:
            await context.write(STARTED)
            await pipe(sock, context)
        except OSError:
            pass  # the command's side ended abruptly: the stream ends
        finally:
            finished.set_result(None)

    def _give(self, sock: socket.socket, finished: asyncio.Future[None]) -> bool:
        """Give ``sock`` to the stream that waited longest; False when none waits."""
        while self._waiting:
            stream = self._waiting.popleft()
            if not stream.done():
                stream.set_result((sock, finished))
                return True
        return False


class GatewayStreams:
    """The service's end for one sandbox: keeps ``standby`` streams open on ``channel`` (to the
    gateway of the sandbox's node, naming its task) and serves each connection one brings with
    ``proxy``. :meth:`start`, then :meth:`aclose` (which ends every stream and connection)."""

    def __init__(self, channel: grpc.aio.Channel, proxy: ConnectionHandler, *, standby: int = 4) -> None:
        if standby < 1:
            raise ValueError(f"standby must be at least 1, got {standby!r}")
        self._channel = channel
        self._proxy = proxy
        self._standby = standby
        self._slots: list[asyncio.Task[None]] = []
        self._carrying: set[asyncio.Task[None]] = set()
        self._ready = asyncio.Event()
        self._settled = asyncio.Event()  # ready, or refused for good (not UNAVAILABLE)
        self._refusal = ""
        self._closing = False

    async def start(self) -> None:
        """Open the standby streams and wait up to :data:`START_SECONDS` until the gateway has
        reached the task's relay (ConnectionError, everything closed, when it has not, or at
        once when the gateway refuses for good: a wrong token, an unknown or lost task)."""
        if self._slots:
            raise RuntimeError("GatewayStreams start once")
        self._slots = [asyncio.ensure_future(self._keep()) for _ in range(self._standby)]
        try:
            await asyncio.wait_for(self._settled.wait(), START_SECONDS)
        except TimeoutError:
            pass
        except BaseException:
            await self.aclose()
            raise
        if not self._ready.is_set():
            await self.aclose()
            raise ConnectionError(f"the gateway did not reach the sandbox's egress relay: "
                                  f"{self._refusal or f'no answer within {START_SECONDS:g} s'}")

    async def aclose(self) -> None:
        self._closing = True  # a slot whose cancellation grpcio turned into a status sees it
        tasks = [*self._slots, *self._carrying]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep(self) -> None:
        """One standby slot: a stream that waits; once it carries a connection, the next one."""
        pause = RETRY_SECONDS[0]
        while not self._closing:
            call = self._channel.stream_stream(METHOD)()
            try:
                if await call.read() == READY:
                    self._ready.set()
                    self._settled.set()
                    pause = RETRY_SECONDS[0]
                    if await call.read() == STARTED:
                        self._carry(call)
                        continue
                else:  # the stream ended at once: the gateway refused it
                    self._refused(await call.code(), await call.details())
            except grpc.aio.AioRpcError as error:  # the gateway is down, restarting, or refuses
                self._refused(error.code(), error.details())
            call.cancel()
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_SECONDS[1])

    def _refused(self, code: grpc.StatusCode, details: str | None) -> None:
        """Note why the gateway ended a stream before it carried a connection; any status but
        UNAVAILABLE (down, restarting, the relay not answering yet) is for good."""
        self._refusal = f"{code.name}: {details}"
        if code != grpc.StatusCode.UNAVAILABLE:
            self._settled.set()

    def _carry(self, call: grpc.aio.StreamStreamCall) -> None:
        task = owning_task(self._serve(call), call.cancel)
        self._carrying.add(task)
        task.add_done_callback(self._carrying.discard)

    async def _serve(self, call: grpc.aio.StreamStreamCall) -> None:
        """Give the proxy one end of a socketpair and copy the stream through the other."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setblocking(False)
        theirs.setblocking(False)
        handling = owning_task(self._proxy.handle(theirs), theirs.close)
        try:
            await pipe(ours, call)
        except (OSError, grpc.aio.AioRpcError):
            pass  # one side ended abruptly: both end
        except asyncio.CancelledError:
            handling.cancel()
            raise
        finally:
            call.cancel()
            ours.close()
            await asyncio.gather(handling, return_exceptions=True)
