"""Real sockets on loopback for the egress proxy's tests: an origin, a proxy server, a client.

``Origin`` is a tiny asyncio server: ``GET /bytes/N`` answers N bytes (streamed, any size),
``GET /hold`` answers a head and then nothing until the connection ends, anything else echoes
what it receives (a tunnel's far end). ``ScriptedNetwork`` answers DNS from a script and connects
every address to the origin, recording what it was asked; ``serve`` puts a proxy behind a
loopback listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field

from protolink.net.addresses import IPAddress
from protolink.net.network import SystemNetwork
from protolink.net.rules import EGRESS_ADDRESS_RULES
from protolink.sandbox.egress.events import EgressEvent
from protolink.sandbox.egress.policy import EgressPolicy
from protolink.sandbox.egress.proxy import EgressProxy

LOOPBACK_RULES = EGRESS_ADDRESS_RULES.allowing("127.0.0.0/8", "::1/128")
_BLOCK = b"x" * (1024 * 1024)


class Origin:
    """The far end of every connection the proxy makes in these tests."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Origin:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await reader.read(65536)
            match = re.match(rb"GET /(bytes/([0-9]+)|hold) HTTP/1\.[01]\r\n", first)
            if match is None:
                while first:
                    writer.write(first)
                    await writer.drain()
                    first = await reader.read(65536)
                return
            while b"\r\n\r\n" not in first:
                first += await reader.read(65536)
            self.requests.append(first)
            if match.group(2) is None:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nheld")
                await writer.drain()
                await reader.read()
                return
            size = int(match.group(2))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            while size > 0:
                block = _BLOCK[:size]
                writer.write(block)
                size -= len(block)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@dataclass
class ScriptedNetwork:
    """DNS answers from ``dns`` (one list per lookup, the last repeated); connections to the origin."""

    origin_port: int
    dns: dict[str, list[list[str]]]
    lookups: list[str] = field(default_factory=list)
    connections: list[tuple[str, int]] = field(default_factory=list)

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        answers = self.dns.get(host)
        if not answers:
            raise OSError(f"unknown name {host}")
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def connect_tcp(self, address: IPAddress, port: int) -> socket.socket:
        self.connections.append((str(address), port))
        return await SystemNetwork().connect_tcp(ipaddress.ip_address("127.0.0.1"), self.origin_port)


@dataclass
class Served:
    proxy: EgressProxy
    port: int
    events: list[EgressEvent]

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    async def ask(self, head: bytes) -> bytes:
        """Send ``head`` and return everything the proxy answers until it closes."""
        reader, writer = await self.open()
        try:
            writer.write(head)
            await writer.drain()
            async with asyncio.timeout(30):
                return await reader.read()
        finally:
            writer.close()

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]


@contextlib.asynccontextmanager
async def serve(policy: EgressPolicy, network=None, sandbox: str = "test", on_event=None) -> AsyncIterator[Served]:
    """A proxy for ``policy`` behind a listener on loopback; closed, with its server, at the end."""
    events: list[EgressEvent] = []

    def record(event: EgressEvent) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event)

    proxy = EgressProxy(policy, sandbox=sandbox, on_event=record, network=network)
    unclosed: list[str] = []

    async def handle(sock: socket.socket) -> None:
        # As the dialer does: the proxy owns the socket and closes it.
        await proxy.handle(sock)
        try:
            await wait_for(lambda: sock.fileno() == -1, 5)
        except TimeoutError:
            unclosed.append("a handled socket was not closed")

    with accepting(handle) as port:
        try:
            yield Served(proxy, port, events)
        finally:
            await proxy.aclose()
    assert not unclosed, unclosed


@contextlib.contextmanager
def accepting(handle) -> Iterator[int]:
    """A loopback listener whose connections (non-blocking sockets) each go to a task of
    ``handle``; its port. At the end it stops accepting and cancels the tasks still running."""
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0), backlog=2048)
    listener.setblocking(False)
    handlers: set[asyncio.Task[None]] = set()

    def accept_all() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            task = asyncio.ensure_future(handle(sock))
            handlers.add(task)
            task.add_done_callback(handlers.discard)

    loop.add_reader(listener.fileno(), accept_all)
    try:
        yield listener.getsockname()[1]
    finally:
        loop.remove_reader(listener.fileno())
        listener.close()
        for task in handlers:
            task.cancel()


async def wait_for(predicate, seconds: float = 10.0) -> None:
    """Wait until ``predicate()`` holds (a generous bound, not a speed test)."""
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.01)


async def until_closed(reader: asyncio.StreamReader, seconds: float = 10.0) -> int:
    """Read until the proxy ends the connection (EOF or a reset); how many bytes came."""
    received = 0
    async with asyncio.timeout(seconds):
        try:
            while data := await reader.read(1 << 20):
                received += len(data)
        except ConnectionResetError:
            pass
    return received
