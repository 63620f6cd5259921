"""A transfer process: writes one upload, or reads one download, as the command user.

The server starts one per ``Upload`` or ``Download`` call (``python -I -m
protolink_sandboxd.transfer_worker``); like a worker (:mod:`protolink_sandboxd.worker`) it sets its
limits, becomes non-dumpable and takes the command uid/gid as its file-system ids for good, so
the files it writes belong to the command user and it opens only what that user may open. It
reads one request frame (:mod:`protolink_sandboxd.frames`) and then:

- ``Upload``: one ``DATA`` frame per ``UploadChunk`` of the call, up to its ``end``. An empty
  frame (the call's stream ended) or the end of input before it means the upload was abandoned:
  nothing of it is kept. One reply frame answers: the ``TransferSummary``, or the ``Error``.
- ``Download``: one ``DATA`` frame per ``DownloadChunk`` (the kind, then the data), then an
  ``OK`` frame with the summary chunk, or an ``ERROR`` frame.

The rules themselves are :mod:`protolink.execution.transfer`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import math
import os
import resource
import sys
from collections.abc import Iterator
from typing import BinaryIO

from protolink.errors import SandboxLimitError, TransferAbandonedError
from protolink.execution.transfer import DEFAULT_LIMITS, TransferLimits, open_source, receive
from google.protobuf.message import DecodeError

from protolink.wire import protowire
from protolink.wire import transfer as wire
from protolink.wire._pb import transfer_pb2
from protolink.wire.status import to_status

from . import frames
from .privileges import (
    OOM_HELPER,
    die_with_parent,
    drop_to_shielded,
    helper_arguments,
    limit,
    make_non_dumpable,
    set_oom_score_adj,
)

#: The field number of ``data`` in both UploadChunk and DownloadChunk.
_DATA_FIELD = 2
#: The capacity asked of the pipes to and from the server: a whole chunk
#: (:data:`~protolink.execution.transfer.CHUNK_BYTES`) passes in one write and one read, not in 16
#: of the default 64 KiB, each a wake-up of both sides. The most an unprivileged process may ask
#: (/proc/sys/fs/pipe-max-size).
PIPE_BYTES = 1 << 20


def main(argv: list[str] | None = None) -> int:
    args = helper_arguments("python -m protolink_sandboxd.transfer_worker", argv, "--memory-bytes",
                            "--max-request-bytes")
    make_non_dumpable()
    limit(resource.RLIMIT_AS, args.memory_bytes)
    limit(resource.RLIMIT_CORE, 0)
    os.umask(0o022)
    os.chdir("/")
    for pipe in (0, 1):
        with contextlib.suppress(OSError):  # a kernel that refuses (gVisor may) keeps its own size
            fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    set_oom_score_adj(OOM_HELPER)
    drop_to_shielded(args.uid, args.gid)
    die_with_parent(args.server)  # after the drop, which clears the parent-death signal
    source, sink = os.fdopen(0, "rb"), os.fdopen(1, "wb", buffering=0)
    sys.stdout = sys.stderr  # stdout carries frames only
    header = source.read(frames.REQUEST.size)
    if len(header) < frames.REQUEST.size:
        return 1
    name_length, payload_length, cpu_seconds = frames.REQUEST.unpack(header)
    if payload_length > args.max_request_bytes:
        return 1
    method, request = source.read(name_length).decode("ascii", "replace"), source.read(payload_length)
    limit(resource.RLIMIT_CPU, math.ceil(cpu_seconds) + 1)
    try:
        if method == "Upload":
            reply = _upload(request, _data(source, args.max_request_bytes))
        elif method == "Download":
            reply = _download(request, sink)
        else:
            raise ValueError(f"unknown transfer {method!r}")
        sink.write(frames.reply_frame(frames.OK, reply))
    except DecodeError:
        sink.write(frames.reply_frame(frames.ERROR, _error(ValueError(f"a malformed {method} message"))))
    except MemoryError:
        sink.write(frames.reply_frame(frames.ERROR, _error(SandboxLimitError(
            f"the {method.lower()} exceeded its process's memory limit and was stopped"))))
    except Exception as error:  # every failure becomes a typed wire error
        sink.write(frames.reply_frame(frames.ERROR, _error(error)))
    return 0


def _upload(request: bytes, data: Iterator[bytes]) -> bytes:
    start = transfer_pb2.UploadChunk.FromString(request).start
    result = receive(start.destination, list(start.roots), wire.kind(start.kind), data, overwrite=start.overwrite,
                     mode=start.mode if start.HasField("mode") else None,
                     keep_outside_symlinks=start.keep_outside_symlinks, limits=_limits(start))
    return wire.summary_message(result).SerializeToString()


def _download(request: bytes, sink: BinaryIO) -> bytes:
    message = transfer_pb2.DownloadRequest.FromString(request)
    with open_source(message.path, list(message.roots), limits=_limits(message)) as source:
        kind = transfer_pb2.DownloadChunk(kind=wire.KIND_NUMBERS[source.kind]).SerializeToString()
        sink.write(frames.reply_frame(frames.DATA, kind))
        for chunk in source:
            sink.write(data_frame_head(len(chunk)))
            sink.write(chunk)  # not copied into a message
    assert source.result is not None  # the source was read to its end
    return transfer_pb2.DownloadChunk(summary=wire.summary_message(source.result)).SerializeToString()


def _data(source: BinaryIO, max_bytes: int) -> Iterator[bytes]:
    """The data of an upload's chunks, up to its ``end``; TransferAbandonedError when the call's
    stream or the input ends first."""
    received = 0
    while len(header := source.read(frames.REPLY.size)) == frames.REPLY.size:
        status, length = frames.REPLY.unpack(header)
        if status != frames.DATA or length > max_bytes:
            raise ValueError("a malformed upload frame")
        if not length:
            break
        payload = source.read(length)
        if (data := data_field(payload)) is not None:
            received += len(data)
            yield data
            continue
        chunk = transfer_pb2.UploadChunk.FromString(payload)
        if chunk.WhichOneof("item") != "end":
            raise ValueError("an upload's chunks after the first carry data, then its end")
        if chunk.end.bytes != received:
            raise ValueError(f"the upload sent {chunk.end.bytes} bytes; {received} arrived")
        return
    raise TransferAbandonedError("the upload ended before its data did; nothing of it was kept")


def _limits(message: transfer_pb2.UploadStart | transfer_pb2.DownloadRequest) -> TransferLimits:
    """The request's limits within this sandbox's: :data:`DEFAULT_LIMITS`, and no more bytes than
    the largest file this process may write (``RLIMIT_FSIZE``, a sandbox's disk budget), so an
    upload that could not land stops at that size with TransferLimitError."""
    own = DEFAULT_LIMITS
    largest, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if largest != resource.RLIM_INFINITY:
        own = own.within(dataclasses.replace(own, max_total_bytes=max(largest, 1), max_file_bytes=max(largest, 1)))
    return wire.limits(message.limits).within(own) if message.HasField("limits") else own


def data_frame_head(size: int) -> bytes:
    """What goes before ``size`` bytes of data to make them a ``DATA`` frame holding a
    DownloadChunk whose one field is that data."""
    field = protowire.key(_DATA_FIELD, protowire.LENGTH) + protowire.varint(size)
    return frames.REPLY.pack(frames.DATA, len(field) + size) + field


def data_field(payload: bytes) -> memoryview | None:
    """The data of an UploadChunk that holds data and nothing else, as a view of ``payload``
    (no copy); None for any other message."""
    try:
        found = list(protowire.fields(memoryview(payload)))
    except ValueError:
        return None
    if len(found) == 1 and found[0][:2] == (_DATA_FIELD, protowire.LENGTH):
        return found[0][2]  # type: ignore[return-value]
    return None


def _error(error: BaseException) -> bytes:
    return to_status(error)[1].SerializeToString()


if __name__ == "__main__":
    sys.exit(main())
