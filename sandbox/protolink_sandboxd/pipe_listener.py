"""The command channel: Execute for a host on this machine, without gRPC, and commands' output
pipes handed to it (:mod:`protolink.wire.pipe_passing`).

Through grpc.aio a command's request and its answers are each handed between grpc's threads and
this server's event loop, most of this server's CPU for a short command. A host on this machine
connects here instead: each connection is one Execute call, its requests and events one datagram
each, served by the same :class:`~protolink_sandboxd.execute.ProcessCall` as the gRPC method,
read and written on the event loop itself. Where the host asks for it, the read ends of a
command's pipes go to the host, and the host reads them as it reads its own commands'
(:class:`protolink.execution.output_pipes.OutputPipes`): the output never passes through this
process, which keeps the supervision (start, timeout, group kill, exit) and no copy of them.

The socket is created by the owner of the socket directory, as the server's own, so commands
cannot open it. A connection is greeted with its key and a pipe's read end (the proof that the
kernel passes descriptors to the host); a connection that cannot take it is closed and the host
keeps to gRPC. Its first datagram must carry the token when the server has one; its pings are
answered, and a host silent for HOST_SILENT_SECONDS is gone. At most
``max_connections`` connections are held (more are answered ``AT_LIMIT`` and closed at once).
Each request is handed to the call as it is read (:meth:`~protolink_sandboxd.execute.ProcessCall.take`),
and a connection is not read while MAX_WAITING of its call's events wait to be sent, nor while
the call takes no requests (a process's stdin is full); a hand-off that would wait
(the host does not read its connection) is not made, and that command's output comes as events.
A closed connection, or one that breaks the protocol, is a canceled call: its processes are
killed and reaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from protolink.errors import SandboxAuthenticationError
from protolink.net.accepting import Acceptor
from protolink.net.descriptors import rights, send_next
from protolink.wire._pb import errors_pb2
from protolink.wire.pipe_passing import (
    AUTHORIZATION,
    DATAGRAM_BYTES,
    EVENT,
    FAILURE,
    HANDOFF,
    HANDOFF_KIND,
    HOST_SILENT_SECONDS,
    PING,
    PONG,
    SOCKET_NAME,
    accept_greeted,
    close_connection,
    event_datagrams,
)
from protolink.wire.status import to_status

from .config import ServerConfig
from .owned_socket import unix_listener

log = logging.getLogger("sandbox")


class Call(Protocol):
    """One Execute call (:class:`~protolink_sandboxd.execute.ProcessCall`): its requests in, one
    by one, its events out, serialized."""

    @property
    def waiting(self) -> int:
        """How many of its events wait to be taken from :meth:`events`."""

    def take(self, request: bytes) -> asyncio.Future[None] | None:
        """Act on one request now; one that fails the call makes :meth:`events` raise. A future
        when the call takes no more requests until it is done."""

    def events(self) -> AsyncIterator[bytes]:
        """The call's events until it fails or is closed."""

    async def aclose(self) -> None:
        """Take no more requests; end what the call started."""


#: A new Execute call per connection.
Calls = Callable[[], Call]
#: The most datagrams taken from a connection in one go, so that one host cannot hold the loop.
MAX_AT_ONCE = 64
#: The most events of a connection's call waiting to be sent; beyond, the connection is not read
#: until some are sent (the host's sends wait for room: back-pressure, not memory).
MAX_WAITING = 256


class PipeListener:
    """Listens on :data:`~protolink.wire.pipe_passing.SOCKET_NAME` in ``directory``, serves each
    connection as an Execute call once :meth:`serve` is called, and hands output pipes to the
    connections there, by key."""

    def __init__(self, directory: str, *, command_uid: int, max_connections: int) -> None:
        self._path = os.path.join(directory, SOCKET_NAME)
        self._max_connections = max_connections
        self._channels: dict[bytes, _Channel] = {}
        self._calls: Calls | None = None
        self._acceptor: Acceptor | None = None
        self._token_allows: Callable[[bytes], bool] = lambda _: True
        self._listener = unix_listener(self._path, command_uid, max_connections)

    @classmethod
    def beside(cls, config: ServerConfig) -> PipeListener | None:
        """The listener beside the server's Unix socket; None for a TCP server (not this host's)."""
        if config.tcp:
            return None
        return cls(os.path.dirname(config.socket_path), command_uid=config.command_uid,
                   max_connections=config.max_concurrency)

    def serve(self, calls: Calls, token_allows: Callable[[bytes], bool] | None = None) -> None:
        """Accept connections from now on, each served as the Execute call ``calls`` makes once
        ``token_allows`` the authorization metadata its first datagram carries (the gRPC calls'
        own check, :class:`~protolink_sandboxd.server.TokenCheck`; None: a server without a token)."""
        self._calls = calls
        if token_allows is not None:
            self._token_allows = token_allows
        self._acceptor = Acceptor(self._listener, self._accept, "pipes")

    def hand_off(self, key: bytes, request_id: int, stdout: int, stderr: int) -> bool:
        """Send the read ends ``stdout`` and ``stderr`` of request ``request_id`` on the
        connection of ``key``: True once sent (the caller then closes its copies); False when
        there is no such connection or it cannot take them now."""
        channel = self._channels.get(key)
        return channel is not None and channel.hand_off(request_id, stdout, stderr)

    async def aclose(self) -> None:
        """Stop listening; end every connection's call (its processes killed and reaped)."""
        if self._acceptor is not None:
            self._acceptor.close()
        self._listener.close()
        channels = list(self._channels.values())
        for channel in channels:
            channel.end()
        await asyncio.gather(*(channel.ended for channel in channels), return_exceptions=True)

    def _accept(self) -> None:
        assert self._calls is not None
        greeted = accept_greeted(self._listener, at_limit=len(self._channels) >= self._max_connections)
        if greeted is None:
            return
        connection, key = greeted
        channel = _Channel(connection, self._calls, self._authorized)
        self._channels[key] = channel
        channel.ended.add_done_callback(lambda _: self._channels.pop(key, None))

    def _authorized(self, first: bytes) -> bool:
        """Whether the host's first datagram is an authorization this server takes."""
        return first.startswith(AUTHORIZATION) and self._token_allows(first.removeprefix(AUTHORIZATION))


class _Channel:
    """One connection, served as one Execute call until either side ends it."""

    def __init__(self, sock: socket.socket, calls: Calls, authorized: Callable[[bytes], bool]) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._call = calls()
        self._authorized = authorized
        self._admitted: asyncio.Future[None] = self._loop.create_future()
        self._paused = False  # not read while MAX_WAITING events wait
        self._blocked: asyncio.Future[None] | None = None  # nor while the call takes no requests
        self._heard_at = self._loop.time()
        self._silence = self._loop.call_later(HOST_SILENT_SECONDS, self._check_silence)
        self._loop.add_reader(sock.fileno(), self._receive)
        self._task = asyncio.ensure_future(self._serve())
        #: Done once the call has ended and the connection is closed.
        self.ended: asyncio.Future[None] = self._loop.create_future()
        self._task.add_done_callback(self._closed)

    def hand_off(self, request_id: int, stdout: int, stderr: int) -> bool:
        try:
            self._sock.sendmsg([HANDOFF.pack(HANDOFF_KIND, request_id)], rights((stdout, stderr)),
                               socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            self.end()
            return False
        return True

    def end(self) -> None:
        """Cancel the call: its processes are killed and reaped, then the connection closes."""
        self._task.cancel()

    def _receive(self) -> None:
        """Hand the requests that have come to the call, answer pings; the first must be the
        authorization. The host's close (or a datagram too long, or a descriptor sent along)
        ends the call; MAX_WAITING events waiting stop the reading (:meth:`_serve` resumes it), as
        does a call that takes no requests for a while (until it takes them again)."""
        self._heard_at = self._loop.time()
        if self._task.done():  # the call has ended (perhaps before its first step): nothing more starts
            return
        for _ in range(MAX_AT_ONCE):
            try:
                data, _, flags, _ = self._sock.recvmsg(DATAGRAM_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data, flags = b"", 0
            if not data or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                self._loop.remove_reader(self._sock.fileno())
                self.end()
                return
            if data == PING:
                with contextlib.suppress(OSError):  # full: the host is behind on reading, and knows it
                    self._sock.sendmsg([PONG], [], socket.MSG_DONTWAIT)
                continue
            if self._admitted.done():
                if (blocked := self._call.take(data)) is not None:
                    self._loop.remove_reader(self._sock.fileno())
                    self._blocked = blocked
                    blocked.add_done_callback(self._unblocked)
                    return
            elif not self._admit(data):
                self._loop.remove_reader(self._sock.fileno())
                return
            if self._call.waiting >= MAX_WAITING:
                self._loop.remove_reader(self._sock.fileno())
                self._paused = True
                return

    def _unblocked(self, _: asyncio.Future[None]) -> None:
        self._blocked = None
        self._resume()

    def _resume(self) -> None:
        """Read the connection again, unless the call has ended or something still stops it."""
        if not self._task.done() and not self._paused and self._blocked is None:
            self._loop.add_reader(self._sock.fileno(), self._receive)

    def _admit(self, first: bytes) -> bool:
        """Take the host's first datagram as its authorization: whether it is one this server takes."""
        if self._authorized(first):
            self._admitted.set_result(None)
            return True
        self._admitted.set_exception(SandboxAuthenticationError("missing or wrong token"))
        return False

    def _check_silence(self) -> None:
        """End the call of a host that has sent nothing for HOST_SILENT_SECONDS (it pings)."""
        if self._paused or self._blocked is not None:  # the host is waiting for this call, not silent
            self._heard_at = self._loop.time()
        if self._loop.time() - self._heard_at >= HOST_SILENT_SECONDS:
            log.info("commands: a host sent nothing for %g s; its call ends", HOST_SILENT_SECONDS)
            self.end()
            return
        self._silence = self._loop.call_at(self._heard_at + HOST_SILENT_SECONDS, self._check_silence)

    async def _serve(self) -> None:
        try:
            await self._admitted
            async with contextlib.aclosing(self._call.events()) as events:
                async for event in events:
                    for piece in event_datagrams(event):
                        await send_next(self._sock, [EVENT, piece])
                    if self._paused and self._call.waiting < MAX_WAITING:
                        self._paused = False
                        self._resume()
        except OSError:
            pass  # the host has gone: the call is canceled
        except Exception as error:  # a request that does not parse, a broken protocol, a refusal
            wire = to_status(error)[1]
            if wire.kind == errors_pb2.ERROR_KIND_INTERNAL:
                log.error("internal error", exc_info=error)  # as the gRPC method logs it
            with contextlib.suppress(OSError):
                self._sock.sendmsg([FAILURE, wire.SerializeToString()], [], socket.MSG_DONTWAIT)
        finally:
            await self._call.aclose()  # also when canceled before the call's events were iterated

    def _closed(self, _: asyncio.Future[None]) -> None:
        self._silence.cancel()
        self._loop.remove_reader(self._sock.fileno())
        close_connection(self._sock)
        self.ended.set_result(None)
