"""Where web built-ins resolve names and open connections: one replaceable seam.

Every request first resolves its host and checks that *all* answers are public
(:func:`resolve_public`), then connects to one of those validated addresses, never to the name:
nothing re-resolves between the check and the connection (DNS rebinding), while the Host header
and the TLS server name stay the URL's host.

The active :class:`Network` lives in a context variable. The default, :class:`SystemNetwork`,
uses the operating system's resolver and real sockets. Tests install their own resolver and
connector with :func:`use_network`; applications have no reason to.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Protocol

from .addresses import Destination, IPAddress, is_public_address

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
    """Route the web built-ins through ``network`` inside this block (for tests)."""
    token = _network.set(network)
    try:
        yield network
    finally:
        _network.reset(token)


async def resolve_public(destination: Destination) -> tuple[IPAddress, ...]:
    """The validated addresses of a destination; ValueError when any of them is not public.

    DNS lookup happens here, outside any transport deadline (the spec keeps it separate).
    Lookup failures raise RuntimeError.
    """
    if destination.address is not None:
        candidates: tuple[IPAddress, ...] = (destination.address,)
    else:
        try:
            answers = await current_network().resolve(destination.host, destination.port)
            candidates = tuple(ipaddress.ip_address(answer.split("%", 1)[0]) for answer in answers)
        except (OSError, UnicodeError, ValueError) as error:
            raise RuntimeError(f"could not resolve {destination.host}: {error}") from None
        if not candidates:
            raise RuntimeError(f"could not resolve {destination.host}: no addresses")
    for address in candidates:
        if not is_public_address(address):
            raise ValueError(f"{destination.host} is not a public destination: it resolves to {address}")
    return candidates
