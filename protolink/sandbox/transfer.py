"""Files in and out of a sandbox as bounded streams: :func:`upload` and :func:`download`.

A local file goes as its bytes, a local directory as a tar built while it is read (symlinks as
symlinks, special files left out and reported); the sandbox writes it beneath a writable root
as its command user, by the rules of :mod:`protolink.execution.transfer`. A download comes
back the same way and is untrusted: the same rules check every tar member again here, it is
written into a temporary sibling of ``destination`` and renamed into place at the end, and a
refused or interrupted download leaves nothing. Blocking file work runs on threads; no side
holds more than a few chunks of the data at once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from protolink.errors import SandboxProtocolError
from protolink.execution.paths import canonical_roots, resolve_under_roots
from protolink.execution.transfer import DEFAULT_LIMITS, TransferLimits, TransferResult, open_source, receive
from protolink.wire import transfer as wire
from protolink.wire._pb import transfer_pb2
from protolink.wire.status import CallEnd, Status, checked_answer, from_rpc_error, parsed_answer

from .client import SandboxBackend

__all__ = ["TransferLimits", "TransferResult", "download", "upload"]


async def upload(backend: SandboxBackend, source: str | os.PathLike[str], destination: str, *,
                 overwrite: bool = False, mode: int | None = None, keep_outside_symlinks: bool = False,
                 roots: Sequence[str] | None = None, limits: TransferLimits = DEFAULT_LIMITS,
                 timeout: float | None = None) -> TransferResult:
    """Copy the local file or directory ``source`` to ``destination`` in the sandbox.

    ``destination`` is absolute, beneath ``roots`` (by default the sandbox's writable roots), in
    an existing directory; it must not exist unless ``overwrite``. A file gets ``mode`` (0644 by
    default); a directory keeps its files' permission bits (never set-id bits). Symlinks in a
    directory whose target leaves it are refused unless ``keep_outside_symlinks``. Returns what
    the sandbox wrote. Raises ArchiveError, TransferLimitError, the path rules' ValueError, and
    the sandbox's errors; nothing is left in the sandbox of a failed upload.
    """
    roots = _roots(backend, roots, writable=True)
    target = resolve_under_roots(destination, roots).path
    path, local_roots = _local(source)
    failures: list[BaseException] = []
    with open_source(path, local_roots, limits=limits) as local:
        start = transfer_pb2.UploadStart(
            destination=destination, roots=roots, kind=wire.KIND_NUMBERS[local.kind], overwrite=overwrite, mode=mode,
            keep_outside_symlinks=keep_outside_symlinks, limits=wire.limits_message(limits))

        async def messages() -> AsyncIterator[transfer_pb2.UploadChunk]:
            yield transfer_pb2.UploadChunk(start=start)
            pieces, sent = iter(local), 0
            while True:
                try:
                    piece = await asyncio.to_thread(next, pieces, None)
                except Exception as error:
                    # Ended without its end, the stream is abandoned by the sandbox, which
                    # keeps nothing of it; the call fails, and this error is the reason.
                    failures.append(error)
                    return
                if piece is None:
                    break
                sent += len(piece)
                yield transfer_pb2.UploadChunk(data=piece)
            yield transfer_pb2.UploadChunk(end=transfer_pb2.UploadEnd(bytes=sent))

        call = backend.stream_method("Upload")(messages(), timeout=timeout)
        end = CallEnd(call)  # a refusal while the data goes out comes typed, not as grpcio's INTERNAL
        try:
            response = await call
        except grpc.aio.AioRpcError as error:
            if failures:
                raise failures[0] from None
            raise end.error(Status.raised_by(error)) from None
    return checked_answer(wire.summary, parsed_answer(response), path=target, limits=limits)


async def download(backend: SandboxBackend, source: str, destination: str | os.PathLike[str], *,
                   overwrite: bool = False, keep_outside_symlinks: bool = False, roots: Sequence[str] | None = None,
                   limits: TransferLimits = DEFAULT_LIMITS, timeout: float | None = None) -> TransferResult:
    """Copy the file or directory ``source`` in the sandbox to the local ``destination``.

    ``source`` is absolute, beneath ``roots`` (by default all of the sandbox's roots); a symlink
    or special file there is refused. ``destination``'s directory must exist; ``destination``
    must not, unless ``overwrite``. Every member of a directory's tar is checked as
    :func:`upload`'s are in the sandbox (symlinks out of it refused unless
    ``keep_outside_symlinks``, kept as links then, never followed). Returns what was written
    here, with the special files the sandbox left out in ``skipped``.
    """
    roots = _roots(backend, roots, writable=False)
    remote = resolve_under_roots(source, roots).path
    path, local_roots = _local(destination)
    request = transfer_pb2.DownloadRequest(path=source, roots=roots, limits=wire.limits_message(limits))
    call = backend.stream_method("Download")(request, timeout=timeout)
    loop = asyncio.get_running_loop()
    summaries: list[TransferResult] = []

    def pull() -> Any:
        return asyncio.run_coroutine_threadsafe(_next(call), loop).result()

    def data() -> Iterator[bytes]:
        while (message := pull()).WhichOneof("item") == "data":
            yield message.data
        _require(message.WhichOneof("item") == "summary", "the sandbox sent a download out of order")
        summaries.append(checked_answer(wire.summary, message.summary, path=remote, limits=limits))
        _require(summaries[0].kind == kind, "the sandbox sent a download of another kind")

    try:
        first = await _next(call)
        _require(first.WhichOneof("item") == "kind", "the sandbox sent a download without its kind")
        kind = checked_answer(wire.kind, first.kind)
        result = await asyncio.to_thread(receive, path, local_roots, kind, data(), overwrite=overwrite,
                                         keep_outside_symlinks=keep_outside_symlinks, limits=limits)
    finally:
        call.cancel()  # done, or stop the sandbox's side of a failed download
    return TransferResult(result.path, result.kind, files=result.files, directories=result.directories,
                          symlinks=result.symlinks, bytes=result.bytes, skipped=summaries[0].skipped)


async def _next(call: Any) -> transfer_pb2.DownloadChunk:
    """The next message of a download; SandboxProtocolError when the stream ends instead."""
    try:
        message = await call.read()
    except grpc.aio.AioRpcError as error:
        raise from_rpc_error(error) from None
    _require(message is not grpc.aio.EOF and message is not None, "the sandbox ended a download before its summary")
    return message


def _roots(backend: SandboxBackend, roots: Sequence[str] | None, *, writable: bool) -> list[str]:
    if roots is None:
        roots = [root.path for root in backend.info_at_connect.roots if root.writable or not writable]
    if isinstance(roots, (str, bytes)):
        raise TypeError("roots must be a list of absolute paths, not a single path")
    return list(roots)


def _local(path: str | os.PathLike[str]) -> tuple[str, tuple[str, ...]]:
    """A local path spelled beneath its directory's real path, and that directory as the root:
    the path rules then apply to its last component, the caller's own choice of directory aside."""
    absolute = Path(os.path.abspath(path))
    if absolute == absolute.parent:
        return str(absolute), canonical_roots([absolute])
    parent = canonical_roots([absolute.parent])
    return os.path.join(parent[0], absolute.name), parent


def _require(condition: bool, problem: str) -> None:
    if not condition:
        raise SandboxProtocolError(problem)
