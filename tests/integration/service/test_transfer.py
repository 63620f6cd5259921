"""Files in and out of a service's sandbox: through the service, into its managed workspace."""

from __future__ import annotations

import pytest

from protolink.errors import ArchiveError, SandboxNotFoundError
from protolink.sandbox.service.client import Sandbox

pytestmark = pytest.mark.docker


async def test_a_tree_goes_into_the_managed_workspace_and_comes_back_the_same(service, run, tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "data.bin").write_bytes(bytes(range(256)) * 4096)
    (tree / "run.sh").write_text("#!/bin/sh\ncat sub/data.bin | wc -c\n")
    (tree / "run.sh").chmod(0o755)
    client = await service.client()
    async with await client.create(workspace=True) as sandbox:
        workspace = sandbox.status.workspace
        sent = await sandbox.upload(tree, f"{workspace}/tree")
        assert (sent.files, sent.bytes) == (2, 256 * 4096 + len("#!/bin/sh\ncat sub/data.bin | wc -c\n"))
        ran = await run(sandbox.backend, [f"{workspace}/tree/run.sh"], cwd=f"{workspace}/tree")
        assert (ran.exit_code, ran.stdout) == (0, f"{256 * 4096}\n")

        await sandbox.download(f"{workspace}/tree", tmp_path / "back")
        assert (tmp_path / "back" / "sub" / "data.bin").read_bytes() == (tree / "sub" / "data.bin").read_bytes()
        assert (tmp_path / "back" / "run.sh").stat().st_mode & 0o777 == 0o755

        hostile = tmp_path / "hostile"
        hostile.mkdir()
        (hostile / "out").symlink_to("/etc")
        with pytest.raises(ArchiveError):
            await sandbox.upload(hostile, f"{workspace}/hostile")
        with pytest.raises(FileNotFoundError):
            await sandbox.download(f"{workspace}/hostile", tmp_path / "nothing")  # nothing of it landed
        # a unary call's typed error comes through the service as the sandbox raised it
        with pytest.raises(ValueError, match="not inside a configured root"):
            await sandbox.backend.snapshot_file("/etc/passwd", roots=[workspace], max_file_bytes=100)


async def test_another_tokens_sandbox_takes_no_upload_and_gives_no_download(service, tmp_path):
    (tmp_path / "note.txt").write_text("for alice only\n")
    alice = await service.client(service.token("alice"))
    bob = await service.client(service.token("bob"))
    async with await alice.create(workspace=True) as mine:
        workspace = mine.status.workspace
        await mine.upload(tmp_path / "note.txt", f"{workspace}/note.txt")
        intruder = await Sandbox.open(bob, mine.status)  # the server's info is at hand: no call yet
        try:
            with pytest.raises(SandboxNotFoundError):
                await intruder.upload(tmp_path / "note.txt", f"{workspace}/other.txt")
            with pytest.raises(SandboxNotFoundError):
                await intruder.download(f"{workspace}/note.txt", tmp_path / "stolen.txt")
        finally:
            await intruder.backend.aclose()
    assert not (tmp_path / "stolen.txt").exists()
