"""Where a failing file system leaves a replacement: unchanged before the commit point,
uncertain after it. Failures are injected into the host implementation's system calls."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from protolink.errors import ResourceUnchangedError
from protolink.execution import fswrite
from protolink.execution.paths import canonical_roots


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path.resolve() / "doc.txt"
    path.write_text("original\n")
    return path


def refuse(error_number: int):
    def fail(*args, **kwargs):
        raise OSError(error_number, os.strerror(error_number))

    return fail


def test_a_refused_write_is_reported_unchanged_and_leaves_nothing(target: Path, monkeypatch) -> None:
    roots = canonical_roots([target.parent])
    snapshot = fswrite.snapshot_file(str(target), roots, max_file_bytes=1024)
    monkeypatch.setattr(fswrite, "_write_all", refuse(errno.ENOSPC))
    with pytest.raises(ResourceUnchangedError) as raised:
        fswrite.replace_file(snapshot.revision, b"new\n", None, roots)
    assert raised.value.errno == errno.ENOSPC
    assert target.read_text() == "original\n"
    assert os.listdir(target.parent) == ["doc.txt"]


def test_a_failure_after_the_rename_is_not_reported_unchanged(target: Path, monkeypatch) -> None:
    roots = canonical_roots([target.parent])
    snapshot = fswrite.snapshot_file(str(target), roots, max_file_bytes=1024)
    real_fsync = os.fsync
    directory = os.stat(target.parent)

    def fail_directory_fsync(fd: int) -> None:
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) == (directory.st_dev, directory.st_ino):
            raise OSError(errno.EIO, "I/O error")
        real_fsync(fd)

    monkeypatch.setattr(fswrite.os, "fsync", fail_directory_fsync)
    with pytest.raises(OSError) as raised:
        fswrite.replace_file(snapshot.revision, b"new\n", None, roots)
    assert not isinstance(raised.value, ResourceUnchangedError)
    assert target.read_text() == "new\n"


def test_an_incomplete_expected_revision_is_refused(target: Path) -> None:
    roots = canonical_roots([target.parent])
    snapshot = fswrite.snapshot_file(str(target), roots, max_file_bytes=1024)
    vague = type(snapshot.revision)(snapshot.resource_id, True, size=snapshot.revision.size)
    with pytest.raises(ValueError, match="lacks"):
        fswrite.replace_file(vague, b"anything\n", None, roots)
    assert target.read_text() == "original\n"
