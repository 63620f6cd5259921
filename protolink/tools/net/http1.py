"""One bounded HTTP/1.1 exchange on a pinned connection.

Requests are ``Connection: close`` and ask for the identity encoding; the response head is
limited in size and header count, and the body is read incrementally up to a byte limit (reading
stops as soon as the limit is passed). Errors are RuntimeError with a readable message.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPException, parse_headers

from protolink import __version__, deadlines
from protolink.core.tools import ToolContext
from protolink.errors import BudgetExceededError

from protolink.net.addresses import Destination, IPAddress
from .media import check_header, media_type
from protolink.net.network import Streams, current_network

MAX_HEAD_BYTES = 65_536
MAX_HEADERS = 100
_CHUNK_LINE_BYTES = 1024
_READ_SIZE = 65_536
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-9][0-9]{2})(?: ([^\r\n]*))?\r?\n\Z")
_INTERIM_LIMIT = 5
USER_AGENT = f"protolink/{__version__} (ProtoLink agent runtime; web tools)"


@dataclass
class Response:
    """A response head; the body is read on demand with :meth:`read`."""

    status: int
    reason: str
    headers: Message
    _reader: asyncio.StreamReader
    _has_body: bool

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def media_type(self) -> str | None:
        """The lowercase media type without parameters, or None when none (or no valid one) was sent."""
        return media_type(self.headers.get("Content-Type"))

    async def read(self, limit: int) -> bytes:
        """The whole body; RuntimeError as soon as it exceeds ``limit`` bytes."""
        if not self._has_body:
            return b""
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding != "identity":
            raise RuntimeError(f"unsupported content encoding {encoding!r}")
        try:
            return await self._read_body(limit)
        except asyncio.IncompleteReadError:
            raise RuntimeError("the connection closed before the response body was complete") from None
        except (ValueError, asyncio.LimitOverrunError):
            raise RuntimeError("malformed response body framing") from None

    async def _read_body(self, limit: int) -> bytes:
        codings = [c.strip().lower() for v in self.headers.get_all("Transfer-Encoding", []) for c in v.split(",")]
        if codings:
            if codings != ["chunked"]:
                raise RuntimeError(f"unsupported transfer encoding {', '.join(codings)!r}")
            return await self._read_chunked(limit)
        lengths = {value.strip() for value in self.headers.get_all("Content-Length", [])}
        if lengths:
            if len(lengths) != 1 or not re.fullmatch(r"[0-9]{1,18}", next(iter(lengths))):
                raise RuntimeError("malformed Content-Length header")
            length = int(lengths.pop())
            _check_size(length, limit)
            return await self._reader.readexactly(length)
        body = bytearray()
        while chunk := await self._reader.read(_READ_SIZE):
            body += chunk
            _check_size(len(body), limit)
        return bytes(body)

    async def _read_chunked(self, limit: int) -> bytes:
        body = bytearray()
        while True:
            line = await self._reader.readuntil(b"\n")
            size_text = line.split(b";", 1)[0].strip()
            if len(line) > _CHUNK_LINE_BYTES or not re.fullmatch(rb"[0-9a-fA-F]{1,16}", size_text):
                raise RuntimeError("malformed chunked response body")
            size = int(size_text, 16)
            if size == 0:
                await _read_head_lines(self._reader)  # trailers
                return bytes(body)
            _check_size(len(body) + size, limit)
            body += await self._reader.readexactly(size)
            if await self._reader.readexactly(2) != b"\r\n":
                raise RuntimeError("malformed chunked response body")


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise RuntimeError(f"the response is larger than {limit} bytes")


@contextlib.asynccontextmanager
async def open_response(
    destination: Destination,
    addresses: tuple[IPAddress, ...],
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
) -> AsyncIterator[Response]:
    """Connect to the first reachable validated address, send the request, yield the head.

    The connection is closed (aborted) when the block exits, normally or not.
    """
    reader, writer = await _connect(destination, addresses)
    try:
        writer.write(_request_bytes(destination, method, headers or {}))
        await writer.drain()
        yield await _read_response(reader, method)
    except (OSError, EOFError) as error:
        raise RuntimeError(f"request to {destination.host} failed: {error or type(error).__name__}") from None
    finally:
        writer.transport.abort()


async def _connect(destination: Destination, addresses: tuple[IPAddress, ...]) -> Streams:
    network = current_network()
    server_name = destination.host if destination.scheme == "https" else None
    failures = []
    for address in addresses:
        try:
            return await network.connect(address, destination.port, server_name=server_name)
        except OSError as error:
            failures.append(f"{address}: {error}")
    raise RuntimeError(f"could not connect to {destination.host} ({'; '.join(failures)})")


def _request_bytes(destination: Destination, method: str, headers: Mapping[str, str]) -> bytes:
    fields = {"Host": destination.host_header, "User-Agent": USER_AGENT,
              "Accept-Encoding": "identity", **headers, "Connection": "close"}
    lines = [f"{method} {destination.target} HTTP/1.1"]
    for name, value in fields.items():
        check_header(name, value)
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _read_head_lines(reader: asyncio.StreamReader) -> list[bytes]:
    lines: list[bytes] = []
    total = 0
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.LimitOverrunError:
            raise RuntimeError("response header line too long") from None
        total += len(line)
        if total > MAX_HEAD_BYTES or len(lines) > MAX_HEADERS:
            raise RuntimeError("response headers are too large")
        if line in (b"\r\n", b"\n"):
            return lines
        lines.append(line)


async def _read_response(reader: asyncio.StreamReader, method: str) -> Response:
    for _ in range(_INTERIM_LIMIT):
        try:
            status_line = await reader.readuntil(b"\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            raise RuntimeError("the server sent no valid HTTP response") from None
        match = _STATUS_LINE.match(status_line)
        if match is None:
            raise RuntimeError("the server sent no valid HTTP response")
        lines = await _read_head_lines(reader)
        status = int(match.group(1))
        if status == 101 or status >= 200:
            break
    else:
        raise RuntimeError("too many interim (1xx) responses")
    if status == 101:
        raise RuntimeError("the server tried to switch protocols")
    try:
        headers = parse_headers(io.BytesIO(b"".join(lines) + b"\r\n"))
    except HTTPException as error:
        raise RuntimeError(f"malformed response headers: {error}") from None
    reason = (match.group(2) or b"").decode("latin-1")
    has_body = method != "HEAD" and status not in (204, 304)
    return Response(status, reason, headers, reader, has_body)


@contextlib.asynccontextmanager
async def transport_deadline(context: ToolContext, seconds: float, what: str) -> AsyncIterator[None]:
    """Bound a block by ``seconds`` and by the run's remaining budget.

    Expiry raises RuntimeError, or BudgetExceededError when the run budget was the tighter bound.
    """
    timeout, limited_by_budget = context.bound_timeout(seconds)
    scope = deadlines.timeout(timeout)
    try:
        async with scope:
            yield
    except TimeoutError:
        if not scope.expired():
            raise
        if limited_by_budget:
            raise BudgetExceededError(f"run {context.run_id} exhausted its time budget during {what}") from None
        raise RuntimeError(f"{what} timed out after {seconds:g} seconds") from None
