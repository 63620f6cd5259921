"""Output events written by hand are the ExecuteEvents protobuf writes, and the client reads in
place exactly what protobuf would read, leaving every other layout to protobuf."""

import pytest

from protolink.wire._pb import process_pb2
from protolink.wire.output_events import MAX_HEAD_BYTES, output_event, output_event_in, read_output_event


def serialized(request_id: int, channel: int, data: bytes) -> bytes:
    return process_pb2.ExecuteEvent(id=request_id, output=process_pb2.Output(channel=channel, data=data)) \
        .SerializeToString()


@pytest.mark.parametrize(("request_id", "channel", "data"), [
    (1, 1, b"x"),
    (300, 2, "é€😀\n".encode()),
    ((1 << 64) - 1, 1, b"\0" * 70_000),  # a three-byte length, the largest id
])
def test_an_output_event_is_what_protobuf_writes_and_reads_back_in_place(request_id, channel, data):
    event = output_event(request_id, channel, data)
    assert event == serialized(request_id, channel, data)
    read = read_output_event(event)
    assert read is not None and (read.id, read.channel, bytes(read.data)) == (request_id, channel, data)
    assert read.data.obj is event  # a view of what arrived, not a copy


@pytest.mark.parametrize("event", [
    process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=0)).SerializeToString(),
    serialized(0, 1, b"x"),  # no id field: protobuf leaves a zero out
    serialized(1, 1, b""),  # no data field
    serialized(1, 1, b"x") + b"\x28\x05",  # a later id replaces the first one
    output_event(1, 1 << 31, b"x"),  # protobuf reads this channel as a negative number
    output_event(1, 1, b"xy")[:-1],  # cut short
    b"\x28\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # a varint longer than protobuf reads
    b"",
])
def test_any_other_layout_is_left_to_protobuf(event):
    assert read_output_event(event) is None


def test_an_output_event_made_in_the_room_before_its_data_is_the_same_event():
    data = b"\xff" * 200_000
    buffer = bytearray(b"?" * MAX_HEAD_BYTES) + data + b"after"
    event = output_event_in(buffer, MAX_HEAD_BYTES, MAX_HEAD_BYTES + len(data), (1 << 64) - 1, 2)
    assert event == serialized((1 << 64) - 1, 2, data)
    assert buffer.endswith(data + b"after")


def test_an_output_event_whose_head_does_not_fit_before_its_data_is_refused():
    buffer = bytearray(b"??" + b"x" * 10)
    with pytest.raises(ValueError):
        output_event_in(buffer, 2, 12, 1, 1)
    assert buffer == bytearray(b"??" + b"x" * 10)
