"""The host's end of the egress link: standby connections dialed into the sandbox's relay.

The relay (``protolink_sandboxd.egress_relay``, inside the container) listens on
:data:`~protolink.wire.egress.SOCKET_NAME` in the channel directory; the host dials in and
waits. When a command connects to the relay, the relay writes
:data:`~protolink.wire.egress.HANDOVER` on one standby connection, either with the command's
socket attached (the proxy then serves that socket itself, and the standby connection waits for
the next) or alone, the relay piping the command's bytes over that connection (the proxy serves
the standby connection, and :class:`RelayDialer` dials a replacement at once). A descriptor that
is not a connected TCP socket is closed unread. The host never listens: the container cannot
reach anything the host made.
"""

from __future__ import annotations

import array
import asyncio
import logging
import socket
from pathlib import Path
from typing import Protocol

from protolink.wire.egress import HANDOVER

log = logging.getLogger(__name__)

#: The largest read the proxy's side of a connection buffers before it waits for its reader.
CHUNK = 256 * 1024
#: Pauses between attempts while the relay's socket is missing or refuses (doubling, then the most).
RETRY_SECONDS = (0.05, 1.0)
#: How long :meth:`RelayDialer.start` waits for the relay to answer.
START_SECONDS = 10.0


class ConnectionHandler(Protocol):
    """What serves a command's connection, start to end (an EgressProxy)."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None: ...


class RelayDialer:
    """Keeps ``standby`` connections open to the relay's Unix socket ``socket_path`` and gives
    each one the relay hands a command's connection to ``proxy.handle``, dialing a replacement
    at once. :meth:`start`, then :meth:`aclose` (which ends every connection it holds or handles)."""

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
        """One standby slot: wait for a handover on ``standby`` and serve it; dial the next when
        the relay took the connection itself, or closed it; forever."""
        pause = RETRY_SECONDS[0]
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
                    if handed is not None:
                        handed.close()
                    standby.close()
                    standby = None
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, RETRY_SECONDS[1])
                    continue
                pause = RETRY_SECONDS[0]
                if handed is None:  # the relay pipes the command's bytes over this connection
                    standby, piped = None, standby
                    self._serve(piped)
                elif _is_tcp_connection(handed):
                    self._serve(handed)
                else:
                    log.warning("the egress relay handed over a descriptor that is not a TCP connection; closed")
                    handed.close()
        finally:
            if standby is not None:
                standby.close()

    def _serve(self, sock: socket.socket) -> None:
        task = asyncio.ensure_future(self._handle(sock))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _handle(self, sock: socket.socket) -> None:
        writer = None
        try:
            if sock.family == socket.AF_UNIX:
                reader, writer = await asyncio.open_unix_connection(sock=sock, limit=CHUNK)
            else:
                reader, writer = await asyncio.open_connection(sock=sock, limit=CHUNK)
            await self._proxy.handle(reader, writer)
        except Exception:  # the proxy promises never to raise; one connection's failure must not end others
            log.exception("the egress proxy failed on a connection")
        finally:
            if writer is not None:
                writer.close()
            else:
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


async def _receive(standby: socket.socket) -> tuple[bytes, socket.socket | None]:
    """The next byte the relay writes on ``standby`` (b"": it closed, or failed) and the socket
    that came with it, if one did. Descriptors beyond one are closed."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, ancillary, flags, _ = standby.recvmsg(
                1, socket.CMSG_SPACE(_INT.itemsize), socket.MSG_CMSG_CLOEXEC)
            break
        except BlockingIOError:
            pass
        except OSError:
            return b"", None
        ready = loop.create_future()
        loop.add_reader(standby.fileno(), lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_reader(standby.fileno())
    descriptors = array.array("i")
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            descriptors.frombytes(payload[:len(payload) - len(payload) % _INT.itemsize])
    handed = None
    for descriptor in descriptors:
        if handed is None and not flags & socket.MSG_CTRUNC:
            try:
                handed = socket.socket(fileno=descriptor)
                continue
            except OSError:  # not a socket
                pass
        socket.close(descriptor)
    return data, handed


def _is_tcp_connection(sock: socket.socket) -> bool:
    """Whether ``sock`` is a connected TCP socket (what the relay hands over, and nothing else);
    made non-blocking when it is."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return False
    try:
        sock.getpeername()
    except OSError:
        return False
    sock.setblocking(False)
    return True


_INT = array.array("i")
