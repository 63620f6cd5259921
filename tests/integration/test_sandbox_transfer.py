"""Upload and download through a real sandbox: trees and files go in and come back byte for byte,
owned by the command user; hostile archives and paths are refused at either end and leave nothing."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protolink.errors import ArchiveError, SandboxLimitError, TransferLimitError
from protolink.sandbox.client import SandboxBackend
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.transfer import TransferLimits, download, upload
from protolink.wire._pb import transfer_pb2
from protolink.wire.status import from_rpc_error

pytestmark = pytest.mark.docker

NOBODY = 65534
HANG_GUARD = 120  # seconds: only keeps a broken build from hanging; never a timing assertion


@pytest.fixture
def work(tmp_path: Path) -> Path:
    root = tmp_path.resolve() / "work"
    root.mkdir()
    os.chown(root, NOBODY, NOBODY)
    return root


@pytest.fixture
async def box(sandbox_image: str, work: Path, tmp_path: Path) -> AsyncIterator[SandboxBackend]:
    (tmp_path / "ro").mkdir()
    async with DockerSandbox([tmp_path / "ro"], writable=[work], image=sandbox_image) as backend:
        yield backend


def local_tree(base: Path) -> Path:
    tree = base / "project"
    (tree / "src" / "pkg").mkdir(parents=True)
    (tree / "src" / "pkg" / "data.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 11))
    (tree / "src" / "main.py").write_text("print('hello from the upload')\n")
    (tree / "run.sh").write_text("#!/bin/sh\ncat src/main.py\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "link").symlink_to("src/main.py")
    return tree


def files_of(tree: Path) -> dict[str, object]:
    found: dict[str, object] = {}
    for path in sorted(tree.rglob("*")):
        name = str(path.relative_to(tree))
        if path.is_symlink():
            found[name] = ("link", os.readlink(path))
        elif path.is_file():
            found[name] = (path.read_bytes(), path.stat().st_mode & 0o777)
        else:
            found[name] = "dir"
    return found


async def test_a_tree_and_a_file_go_in_and_come_back_identical(box: SandboxBackend, work: Path, tmp_path: Path,
                                                              run) -> None:
    tree = local_tree(tmp_path)
    single = tmp_path / "notes.txt"
    single.write_bytes(b"notes\n" * 1000)
    backend = box
    sent = await asyncio.wait_for(upload(backend, tree, str(work / "project")), HANG_GUARD)
    assert (sent.kind, sent.files, sent.directories, sent.symlinks) == ("tar", 3, 2, 1)
    await asyncio.wait_for(upload(backend, single, str(work / "notes.txt"), mode=0o600), HANG_GUARD)

    result = await run(backend, ["/bin/sh", "-c", "./run.sh && cat link && stat -c '%u %a' src/main.py ../notes.txt"],
                       cwd=str(work / "project"))
    assert result.exit_code == 0, result
    assert result.stdout.splitlines() == ["print('hello from the upload')"] * 2 + [f"{NOBODY} 644", f"{NOBODY} 600"]

    back = tmp_path / "back"
    back.mkdir()
    received = await asyncio.wait_for(download(backend, str(work / "project"), back / "project"), HANG_GUARD)
    assert (received.files, received.symlinks, received.skipped) == (3, 1, ())
    assert files_of(back / "project") == files_of(tree)
    await asyncio.wait_for(download(backend, str(work / "notes.txt"), back / "notes.txt"), HANG_GUARD)
    assert (back / "notes.txt").read_bytes() == single.read_bytes()


async def test_a_symlink_to_etc_comes_back_as_a_link_never_its_target(box: SandboxBackend, work: Path,
                                                                      tmp_path: Path, run) -> None:
    made = await run(box, ["/bin/sh", "-c", "mkdir tree && ln -s /etc tree/etc && ln -s /etc/passwd tree/pw"
                                                    " && mkfifo tree/fifo"], cwd=str(work))
    assert made.exit_code == 0, made
    with pytest.raises(ArchiveError, match="outside"):
        await asyncio.wait_for(download(box, str(work / "tree"), tmp_path / "refused"), HANG_GUARD)
    assert not (tmp_path / "refused").exists()
    assert [name for name in os.listdir(tmp_path) if name.startswith(".protolink")] == []

    kept = await asyncio.wait_for(download(box, str(work / "tree"), tmp_path / "kept",
                                           keep_outside_symlinks=True), HANG_GUARD)
    assert kept.skipped == ("fifo",)
    assert sorted(os.listdir(tmp_path / "kept")) == ["etc", "pw"]
    assert os.readlink(tmp_path / "kept" / "etc") == "/etc" and os.readlink(tmp_path / "kept" / "pw") == "/etc/passwd"
    with pytest.raises(ValueError, match="symlink"):
        await asyncio.wait_for(download(box, str(work / "tree" / "pw"), tmp_path / "pw"), HANG_GUARD)


def hostile(*members: tuple[str, bytes, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, type, linkname in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = type, linkname, 1 if type == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(b"x") if type == tarfile.REGTYPE else None)
    return buffer.getvalue()


async def send_raw(backend, destination: str, data: bytes, *, sent: int | None = None, **start: object) -> None:
    """An upload of ``data`` as it stands, as a hostile client would send it, whose end says
    ``sent`` bytes were sent (by default, as many as there are)."""
    async def messages():
        yield transfer_pb2.UploadChunk(start=transfer_pb2.UploadStart(
            destination=destination, roots=[str(Path(destination).parent)], kind=transfer_pb2.TRANSFER_KIND_TAR,
            **start))
        yield transfer_pb2.UploadChunk(data=data)
        yield transfer_pb2.UploadChunk(end=transfer_pb2.UploadEnd(bytes=len(data) if sent is None else sent))

    try:
        await backend.stream_method("Upload")(messages(), timeout=HANG_GUARD)
    except grpc.aio.AioRpcError as error:
        raise from_rpc_error(error) from None


@pytest.mark.parametrize(("members", "message"), [
    ([("../escape", tarfile.REGTYPE, "")], "'..'"),
    ([("/tmp/escape", tarfile.REGTYPE, "")], "absolute"),
    ([("out", tarfile.SYMTYPE, "/etc")], "outside"),
    ([("hard", tarfile.LNKTYPE, "/etc/passwd")], "hard link"),
    ([("dev", tarfile.CHRTYPE, "")], "special"),
    ([("link", tarfile.SYMTYPE, "sub"), ("sub", tarfile.DIRTYPE, ""), ("link/x", tarfile.REGTYPE, "")], "symlink"),
])
async def test_a_hostile_archive_is_refused_in_the_sandbox_and_leaves_nothing(box: SandboxBackend, work: Path,
                                                                              members, message: str) -> None:
    with pytest.raises(ArchiveError, match=message):
        await send_raw(box, str(work / "tree"), hostile(*members))
    assert os.listdir(work) == []


async def test_refused_paths_and_limits_leave_nothing(box: SandboxBackend, work: Path, tmp_path: Path) -> None:
    tree = local_tree(tmp_path)
    (work / "planted").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="symlink"):
        await asyncio.wait_for(upload(box, tree, str(work / "planted" / "tree")), HANG_GUARD)
    with pytest.raises(PermissionError):
        await asyncio.wait_for(upload(box, tree, str(tmp_path / "ro" / "tree"), roots=[str(tmp_path / "ro")]),
                               HANG_GUARD)
    with pytest.raises(TransferLimitError):  # refused by the sandbox: the client's own check is bypassed
        await send_raw(box, str(work / "big"), hostile(("a", tarfile.REGTYPE, ""), ("b", tarfile.REGTYPE, "")),
                       limits=transfer_pb2.TransferLimits(max_total_bytes=10, max_file_bytes=10, max_entries=1,
                                                          max_path_chars=100, max_depth=4))
    with pytest.raises(ValueError, match="arrived"):  # an end that does not match the data
        await send_raw(box, str(work / "short"), hostile(("a", tarfile.REGTYPE, "")), sent=1)
    with pytest.raises(TransferLimitError):
        await asyncio.wait_for(upload(box, tree, str(work / "tree"),
                                      limits=TransferLimits(max_file_bytes=1024 * 1024)), HANG_GUARD)
    assert os.listdir(work) == ["planted"]
    assert sorted(os.listdir(tmp_path)) == ["project", "ro", "work"]


async def stalled_upload(backend: SandboxBackend, work: Path, run) -> Any:
    """An upload of a tree to ``work``/tree whose first KiB is sent, and nothing after: its call,
    once its private directory is there."""
    sent = asyncio.Event()

    async def messages():
        yield transfer_pb2.UploadChunk(start=transfer_pb2.UploadStart(
            destination=str(work / "tree"), roots=[str(work)], kind=transfer_pb2.TRANSFER_KIND_TAR))
        yield transfer_pb2.UploadChunk(data=hostile(("a", tarfile.REGTYPE, ""))[:1024])
        sent.set()
        await asyncio.Event().wait()  # never finishes

    call = backend.stream_method("Upload")(messages(), timeout=HANG_GUARD)
    await asyncio.wait_for(sent.wait(), HANG_GUARD)
    await run(backend, ["/bin/sh", "-c", f"until ls -A {work} | grep -q .; do :; done"])
    return call


async def test_an_abandoned_upload_leaves_nothing(box: SandboxBackend, work: Path, run) -> None:
    call = await stalled_upload(box, work, run)
    listing = await run(box, ["/bin/ls", "-A", str(work)])
    assert listing.stdout.startswith(".protolink-transfer-")  # the upload is under way in a private directory
    call.cancel()
    emptied = await run(box, ["/bin/sh", "-c", f"while ls -A {work} | grep -q .; do :; done"])
    assert emptied.exit_code == 0 and os.listdir(work) == []


#: Run as root in the container (docker exec): SIGKILL every transfer process, and wait until it
#: has closed its files (its locks go with them). The bracket keeps the pattern from matching itself.
KILL_TRANSFERS = ("for p in /proc/[0-9]*; do grep -q 'transfer_worke[r]' $p/cmdline 2>/dev/null || continue; "
                  "kill -9 ${p#/proc/}; while [ -n \"$(ls $p/fd 2>/dev/null)\" ]; do :; done; done")


async def test_what_a_killed_upload_left_is_removed_by_the_next(sandbox_image: str, work: Path, tmp_path: Path,
                                                                docker_client, run) -> None:
    sandbox = DockerSandbox([], writable=[work], image=sandbox_image)
    async with sandbox as box:
        call = await stalled_upload(box, work, run)
        killed = docker_client.containers.get(sandbox.container_id).exec_run(["/bin/sh", "-c", KILL_TRANSFERS])
        assert killed.exit_code == 0, killed.output
        with pytest.raises(grpc.aio.AioRpcError) as ended:  # at once, though the client sends nothing more
            await asyncio.wait_for(call, HANG_GUARD)
        assert isinstance(from_rpc_error(ended.value), SandboxLimitError)
        (left,) = os.listdir(work)
        assert left.startswith(".protolink-transfer-")  # the kill left it
        single = tmp_path / "notes.txt"
        single.write_text("notes\n")
        await asyncio.wait_for(upload(box, single, str(work / "notes.txt")), HANG_GUARD)
        assert os.listdir(work) == ["notes.txt"]


async def test_links_out_of_an_uploaded_tree_are_refused_unless_kept(box: SandboxBackend, work: Path,
                                                                     tmp_path: Path, run) -> None:
    tree = tmp_path / "venv"
    (tree / "bin").mkdir(parents=True)
    (tree / "bin" / "python").symlink_to("/usr/bin/python3")
    with pytest.raises(ArchiveError, match="outside"):  # refused by the sandbox
        await asyncio.wait_for(upload(box, tree, str(work / "venv")), HANG_GUARD)
    assert os.listdir(work) == []
    kept = await asyncio.wait_for(upload(box, tree, str(work / "venv"), keep_outside_symlinks=True), HANG_GUARD)
    assert kept.symlinks == 1
    assert os.readlink(work / "venv" / "bin" / "python") == "/usr/bin/python3"
