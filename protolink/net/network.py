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
        if server_name is None:
            return await asyncio.open_connection(str(address), port, flags=socket.AI_NUMERICHOST)
        if self._ssl_context is None:
            self._ssl_context = ssl.create_default_context()
        return await asyncio.open_connection(
            str(address), port, ssl=self._ssl_context, server_hostname=server_name,
            flags=socket.AI_NUMERICHOST,
        )


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

