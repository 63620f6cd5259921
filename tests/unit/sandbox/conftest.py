"""Fixtures of the placements' translation tests: a read-only and a writable root."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def ro(tmp_path: Path) -> Path:
    (tmp_path / "ro").mkdir()
    return tmp_path / "ro"


@pytest.fixture
def rw(tmp_path: Path) -> Path:
    (tmp_path / "rw").mkdir()
    return tmp_path / "rw"
