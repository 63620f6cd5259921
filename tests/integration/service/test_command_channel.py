"""The service's hop to a sandbox on this host goes over the sandbox's command channel: a pooled
sandbox waits with a channel connection open, which its owner's first command runs on; a command
forwarded there ends, outputs and is reported as on gRPC; a sandbox whose channel is not there
is forwarded on gRPC; a sandbox deleted or lost under a command on the channel ends it at once,
typed.

The service runs in this process (``serving``), so that the channel's connections, Unix sockets
of type ``SOCK_SEQPACKET`` (gRPC's are ``SOCK_STREAM``), are this process's to count. Its
clients call on gRPC, as a remote client does (a local one's commands take the service's own
command channel: test_local_commands)."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

from protolink.errors import SandboxLostError, SandboxNotFoundError
from protolink.sandbox.appliance import ADDRESS_LABEL
from protolink.sandbox.service.client import connect
from protolink.wire.pipe_passing import SOCKET_NAME
from tests.descriptors import descriptor_targets
from tests.integration.service.test_events import Collected, serving
from tests.integration.service.test_lifecycle import WAIT_SECONDS as HANG_GUARD
from tests.integration.service.test_lifecycle import eventually

pytestmark = pytest.mark.docker

#: /proc/net/unix's socket type of SOCK_SEQPACKET, and the state of a connected socket.
SEQPACKET, CONNECTED = "0005", "03"
#: More output than one datagram of the channel holds: the sandbox splits its event.
LARGE_OUTPUT = 300_000


def own_sockets() -> dict[str, int]:
    """This process's sockets: each one's inode, and a descriptor of it."""
    return {target.removeprefix("socket:[").removesuffix("]"): fd
            for fd, target in descriptor_targets().items() if target.startswith("socket:[")}


def command_channels() -> set[str]:
    """The inodes of this process's connected SOCK_SEQPACKET Unix sockets: its command channel connections."""
    mine = own_sockets()
    rows = Path("/proc/net/unix").read_text().splitlines()[1:]
    return {fields[6] for fields in map(str.split, rows)
            if fields[4] == SEQPACKET and fields[5] == CONNECTED and fields[6] in mine}


def socket_directory(docker_client, sandbox_id: str) -> Path:
    """The host directory of the sandbox's sockets (its gRPC socket's and its command channel's)."""
    found = next(c for c in docker_client.api.containers() if any(n.endswith(f".{sandbox_id}") for n in c["Names"]))
    return Path(found["Labels"][ADDRESS_LABEL].removeprefix("unix://")).parent


async def pool_of_one(client) -> None:
    deadline = asyncio.get_running_loop().time() + HANG_GUARD
    while (await client.pool_ready()).get("default") != 1:
        assert asyncio.get_running_loop().time() < deadline, "no pooled sandbox in time"
        await asyncio.sleep(0.1)


async def test_a_pooled_sandbox_runs_its_first_command_on_the_channel_held_open_for_it(
        runtime, sandbox_image, docker_client, run):
    sink = Collected()
    before = command_channels()  # of tests before, not yet closed: not this service's
    async with serving(sandbox_image, sink, docker_client, pool=1) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0, command_channel=False)
        await pool_of_one(client)

        async def held_alone() -> set[str]:  # the pool member's (its warm-up's connection closed)
            return found if len(found := command_channels() - before) == 1 else set()

        held = await eventually(held_alone, "one connection held")
        sandbox = await client.create()
        assert sandbox.status.pooled
        first = await run(sandbox.backend, ["/bin/sh", "-c", "printf held; exit 4"])
        assert command_channels() - before == held  # the call stays open on the very same connection
        await sandbox.delete()
        await client.aclose()
    assert (first.stdout, first.exit_code) == ("held", 4)
    tenant = sink.of("sandbox.created")[0].tenant
    assert [(e.tenant, e.sandbox, e.fields["exit_code"], e.fields["output_bytes"])
            for e in sink.of("command.ended")] == [(tenant, sandbox.id, 4, 4)]


async def test_a_pooled_sandbox_whose_held_channel_closed_runs_its_first_command_on_a_new_one(
        runtime, sandbox_image, docker_client, run):
    """The connection held for a pool member's owner breaks while it waits (this side shut
    down): the first command still runs, on a connection of its own, and is reported."""
    sink = Collected()
    before = command_channels()
    async with serving(sandbox_image, sink, docker_client, pool=1) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0, command_channel=False)
        await pool_of_one(client)

        async def held_alone() -> set[str]:
            return found if len(found := command_channels() - before) == 1 else set()

        held = await eventually(held_alone, "one connection held")
        shut_down(held)

        async def closed() -> bool:
            return not command_channels() & held

        await eventually(closed, "the held connection closed")
        sandbox = await client.create()
        assert sandbox.status.pooled
        first = await run(sandbox.backend, ["/bin/sh", "-c", "printf new; exit 5"])
        assert len(command_channels() - before - held) == 1  # the call stays open on its new connection
        await sandbox.delete()
        await client.aclose()
    assert (first.stdout, first.exit_code) == ("new", 5)
    assert [(e.sandbox, e.fields["exit_code"]) for e in sink.of("command.ended")] == [(sandbox.id, 5)]


def shut_down(inodes: set[str]) -> None:
    """Shut down both directions of this process's sockets of ``inodes``."""
    for inode, fd in own_sockets().items():
        if inode in inodes:
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)


async def test_a_command_on_the_channel_ends_outputs_and_is_reported_as_on_grpc(
        runtime, sandbox_image, docker_client, run):
    """The same commands on a sandbox whose channel is there and on one whose channel was taken
    away (its socket removed: the service falls back to gRPC): the same results, the same events."""
    sink = Collected()
    argv = ["/bin/sh", "-c", f"head -c {LARGE_OUTPUT} /dev/zero; printf tail >&2; exit 3"]
    async with serving(sandbox_image, sink, docker_client) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0, command_channel=False)
        before = command_channels()
        on_channel = await client.create(workspace=True)
        without = await client.create(workspace=True)
        (socket_directory(docker_client, without.id) / SOCKET_NAME).unlink()
        results = []
        for sandbox, connections in ((on_channel, 1), (without, 0)):
            await running_alone_on(connections, before, sandbox, run)
            results.append(await run(sandbox.backend, argv, max_output_bytes=1 << 20))
            results.append(await run(sandbox.backend, ["/bin/sh", "-c", "exit 7"], timeout=5))
        for sandbox in (on_channel, without):
            await sandbox.delete()
        await client.aclose()
    assert [(len(r.stdout), r.stderr, r.exit_code) for r in results] == [
        (LARGE_OUTPUT, "tail", 3), (0, "", 7)] * 2
    ended = {sandbox: [(e.fields["exit_code"], e.fields["output_bytes"]) for e in sink.of("command.ended")
                       if e.sandbox == sandbox and e.fields["id"] > 1] for sandbox in (on_channel.id, without.id)}
    assert ended[on_channel.id] == ended[without.id] == [(3, LARGE_OUTPUT + 4), (7, 0)]


async def running_alone_on(connections: int, before: set[str], sandbox, run) -> None:
    """Run a command in ``sandbox`` until ``connections`` command channel connections beyond
    ``before`` are open while it runs (none: it runs on gRPC), then cancel it."""
    started = Path(sandbox.status.workspace) / "started"
    command = asyncio.ensure_future(run(sandbox.backend, ["/bin/sh", "-c", "touch started && exec sleep 600"],
                                        cwd=sandbox.status.workspace, timeout=600))

    async def there() -> bool:
        return started.exists() and len(command_channels() - before) == connections

    try:
        await eventually(there, f"{connections} command channel connection(s) while a command runs")
    finally:
        command.cancel()
        await asyncio.gather(command, return_exceptions=True)


@pytest.mark.parametrize("local_client", [False, True], ids=["grpc-client", "local-client"])
async def test_a_sandbox_deleted_or_lost_under_a_command_on_the_channel_ends_it_typed(
        runtime, sandbox_image, docker_client, run, local_client):
    """As a remote client's call, so a local client's on the service's own command channel."""
    async with serving(sandbox_image, Collected(), docker_client) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0,
                               command_channel=local_client)
        for end, error in (("delete", SandboxNotFoundError), ("pause", SandboxLostError)):
            sandbox = await client.create(workspace=True)
            started = Path(sandbox.status.workspace) / "started"
            command = asyncio.ensure_future(run(sandbox.backend, ["/bin/sh", "-c", "touch started && exec sleep 600"],
                                                cwd=sandbox.status.workspace, timeout=600))

            async def under_way() -> bool:
                return started.exists()

            await eventually(under_way, "the command started")
            assert command_channels()
            if end == "delete":
                await client.delete(sandbox.id)
            else:
                name = next(c["Names"][0] for c in docker_client.api.containers()
                            if any(n.endswith(f".{sandbox.id}") for n in c["Names"]))
                docker_client.containers.get(name.lstrip("/")).pause()  # behind the service's back
            with pytest.raises(error):
                await asyncio.wait_for(command, HANG_GUARD)
            await sandbox.delete()
        await client.aclose()
