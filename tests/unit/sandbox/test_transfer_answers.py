"""A download treats everything the sandbox sends as untrusted: a fake server scripts the stream,
and whatever is wrong with it is refused with a typed error, leaving nothing on the host."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protolink.errors import ArchiveError, SandboxProtocolError, TransferLimitError
from protolink.sandbox import connect
from protolink.sandbox.transfer import TransferLimits, download
from protolink.wire._pb import sandbox_pb2, transfer_pb2

from .test_untrusted_answers import SERVICE, serving

REMOTE = "/ws/tree"
TAR, FILE = transfer_pb2.TRANSFER_KIND_TAR, transfer_pb2.TRANSFER_KIND_FILE


class Script:
    """The fake server: Info names one root, Download answers with ``chunks``."""

    def __init__(self) -> None:
        self.chunks: list[transfer_pb2.DownloadChunk] = []

    async def _info(self, request: bytes, context: Any) -> bytes:
        return sandbox_pb2.InfoResponse(boundary="sandbox:fake", server_version="0",
                                        roots=[sandbox_pb2.Root(path="/ws")]).SerializeToString()

    async def _download(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk.SerializeToString()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Info": grpc.unary_unary_rpc_method_handler(self._info),
            "Download": grpc.unary_stream_rpc_method_handler(self._download),
        })


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[Script, str]]:
    script, address = Script(), f"unix://{tmp_path / 'fake.sock'}"
    async with serving(script, address):  # type: ignore[arg-type]
        yield script, address


def kind(number: int) -> transfer_pb2.DownloadChunk:
    return transfer_pb2.DownloadChunk(kind=number)


def data(payload: bytes) -> transfer_pb2.DownloadChunk:
    return transfer_pb2.DownloadChunk(data=payload)


def summary(path: str = REMOTE, number: int = TAR, **counts: int) -> transfer_pb2.DownloadChunk:
    return transfer_pb2.DownloadChunk(summary=transfer_pb2.TransferSummary(path=path, kind=number, **counts))


def tar_of(name: str, type: bytes = tarfile.REGTYPE, linkname: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.size = type, linkname, 1 if type == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(b"x") if type == tarfile.REGTYPE else None)
    return buffer.getvalue()


async def fetch(address: str, destination: Path, **options: Any) -> Any:
    async with await connect(address) as backend:
        return await download(backend, REMOTE, destination, **options)


async def test_a_well_formed_download_lands(fake, tmp_path: Path) -> None:
    script, address = fake
    script.chunks = [kind(TAR), data(tar_of("a")), summary(files=1, bytes=1)]
    result = await fetch(address, tmp_path / "got")
    assert (tmp_path / "got" / "a").read_bytes() == b"x" and result.files == 1


@pytest.mark.parametrize(("chunks", "error"), [
    ([kind(TAR), data(tar_of("../escape")), summary()], ArchiveError),
    ([kind(TAR), data(tar_of("etc", tarfile.SYMTYPE, "/etc")), summary()], ArchiveError),
    ([kind(TAR), data(tar_of("dev", tarfile.CHRTYPE)), summary()], ArchiveError),
    ([kind(TAR), data(tar_of("a"))], SandboxProtocolError),
    ([kind(TAR), data(tar_of("a")), summary(path="/ws/other")], SandboxProtocolError),
    ([kind(TAR), data(tar_of("a")), summary(number=FILE)], SandboxProtocolError),
    ([kind(TAR), data(tar_of("a")), summary(files=10**9)], SandboxProtocolError),
    ([data(tar_of("a")), summary()], SandboxProtocolError),
    ([kind(9), data(b"x"), summary()], SandboxProtocolError),
    ([kind(TAR), data(tar_of("a")), kind(TAR), summary()], SandboxProtocolError),
    ([kind(FILE), data(b"x" * 11), summary(number=FILE)], TransferLimitError),
], ids=["dot-dot", "link-out", "device", "no-summary", "other-path", "other-kind", "bad-count", "no-kind",
        "unknown-kind", "out-of-order", "file-too-large"])
async def test_a_bad_download_is_refused_and_leaves_nothing(fake, tmp_path: Path, chunks: list,
                                                            error: type[Exception]) -> None:
    script, address = fake
    script.chunks = chunks
    with pytest.raises(error):
        await fetch(address, tmp_path / "got", limits=TransferLimits(max_file_bytes=10))
    assert sorted(os.listdir(tmp_path)) == ["fake.sock"]
