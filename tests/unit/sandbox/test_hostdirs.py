"""The host's private directories and service files: their socket paths stay short enough."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink.errors import SandboxError
from protolink.sandbox.hostdirs import MAX_SOCKET_PATH_BYTES, private_subdir, write_private
from protolink.sandbox.placements.server import SOCKET_NAME
from protolink.sandbox.service.files import ServiceFiles


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a path as short as a real runtime directory's (pytest's are longer)."""
    with tempfile.TemporaryDirectory(prefix="pl-", dir="/tmp") as path:
        yield Path(path)


def test_a_long_name_still_gives_a_socket_path_that_fits(short_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(short_dir / "run"))
    name = "the-build-farm-of-team-alpha-nightly.02e87ad22c3d1251.8d4114a9d2e44d74.8d4114a9d2e44d74"
    made = private_subdir(name)
    assert made.parent == short_dir / "run" and made.name.startswith(name[:24] + "-")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert len(os.fsencode(made / SOCKET_NAME)) <= MAX_SOCKET_PATH_BYTES
    assert private_subdir(name) != made  # each is new


def test_a_runtime_directory_too_deep_for_sockets_is_refused(tmp_path: Path, monkeypatch) -> None:
    deep = tmp_path / ("d" * 70)
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(deep))
    with pytest.raises(SandboxError, match="PROTOLINK_RUNTIME_DIR"):
        private_subdir("sandbox")
    assert list(deep.iterdir()) == []


def test_a_service_name_too_long_for_its_socket_is_refused(short_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PROTOLINK_RUNTIME_DIR", str(short_dir))
    assert ServiceFiles.of("ci-" + "x" * 60).socket.parent == short_dir
    with pytest.raises(ValueError, match="too long"):
        ServiceFiles.of("ci-" + "x" * 100)


def test_a_private_file_is_replaced_whole_never_rewritten_in_place(tmp_path: Path) -> None:
    """A reader (a client reading a service's pid file as it starts) finds the old text or the
    new: one that opened the file before keeps reading the old, never an emptied file."""
    path = tmp_path / "service.pid"
    write_private(path, '{"pid": 1}')
    with open(path) as before:
        write_private(path, '{"pid": 2}')
        assert before.read() == '{"pid": 1}'
    assert path.read_text() == '{"pid": 2}'
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["service.pid"]  # nothing of the writing is left beside it


def test_a_private_file_replaces_a_symlink_without_writing_through_it(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched")
    (tmp_path / "token").symlink_to(target)
    write_private(tmp_path / "token", "secret")
    assert target.read_text() == "untouched"
    assert not (tmp_path / "token").is_symlink() and (tmp_path / "token").read_text() == "secret"
