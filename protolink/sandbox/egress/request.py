"""The request head a client sends its egress proxy, read strictly and boundedly.

Accepted: ``CONNECT host:port HTTP/1.x`` (authority form; a Host header, if any, must name the
same host and port) and a plain-HTTP request in absolute form (``GET http://host[:port]/path
HTTP/1.x``) whose body, if any, has a Content-Length. The head must end (CRLF CRLF) within the
time and size bounds. Refused with a :class:`Refusal`: other targets (origin form, ``https://``
or other schemes, ``*``), a request line that is not exactly three parts separated by single
spaces, control characters (NUL included) or non-ASCII bytes in it, bare CR or LF, obs-fold
continuation lines, a header without a token name, more than one Host header, a
Transfer-Encoding (chunked request bodies are not forwarded), conflicting Content-Lengths.
Hosts are read with fetch_url's rules (:func:`protolink.net.addresses.parse_host`): an IPv4
address in any spelling is an address literal.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from protolink import deadlines
from protolink.net.addresses import IPAddress, parse_host

#: Up to n bytes from the client; b"" at its end.
Read = Callable[[int], Awaitable[bytes]]
MAX_HEADERS = 100
_READ_SIZE = 64 * 1024
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+\Z")
_TARGET = re.compile(rb"[\x21-\x7e]+\Z")
_VERSION = re.compile(rb"HTTP/1\.[01]\Z")
_VALUE_FORBIDDEN = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_PORT = re.compile(r"[0-9]{1,5}\Z")
# Hop-by-hop and proxy fields, never forwarded; Host is replaced by the target's authority.
_DROPPED = frozenset({
    b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"proxy-authenticate", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host",
})


class Refusal(Exception):
    """A request the proxy does not serve: the HTTP status to answer with and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Request:
    """A parsed request: its target and, for plain HTTP, the head to forward and the body size.

    ``host`` is the lower-case name without a trailing dot, or the canonical text of
    ``address`` for an IP literal. ``leftover`` holds the bytes that came after the head.
    """

    method: str
    host: str
    port: int
    address: IPAddress | None
    forward_head: bytes = b""
    body_length: int | None = None
    leftover: bytes = b""


async def read_request(read: Read, seconds: float, max_bytes: int) -> Request:
    """Read and parse one request head with ``read`` (``loop.sock_recv`` of the client's socket,
    or a stream's ``read``); Refusal when it is late, too large or not accepted."""
    try:
        async with deadlines.timeout(seconds):
            head, leftover = await _read_head(read, max_bytes)
    except TimeoutError:
        raise Refusal(408, f"the request head was not complete within {seconds:g} seconds") from None
    return parse_head(head, leftover)


async def _read_head(read: Read, max_bytes: int) -> tuple[bytes, bytes]:
    buffer = bytearray()
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            if end + 4 > max_bytes:
                break
            return bytes(buffer[:end]), bytes(buffer[end + 4:])
        if len(buffer) >= max_bytes:
            break
        data = await read(_READ_SIZE)
        if not data:
            raise Refusal(400, "the connection ended before the request head was complete")
        buffer += data
    raise Refusal(431, f"the request head is larger than {max_bytes} bytes")


def parse_head(head: bytes, leftover: bytes = b"") -> Request:
    """A :class:`Request` from a head without its final CRLF CRLF; Refusal when not accepted."""
    request_line, *lines = head.split(b"\r\n")
    if b"\r" in head.replace(b"\r\n", b"") or b"\n" in head.replace(b"\r\n", b""):
        raise Refusal(400, "bare CR or LF in the request head")
    parts = request_line.split(b" ")
    if len(parts) != 3 or not all(parts):
        raise Refusal(400, "the request line is not three parts separated by single spaces")
    method, target, version = parts
    if not (_TOKEN.match(method) and _TARGET.match(target) and _VERSION.match(version)):
        raise Refusal(400, "malformed request line (control or non-ASCII characters, or not HTTP/1.x)")
    headers = _headers(lines)
    hosts = [value for name, value in headers if name.lower() == b"host"]
    if len(hosts) > 1:
        raise Refusal(400, "more than one Host header")
    text = target.decode("ascii")
    if method == b"CONNECT":
        return _connect_request(text, hosts[0].decode("latin-1") if hosts else None, leftover)
    return _forward_request(method.decode("ascii"), text, version, headers, leftover)


def _headers(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    if len(lines) > MAX_HEADERS:
        raise Refusal(431, f"more than {MAX_HEADERS} header fields")
    fields = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise Refusal(400, "obsolete line folding in the request head")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.match(name) or _VALUE_FORBIDDEN.search(value):
            raise Refusal(400, "malformed header field")
        fields.append((name, value.strip(b" \t")))
    return fields


def _connect_request(target: str, host_header: str | None, leftover: bytes) -> Request:
    if "/" in target or "@" in target:
        raise Refusal(400, "CONNECT wants an authority (host:port), not a URL")
    host, port, address = _authority(target, default_port=None)
    if host_header is not None:
        try:
            named_host, named_port, _ = _authority(host_header, default_port=port)
        except Refusal:
            named_host, named_port = "", 0
        if (named_host, named_port) != (host, port):
            raise Refusal(400, "the Host header does not name the CONNECT target")
    return Request("CONNECT", host, port, address, leftover=leftover)


def _forward_request(method: str, target: str, version: bytes, headers: list[tuple[bytes, bytes]],
                     leftover: bytes) -> Request:
    scheme, separator, rest = target.partition("://")
    if not separator:
        raise Refusal(400, "this is a proxy: send an absolute http:// URL, or CONNECT host:port")
    if scheme.lower() != "http":
        raise Refusal(400, f"only http:// URLs are forwarded, not {scheme}:// (use CONNECT for https)")
    if "#" in rest:
        raise Refusal(400, "a fragment in the request target")
    split = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:split], rest[split:]
    if "@" in authority:
        raise Refusal(400, "credentials in the URL")
    host, port, address = _authority(authority, default_port=80)
    length = _body_length(headers)
    connection_fields = {token.strip().lower() for name, value in headers if name.lower() == b"connection"
                         for token in value.split(b",")}
    host_field = (f"[{host}]" if address is not None and address.version == 6 else host) + (
        "" if port == 80 else f":{port}")
    lines = [f"{method} {path if path.startswith('/') else '/' + path} ".encode("ascii") + version,
             b"Host: " + host_field.encode("ascii")]
    lines += [name + b": " + value for name, value in headers
              if name.lower() not in _DROPPED and name.lower() not in connection_fields]
    lines.append(b"Connection: close")
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    return Request(method, host, port, address, forward_head=head, body_length=length, leftover=leftover)


def _body_length(headers: list[tuple[bytes, bytes]]) -> int:
    if any(name.lower() == b"transfer-encoding" for name, _ in headers):
        raise Refusal(411, "Transfer-Encoding in a request is not forwarded: send a Content-Length")
    lengths = {value for name, value in headers if name.lower() == b"content-length"}
    if not lengths:
        return 0
    if len(lengths) > 1 or not re.fullmatch(rb"[0-9]{1,18}", next(iter(lengths))):
        raise Refusal(400, "malformed or conflicting Content-Length")
    return int(lengths.pop())


def _authority(text: str, *, default_port: int | None) -> tuple[str, int, IPAddress | None]:
    """Host, port and address literal of ``host[:port]`` or ``[v6][:port]``."""
    bracketed = text.startswith("[")
    if bracketed:
        host_text, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise Refusal(400, f"malformed authority {text!r}")
        port_text = rest[1:] if rest else None
    else:
        before, colon, after = text.rpartition(":")
        host_text, port_text = (before, after) if colon else (text, None)
    if port_text is None:
        if default_port is None:
            raise Refusal(400, "CONNECT wants host:port")
        port = default_port
    elif _PORT.match(port_text) and 1 <= int(port_text) <= 65535:
        port = int(port_text)
    else:
        raise Refusal(400, f"malformed port in {text!r}")
    try:
        host, address = parse_host(host_text.lower(), bracketed=bracketed)
    except ValueError as error:
        raise Refusal(400, str(error)) from None
    return (str(address) if address is not None else host.removesuffix(".")), port, address
