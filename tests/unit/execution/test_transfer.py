"""Transfers into and out of a directory (protolink.execution.transfer): the rules a hostile
archive meets, the limits, that a failed transfer leaves nothing behind, and that what a killed
one left is removed by the next, never what one under way is writing."""

from __future__ import annotations

import io
import os
import signal
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from protolink.errors import ArchiveError, TransferLimitError
from protolink.execution.paths import canonical_roots
from protolink.execution.transfer import TransferLimits, open_source, receive


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path.resolve() / "root"
    path.mkdir()
    return path


def archive(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def member(name: str, type: bytes = tarfile.REGTYPE, *, mode: int = 0o644, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname = type, mode, linkname
    return info


def upload(root: Path, data: bytes, name: str = "tree", **options) -> object:
    chunks = [data[index:index + 1000] for index in range(0, len(data), 1000)]
    return receive(str(root / name), canonical_roots([root]), "tar", chunks, **options)


def only(root: Path) -> list[str]:
    return sorted(os.listdir(root))


def test_a_tree_lands_with_its_modes_and_inner_symlinks(root: Path) -> None:
    data = archive((member("bin", tarfile.DIRTYPE, mode=0o750), None),
                   (member("bin/run", mode=0o755), b"#!/bin/sh\n"),
                   (member("docs/a/readme.txt"), b"hello"),
                   (member("docs/link", tarfile.SYMTYPE, linkname="a/readme.txt"), None),
                   (member("top", tarfile.SYMTYPE, linkname="docs/../bin/run"), None))
    result = upload(root, data)
    tree = root / "tree"
    assert (result.files, result.directories, result.symlinks, result.bytes) == (2, 1, 2, 15)
    assert stat.S_IMODE((tree / "bin").stat().st_mode) == 0o750
    assert stat.S_IMODE((tree / "bin/run").stat().st_mode) == 0o755
    assert stat.S_IMODE((tree / "docs").stat().st_mode) == 0o755  # implied by a member's name
    assert os.readlink(tree / "docs/link") == "a/readme.txt"
    assert (tree / "docs/link").read_text() == "hello"
    assert only(root) == ["tree"]


@pytest.mark.parametrize(("hostile", "message"), [
    (member("../escape"), "'..'"),
    (member("a/../../escape"), "'..'"),
    (member("/etc/escape"), "absolute"),
    (member("out", tarfile.SYMTYPE, linkname="/etc"), "outside"),
    (member("out", tarfile.SYMTYPE, linkname="../.."), "outside"),
    (member("a/out", tarfile.SYMTYPE, linkname="../../x"), "outside"),
    (member("hard", tarfile.LNKTYPE, linkname="/etc/passwd"), "hard link"),
    (member("hard", tarfile.LNKTYPE, linkname="inside"), "hard link"),
    (member("device", tarfile.CHRTYPE), "special"),
    (member("disk", tarfile.BLKTYPE), "special"),
    (member("fifo", tarfile.FIFOTYPE), "special"),
    (member("setuid", mode=0o4755), "set-id"),
    (member("setgid", tarfile.DIRTYPE, mode=0o2755), "set-id"),
])
def test_a_hostile_member_is_refused_and_nothing_is_left(root: Path, hostile: tarfile.TarInfo, message: str) -> None:
    data = archive((member("inside"), b"fine"), (hostile, b"x" if hostile.type == tarfile.REGTYPE else None))
    with pytest.raises(ArchiveError, match=message):
        upload(root, data)
    assert only(root) == []


def test_a_symlink_the_archive_made_is_never_written_through(root: Path, tmp_path: Path) -> None:
    (root / "sub").mkdir()
    data = archive((member("link", tarfile.SYMTYPE, linkname="sub"), None), (member("link/file"), b"through"))
    with pytest.raises(ArchiveError, match="not a directory the archive made"):
        upload(root, data)
    assert only(root) == ["sub"] and only(root / "sub") == []


def test_a_symlink_planted_in_the_destination_is_never_written_through(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "planted").symlink_to(outside)
    with pytest.raises(ValueError, match="symlink"):
        receive(str(root / "planted" / "tree"), canonical_roots([root]), "tar", [archive((member("f"), b"x"))])
    with pytest.raises(ValueError, match="symlink"):
        receive(str(root / "planted" / "file"), canonical_roots([root]), "file", [b"x"])
    assert only(outside) == []


def test_a_file_replacing_a_planted_symlink_replaces_the_link_not_its_target(root: Path, tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("keep")
    (root / "name").symlink_to(target)
    receive(str(root / "name"), canonical_roots([root]), "file", [b"new"], overwrite=True)
    assert target.read_text() == "keep"
    assert not (root / "name").is_symlink() and (root / "name").read_bytes() == b"new"


def test_a_member_given_twice_is_refused(root: Path) -> None:
    data = archive((member("a"), b"1"), (member("a"), b"2"))
    with pytest.raises(ArchiveError, match="twice"):
        upload(root, data)
    assert only(root) == []


@pytest.mark.parametrize(("limits", "members"), [
    (TransferLimits(max_total_bytes=10), [("a", 6), ("b", 6)]),
    (TransferLimits(max_file_bytes=5), [("a", 6)]),
    (TransferLimits(max_entries=2), [("a", 1), ("b", 1), ("c", 1)]),
    (TransferLimits(max_depth=2), [("a/b/c", 1)]),
    (TransferLimits(max_path_chars=10), [("a" * 11, 1)]),
])
def test_a_tree_past_a_limit_is_refused_and_nothing_is_left(root: Path, limits: TransferLimits,
                                                            members: list[tuple[str, int]]) -> None:
    data = archive(*((member(name), b"x" * size) for name, size in members))
    with pytest.raises(TransferLimitError):
        upload(root, data, limits=limits)
    assert only(root) == []


def test_headers_past_the_archive_bound_are_refused(root: Path) -> None:
    limits = TransferLimits(max_total_bytes=10, max_entries=1)
    padded = member("a")
    padded.pax_headers = {"comment": "x" * limits.max_archive_bytes}
    with pytest.raises(TransferLimitError):
        upload(root, archive((padded, b"1")), limits=limits)
    assert only(root) == []


def test_a_file_past_its_limit_is_refused_and_nothing_is_left(root: Path) -> None:
    with pytest.raises(TransferLimitError):
        receive(str(root / "big"), canonical_roots([root]), "file", [b"x" * 6], limits=TransferLimits(max_file_bytes=5))
    assert only(root) == []


@pytest.mark.parametrize("failure", [
    lambda: (_ for _ in ()).throw(ConnectionError("the sender went away")),
    lambda: iter([archive((member("a"), b"1"))[:700]]),
], ids=["aborted", "truncated"])
def test_an_interrupted_upload_leaves_nothing(root: Path, failure: Callable[[], object]) -> None:
    def chunks():
        yield archive((member("first"), b"1"))[:1024]
        yield from failure()

    with pytest.raises((ConnectionError, ArchiveError)):
        receive(str(root / "tree"), canonical_roots([root]), "tar", chunks())
    assert only(root) == []


#: A transfer in a process of its own: it writes the first chunk, says so, then waits for the rest
#: on its input.
SLOW_TRANSFER = """
import sys
from protolink.execution.transfer import receive
destination, root, kind, first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = sys.stdin.buffer

def chunks():
    yield data.read(first)
    print("written", flush=True)
    yield data.read()

receive(destination, [root], kind, chunks())
"""
HANG_GUARD = 60


def slow_transfer(root: Path, name: str, kind: str, data: bytes) -> subprocess.Popen[bytes]:
    """A transfer of ``data`` to ``name`` that has written half of it and waits for the rest."""
    process = subprocess.Popen([sys.executable, "-c", SLOW_TRANSFER, str(root / name), str(root), kind,
                                str(len(data) // 2)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(data[:len(data) // 2])
    process.stdin.flush()
    assert process.stdout.readline() == b"written\n"
    return process


def payload(kind: str) -> bytes:
    return os.urandom(200_000) if kind == "file" else archive((member("big"), os.urandom(200_000)))


@pytest.mark.parametrize("kind", ["file", "tar"])
def test_what_a_killed_transfer_left_is_removed_by_the_next(root: Path, kind: str) -> None:
    killed = slow_transfer(root, "first", kind, payload(kind))
    killed.kill()
    assert killed.wait(HANG_GUARD) == -signal.SIGKILL
    (left,) = only(root)
    assert left.startswith(".protolink-transfer-")
    (root / ".protolink-transfer-mine").write_text("not a transfer's")  # only the exact pattern goes
    receive(str(root / "second"), canonical_roots([root]), kind, [payload(kind)])
    assert only(root) == [".protolink-transfer-mine", "second"]


@pytest.mark.parametrize("kind", ["file", "tar"])
def test_a_transfer_under_way_is_never_swept(root: Path, kind: str) -> None:
    data = payload(kind)
    running = slow_transfer(root, "first", kind, data)
    try:
        receive(str(root / "second"), canonical_roots([root]), kind, [payload(kind)])
        (writing,) = [name for name in only(root) if name != "second"]
        assert writing.startswith(".protolink-transfer-")
        running.communicate(data[len(data) // 2:], timeout=HANG_GUARD)
    finally:
        running.kill()
    assert running.returncode == 0 and only(root) == ["first", "second"]
    landed = (root / "first").read_bytes() if kind == "file" else (root / "first" / "big").read_bytes()
    assert len(landed) == 200_000


def test_a_replaced_tree_is_moved_aside_under_a_name_no_sweep_takes(root: Path) -> None:
    """A transfer killed between moving the old tree aside and renaming the new one into place
    leaves both; the old one is not a leftover."""
    (root / ".protolink-replaced-0123456789abcdef").mkdir()
    upload(root, archive((member("new"), b"new")))
    assert only(root) == [".protolink-replaced-0123456789abcdef", "tree"]


def test_an_existing_destination_needs_overwrite(root: Path) -> None:
    (root / "tree").mkdir()
    (root / "tree" / "old").write_text("old")
    with pytest.raises(FileExistsError):
        upload(root, archive((member("new"), b"new")))
    with pytest.raises(FileExistsError):
        receive(str(root / "tree"), canonical_roots([root]), "file", [b"x"])
    upload(root, archive((member("new"), b"new")), overwrite=True)
    assert only(root) == ["tree"] and only(root / "tree") == ["new"]


def test_outside_symlinks_may_be_kept_as_links(root: Path) -> None:
    upload(root, archive((member("etc", tarfile.SYMTYPE, linkname="/etc"), None)), keep_outside_symlinks=True)
    assert os.readlink(root / "tree" / "etc") == "/etc"


def read_all(path: Path, roots: list[Path], **options) -> tuple[object, bytes]:
    with open_source(str(path), canonical_roots(roots), **options) as source:
        data = b"".join(source)
    return source, data


def test_a_tree_read_back_round_trips_without_following_links(root: Path, tmp_path: Path) -> None:
    tree = root / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "data.bin").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    (tree / "run.sh").write_text("#!/bin/sh\n")
    (tree / "run.sh").chmod(0o755)
    (tree / "etc").symlink_to("/etc")
    os.mkfifo(tree / "fifo")
    source, data = read_all(tree, [root])
    assert source.kind == "tar" and source.result.skipped == ("fifo",)
    assert (source.result.files, source.result.directories, source.result.symlinks) == (2, 1, 1)
    copy = tmp_path / "copy"
    copy.mkdir()
    receive(str(copy / "tree"), canonical_roots([copy]), "tar", [data], keep_outside_symlinks=True)
    assert (copy / "tree/sub/data.bin").read_bytes() == (tree / "sub/data.bin").read_bytes()
    assert stat.S_IMODE((copy / "tree/run.sh").stat().st_mode) == 0o755
    assert os.readlink(copy / "tree/etc") == "/etc"
    assert not (copy / "tree/fifo").exists()


def test_reading_refuses_a_symlink_and_a_tree_past_its_limits(root: Path) -> None:
    (root / "link").symlink_to("/etc/passwd")
    with pytest.raises(ValueError, match="symlink"):
        read_all(root / "link", [root])
    (root / "big").write_bytes(b"x" * 100)
    with pytest.raises(TransferLimitError):
        read_all(root / "big", [root], limits=TransferLimits(max_file_bytes=99))
    with pytest.raises(TransferLimitError):
        read_all(root, [root], limits=TransferLimits(max_entries=1))


def test_reading_strips_set_id_bits(root: Path) -> None:
    (root / "tool").write_bytes(b"x")
    (root / "tool").chmod(0o4755)
    _, data = read_all(root, [root])
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getmember("tool").mode == 0o755
