"""The egress relay: commands' proxy connections, carried to the host's proxy over connections
the host dialed in.

::

    command ──TCP──► 127.0.0.1:PORT (and [::1]:PORT when the container has IPv6 loopback)
                       │ takes one standby connection, writes HANDOVER, then pipes both ways
                       ▼
    /run/protolink/egress.sock   the host keeps standby connections open here (RelayDialer)

The host dials in; the container never dials out: it has no network, and under gVisor
(``--host-uds=create``) a container may create a socket on a host mount for the host to
connect to, but not connect to one the host made. The socket is created by the owner of the
channel directory (the server acts as it for a moment), in that owner's mode-0700 directory:
commands cannot open it. Everything is bounded: at most ``max_standby`` standby connections
are held (more are closed at once), at most ``max_tunnels`` command connections are open or
waiting (more are closed at once), and a command connection waits at most
``standby_seconds`` for a standby one (none: it is closed); a tunnel buffers at most
:data:`WRITE_BUFFER_BYTES` a direction for a slow reader. Paired connections are joined at the
transport level (:class:`_End`). The relay decides nothing: the host's proxy reads the request
and applies the policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections import deque
from dataclasses import dataclass

from protolink.wire.egress import HANDOVER

from .privileges import acting_as

#: What the stream of a connection reads ahead before it is paired (a request head, usually).
CHUNK = 128 * 1024
#: What a direction of a tunnel buffers for a slow reader before it stops reading its writer:
#: some 64 tunnels carrying data (the proxy's limit) cost the server tens of MiB, not hundreds.
WRITE_BUFFER_BYTES = 256 * 1024
#: Hosts whose connections commands make directly, not through the proxy.
NO_PROXY = "localhost,127.0.0.1,::1"

log = logging.getLogger("sandbox")

_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@dataclass(frozen=True)
class RelayLimits:
    """How many standby connections the relay holds, how many tunnels (open or waiting for a
    standby connection) it carries, and how long a command's connection waits for a standby one."""

    max_standby: int = 32
    max_tunnels: int = 256
    standby_seconds: float = 10.0


def proxy_environment(port: int) -> dict[str, str]:
    """The variables that send commands' HTTP, HTTPS and other proxied traffic to the relay on ``port``."""
    url = f"http://127.0.0.1:{port}"
    env = {}
    for name, value in (("HTTP_PROXY", url), ("HTTPS_PROXY", url), ("ALL_PROXY", url), ("NO_PROXY", NO_PROXY)):
        env[name] = env[name.lower()] = value
    return env


class EgressRelay:
    """Listens for commands on loopback ``port`` and for the host's standby connections on the
    Unix socket ``socket_path``; see the module's docstring. :meth:`start`, then :meth:`aclose`."""

    def __init__(self, port: int, socket_path: str, *, command_uid: int, limits: RelayLimits = RelayLimits()) -> None:
        self._port = port
        self._socket_path = socket_path
        self._command_uid = command_uid
        self._limits = limits
        self._servers: list[asyncio.Server] = []
        self._idle: deque[_Stream] = deque()
        self._waiters: deque[asyncio.Future[_Stream]] = deque()
        self._tunnels: set[asyncio.Task[None]] = set()
        self._joined: set[_End] = set()
        self._closed = False

    @property
    def port(self) -> int:
        """The loopback port commands connect to (the one the system picked, for port 0)."""
        return self._port

    @property
    def tunnels(self) -> int:
        """Command connections open or waiting for a standby connection."""
        return len(self._tunnels)

    @property
    def standby(self) -> int:
        """Standby connections held and still open."""
        return sum(not _ended(stream) for stream in self._idle)

    async def start(self) -> None:
        """Create the Unix socket (as its directory's owner) and the loopback listeners."""
        try:
            self._servers.append(await asyncio.start_unix_server(
                self._standby_arrived, sock=self._unix_socket(), limit=CHUNK))
            for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
                sock = _loopback_socket(family, address, self._port)
                if sock is not None:
                    self._port = sock.getsockname()[1]
                    self._servers.append(await asyncio.start_server(self._command_arrived, sock=sock, limit=CHUNK))
        except BaseException:
            await self.aclose()
            raise
        log.info("egress relay on 127.0.0.1:%d, standby connections at %s", self._port, self._socket_path)

    async def aclose(self) -> None:
        """Stop listening and close every standby connection and tunnel."""
        self._closed = True
        for server in self._servers:
            server.close()
        while self._idle:
            _close(self._idle.popleft())
        for waiter in self._waiters:
            waiter.cancel()  # the command's connection is closed: no standby connection came
        for end in list(self._joined):
            end.transport.abort()  # its tunnel ends
        tunnels = list(self._tunnels)
        if tunnels:
            await asyncio.wait(tunnels)

    def _unix_socket(self) -> socket.socket:
        """The listening Unix socket, bound by the owner of its directory: uid 0 without
        CAP_DAC_OVERRIDE cannot create anything in the host user's private directory."""
        directory = os.path.dirname(self._socket_path)
        owner = os.stat(directory)
        if owner.st_uid == self._command_uid:
            raise SystemExit(f"the egress socket's directory {directory} belongs to the command user")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with acting_as(owner.st_uid, owner.st_gid):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._socket_path)
                sock.bind(self._socket_path)
                with contextlib.suppress(PermissionError):  # gVisor refuses chmod of a socket on a host
                    os.chmod(self._socket_path, 0o600)  # mount; the private directory keeps others out
            sock.listen(self._limits.max_standby)
        except BaseException:
            sock.close()
            raise
        return sock

    def _standby_arrived(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        stream = (reader, writer)
        alive = [held for held in self._idle if not _ended(held)]
        for held in self._idle:
            if _ended(held):
                _close(held)
        self._idle = deque(alive)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(stream)
                return
        if self._closed or len(self._idle) >= self._limits.max_standby:
            _close(stream)
            return
        self._idle.append(stream)

    async def _command_arrived(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        command = (reader, writer)
        if self._closed or len(self._tunnels) >= self._limits.max_tunnels:
            _close(command)
            return
        task = asyncio.current_task()
        assert task is not None
        self._tunnels.add(task)
        host: _Stream | None = None
        try:
            host = await self._take_standby()
            if host is None:
                log.warning("egress: no standby connection from the host within %gs; a command's connection closed",
                            self._limits.standby_seconds)
                return
            await self._join(command, host)
        finally:
            self._tunnels.discard(task)
            _close(command)
            if host is not None:
                _close(host)

    async def _join(self, command: _Stream, host: _Stream) -> None:
        """Hand ``host`` over (HANDOVER), then carry bytes both ways until the host's side
        ends (the proxy is done, or closed it) or either connection is lost. A command that
        half-closes its side still gets the answer."""
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ends = _End(command, ended, up=True), _End(host, ended, up=False)
        ends[0].peer, ends[1].peer = ends[1], ends[0]
        self._joined.update(ends)
        try:
            pending = [end.take_over() for end in ends]
            ends[1].transport.write(HANDOVER)
            for end, (buffered, eof) in zip(ends, pending, strict=True):
                if buffered:
                    end.data_received(buffered)
                if eof:
                    end.eof_received()
                if end.transport.is_closing():
                    end.finish()
            await ended
        finally:
            self._joined.difference_update(ends)

    async def _take_standby(self) -> _Stream | None:
        """A live standby connection, waiting for one up to ``standby_seconds``; None if none came."""
        while self._idle:
            stream = self._idle.popleft()
            if not _ended(stream):
                return stream
            _close(stream)
        waiter: asyncio.Future[_Stream] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait((waiter,), timeout=self._limits.standby_seconds)
        except asyncio.CancelledError:
            if waiter.done():  # handed over in the same instant
                _close(waiter.result())
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
        return None if waiter.cancelled() else waiter.result()


def _loopback_socket(family: socket.AddressFamily, address: str, port: int) -> socket.socket | None:
    """A listening socket on ``address``:``port``; None when the container has no such loopback
    address (IPv6 is often off). No SO_REUSEPORT: no command can bind the same port beside it."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, port))
        sock.listen(1024)
    except OSError as error:
        sock.close()
        if family == socket.AF_INET6 and error.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            return None
        raise SystemExit(f"the egress relay cannot listen on {address}:{port}: {error.strerror}") from None
    sock.setblocking(False)
    return sock


class _End(asyncio.Protocol):
    """One connection of a tunnel, taken over from its stream: what it receives is written
    straight to its peer (no coroutine per chunk), and while the peer's write buffer is full
    this connection is not read (back-pressure both ways)."""

    def __init__(self, stream: _Stream, ended: asyncio.Future[None], *, up: bool) -> None:
        self.up = up  # the command's connection, whose bytes go up to the host
        self.transport: asyncio.Transport = stream[1].transport  # type: ignore[assignment]
        self.peer: _End
        self._reader = stream[0]
        self._stream_protocol = self.transport.get_protocol()
        self._ended = ended

    def take_over(self) -> tuple[bytes, bool]:
        """Become the transport's protocol; what its stream had read and not handed out, and
        whether it had seen the end. (StreamReader offers no public way to take its buffer
        without awaiting; ``_buffer`` and ``_eof`` are as old as asyncio.)"""
        self.transport.set_protocol(self)
        self.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        buffered = bytes(self._reader._buffer)  # type: ignore[attr-defined]
        self._reader._buffer.clear()  # type: ignore[attr-defined]
        self.transport.resume_reading()  # the stream may have paused it, its buffer full
        return buffered, bool(self._reader._eof)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.peer.transport.is_closing():
            self.peer.transport.write(data)

    def eof_received(self) -> bool:
        if not self.up:  # the proxy is done: so is the tunnel
            self.finish()
        elif self.peer.transport.can_write_eof() and not self.peer.transport.is_closing():
            self.peer.transport.write_eof()  # the command half-closed: its answer may still come
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._stream_protocol.connection_lost(exc)  # the stream's own bookkeeping
        self.finish()

    def pause_writing(self) -> None:
        self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        self.peer.transport.resume_reading()

    def finish(self) -> None:
        """End the tunnel (its connections are closed by the one who joined them)."""
        if not self._ended.done():
            self._ended.set_result(None)


def _ended(stream: _Stream) -> bool:
    return stream[0].at_eof() or stream[1].is_closing()


def _close(stream: _Stream) -> None:
    stream[1].close()
