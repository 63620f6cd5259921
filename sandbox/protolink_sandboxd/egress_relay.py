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
:data:`WRITE_BUFFER_BYTES` a direction for a slow reader. Paired connections are joined by
:class:`protolink.net.join.Join`, as the host's proxy joins its own: inside the kernel (splice
through a pipe a direction) where it can, else at the transport level. The relay decides
nothing: the host's proxy reads the request and applies the policy.
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

from protolink.net.join import Join
from protolink.wire.egress import HANDOVER

from .privileges import acting_as

#: What the stream of a connection reads ahead before it is paired (a request head, usually).
CHUNK = 128 * 1024
#: What a direction of a tunnel buffers (its pipe) for a slow reader before it stops reading its writer:
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
        self._joined: set[Join] = set()
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
        for join in list(self._joined):
            join.abort()  # its tunnel ends
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
        join = Join(command, host, ended_by="server", write_buffer_bytes=WRITE_BUFFER_BYTES)
        self._joined.add(join)
        try:
            await join.run(to_server=HANDOVER)
        finally:
            self._joined.discard(join)

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


def _ended(stream: _Stream) -> bool:
    return stream[0].at_eof() or stream[1].is_closing()


def _close(stream: _Stream) -> None:
    stream[1].close()
