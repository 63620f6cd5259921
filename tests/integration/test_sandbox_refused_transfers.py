"""An upload a real sandbox refuses while its data is still going out fails with the sandbox's
own typed error (not grpcio's INTERNAL of the write that found the call ended), and nothing of
it is kept in the sandbox. Each upload is far larger than what the sandbox takes before it
refuses, and is tried three times: grpcio sets the statuses in either order
(:class:`~protolink.wire.status.CallEnd`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from protolink.errors import ArchiveError, TransferLimitError
from protolink.sandbox.client import SandboxBackend
from protolink.sandbox.docker import DockerSandbox
from protolink.sandbox.transfer import upload
from tests.integration.test_sandbox_transfer import HANG_GUARD, box, work  # noqa: F401 (fixtures)

pytestmark = pytest.mark.docker

LARGE_BYTES = 64 << 20
TRIES = 3


def large_file(path: Path) -> Path:
    """``path``, a file of :data:`LARGE_BYTES` zeros (sparse: nothing to write here)."""
    with path.open("wb") as file:
        file.truncate(LARGE_BYTES)
    return path


def hostile_tree(base: Path) -> Path:
    """A tree whose first member is a link out of it, then a large file: the sandbox refuses the
    link while the file's data is still going out."""
    tree = base / "tree"
    tree.mkdir()
    (tree / "a-link").symlink_to("/etc")
    large_file(tree / "z.bin")
    return tree


async def test_an_upload_far_past_the_disk_budget_is_refused_typed_and_leaves_nothing(sandbox_image: str, work: Path,
                                                                                      tmp_path: Path) -> None:
    source = large_file(tmp_path / "large.bin")
    async with DockerSandbox([], writable=[work], image=sandbox_image, disk_bytes=2 * 1024 * 1024) as backend:
        for _ in range(TRIES):
            with pytest.raises(TransferLimitError):
                await asyncio.wait_for(upload(backend, source, str(work / "large.bin")), HANG_GUARD)
            assert os.listdir(work) == []


async def test_a_link_out_of_a_tree_refused_while_its_data_goes_out_is_typed_and_leaves_nothing(
        box: SandboxBackend, work: Path, tmp_path: Path) -> None:
    tree = hostile_tree(tmp_path)
    for _ in range(TRIES):
        with pytest.raises(ArchiveError, match="outside"):
            await asyncio.wait_for(upload(box, tree, str(work / "tree")), HANG_GUARD)
        assert os.listdir(work) == []


async def test_a_destination_that_exists_is_refused_typed_while_the_data_goes_out(box: SandboxBackend, work: Path,
                                                                                 tmp_path: Path) -> None:
    source = large_file(tmp_path / "large.bin")
    await asyncio.wait_for(upload(box, source, str(work / "taken")), HANG_GUARD)
    for _ in range(TRIES):
        with pytest.raises(FileExistsError):
            await asyncio.wait_for(upload(box, source, str(work / "taken")), HANG_GUARD)
        assert os.listdir(work) == ["taken"]
