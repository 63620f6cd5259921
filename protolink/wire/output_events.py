"""Output events of the Execute stream, encoded and read without a message in between.

An ``ExecuteEvent`` carrying output is almost all bytes. Built as a message, those bytes are
copied into it, then into its serialization; parsed as one, they are copied into the message,
then out of it. Each copy of a mebibyte into fresh memory costs its page faults, more than
the copy. So the server writes the event's few header bytes by hand in front of the data
(:func:`output_event`; :func:`output_event_in` writes them into room left in front of the
data, so that the event is one copy of the buffer), and the client reads the data where it arrived
(:func:`read_output_event`). Both speak plain protobuf: the bytes are an ``ExecuteEvent``
with ``id`` and ``output`` (``channel``, ``data``) in field order, as protobuf itself writes
it, and anything laid out otherwise is left to the protobuf parser.
"""

from __future__ import annotations

from typing import NamedTuple

from .protowire import MAX_VARINT_BYTES, read_varint, varint

#: Keys (field number << 3 | wire type) of the fields an output event has, in order.
_ID = 5 << 3 | 0  # ExecuteEvent.id, varint
_OUTPUT = 7 << 3 | 2  # ExecuteEvent.output, length-delimited
_CHANNEL = 1 << 3 | 0  # Output.channel, varint
_DATA = 3 << 3 | 2  # Output.data, length-delimited


class OutputEvent(NamedTuple):
    """An output event as read: its request id, channel number and bytes (a view of the event)."""

    id: int
    channel: int
    data: memoryview


#: The longest head :func:`output_event_head` writes (four keys and four varints).
MAX_HEAD_BYTES = 4 * (1 + MAX_VARINT_BYTES)


def output_event_head(request_id: int, channel: int, size: int) -> bytes:
    """What an output event of ``size`` bytes of data has in front of them."""
    inner = bytes((_CHANNEL,)) + varint(channel) + bytes((_DATA,)) + varint(size)
    return bytes((_ID,)) + varint(request_id) + bytes((_OUTPUT,)) + varint(len(inner) + size) + inner


def output_event(request_id: int, channel: int, data: bytes) -> bytes:
    """The serialized ``ExecuteEvent(id=request_id, output=Output(channel=channel, data=data))``,
    ``data`` copied once."""
    return b"".join((output_event_head(request_id, channel, len(data)), data))


def output_event_in(buffer: bytearray, start: int, end: int, request_id: int, channel: int) -> bytes:
    """:func:`output_event` of ``buffer[start:end]``, its head written into the buffer just
    before ``start`` (at most :data:`MAX_HEAD_BYTES`), so that the event is copied once, whole;
    ValueError when the head does not fit there."""
    head = output_event_head(request_id, channel, end - start)
    if len(head) > start:
        raise ValueError(f"an output event's head of {len(head)} bytes does not fit in {start}")
    buffer[start - len(head) : start] = head
    return bytes(memoryview(buffer)[start - len(head) : end])


def read_output_event(event: bytes | memoryview) -> OutputEvent | None:
    """The output event serialized as :func:`output_event` lays it out; None for any other
    bytes (parse those as an ``ExecuteEvent``), so what this returns is what protobuf reads."""
    view = memoryview(event)
    fields = []
    position = 0
    for key in (_ID, _OUTPUT, _CHANNEL, _DATA):
        if position >= len(view) or view[position] != key:
            return None
        try:
            value, position = read_varint(view, position + 1)
        except ValueError:
            return None
        if value >= 1 << 64:
            return None
        fields.append(value)
        if key == _OUTPUT and position + value != len(view):
            return None  # the output message must be the rest of the event
    request_id, _, channel, size = fields
    if position + size != len(view) or channel >= 1 << 31:
        return None  # trailing fields, or a channel protobuf would read as negative
    return OutputEvent(request_id, channel, view[position:])
