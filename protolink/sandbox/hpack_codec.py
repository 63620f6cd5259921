"""HPACK (RFC 7541) for one gRPC call's header blocks, without importing an HTTP/2 library.

Requests are encoded as literals that are never indexed and never Huffman-coded (the simplest
form every decoder accepts). Answers are decoded in full: indexed fields, literals with or
without indexing, a dynamic table of at most :data:`TABLE_BYTES` and its size updates. A
Huffman-coded string (rare in a gRPC server's answers) is decoded by the ``hpack`` package,
loaded then. Whatever the peer sends is untrusted: a block that does not decode, an index
outside the tables or a header list beyond its bound is a :class:`HeaderError`.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The dynamic table the peer may use (the HTTP/2 default, never changed by our SETTINGS).
TABLE_BYTES = 4096
#: The largest integer a field may hold: more than any index or string length that fits a bound.
MAX_INTEGER = 1 << 24

#: RFC 7541, Appendix A.
STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = tuple(
    (name.encode(), value.encode()) for name, value in (
        (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
        (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
        (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
        ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
        ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""),
        ("cache-control", ""), ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""),
        ("content-length", ""), ("content-location", ""), ("content-range", ""), ("content-type", ""),
        ("cookie", ""), ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
        ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
        ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""),
        ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""),
        ("retry-after", ""), ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""),
        ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
    )
)

Headers = list[tuple[bytes, bytes]]


class HeaderError(ValueError):
    """A header block that does not decode, or is larger than allowed."""


def encode(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """``headers`` as a block of literal fields, never indexed (RFC 7541, 6.2.3)."""
    block = bytearray()
    for name, value in headers:
        block.append(0x10)  # never indexed, the name a literal
        for text in (name, value):
            block += _integer(len(text), 7, 0) + text  # not Huffman-coded
    return bytes(block)


class Decoder:
    """Decodes the header blocks of one connection in order; each list at most ``max_list_bytes``
    (counted as RFC 7541 counts a table entry: name, value and 32)."""

    def __init__(self, max_list_bytes: int) -> None:
        self._max_list_bytes = max_list_bytes
        self._table: list[tuple[bytes, bytes]] = []  # newest first
        self._table_bytes = 0
        self._table_limit = TABLE_BYTES

    def decode(self, block: bytes) -> Headers:
        headers: Headers = []
        size = 0
        at = 0
        while at < len(block):
            first = block[at]
            if first & 0x80:  # indexed field
                index, at = _read_integer(block, at, 7)
                field = self._field(index)
            elif first & 0xE0 == 0x20:  # dynamic table size update
                limit, at = _read_integer(block, at, 5)
                if limit > TABLE_BYTES:
                    raise HeaderError(f"a dynamic table of {limit} bytes was not allowed")
                self._table_limit = limit
                self._evict(0)
                continue
            else:  # a literal: with incremental indexing (01), or without / never indexed (000x)
                indexing = first & 0xC0 == 0x40
                index, at = _read_integer(block, at, 6 if indexing else 4)
                if index:
                    name = self._field(index)[0]
                else:
                    name, at = _read_string(block, at)
                value, at = _read_string(block, at)
                field = (name, value)
                if indexing:
                    self._add(field)
            size += len(field[0]) + len(field[1]) + 32
            if size > self._max_list_bytes:
                raise HeaderError(f"the header list exceeds {self._max_list_bytes} bytes")
            headers.append(field)
        return headers

    def _field(self, index: int) -> tuple[bytes, bytes]:
        if 0 < index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        if 0 < index - len(STATIC_TABLE) <= len(self._table):
            return self._table[index - len(STATIC_TABLE) - 1]
        raise HeaderError(f"header index {index} is outside the tables")

    def _add(self, field: tuple[bytes, bytes]) -> None:
        size = len(field[0]) + len(field[1]) + 32
        self._evict(size)
        if size <= self._table_limit:
            self._table.insert(0, field)
            self._table_bytes += size

    def _evict(self, room: int) -> None:
        while self._table and self._table_bytes + room > self._table_limit:
            name, value = self._table.pop()
            self._table_bytes -= len(name) + len(value) + 32


def _integer(value: int, prefix_bits: int, flags: int) -> bytes:
    """``value`` in an N-bit prefix (RFC 7541, 5.1), the rest of the first byte ``flags``."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([flags | value])
    out = bytearray([flags | limit])
    value -= limit
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_integer(block: bytes, at: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    value = block[at] & limit
    at += 1
    if value < limit:
        return value, at
    shift = 0
    while True:
        if at >= len(block):
            raise HeaderError("a header block ends inside an integer")
        byte = block[at]
        at += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if value > MAX_INTEGER:
            raise HeaderError("a header block holds an integer too large")
        if not byte & 0x80:
            return value, at


def _read_string(block: bytes, at: int) -> tuple[bytes, int]:
    if at >= len(block):
        raise HeaderError("a header block ends before a string")
    huffman = block[at] & 0x80
    length, at = _read_integer(block, at, 7)
    if at + length > len(block):
        raise HeaderError("a header string runs past its block")
    data = block[at:at + length]
    if huffman:
        from hpack import HPACKDecodingError
        from hpack.huffman_table import decode_huffman

        try:
            data = decode_huffman(data)
        except HPACKDecodingError as error:
            raise HeaderError(f"a Huffman-coded header string does not decode: {error}") from None
    return data, at + length
