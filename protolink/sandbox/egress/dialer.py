"""The host's end of the egress link: standby connections dialed into the sandbox's relay.

The relay (``protolink_sandboxd.egress_relay``, inside the container) listens on
:data:`~protolink.wire.egress.SOCKET_NAME` in the channel directory; the host dials in and
waits. The relay writes :data:`~protolink.wire.egress.HANDOVER` on a standby connection with
what it gives attached:

- its loopback listeners: :class:`RelayDialer` accepts commands' connections from them itself
  and gives each to the proxy, for as long as that standby connection stays open;
- a command's connection (one the relay accepted while no host held the listeners): the proxy
  serves it; the standby connection waits for the next;
- nothing: the relay pipes the command's bytes over that connection (where sockets cannot be
  passed); the proxy serves the standby connection, and a replacement is dialed at once.

A descriptor that is not a TCP socket (listening, or connected) is closed unused. At most
:data:`MAX_HANDLING` connections are served at once; beyond, a command's connection is closed
at once. The host never listens: the container cannot reach anything the host made.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from pathlib import Path
from typing import Literal, Protocol

from protolink.net.accepting import Acceptor
from protolink.net.descriptors import receive_next
from protolink.net.tasks import owning_task
from protolink.wire.egress import HANDOVER

log = logging.getLogger(__name__)

#: Connections served at once (the proxy refuses beyond its own limit, which is lower); beyond
#: this, a command's connection is closed at once: a flood costs the host no more descriptors.
MAX_HANDLING = 256
#: The most descriptors one HANDOVER carries (a listener for IPv4 and one for IPv6).
MAX_HANDED = 2
#: Pauses between attempts while the relay's socket is missing or refuses (doubling, then the most).
RETRY_SECONDS = (0.05, 1.0)
#: How long :meth:`RelayDialer.start` waits for the relay to answer.
START_SECONDS = 10.0


class ConnectionHandler(Protocol):
    """What serves a command's connection (a non-blocking socket it owns and closes), start to
    end (an EgressProxy)."""

    async def handle(self, sock: socket.socket) -> None: ...


class RelayDialer:
    """Keeps ``standby`` connections open to the relay's Unix socket ``socket_path`` and gives
    every command's connection the relay hands over (see the module's docstring) to
    ``proxy.handle``. :meth:`start`, then :meth:`aclose` (which ends every connection it holds,
    accepts from or handles)."""

    def __init__(self, socket_path: Path, proxy: ConnectionHandler, *, standby: int = 4) -> None:
        if standby < 1:
            raise ValueError(f"standby must be at least 1, got {standby!r}")
        self._path = socket_path
        self._proxy = proxy
        self._standby = standby
        self._keepers: list[asyncio.Task[None]] = []
        self._handling: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def handling(self) -> int:
        """Command connections being served now."""
        return len(self._handling)

    async def start(self) -> None:
        """Dial the first standby connections, waiting up to START_SECONDS for the relay to
        answer (ConnectionError if it does not), and keep that many from then on."""
        if self._keepers or self._closed:
            raise RuntimeError("a RelayDialer starts once")
        deadline = asyncio.get_running_loop().time() + START_SECONDS
        first = []
        try:
            for _ in range(self._standby):
                first.append(await self._dial_until(deadline))
        except BaseException:
            for standby in first:
                standby.close()
            raise
        self._keepers = [asyncio.ensure_future(self._keep(standby)) for standby in first]

    async def aclose(self) -> None:
        """Stop dialing and close every connection, standby or being served."""
        self._closed = True
        tasks = [*self._keepers, *self._handling]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _dial_until(self, deadline: float) -> socket.socket:
        pause = RETRY_SECONDS[0]
        while True:
            try:
                return await _dial(self._path)
            except OSError as error:
                if asyncio.get_running_loop().time() + pause > deadline:
                    raise ConnectionError(
                        f"the sandbox's egress relay does not answer at {self._path}: {error}") from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_SECONDS[1])

    async def _keep(self, standby: socket.socket | None) -> None:
        """One standby slot: wait for a handover on ``standby`` and serve what it brings; dial the
        next when the relay took the connection itself, or closed it; forever."""
        pause = RETRY_SECONDS[0]
        listeners: dict[socket.socket, Acceptor] = {}  # handed over on this standby connection, accepted from while it lasts
        try:
            while True:
                if standby is None:
                    try:
                        standby = await _dial(self._path)
                    except OSError:
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, RETRY_SECONDS[1])
                        continue
                first, handed = await _receive(standby)
                if first != HANDOVER:  # the relay closed it (it stops, or holds enough): dial again after a pause
                    _close_all(handed)
                    _close_all(self._stop_accepting(listeners))
                    standby.close()
                    standby = None
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_SECONDS[1])
                    continue
                pause = RETRY_SECONDS[0]
                if not handed:  # the relay pipes the command's bytes over this connection
                    _close_all(self._stop_accepting(listeners))
                    standby, piped = None, standby
                    self._serve(piped)
                for sock in handed:
                    kind = _tcp_kind(sock)
                    if kind == "connection":
                        self._serve(sock)
                    elif kind == "listener":
                        listeners[sock] = Acceptor(sock, functools.partial(self._accept, sock), "the egress proxy")
                    else:
                        log.warning("the egress relay handed over a descriptor that is not a TCP socket; closed")
                        sock.close()
        finally:
            _close_all(self._stop_accepting(listeners))
            if standby is not None:
                standby.close()

    def _stop_accepting(self, listeners: dict[socket.socket, Acceptor]) -> list[socket.socket]:
        """Stop accepting from ``listeners`` (emptied); what they were, to close."""
        for acceptor in listeners.values():
            acceptor.close()
        stopped = list(listeners)
        listeners.clear()
        return stopped

    def _accept(self, listener: socket.socket) -> None:
        sock, _ = listener.accept()
        if len(self._handling) >= MAX_HANDLING:
            sock.close()
            return
        sock.setblocking(False)
        self._serve(sock)

    def _serve(self, sock: socket.socket) -> None:
        task = owning_task(self._handle(sock), sock.close)
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _handle(self, sock: socket.socket) -> None:
        try:
            await self._proxy.handle(sock)
        except Exception:  # the proxy promises never to raise; one connection's failure must not end others
            log.exception("the egress proxy failed on a connection")
            sock.close()


async def _dial(path: Path) -> socket.socket:
    """A new connection to the relay's socket, non-blocking."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    try:
        await asyncio.get_running_loop().sock_connect(sock, str(path))
    except BaseException:
        sock.close()
        raise
    return sock


async def _receive(standby: socket.socket) -> tuple[bytes, list[socket.socket]]:
    """The next byte the relay writes on ``standby`` (b"": it closed, or failed) and the sockets
    that came with it (at most :data:`MAX_HANDED`; any others, and what is not a socket, are closed)."""
    try:
        data, descriptors, flags = await receive_next(standby, 1, MAX_HANDED)
    except OSError:
        return b"", []
    handed = []
    for descriptor in descriptors:
        if not flags & socket.MSG_CTRUNC:
            try:
                handed.append(socket.socket(fileno=descriptor))
                continue
            except OSError:  # not a socket
                pass
        os.close(descriptor)
    return data, handed


def _tcp_kind(sock: socket.socket) -> Literal["connection", "listener"] | None:
    """What a handed-over socket is: a TCP connection, a listening TCP socket, or neither;
    made non-blocking when it is one of the two."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return None
    sock.setblocking(False)
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return "listener"
    try:
        sock.getpeername()
    except OSError:
        return None
    return "connection"


def _close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()
