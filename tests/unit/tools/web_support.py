"""A network the test controls, for the web built-ins.

``Site`` is a real HTTP/1.1 server on 127.0.0.1 that answers by Host header and path.
``ScriptedNetwork`` is installed with ``use_network``: its resolver returns the answers a test
scripts for each name (one answer list per lookup, the last one repeating), and every pinned
connection, to whatever validated address, reaches the Site, while being recorded.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "web"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@dataclass
class Reply:
    """One canned response; ``body_stream`` (an async iterator factory) overrides ``body``."""

    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""
    framing: str = "length"  # "length", "chunked" or "close"
    body_stream: Callable[[], AsyncIterator[bytes]] | None = None
    stall: bool = False  # never answer


@dataclass
class Request:
    method: str
    host: str
    target: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


@dataclass
class Site:
    routes: dict[tuple[str, str], Reply] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    def route(self, host: str, path: str, reply: Reply) -> None:
        self.routes[(host, path)] = reply

    async def __aenter__(self) -> Site:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            method, target, _ = request_line.split(" ")
            headers = {}
            for line in filter(None, lines):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            request = Request(method, headers.get("host", "").split(":")[0], target, headers)
            self.requests.append(request)
            reply = self.routes.get((request.host, request.path), Reply(404, [("Content-Type", "text/plain")], b"no"))
            if reply.stall:
                await reader.read()  # until the client goes away
                return
            await self._send(writer, reply)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.closed.set()

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, reply: Reply) -> None:
        head = [f"HTTP/1.1 {reply.status} Reason", *(f"{n}: {v}" for n, v in reply.headers)]
        if reply.framing == "length" and reply.body_stream is None:
            head.append(f"Content-Length: {len(reply.body)}")
        elif reply.framing == "chunked":
            head.append("Transfer-Encoding: chunked")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        chunks = reply.body_stream() if reply.body_stream else _once(reply.body)
        async for chunk in chunks:
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if reply.framing == "chunked" else chunk)
            await writer.drain()
        if reply.framing == "chunked":
            writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _once(body: bytes) -> AsyncIterator[bytes]:
    if body:
        yield body


@dataclass
class ScriptedNetwork:
    """Scripted DNS answers; every connection reaches ``site`` and is recorded."""

    site: Site
    dns: dict[str, list[list[str]]]
    lookups: list[str] = field(default_factory=list)
    connections: list[tuple[str, int, str | None]] = field(default_factory=list)

    async def resolve(self, host: str, port: int) -> Sequence[str]:
        self.lookups.append(host)
        answers = self.dns.get(host)
        if not answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers.pop(0) if len(answers) > 1 else answers[0]

    async def connect(self, address, port: int, *, server_name: str | None):
        self.connections.append((str(address), port, server_name))
        return await asyncio.open_connection("127.0.0.1", self.site.port)
