"""The service's command channel, for its clients on this host: a forwarded Execute call as the
datagrams of :mod:`protolink.wire.pipe_passing`, and a command's output passed on as pipes, so
that a local client reads it as it reads a sandbox's own, not through gRPC twice.

The socket (0600, beside the service's: :func:`~.files.commands_socket`) speaks the protocol a
sandbox's server speaks. The client's first datagram carries its token and the sandbox it names
(:func:`~protolink.wire.pipe_passing.first_datagram`), checked as a forwarded gRPC call's
metadata is (:class:`~.server.Gate`): a refusal is the call's typed failure. Each connection is
one Execute call of that sandbox: on the sandbox's own command channel where it offers one,
else on gRPC. Requests go on as they come (the client's pings answered here; one that names
this connection for its pipes names the sandbox's connection instead), events come back as
they are, and the :class:`~.watched.Commands` of the call become events.

A hand-off from the sandbox is passed on as two new pipes of this service, each fed from the
sandbox's pipe inside the kernel (:func:`~protolink.net.splice.pipe_to_pipe`), so that every
byte is counted in the command's event, and a client that closes its end (it stopped at its cap)
closes the sandbox's. A connection on which no command runs (the client keeps it for its next)
is not the sandbox's use: its idle timeout runs meanwhile (:class:`_InUse`). A connection whose
client sends nothing for
:data:`~protolink.wire.pipe_passing.HOST_SILENT_SECONDS` ends; so does every call in flight to
a sandbox that is deleted or lost, with that typed error (:class:`~.watched.InFlight`). At most
:data:`MAX_CONNECTIONS` connections are served; more are answered ``AT_LIMIT`` (the client uses
gRPC for that call).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from google.protobuf.message import DecodeError

from protolink.errors import SandboxProtocolError
from protolink.execution.output_pipes import PIPE_BYTES, READ_CHUNK_BYTES, READ_INTERVAL_SECONDS
from protolink.net.accepting import Acceptor
from protolink.net.descriptors import receive_next, send_next
from protolink.net.splice import pipe_to_pipe
from protolink.wire._pb import process_pb2
from protolink.wire.pipe_passing import (
    DATAGRAM_BYTES,
    EVENT,
    FAILURE,
    HANDOFF,
    HANDOFF_KIND,
    HOST_SILENT_SECONDS,
    PING,
    PONG,
    accept_greeted,
    close_connection,
    event_datagrams,
    read_first_datagram,
)
from protolink.wire.status import to_status

from ..pipe_connection import ChannelCall, PassedPipes, Unsent
from ..process_stream import grpc_calls
from .channel_hop import HeldChannel, opened_ahead
from .forward import EXECUTE, Target, lost
from .watched import Commands

log = logging.getLogger(__name__)

#: The most connections served at once (each holds a connection to its sandbox too).
MAX_CONNECTIONS = 256
#: How long a new connection may take to send its first datagram.
FIRST_DATAGRAM_SECONDS = 5.0

#: Finds the tenant and the sandbox that a connection's first datagram names: typed refusals.
Resolve = Callable[[Mapping[str, str], str], Awaitable[tuple[str, Target]]]


class CommandRelay:
    """Serves the command channel at ``path`` once :meth:`start` is called; each connection's
    call goes to the sandbox ``resolve`` finds for it, its commands told to ``events``."""

    def __init__(self, path: str, resolve: Resolve, events: Any, *, max_connections: int = MAX_CONNECTIONS) -> None:
        self.path = path
        self._resolve = resolve
        self._events = events
        self._max_connections = max_connections
        self._connections: set[asyncio.Task[None]] = set()
        self._splices: set[asyncio.Task[None]] = set()
        self._listener: socket.socket | None = None
        self._acceptor: Acceptor | None = None

    def start(self) -> None:
        """Listen (the socket born 0600, replacing one a crashed service left)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            listener.bind(self.path)
        except OSError:
            listener.close()
            raise
        finally:
            os.umask(old)
        listener.listen(self._max_connections)
        self._listener = listener
        self._acceptor = Acceptor(listener, self._accept, "the command channel")

    async def aclose(self) -> None:
        """Stop listening; end every call (the sandboxes kill their commands) and every pipe."""
        if self._listener is not None:
            assert self._acceptor is not None
            self._acceptor.close()
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        tasks = [*self._connections, *self._splices]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _accept(self) -> None:
        assert self._listener is not None
        greeted = accept_greeted(self._listener, at_limit=len(self._connections) >= self._max_connections)
        if greeted is None:
            return
        connection, key = greeted
        task = asyncio.ensure_future(_Connection(connection, key, self._splices).serve(self._resolve, self._events))
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)


class _ClientGone(Exception):
    """The client closed its connection, or broke the protocol."""


class _InUse:
    """Counts a call in flight to its sandbox while it is in use: while a command runs on it or
    a command's output is still passed on. A connection the client keeps open for its next
    command is not use: the sandbox's idle timeout runs meanwhile, as it does between a remote
    client's gRPC calls, and ends from the sandbox's last command or output."""

    def __init__(self, target: Target, call: Any, watch: Commands) -> None:
        self._target, self._call, self._watch = target, call, watch
        self._counted = self._closed = False

    def settle(self) -> None:
        """Count the call in (canceled at once if its sandbox has gone), or out, as its use says."""
        busy = self._watch.busy and not self._closed
        if busy != self._counted:
            self._counted = busy
            if busy:
                self._target.calls.add(self._call)
            else:
                self._target.calls.discard(self._call)
        if not busy:
            self._target.last_used = time.time()

    def close(self) -> None:
        """The call has ended: counted out for good."""
        self._closed = True
        self.settle()


class _Connection:
    """One client connection, served as one Execute call of its sandbox."""

    def __init__(self, sock: socket.socket, key: bytes, splices: set[asyncio.Task[None]]) -> None:
        self._sock = sock
        self._key = key
        self._splices = splices
        self._client_gone = False
        self._failure: Exception | None = None  # a request that could not go on

    async def serve(self, resolve: Resolve, events: Any) -> None:
        try:
            try:
                async with asyncio.timeout(FIRST_DATAGRAM_SECONDS):
                    first = await self._receive()
                metadata = read_first_datagram(first)
                if metadata is None:
                    raise SandboxProtocolError("the command channel's first datagram is not an authorization")
                tenant, target = await resolve(metadata, EXECUTE)
                if target.state == "lost":
                    raise lost(target)
            except (_ClientGone, TimeoutError):
                return  # gone, or silent: nothing to answer
            except Exception as error:  # noqa: BLE001 (a refusal: the call's typed failure)
                self._fail(error)
                return
            await self._relay(target, Commands(events, tenant, target.id))
        finally:
            close_connection(self._sock)

    async def _relay(self, target: Target, watch: Commands) -> None:
        try:
            upstream = await _upstream(target)
        except Exception as error:  # noqa: BLE001 (its server not reached: the call's typed failure)
            self._fail(error)
            return
        in_use = _InUse(target, upstream, watch)
        requests = asyncio.ensure_future(self._requests(upstream, watch, in_use))
        try:
            async for item in upstream:
                if isinstance(item, PassedPipes):
                    await self._pass_on(item, watch, in_use)
                    continue
                watch.event(item)
                in_use.settle()
                for piece in event_datagrams(item):
                    await self._send([EVENT, piece])
        except _ClientGone:
            pass
        except Exception as error:  # noqa: BLE001 (the sandbox's failure, or the end InFlight was given)
            if not self._client_gone:
                self._fail(self._failure or target.calls.ended or error)
        finally:
            requests.cancel()
            await asyncio.wait([requests])  # it no longer watches the connection, which closes next
            upstream.cancel()
            in_use.close()
            watch.call_ended()

    async def _requests(self, upstream: Any, watch: Commands, in_use: _InUse) -> None:
        """Send the client's requests on; answer its pings. Its close, its silence or a request
        that cannot go on ends the call."""
        try:
            while True:
                async with asyncio.timeout(HOST_SILENT_SECONDS):
                    data = await self._receive()
                if data == PING:
                    with contextlib.suppress(OSError):  # full: the client is behind on reading, and knows it
                        self._sock.sendmsg([PONG], [], socket.MSG_DONTWAIT)
                    continue
                try:
                    request = process_pb2.ExecuteRequest.FromString(data)
                except DecodeError:
                    self._failure = ValueError("an Execute request that does not parse")
                    return
                pipes = request.pipe_connection == self._key and isinstance(upstream, ChannelCall)
                request.ClearField("pipe_connection")
                watch.started(request)
                in_use.settle()  # a deleted sandbox's call is canceled here, and the request not sent
                await (upstream.write(request, pipes=True) if pipes else upstream.write(request))
        except (_ClientGone, TimeoutError):
            self._client_gone = True
        except Unsent:
            pass  # the call has ended: its reader says why
        finally:
            upstream.cancel()

    async def _pass_on(self, passed: PassedPipes, watch: Commands, in_use: _InUse) -> None:
        """Hand the client two pipes of its own, fed from ``passed`` (the sandbox's)."""
        stdout, stdout_sink = os.pipe2(os.O_CLOEXEC)
        stderr, stderr_sink = os.pipe2(os.O_CLOEXEC)
        try:
            await self._send([HANDOFF.pack(HANDOFF_KIND, passed.request_id)], (stdout, stderr))
        except BaseException:
            for fd in (stdout_sink, stderr_sink):
                os.close(fd)
            passed.close()
            raise
        finally:
            os.close(stdout)
            os.close(stderr)
        watch.piping(passed.request_id, 2)
        for source, sink in ((passed.stdout, stdout_sink), (passed.stderr, stderr_sink)):
            task = asyncio.ensure_future(_passed_on(source, sink, passed.request_id, watch, in_use))
            self._splices.add(task)
            task.add_done_callback(self._splices.discard)

    async def _receive(self) -> bytes:
        """The client's next datagram; :class:`_ClientGone` once it has closed the connection or
        broken the protocol (a datagram too long, descriptors attached)."""
        try:
            data, fds, flags = await receive_next(self._sock, DATAGRAM_BYTES + 1, 1)
        except OSError as error:
            raise _ClientGone() from error
        for fd in fds:
            os.close(fd)
        if not data or fds or len(data) > DATAGRAM_BYTES or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise _ClientGone()
        return data

    async def _send(self, parts: list[bytes], fds: tuple[int, ...] = ()) -> None:
        """Send one datagram, waiting while the client's side is full (back-pressure);
        :class:`_ClientGone` once it has closed the connection."""
        try:
            await send_next(self._sock, parts, fds)
        except OSError as error:
            raise _ClientGone() from error

    def _fail(self, error: BaseException) -> None:
        """Tell the client what ended its call, if it still listens."""
        with contextlib.suppress(OSError):
            self._sock.sendmsg([FAILURE, to_status(error)[1].SerializeToString()], [], socket.MSG_DONTWAIT)

async def _upstream(target: Target) -> Any:
    """An Execute call to ``target``: on its command channel where it offers one (the one a
    pooled sandbox holds open, else a new one greeted and sent
    :data:`~protolink.sandbox.process_stream.OPENING`), else on gRPC."""
    held = target.held_call()
    if isinstance(held, HeldChannel):
        if (taken := await held.take()) is not None:
            return taken
    elif held is not None:
        held.cancel()  # a gRPC call held for the first command: this one goes on its own
    calls = target.command_channel()
    call = await opened_ahead(calls) if calls is not None else None
    return call if call is not None else grpc_calls(target.channel(), ())()


async def _passed_on(source: int, sink: int, request_id: int, watch: Commands, in_use: _InUse) -> None:
    """One pipe of a process passed on, counted, then closed."""
    try:
        await pipe_to_pipe(source, sink, pipe_bytes=PIPE_BYTES, worth_bytes=READ_CHUNK_BYTES,
                           pause_seconds=READ_INTERVAL_SECONDS, counted=lambda size: watch.output(request_id, size))
    except OSError as error:
        log.warning("a command's output pipe could not be passed on: %s", error)
    finally:
        os.close(source)
        os.close(sink)
        watch.piped(request_id)
        in_use.settle()
