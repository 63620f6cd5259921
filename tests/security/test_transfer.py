"""Uploads and downloads (protolink.sandbox.transfer): a hostile client's archive and a hostile
command's tree are refused member by member, and nothing of a refused transfer stays."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
from pathlib import Path

import grpc
import pytest

from protolink.errors import ArchiveError
from protolink.sandbox.transfer import download, upload
from protolink.wire._pb import transfer_pb2
from protolink.wire.status import from_rpc_error

from .conftest import HANG_GUARD, Attacker, still_serves

pytestmark = pytest.mark.docker

#: (name, type, link target) of one hostile member each, and the words of its refusal.
HOSTILE_MEMBERS = [
    (("../escape", tarfile.REGTYPE, ""), "'..'"),
    (("/tmp/escape", tarfile.REGTYPE, ""), "absolute"),
    (("out", tarfile.SYMTYPE, "../../../../etc"), "outside"),
    (("hard", tarfile.LNKTYPE, "/etc/passwd"), "hard link"),
    (("null", tarfile.CHRTYPE, ""), "special"),
    (("fifo", tarfile.FIFOTYPE, ""), "special"),
    (("tool", tarfile.REGTYPE, ""), "set-id"),
]


def _archive(*members: tuple[str, bytes, str], mode: int = 0o644) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, type, linkname in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = type, linkname, mode
            info.size = 1 if type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(b"x") if type == tarfile.REGTYPE else None)
    return buffer.getvalue()


async def _send(attacker: Attacker, destination: Path, data: bytes) -> None:
    """The upload a hostile client makes: its own archive, past every check of the host's client."""
    async def messages():
        yield transfer_pb2.UploadChunk(start=transfer_pb2.UploadStart(
            destination=str(destination), roots=[str(attacker.ws)], kind=transfer_pb2.TRANSFER_KIND_TAR))
        yield transfer_pb2.UploadChunk(data=data)
        yield transfer_pb2.UploadChunk(end=transfer_pb2.UploadEnd(bytes=len(data)))

    try:
        await attacker.backend.stream_method("Upload")(messages(), timeout=HANG_GUARD)
    except grpc.aio.AioRpcError as error:
        raise from_rpc_error(error) from None


async def test_hostile_archive_uploaded(attacker):
    """A client uploads tar archives with a '..' name, an absolute name, a symlink out of the destination, a hard link to /etc/passwd, a character device, a FIFO, a set-uid file, and a symlink to a directory followed by a file written through it.

    The sandbox refuses each with ArchiveError before its member is written, and the workspace holds nothing afterwards: not the member, not the files before it, not the private directory the upload was extracted into.
    """
    for (name, type, linkname), message in HOSTILE_MEMBERS:
        mode = 0o4755 if message == "set-id" else 0o644
        with pytest.raises(ArchiveError, match=message):
            await _send(attacker, attacker.ws / "tree", _archive(("first", tarfile.REGTYPE, ""),
                                                                  (name, type, linkname), mode=mode))
    (attacker.ws / "sub").mkdir()
    through = _archive(("link", tarfile.SYMTYPE, "sub"), ("link/file", tarfile.REGTYPE, ""))
    with pytest.raises(ArchiveError, match="symlink"):
        await _send(attacker, attacker.ws / "tree", through)
    assert sorted(os.listdir(attacker.ws)) == ["sub"] and os.listdir(attacker.ws / "sub") == []
    await still_serves(attacker)


async def test_hostile_tree_downloaded_and_planted_links_uploaded_through(attacker, tmp_path: Path):
    """A command fills a tree with a symlink to /etc, a symlink to /etc/passwd and a FIFO, then the host downloads it; a command plants a symlink to /etc where the host then uploads a directory.

    The download refuses the links out (ArchiveError) and writes nothing on the host; asked to keep them, it writes them as symlinks, never the content of /etc, and reports the FIFO as skipped. The upload through the planted link is refused and /etc in the sandbox is untouched.
    """
    made = await attacker.shell("mkdir tree && ln -s /etc tree/etc && ln -s /etc/passwd tree/pw && mkfifo tree/fifo"
                                " && ln -s /etc planted")
    assert made.exit_code == 0, made
    with pytest.raises(ArchiveError, match="outside"):
        await asyncio.wait_for(download(attacker.backend, str(attacker.ws / "tree"), tmp_path / "got"), HANG_GUARD)
    assert os.listdir(tmp_path) == []
    kept = await asyncio.wait_for(download(attacker.backend, str(attacker.ws / "tree"), tmp_path / "got",
                                           keep_outside_symlinks=True), HANG_GUARD)
    assert kept.skipped == ("fifo",) and (kept.files, kept.symlinks) == (0, 2)
    assert {name: os.readlink(tmp_path / "got" / name) for name in os.listdir(tmp_path / "got")} == {
        "etc": "/etc", "pw": "/etc/passwd"}
    local = tmp_path / "local"
    (local / "cron.d").mkdir(parents=True)
    (local / "cron.d" / "job").write_text("* * * * * root id\n")
    with pytest.raises(ValueError, match="symlink"):
        await asyncio.wait_for(upload(attacker.backend, local, str(attacker.ws / "planted" / "cron.d")), HANG_GUARD)
    listed = await attacker.shell("ls /etc/cron.d 2>&1; ls -A")
    assert "job" not in listed.stdout
    await still_serves(attacker)
