"""Destinations and host names, parsed once for fetch_url, web_search and the egress proxy.

A destination is an absolute ``http``/``https`` URL without credentials, on the scheme's standard
port, whose host is a DNS name or an IP address in any spelling a resolver accepts (``2130706433``,
``0177.0.0.1``, ``0x7f.1``, ``[::ffff:127.0.0.1]``): :func:`parse_host` reads such a host, so a
number that a resolver would take for an address is always an address literal here too. Whether
an address may be reached is :mod:`protolink.net.rules`' decision.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL_CHARS = 2048
STANDARD_PORTS = {"http": 80, "https": 443}

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?\Z")
_NUMBER = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)\Z")
_UNSAFE = re.compile(r"[\x00-\x20\x7f]")
# Characters kept as they are in a request target; everything else is percent-encoded.
_TARGET_SAFE = "!$%&'()*+,/:;=?@[]~"


@dataclass(frozen=True)
class Destination:
    """A parsed, shape-checked URL: where to connect and what to ask for."""

    url: str
    scheme: str
    host: str
    port: int
    target: str
    address: IPAddress | None = None

    @property
    def host_header(self) -> str:
        """The Host header value: the host, bracketed when IPv6, with any nonstandard port."""
        host = f"[{self.host}]" if isinstance(self.address, ipaddress.IPv6Address) else self.host
        return host if self.port == STANDARD_PORTS[self.scheme] else f"{host}:{self.port}"


def parse_url(url: str, *, any_port: bool = False) -> Destination:
    """Check an URL's shape: http(s), no credentials, a valid host, a standard port.

    ``any_port=True`` accepts any port, for links that are listed rather than fetched.
    Raises ValueError naming the problem; no DNS lookup happens here.
    """
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"URL is longer than {MAX_URL_CHARS} characters")
    if _UNSAFE.search(url):
        raise ValueError("URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"invalid URL: {error}") from None
    scheme = parts.scheme.lower()
    if scheme not in STANDARD_PORTS:
        raise ValueError(f"only http and https URLs are allowed, not {parts.scheme or 'a relative URL'!r}")
    if "@" in parts.netloc:
        raise ValueError("URLs with embedded credentials are not allowed")
    port = STANDARD_PORTS[scheme] if port is None else port
    if not any_port and port != STANDARD_PORTS[scheme]:
        raise ValueError(f"{scheme} URLs must use port {STANDARD_PORTS[scheme]}, not {port}")
    host, address = parse_host(parts.hostname or "", bracketed="[" in parts.netloc)
    target = quote(parts.path or "/", safe=_TARGET_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_TARGET_SAFE)
    destination = Destination(url="", scheme=scheme, host=host, port=port, target=target, address=address)
    return dataclasses.replace(destination, url=f"{scheme}://{destination.host_header}{target}")


def parse_host(hostname: str, *, bracketed: bool) -> tuple[str, IPAddress | None]:
    """The ASCII host and, for address literals in any spelling, the address it denotes.

    ``hostname`` is lower-case without brackets; ``bracketed`` says it was written in brackets
    (only an IPv6 address is valid then). Raises ValueError naming the host.
    """
    if not hostname:
        raise ValueError("URL has no host")
    if bracketed:
        try:
            address = ipaddress.IPv6Address(hostname)
        except ValueError:
            address = None
        if address is None or address.scope_id:
            raise ValueError(f"invalid IPv6 address {hostname!r}")
        return str(address), address
    try:
        ascii_host = hostname if hostname.isascii() else hostname.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise ValueError(f"invalid host name {hostname!r}") from None
    labels = ascii_host.split(".")
    if labels[-1] == "" and len(labels) > 1:
        labels.pop()
    if _NUMBER.match(labels[-1]):
        address = _ipv4(labels)
        return str(address), address
    if len(ascii_host) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"invalid host name {hostname!r}")
    return ascii_host, None


def _ipv4(labels: list[str]) -> ipaddress.IPv4Address:
    """An IPv4 address from 1-4 decimal, octal (leading 0) or hex (0x) parts, as resolvers read it."""
    if len(labels) > 4:
        raise ValueError(f"invalid IPv4 address {'.'.join(labels)!r}")
    numbers = []
    for label in labels:
        if re.fullmatch(r"0x[0-9a-f]*", label):
            numbers.append(int(label[2:] or "0", 16))
        elif re.fullmatch(r"0[0-7]+", label):
            numbers.append(int(label, 8))
        elif re.fullmatch(r"0|[1-9][0-9]*", label):
            numbers.append(int(label))
        else:
            raise ValueError(f"invalid IPv4 address {'.'.join(labels)!r}")
    *leading, last = numbers
    if any(number > 255 for number in leading) or last >= 256 ** (5 - len(numbers)):
        raise ValueError(f"invalid IPv4 address {'.'.join(labels)!r}")
    value = last
    for index, number in enumerate(leading):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)
