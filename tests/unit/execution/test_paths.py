"""Path walks beneath roots: a kernel that follows a symlink opened as a directory is caught."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from protolink.execution import paths


def test_directory_symlink_followed_by_the_kernel_is_rejected(tmp_path: Path, monkeypatch):
    """gVisor follows a symlink to a directory opened with O_DIRECTORY | O_NOFOLLOW; the walk must still refuse it."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("secret\n")
    (root / "link").symlink_to(tmp_path / "outside")
    real_open = os.open

    def following(path, flags, *args, **kwargs):  # what gVisor does with O_DIRECTORY
        if flags & os.O_DIRECTORY:
            flags &= ~os.O_NOFOLLOW
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(paths.os, "open", following)
    with pytest.raises(ValueError, match="symlink"):
        paths.read_regular_file(str(root / "link" / "secret.txt"), [str(root)], max_bytes=100)
    (root / "sub" / "ok.txt").write_text("ok\n")
    assert paths.read_regular_file(str(root / "sub" / "ok.txt"), [str(root)], max_bytes=100) == b"ok\n"
