"""Through a real service process: an upload the sandbox refuses while its data is still going
out fails with the sandbox's own typed error and leaves nothing; a sandbox deleted while an
upload or a command of its is in flight ends that call at once with SandboxNotFoundError, and
one lost under an upload ends it with SandboxLostError (before, each waited for its deadline)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from protolink.errors import ArchiveError, SandboxLostError, SandboxNotFoundError
from protolink.wire._pb import transfer_pb2
from protolink.wire.status import from_rpc_error
from tests.integration.service.test_lifecycle import WAIT_SECONDS as HANG_GUARD
from tests.integration.service.test_lifecycle import containers, eventually
from tests.integration.test_sandbox_refused_transfers import TRIES, hostile_tree, large_file

pytestmark = pytest.mark.docker


async def exists(path: Path) -> bool:
    return path.exists()


async def stalled_upload(workspace: str) -> AsyncIterator[transfer_pb2.UploadChunk]:
    """An upload into ``workspace`` that sends its start and some data, then waits forever."""
    yield transfer_pb2.UploadChunk(start=transfer_pb2.UploadStart(
        destination=f"{workspace}/file", roots=[workspace], kind=transfer_pb2.TRANSFER_KIND_FILE))
    yield transfer_pb2.UploadChunk(data=b"x" * 1024)
    await asyncio.Event().wait()


async def under_way(workspace: str) -> bool:
    """Whether an upload into ``workspace`` writes there (in its private directory)."""
    return bool(os.listdir(workspace))


async def test_an_upload_refused_while_its_data_goes_out_is_typed_and_leaves_nothing(service, tmp_path):
    tree, source = hostile_tree(tmp_path), large_file(tmp_path / "large.bin")
    client = await service.client()
    async with await client.create(workspace=True) as sandbox:
        workspace = sandbox.status.workspace
        for _ in range(TRIES):
            with pytest.raises(ArchiveError, match="outside"):
                await asyncio.wait_for(sandbox.upload(tree, f"{workspace}/tree"), HANG_GUARD)
            assert os.listdir(workspace) == []
        await asyncio.wait_for(sandbox.upload(source, f"{workspace}/taken"), HANG_GUARD)
        for _ in range(TRIES):
            with pytest.raises(FileExistsError):
                await asyncio.wait_for(sandbox.upload(source, f"{workspace}/taken"), HANG_GUARD)
            assert os.listdir(workspace) == ["taken"]


async def test_deleting_a_sandbox_ends_its_upload_in_flight_with_sandbox_not_found(service):
    client = await service.client()
    sandbox = await client.create(workspace=True)
    workspace = sandbox.status.workspace
    try:
        call = sandbox.backend.stream_method("Upload")(stalled_upload(workspace), timeout=HANG_GUARD)
        await eventually(lambda: under_way(workspace), "the upload under way")
        await client.delete(sandbox.id)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call, HANG_GUARD)
        assert isinstance(from_rpc_error(ended.value), SandboxNotFoundError), ended.value
    finally:
        await sandbox.delete()


async def test_deleting_a_sandbox_ends_its_command_in_flight_with_sandbox_not_found(service, run):
    client = await service.client()
    sandbox = await client.create(workspace=True)
    workspace = sandbox.status.workspace
    try:
        command = asyncio.ensure_future(run(sandbox.backend, ["/bin/sh", "-c", "touch started && exec sleep 600"],
                                            cwd=workspace, timeout=600))
        await eventually(lambda: exists(Path(workspace) / "started"), "the command started")
        await client.delete(sandbox.id)
        with pytest.raises(SandboxNotFoundError):
            await asyncio.wait_for(command, HANG_GUARD)
    finally:
        await sandbox.delete()


async def test_a_sandbox_lost_under_an_upload_ends_it_with_sandbox_lost(service, docker_client):
    """A container that stops answering (paused, as a dead node's would) is lost: the upload in
    flight, which nothing else would end, ends with SandboxLostError."""
    client = await service.client()
    sandbox = await client.create(workspace=True)
    workspace = sandbox.status.workspace
    try:
        call = sandbox.backend.stream_method("Upload")(stalled_upload(workspace), timeout=HANG_GUARD)
        await eventually(lambda: under_way(workspace), "the upload under way")
        name = next(name for name in containers(docker_client, service) if name.endswith(sandbox.id))
        docker_client.containers.get(name).pause()  # behind the service's back
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(call, HANG_GUARD)
        assert isinstance(from_rpc_error(ended.value), SandboxLostError), ended.value
    finally:
        await sandbox.delete()
