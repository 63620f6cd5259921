"""The transfer process's hand-written data messages agree with the generated code."""

from __future__ import annotations

from protolink_sandboxd import frames
from protolink_sandboxd.transfer_worker import data_field, data_frame_head

from protolink.wire._pb import transfer_pb2


def test_a_data_frame_holds_a_download_chunk_of_the_data() -> None:
    data = bytes(range(256)) * 600
    frame = data_frame_head(len(data)) + data
    status, length = frames.REPLY.unpack_from(frame)
    assert (status, length) == (frames.DATA, len(frame) - frames.REPLY.size)
    assert transfer_pb2.DownloadChunk.FromString(frame[frames.REPLY.size:]) == transfer_pb2.DownloadChunk(data=data)


def test_only_an_upload_chunk_of_data_alone_is_read_as_data() -> None:
    data = b"x" * 200_000
    assert bytes(data_field(transfer_pb2.UploadChunk(data=data).SerializeToString())) == data
    assert bytes(data_field(transfer_pb2.UploadChunk(data=b"").SerializeToString())) == b""
    for other in (transfer_pb2.UploadChunk(end=transfer_pb2.UploadEnd(bytes=3)),
                  transfer_pb2.UploadChunk(start=transfer_pb2.UploadStart(destination="/x")), transfer_pb2.UploadChunk()):
        assert data_field(other.SerializeToString()) is None
    assert data_field(b"\x12\x05ab") is None  # cut short
