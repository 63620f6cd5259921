"""The egress relay: commands' proxy connections, carried to the host's proxy over connections
the host dialed in.

::

    command ──TCP──► 127.0.0.1:PORT (and [::1]:PORT when the container has IPv6 loopback)
                       │ hands the connection to the host (HANDOVER with its descriptor), or
                       │ takes one standby connection, writes HANDOVER, then pipes both ways
                       ▼
    /run/protolink/egress.sock   the host keeps standby connections open here (RelayDialer)

The host dials in; the container never dials out: it has no network, and under gVisor
(``--host-uds=create``) a container may create a socket on a host mount for the host to
connect to, but not connect to one the host made. The socket is created by the owner of the
channel directory (the server acts as it for a moment), in that owner's mode-0700 directory:
commands cannot open it.

The relay passes sockets to the host (``SCM_RIGHTS``) where the kernel can: on the first
standby connection, HANDOVER with its loopback listeners attached. From then on the host accepts
commands' connections itself, and the command's bytes reach the host's proxy with no hop in the
container and no work on the container's CPU, which the commands share. The relay keeps its copy
of the listeners and watches that standby connection: once it ends (the host's daemon stopped),
the relay accepts again and hands the listeners to the next standby connection, and the
connections it accepted meanwhile one by one (HANDOVER with the connection attached). Where the
kernel cannot pass a socket (gVisor's sockets are not the host's: EINVAL), the relay pipes
instead: it writes HANDOVER alone on a standby connection and joins the two with
:class:`protolink.net.tunnel.Tunnel`, the host proxy's own relay (inside the kernel, splice
through a pipe a direction, where it can). The host tells these apart by what is attached. The
relay decides nothing: the host's proxy reads the request and applies the policy.

Everything the relay holds is bounded: at most ``max_standby`` standby connections (more are
closed at once), at most ``max_tunnels`` command connections piped or waiting (more are closed
at once), and a command connection waits at most ``standby_seconds`` for a standby one (none: it
is closed); a piped tunnel buffers at most :data:`PIPE_BYTES` a direction for a slow reader.
What the host accepts, its dialer bounds.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from protolink.net.accepting import Acceptor
from protolink.net.descriptors import rights
from protolink.net.tunnel import Tunnel
from protolink.wire.egress import HANDOVER

from .owned_socket import unix_listener

#: What a direction of a piped tunnel buffers (its pipe) for a slow reader before it stops reading
#: its writer: some 64 tunnels carrying data (the proxy's limit) cost tens of MiB, not hundreds.
PIPE_BYTES = 256 * 1024
#: How long a piped tunnel's last bytes may take to reach a slow reader once its exchange ended.
CLOSE_SECONDS = 10.0
#: Hosts whose connections commands make directly, not through the proxy.
NO_PROXY = "localhost,127.0.0.1,::1"
#: errno values of a standby connection the host has closed.
_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN})

log = logging.getLogger("sandbox")


@dataclass(frozen=True)
class RelayLimits:
    """How many standby connections the relay holds, how many tunnels (piped or waiting for a
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


class _Waiting:
    """A command's connection waiting for a standby one, closed after ``seconds``."""

    def __init__(self, relay: EgressRelay, sock: socket.socket, seconds: float) -> None:
        self.sock = sock
        self.timer = asyncio.get_running_loop().call_later(seconds, relay._expired, self)


class EgressRelay:
    """Listens for commands on loopback ``port`` and for the host's standby connections on the
    Unix socket ``socket_path``; see the module's docstring. :meth:`start`, then :meth:`aclose`."""

    def __init__(self, port: int, socket_path: str, *, command_uid: int, limits: RelayLimits = RelayLimits(),
                 pass_descriptors: bool = True) -> None:
        self._port = port
        self._socket_path = socket_path
        self._command_uid = command_uid
        self._limits = limits
        self._listeners: list[socket.socket] = []  # the Unix socket's, then the loopback ones
        self._acceptors: dict[socket.socket, Acceptor] = {}  # the listeners accepted from now
        self._holder: socket.socket | None = None  # the standby connection whose host holds the loopback listeners
        self._idle: deque[socket.socket] = deque()
        self._busy: set[socket.socket] = set()  # its host's queue is full: used again once it has room
        self._waiting: deque[_Waiting] = deque()
        self._tunnels: set[asyncio.Task[None]] = set()
        self._joined: set[Tunnel] = set()
        self._pass_descriptors = pass_descriptors  # False: pipe every connection; so once the kernel refuses
        self._closed = False

    @property
    def port(self) -> int:
        """The loopback port commands connect to (the one the system picked, for port 0)."""
        return self._port

    @property
    def tunnels(self) -> int:
        """Command connections piped or waiting for a standby connection."""
        return len(self._tunnels) + len(self._waiting)

    @property
    def standby(self) -> int:
        """Standby connections held and still open (the one whose host holds the listeners included)."""
        self._drop_dead()
        return len(self._idle) + len(self._busy) + (self._holder is not None)

    @property
    def handed_over(self) -> bool:
        """Whether a host accepts commands' connections itself now."""
        return self._holder is not None

    async def start(self) -> None:
        """Create the Unix socket (as its directory's owner) and the loopback listeners."""
        try:
            self._listen(self._unix_socket(), self._standby_arrived)
            for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
                sock = _loopback_socket(family, address, self._port)
                if sock is not None:
                    self._port = sock.getsockname()[1]
                    self._listen(sock, self._command_arrived)
        except BaseException:
            await self.aclose()
            raise
        log.info("egress relay on 127.0.0.1:%d, standby connections at %s", self._port, self._socket_path)

    async def aclose(self) -> None:
        """Stop listening and close every standby connection, waiting command and piped tunnel."""
        self._closed = True
        loop = asyncio.get_running_loop()
        for acceptor in self._acceptors.values():
            acceptor.close()
        self._acceptors.clear()
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        if self._holder is not None:
            loop.remove_reader(self._holder.fileno())
            self._holder.close()
            self._holder = None
        for standby in (*self._idle, *self._busy):
            self._discard(standby)
        self._idle.clear()
        while self._waiting:
            waiting = self._waiting.popleft()
            waiting.timer.cancel()
            waiting.sock.close()  # no standby connection came
        for tunnel in list(self._joined):
            tunnel.abort()  # its exchange ends
        tunnels = list(self._tunnels)
        if tunnels:
            await asyncio.wait(tunnels)

    def _listen(self, listener: socket.socket, arrived: Callable[[socket.socket], None]) -> None:
        listener.setblocking(False)
        self._listeners.append(listener)
        self._accept(listener, arrived)

    def _accept(self, listener: socket.socket, arrived: Callable[[socket.socket], None]) -> None:
        """Accept each connection waiting on ``listener`` from now on, to ``arrived``."""
        self._acceptors[listener] = Acceptor(listener, functools.partial(_accept_one, listener, arrived), "egress relay")

    def _unix_socket(self) -> socket.socket:
        """The listening Unix socket, bound by the owner of its directory (:mod:`.owned_socket`)."""
        return unix_listener(self._socket_path, self._command_uid, self._limits.max_standby, socket.SOCK_STREAM)

    def _standby_arrived(self, sock: socket.socket) -> None:
        self._drop_dead()
        if self._closed or len(self._idle) + len(self._busy) >= self._limits.max_standby:
            sock.close()
            return
        self._idle.append(sock)
        self._serve_waiting()
        self._hand_listeners()

    def _command_arrived(self, sock: socket.socket) -> None:
        if self._closed or self.tunnels >= self._limits.max_tunnels:
            sock.close()
            return
        self._waiting.append(_Waiting(self, sock, self._limits.standby_seconds))
        self._serve_waiting()

    def _expired(self, waiting: _Waiting) -> None:
        self._waiting.remove(waiting)
        waiting.sock.close()
        log.warning("egress: no standby connection from the host within %gs; a command's connection closed",
                    self._limits.standby_seconds)

    def _serve_waiting(self) -> None:
        """Give the waiting commands' connections to standby connections, first come first served."""
        while self._waiting and (standby := self._take()) is not None:
            waiting = self._waiting[0]
            sent = self._pass_descriptors and self._send(standby, [waiting.sock])
            if sent is None:
                continue  # that standby connection is gone or full; the command waits for the next
            self._waiting.popleft()
            waiting.timer.cancel()
            if sent:
                self._idle.append(standby)
                waiting.sock.close()  # the host holds the connection now
            else:
                self._pipe(waiting.sock, standby)

    def _hand_listeners(self) -> None:
        """Give the loopback listeners to a host, which accepts commands' connections from then on."""
        loop = asyncio.get_running_loop()
        while self._pass_descriptors and self._holder is None and not self._closed and not self._waiting:
            standby = self._take()
            if standby is None:
                return
            sent = self._send(standby, self._listeners[1:])
            if sent is None:
                continue
            if not sent:
                self._idle.append(standby)
                return
            self._holder = standby
            for listener in self._listeners[1:]:
                self._acceptors.pop(listener).close()
            loop.add_reader(standby.fileno(), self._holder_gone)

    def _holder_gone(self) -> None:
        """The host that held the listeners closed its standby connection (or wrote on it): accept again."""
        assert self._holder is not None
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._holder.fileno())
        self._holder.close()
        self._holder = None
        for listener in self._listeners[1:]:
            self._accept(listener, self._command_arrived)
        self._hand_listeners()

    def _take(self) -> socket.socket | None:
        """A live standby connection, or None."""
        while self._idle:
            standby = self._idle.popleft()
            if _alive(standby):
                return standby
            self._discard(standby)
        return None

    def _send(self, standby: socket.socket, socks: list[socket.socket]) -> bool | None:
        """Send HANDOVER with ``socks`` attached over ``standby``: True once sent; None when
        ``standby`` is gone (closed) or full (busy until its host has read); False when the kernel
        refuses to pass sockets, and from then on the relay pipes."""
        try:
            standby.sendmsg([HANDOVER], rights([sock.fileno() for sock in socks]), socket.MSG_DONTWAIT)
        except BlockingIOError:
            self._busy.add(standby)
            asyncio.get_running_loop().add_writer(standby.fileno(), self._has_room, standby)
            return None
        except OSError as error:
            if error.errno in _GONE:
                self._discard(standby)
                return None
            log.warning("egress: the kernel does not pass sockets to the host (%s); relaying instead", error)
            self._pass_descriptors = False
            return False
        return True

    def _has_room(self, standby: socket.socket) -> None:
        asyncio.get_running_loop().remove_writer(standby.fileno())
        self._busy.discard(standby)
        self._idle.append(standby)
        self._serve_waiting()
        self._hand_listeners()

    def _pipe(self, command: socket.socket, host: socket.socket) -> None:
        """Join ``command`` to the standby connection ``host`` in a task of its own; both are
        closed once it is done."""
        tunnel = Tunnel(command, host, ended_by="server", pipe_bytes=PIPE_BYTES)
        self._joined.add(tunnel)  # now, not once its task runs: aclose in this turn of the loop aborts it too
        task = asyncio.ensure_future(self._join(tunnel))
        self._tunnels.add(task)
        task.add_done_callback(self._tunnels.discard)
        task.add_done_callback(lambda _: (command.close(), host.close()))

    async def _join(self, tunnel: Tunnel) -> None:
        """Hand the host's side over (HANDOVER alone), then carry bytes both ways until it ends
        (the proxy is done, or closed it) or either connection is lost. A command that
        half-closes its side still gets the answer."""
        try:
            await tunnel.open(to_server=HANDOVER)
            await tunnel.ended()
            await tunnel.aclose(graceful=True, seconds=CLOSE_SECONDS)
        finally:
            self._joined.discard(tunnel)
            tunnel.abort()

    def _drop_dead(self) -> None:
        alive = deque(standby for standby in self._idle if _alive(standby))
        for standby in self._idle:
            if standby not in alive:
                self._discard(standby)
        self._idle = alive

    def _discard(self, standby: socket.socket) -> None:
        if standby in self._busy:
            self._busy.discard(standby)
            asyncio.get_running_loop().remove_writer(standby.fileno())
        standby.close()


def _alive(standby: socket.socket) -> bool:
    """Whether the host keeps a standby connection open (it writes nothing on one)."""
    try:
        standby.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False  # its end, or bytes no host writes there


def _accept_one(listener: socket.socket, arrived: Callable[[socket.socket], None]) -> None:
    """Accept one connection waiting on ``listener`` (BlockingIOError when none waits), to ``arrived``."""
    sock, _ = listener.accept()
    sock.setblocking(False)
    arrived(sock)


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
    return sock
