"""The host-side proxy of one sandbox: it decides every connection, then relays it.

One :meth:`EgressProxy.handle` call serves one client connection from start to end: admission
(connections open at once, connections per second, the byte budget), one strictly parsed
request head (:mod:`protolink.sandbox.egress.request`), the decision (the allow-list, then one
resolution and the address rules on every answer), a connection to one validated address, and
the relay. Refusals are a short HTTP answer and a ``denied`` event; an allowed connection gets
one ``allowed`` event once its upstream connection is tried (failed, or made and answered) and a
``closed`` event at its end.

The client's socket is used as it is, never through a transport or a stream (but for a
refusal's short answer): the head is read as soon as it is there, most often within the turn of
the event loop that accepted the connection, and the relay is a
:class:`~protolink.net.tunnel.Tunnel` that splices the socket to the upstream connection. A
tunnel's ``200`` is the tunnel's first write, made once both sides are joined: the client's next
bytes find the join ready. The ``allowed`` event is recorded after it, off the connection's way.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from protolink import deadlines
from protolink.net.addresses import IPAddress
from protolink.net.network import Network, current_network
from protolink.net.tunnel import Tunnel

from .events import EgressEvent, EventKind
from .lookups import Lookups
from .policy import EgressPolicy
from .request import Refusal, Request, read_request

_log = logging.getLogger(__name__)

#: What a direction of a relayed connection buffers for a slow reader (its pipe) before its writer is not read.
PIPE_BYTES = 1024 * 1024
#: The most a refused client's stream reads at once.
CHUNK = 256 * 1024
#: A connection beyond the rate limit's bucket waits for its token when it is due within this,
#: and is refused (429) otherwise: a package manager's burst is delayed, a flood still refused.
RATE_WAIT_SECONDS = 1.0
TUNNEL_ANSWER = b"HTTP/1.1 200 Connection established\r\n\r\n"
LINGER_SECONDS = 1.0
LINGER_BYTES = 64 * 1024
_STATUS_TEXT = {
    400: "Bad Request", 403: "Forbidden", 408: "Request Timeout", 411: "Length Required",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout",
}


@dataclass(eq=False)
class _Connection:
    """One client connection: its socket (its streams once a refusal needs them), its target
    once known, the upstream socket and the relay between them, its counters, and how it ended."""

    sock: socket.socket
    client: asyncio.StreamWriter | None = None
    client_reader: asyncio.StreamReader | None = None
    started: float = field(default_factory=time.monotonic)
    request: Request | None = None
    address: IPAddress | None = None
    upstream: socket.socket | None = None
    relay: Tunnel | None = None
    bytes_up: int = 0
    bytes_down: int = 0
    end: str | None = None
    last_active: float = 0.0
    idle_timer: asyncio.TimerHandle | None = None

    def close(self, reason: str) -> None:
        """End the connection now (the first reason wins): the relay stops, a client's stream
        is aborted, its socket and the upstream one are shut down (a read of them ends at once)."""
        if self.end is None:
            self.end = reason
        if self.relay is not None:
            self.relay.abort()
        if self.client is not None:
            _abort(self.client.transport)
        for sock in (self.sock, self.upstream):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    async def streams(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The client's stream, made once, from its socket."""
        if self.client is None or self.client_reader is None:
            self.client_reader, self.client = await asyncio.open_connection(sock=self.sock, limit=CHUNK)
        return self.client_reader, self.client

    def release(self) -> None:
        """Close the client's socket (through its stream when it has one) and the upstream one."""
        if self.client is not None:
            _abort(self.client.transport)
        else:
            self.sock.close()
        if self.upstream is not None:
            self.upstream.close()


class _TokenBucket:
    """``rate`` tokens a second, holding at most one second's worth (at least one token); a
    token not there yet can be reserved ahead."""

    def __init__(self) -> None:
        self._tokens: float | None = None
        self._stamp = 0.0

    def reserve(self, rate: float, longest: float) -> float | None:
        """Take a token: the seconds until it is due (0.0: now), or None (nothing taken) when
        that is more than ``longest``."""
        now = time.monotonic()
        capacity = max(rate, 1.0)
        tokens = capacity if self._tokens is None else min(capacity, self._tokens + (now - self._stamp) * rate)
        self._stamp = now
        wait = 0.0 if tokens >= 1 else (1 - tokens) / rate
        if wait > longest:
            self._tokens = tokens
            return None
        self._tokens = tokens - 1
        return wait


class EgressProxy:
    """One sandbox's egress proxy: HTTP ``CONNECT`` and plain-HTTP forwarding under a policy.

    ``network`` resolves names and opens connections (default: the current
    :class:`~protolink.net.network.Network`, the system's unless a test installed another).
    ``on_event`` receives every :class:`EgressEvent`; its exceptions are logged and ignored.
    """

    def __init__(self, policy: EgressPolicy, *, sandbox: str,
                 on_event: Callable[[EgressEvent], None] | None = None,
                 network: Network | None = None) -> None:
        self._policy = policy
        self._sandbox = sandbox
        self._on_event = on_event
        self._network = network if network is not None else current_network()
        self._connections: set[_Connection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._bucket = _TokenBucket()
        self._bytes = 0
        self._closed = False
        self._lookups = Lookups(self._network)

    @property
    def policy(self) -> EgressPolicy:
        return self._policy

    @property
    def open_connections(self) -> int:
        """Connections admitted and not yet ended (refused ones never count)."""
        return len(self._connections)

    @property
    def bytes_relayed(self) -> int:
        """Bytes relayed both ways over the proxy's life: what the byte budget counts."""
        return self._bytes

    def set_policy(self, policy: EgressPolicy) -> None:
        """Use ``policy`` for new connections at once; close open ones it does not allow.

        Deny-all closes every connection, those still sending their request included.
        """
        self._policy = policy
        if policy.denies_all or self._budget_spent():
            self._close_all("deny-all" if policy.denies_all else "byte budget")
            return
        for connection in list(self._connections):
            if connection.request is not None and connection.upstream is not None:
                reason = self._still_denied(connection)
                if reason is not None:
                    connection.close(f"policy changed: {reason}")

    async def handle(self, sock: socket.socket) -> None:
        """Serve one client connection, a connected non-blocking stream socket that the proxy
        owns from now on, start to end; never raises; always closes ``sock``."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        connection = _Connection(sock)
        try:
            admission = self._admission()
            if isinstance(admission, Refusal):
                self._emit("denied", None, reason=admission.reason)
                await _refuse(*await connection.streams(), admission)
                return
            self._connections.add(connection)
            try:
                await self._serve(connection, admission)
            finally:
                if connection.idle_timer is not None:
                    connection.idle_timer.cancel()
                # Until its last bytes are sent, a connection still counts and can still be cut.
                graceful = connection.end is None
                if connection.relay is not None:
                    await connection.relay.aclose(graceful=graceful, seconds=self._policy.limits.idle_seconds)
                elif connection.client is not None:
                    await _finish(connection.client, graceful=graceful)
                self._connections.discard(connection)
        except Exception:  # a bug must not take the host process down with it
            _log.exception("egress proxy of sandbox %s failed", self._sandbox)
        finally:
            connection.release()
            if task is not None:
                self._tasks.discard(task)

    async def aclose(self) -> None:
        """Refuse new connections, end the open ones and wait for their handlers."""
        self._closed = True
        self._close_all("proxy closed")
        self._lookups.cancel()
        tasks = self._tasks - {asyncio.current_task()}
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=5.0)
            for task in pending:
                task.cancel()

    # -- admission and decision ----------------------------------------------------------------

    def _admission(self) -> Refusal | float:
        """A refusal, or the seconds the connection waits for its turn under the rate limit."""
        limits = self._policy.limits
        if self._closed:
            return Refusal(503, "the egress proxy is closed")
        if self._budget_spent():
            return Refusal(403, "byte budget spent")
        if len(self._connections) >= limits.max_connections:
            return Refusal(503, f"too many connections (at most {limits.max_connections} at once)")
        wait = self._bucket.reserve(limits.max_connections_per_second, RATE_WAIT_SECONDS)
        if wait is None:
            return Refusal(429, f"too many connections (at most {limits.max_connections_per_second:g} a second)")
        return wait

    async def _serve(self, connection: _Connection, wait: float) -> None:
        limits = self._policy.limits
        read = functools.partial(asyncio.get_running_loop().sock_recv, connection.sock)
        try:
            if wait:  # its turn under the rate limit (it counts as open meanwhile)
                await asyncio.sleep(wait)
            request = await read_request(read, limits.head_seconds, limits.max_head_bytes)
            connection.request = request
            addresses = await self._decide(request)
        except Refusal as refusal:
            self._emit("denied", connection, reason=connection.end or refusal.reason)
            if connection.end is None:
                await _refuse(*await connection.streams(), refusal)
            return
        except asyncio.CancelledError:
            connection.close("cancelled")
            raise
        connection.address = addresses[0]
        try:
            try:
                await self._connect(connection, addresses)
                relay = await self._open(connection, request)
            finally:  # tried: failed, refused after all, or answered (off the connection's way)
                self._emit("allowed", connection, reason="allowed")
            self._watch_idle(connection)
            ending = await relay.ended()
            if connection.end is None and ending != "eof":
                connection.end = ending
        except Refusal as refusal:
            connection.end = refusal.reason
            await _refuse(*await connection.streams(), refusal)
        except asyncio.CancelledError:  # the caller gave up on this connection: nothing is flushed
            connection.close("cancelled")
            raise
        finally:
            self._emit("closed", connection, reason=connection.end or "eof")

    async def _decide(self, request: Request) -> tuple[IPAddress, ...]:
        """The validated addresses of an allowed request; Refusal otherwise."""
        policy = self._policy
        reason = policy.denial(request.host, request.port, request.address)
        if reason is not None:
            raise Refusal(403, reason)
        if request.address is not None:
            return (request.address,)
        try:
            async with deadlines.timeout(policy.limits.connect_seconds):
                answers = await self._lookups.resolve(request.host, request.port)
            addresses = tuple(dict.fromkeys(ipaddress.ip_address(a.split("%", 1)[0]) for a in answers))
        except TimeoutError:
            raise Refusal(504, f"resolving {request.host} timed out") from None
        except (OSError, UnicodeError, ValueError) as error:
            raise Refusal(502, f"could not resolve {request.host}: {error}") from None
        if not addresses:
            raise Refusal(502, f"could not resolve {request.host}: no addresses")
        for address in addresses:
            reason = policy.addresses.denial(address)
            if reason is not None:
                raise Refusal(403, f"{request.host} resolves to a denied address: {reason}")
        return addresses

    def _still_denied(self, connection: _Connection) -> str | None:
        """Why the current policy would refuse an open connection now (no new resolution)."""
        request, policy = connection.request, self._policy
        assert request is not None and connection.address is not None
        return policy.denial(request.host, request.port, request.address) or policy.addresses.denial(
            connection.address)

    async def _connect(self, connection: _Connection, addresses: tuple[IPAddress, ...]) -> None:
        """Connect to the first validated address that answers (never to the name)."""
        request = connection.request
        assert request is not None
        failures = []
        for address in addresses:
            try:
                async with deadlines.timeout(self._policy.limits.connect_seconds):
                    upstream = await self._network.connect_tcp(address, request.port)
            except (OSError, TimeoutError) as error:
                failures.append(f"{address}: {error or type(error).__name__}")
                continue
            connection.address, connection.upstream = address, upstream
            # The policy may have changed (or the proxy closed) while this connection was made.
            reason = connection.end or self._still_denied(connection)
            if reason is not None:
                connection.close(reason)
                raise Refusal(403, reason)
            return
        raise Refusal(502, f"connect failed: {'; '.join(failures)}")

    # -- relay ---------------------------------------------------------------------------------

    async def _open(self, connection: _Connection, request: Request) -> Tunnel:
        """Answer and join the client to its upstream connection."""
        assert connection.upstream is not None
        tunnel = request.method == "CONNECT"
        relay = connection.relay = Tunnel(
            connection.sock, connection.upstream, ended_by="both" if tunnel else "server",
            pipe_bytes=PIPE_BYTES, up_limit=None if tunnel else request.body_length,
            count=lambda size, up: self._spend(connection, size, up=up))
        head = request.forward_head
        if head:
            head = head[:self._spend(connection, len(head), up=True)]
        await relay.open(to_client=TUNNEL_ANSWER if tunnel else b"", to_server=head, from_client=request.leftover)
        return relay

    def _spend(self, connection: _Connection, size: int, *, up: bool) -> int:
        """Count ``size`` bytes against the budget; how many fit (all, unless it is spent)."""
        connection.last_active = time.monotonic()
        budget = self._policy.limits.max_bytes
        if budget is not None and self._bytes + size >= budget:
            size = min(size, max(budget - self._bytes, 0))
            asyncio.get_running_loop().call_soon(self._close_all, "byte budget")
            connection.end = connection.end or "byte budget"
        self._bytes += size
        if up:
            connection.bytes_up += size
        else:
            connection.bytes_down += size
        return size

    def _budget_spent(self) -> bool:
        budget = self._policy.limits.max_bytes
        return budget is not None and self._bytes >= budget

    def _watch_idle(self, connection: _Connection) -> None:
        """Close the connection once it moved no byte for ``idle_seconds`` (checked lazily)."""
        loop = asyncio.get_running_loop()
        connection.last_active = time.monotonic()

        def check() -> None:
            idle = self._policy.limits.idle_seconds
            quiet = time.monotonic() - connection.last_active
            if quiet >= idle:
                connection.close("idle")
            elif connection.end is None:
                connection.idle_timer = loop.call_later(idle - quiet, check)

        connection.idle_timer = loop.call_later(self._policy.limits.idle_seconds, check)

    def _close_all(self, reason: str) -> None:
        for connection in list(self._connections):
            connection.close(reason)

    # -- events --------------------------------------------------------------------------------

    def _emit(self, kind: EventKind, connection: _Connection | None, *, reason: str) -> None:
        if self._on_event is None:
            return
        fields: dict[str, object] = {"host": "", "port": 0, "method": "", "address": None}
        if connection is not None and connection.request is not None:
            request = connection.request
            fields.update(host=request.host, port=request.port, method=request.method)
        if connection is not None and connection.address is not None:
            fields["address"] = str(connection.address)
        if connection is not None and kind == "closed":
            fields.update(bytes_up=connection.bytes_up, bytes_down=connection.bytes_down,
                          duration_seconds=time.monotonic() - connection.started)
        event = EgressEvent(**{"bytes_up": 0, "bytes_down": 0, "duration_seconds": 0.0, **fields},
                            sandbox=self._sandbox, kind=kind, reason=reason)  # type: ignore[arg-type]
        try:
            self._on_event(event)
        except Exception:
            _log.exception("the egress event handler of sandbox %s failed", self._sandbox)


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, refusal: Refusal) -> None:
    """Answer with a short error, then linger briefly so that the client can read it.

    Closing a socket with unread input resets it, and the reset can destroy the answer before
    the client reads it; so the proxy half-closes and reads (and drops) until EOF, boundedly.
    """
    body = (refusal.reason + "\n").encode("utf-8", "replace")
    head = (f"HTTP/1.1 {refusal.status} {_STATUS_TEXT.get(refusal.status, 'Error')}\r\n"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode("ascii")
    if writer.transport.is_closing():
        return
    with contextlib.suppress(OSError, RuntimeError, TimeoutError):
        writer.write(head + body)
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_SECONDS):
            received = 0
            while received < LINGER_BYTES and (data := await reader.read(LINGER_BYTES)):
                received += len(data)


async def _finish(writer: asyncio.StreamWriter, *, graceful: bool) -> None:
    """Close one side: after its buffered output is sent when ``graceful`` (boundedly), else at once."""
    transport = writer.transport
    if graceful and not transport.is_closing():
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            transport.set_write_buffer_limits(high=0)  # drain() now waits for an empty buffer
            async with asyncio.timeout(LINGER_SECONDS):
                await writer.drain()
            transport.close()
            return
    _abort(transport)


def _abort(transport: asyncio.WriteTransport) -> None:
    """Close ``transport`` at once, dropping unsent output; nothing when it is closed already.

    (A selector transport that finished a graceful close fails when aborted afterwards.)
    """
    if not (transport.is_closing() and transport.get_write_buffer_size() == 0):
        transport.abort()
