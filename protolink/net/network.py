"""Where names are resolved and connections opened: one replaceable seam.

Its users (fetch_url, web_search, the egress proxy) resolve a host once, check *every* answer
against their address rules, then connect to one of those validated addresses, never to the
name: nothing re-resolves between the check and the connection (DNS rebinding).

The active :class:`Network` lives in a context variable. The default, :class:`SystemNetwork`,
uses the operating system's resolver and real sockets. Tests install their own resolver and
connector with :func:`use_network`; applications have no reason to.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import socket
import ssl
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Protocol

from .addresses import IPAddress

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Network(Protocol):
    """Name resolution and pinned connections."""

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        """Every address ``host`` resolves to, as strings."""
        ...

    async def connect(self, address: IPAddress, port: int, *, server_name: str | None) -> Streams:
        """A connection to exactly ``address``; TLS for ``server_name`` when it is given."""
        ...

    async def connect_tcp(self, address: IPAddress, port: int) -> socket.socket:
        """A plain TCP connection to exactly ``address``: a non-blocking socket, no stream (the
        egress proxy splices it)."""
        ...


class SystemNetwork:
    """The operating system's resolver and TCP/TLS sockets (certificates verified)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._ssl_context = ssl_context

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    async def connect(self, address: IPAddress, port: int, *, server_name: str | None) -> Streams:
        sock = await self.connect_tcp(address, port)
        try:
            if server_name is None:
                return await asyncio.open_connection(sock=sock)
            if self._ssl_context is None:
                self._ssl_context = ssl.create_default_context()
            return await asyncio.open_connection(sock=sock, ssl=self._ssl_context, server_hostname=server_name)
        except BaseException:
            sock.close()
            raise

    async def connect_tcp(self, address: IPAddress, port: int) -> socket.socket:
        """At once when the handshake completed within ``connect`` (as on loopback: no turn of
        the event loop), else once the event loop sees the socket writable."""
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's transports do
        target = (str(address), port)
        try:
            try:
                sock.connect(target)
            except BlockingIOError:
                poll = select.poll()
                poll.register(sock, select.POLLOUT)
                if not poll.poll(0):
                    await asyncio.get_running_loop().sock_connect(sock, target)
                elif error := sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    raise OSError(error, os.strerror(error)) from None
        except BaseException:
            sock.close()
            raise
        return sock


_network: ContextVar[Network] = ContextVar("protolink_network", default=SystemNetwork())


def current_network() -> Network:
    return _network.get()


@contextlib.contextmanager
def use_network(network: Network) -> Iterator[Network]:
    """Route resolution and connections through ``network`` inside this block (for tests)."""
    token = _network.set(network)
    try:
        yield network
    finally:
        _network.reset(token)

