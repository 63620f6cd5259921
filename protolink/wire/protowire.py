"""The protobuf wire format by hand, for the two paths that cannot afford the generated code:
output events, whose bytes should not be copied through a message (:mod:`.output_events`), and
``protolink-sandbox exec``, which is timed against ``docker exec`` and loads no protobuf
(:mod:`protolink.sandbox.exec_client`). Tests hold both to the generated code."""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
#: The longest varint protobuf reads (a 64-bit value).
MAX_VARINT_BYTES = 10


def varint(value: int) -> bytes:
    """``value`` as a varint; a negative one as its 64-bit two's complement (ten bytes), as
    protobuf writes an int64."""
    value &= 0xFFFF_FFFF_FFFF_FFFF
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(data: bytes | memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and the position after it, as written (it may exceed 64 bits);
    ValueError when it is cut short or longer than :data:`MAX_VARINT_BYTES`."""
    value = shift = 0
    for index in range(at, min(at + MAX_VARINT_BYTES, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, index + 1
        shift += 7
    raise ValueError("a varint is cut short or too long")


def key(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def length_delimited(number: int, data: bytes) -> bytes:
    return key(number, LENGTH) + varint(len(data)) + data


def fields(data: bytes | memoryview) -> Iterator[tuple[int, int, int | bytes | memoryview]]:
    """(field number, wire type, value) of each field of a message: varints as ints (64 bits),
    the others as slices of ``data``; ValueError for what does not parse."""
    at = 0
    while at < len(data):
        tag, at = read_varint(data, at)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise ValueError("field number 0")
        if wire_type == VARINT:
            value, at = read_varint(data, at)
            yield number, wire_type, value & 0xFFFF_FFFF_FFFF_FFFF
            continue
        if wire_type == LENGTH:
            size, at = read_varint(data, at)
        elif wire_type in (FIXED64, FIXED32):
            size = 8 if wire_type == FIXED64 else 4
        else:
            raise ValueError(f"wire type {wire_type}")
        if at + size > len(data):
            raise ValueError("a field runs past the message")
        yield number, wire_type, data[at:at + size]
        at += size
