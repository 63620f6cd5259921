"""A client on the service's host runs its commands on the service's command channel
(protolink.sandbox.service.command_relay): large output comes as pipes the service feeds from
the sandbox's, intact and counted in the command's event; the same results where the sandbox
offers no channel (the service uses gRPC behind); another tenant's token is refused, typed; a
flood past the cap is drained until the command's timeout; nothing of a call is left open in
the service once it has ended, nor in the client once it is closed. A sandbox deleted or lost
under a command: test_command_channel.

The service runs in this process (``serving``), so that its descriptors are this process's to
count, and its pipes' feeding (``pipe_to_pipe``) can be watched."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from protolink.errors import SandboxNotFoundError
from protolink.sandbox.pipe_connection import ChannelCalls
from protolink.sandbox.service import command_relay
from protolink.sandbox.service.client import SANDBOX_KEY, connect
from protolink.sandbox.service.files import commands_socket
from protolink.sandbox.service.tokens import Tokens
from protolink.wire._pb import process_pb2
from protolink.wire.pipe_passing import SOCKET_NAME
from tests.integration.service.test_command_channel import socket_directory
from tests.descriptors import descriptor_targets
from tests.integration.service.test_events import Collected, serving
from tests.integration.service.test_lifecycle import WAIT_SECONDS as HANG_GUARD
from tests.integration.service.test_lifecycle import eventually

pytestmark = pytest.mark.docker

#: Output well past what a client asks pipes for (1 MiB): `seq`'s lines, known here.
LINES = 400_000
EXPECTED = "".join(f"{n}\n" for n in range(1, LINES + 1))


async def test_large_output_comes_through_the_services_pipes_intact_and_counted(
        runtime, sandbox_image, docker_client, run, monkeypatch):
    fed: list[int] = []
    real = command_relay.pipe_to_pipe

    async def watched(source: int, sink: int, **options):
        fed.append(source)
        await real(source, sink, **options)

    monkeypatch.setattr(command_relay, "pipe_to_pipe", watched)
    sink = Collected()
    argv = ["/bin/sh", "-c", f"seq 1 {LINES}; printf tail >&2; exit 3"]
    async with serving(sandbox_image, sink, docker_client) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        on_channel = await client.create()
        without = await client.create()
        (socket_directory(docker_client, without.id) / SOCKET_NAME).unlink()
        before = set(descriptor_targets().values())
        results = []
        for sandbox in (on_channel, without):
            results.append(await run(sandbox.backend, argv, max_output_bytes=4 << 20))
            piped = len(fed)
        for sandbox in (on_channel, without):
            await sandbox.delete()
        await client.aclose()

        async def all_closed() -> bool:
            return set(descriptor_targets().values()) <= before

        await eventually(all_closed, "the calls' connections and pipes closed")
    assert [(r.stdout == EXPECTED, r.stderr, r.exit_code) for r in results] == [(True, "tail", 3)] * 2
    assert piped == 2 and len(fed) == 2  # stdout and stderr of the first: the second's sandbox has no channel
    ended = [(e.sandbox, e.fields["exit_code"], e.fields["output_bytes"]) for e in sink.of("command.ended")]
    assert ended == [(on_channel.id, 3, len(EXPECTED) + 4), (without.id, 3, len(EXPECTED) + 4)]


async def test_a_flood_past_the_cap_is_drained_and_its_timeout_ends_it(runtime, sandbox_image, docker_client, run):
    """`yes` never ends by itself: past the cap its output is drained through the service's pipes
    and dropped, as on the host, and its timeout ends it, its pipes with it."""
    sink = Collected()
    async with serving(sandbox_image, sink, docker_client) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        async with await client.create() as sandbox:
            result = await asyncio.wait_for(run(sandbox.backend, ["/usr/bin/yes"], timeout=3, max_output_bytes=2 << 20),
                                            HANG_GUARD)
        await client.aclose()
    assert (len(result.stdout), result.truncated, result.timed_out) == (2 << 20, True, True)
    [ended] = sink.of("command.ended")
    assert ended.fields["timed_out"] and ended.fields["output_bytes"] > 2 << 20  # every byte that went through


async def test_another_tenants_token_is_refused_on_the_command_channel(runtime, sandbox_image, docker_client):
    async with serving(sandbox_image, Collected(), docker_client) as files:
        owner = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        other = Tokens(files.tokens).add("other")
        async with await owner.create() as sandbox:
            for token, error in ((other, SandboxNotFoundError), ("wrong", "a valid token is required")):
                metadata = (("authorization", f"Bearer {token}"), (SANDBOX_KEY, sandbox.id))
                calls = ChannelCalls(commands_socket(str(files.socket)), metadata, lambda: None, pipes_above=None)
                call = calls()
                await call.write(process_pb2.ExecuteRequest(id=5, argv=["/bin/true"], cwd="/tmp"))
                with pytest.raises(Exception) as raised:
                    await asyncio.wait_for(anext(call), HANG_GUARD)
                call.cancel()
                if isinstance(error, str):
                    assert error in str(raised.value)
                else:
                    assert isinstance(raised.value, error)
        await owner.aclose()


async def test_closing_the_client_closes_its_sandboxes_connections(runtime, sandbox_image, docker_client, run):
    """A sandbox the client opened and never deleted keeps its connection for its next command;
    closing the client closes it (a script's client, say, that leaves a sandbox for later)."""
    async with serving(sandbox_image, Collected(), docker_client) as files:
        client = await connect(files.address, files.default_token.read_text(), timeout=30.0)
        sandbox = await client.create()
        await run(sandbox.backend, ["/bin/true"])
        assert relay_connections(files) == 1  # open, for the next command
        await client.aclose()

        async def closed() -> bool:
            return relay_connections(files) == 0

        await eventually(closed, "the sandbox's connection closed")
        assert sandbox.backend.closed
        async with await connect(files.address, files.default_token.read_text(), timeout=30.0) as again:
            assert [status.state for status in await again.list()] == ["running"]  # the sandbox stays


def relay_connections(files) -> int:
    """The connections the service's command channel holds (accepted sockets carry its path)."""
    path = commands_socket(str(files.socket))
    rows = Path("/proc/net/unix").read_text().splitlines()[1:]
    return sum(1 for fields in map(str.split, rows) if fields[5] == "03" and fields[-1] == path)
