"""The service's command channel without a sandbox behind it: a refusal is the call's typed
failure; a relay at its limit of connections sends the client to gRPC for that call; a relay
out of descriptors waits, without spinning, and serves the connection once it can; the socket
is born 0600 and is gone after close."""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import socket
import stat
from pathlib import Path

import pytest

from protolink.errors import SandboxAuthenticationError
from protolink.net.accepting import PAUSE_SECONDS
from protolink.sandbox.pipe_connection import ChannelCalls, Unsent
from protolink.sandbox.service.command_relay import CommandRelay
from protolink.wire._pb import process_pb2
from protolink.wire.pipe_passing import GREETING

GUARD_SECONDS = 30.0
REQUEST = process_pb2.ExecuteRequest(id=5, argv=["/bin/true"], cwd="/tmp")


async def refuse(metadata, method):
    raise SandboxAuthenticationError(f"token {metadata.get('authorization')!r} refused for {method}")


class Fallback:
    """The gRPC call a client would make instead: records that it was asked for."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return "grpc"


@pytest.fixture
async def relay(tmp_path: Path):
    started = CommandRelay(str(tmp_path / "svc.sock.commands"), refuse, None, max_connections=1)
    started.start()
    yield started
    await started.aclose()


def calls_to(relay: CommandRelay, fallback: Fallback) -> ChannelCalls:
    return ChannelCalls(relay.path, (("authorization", "Bearer wrong"), ("protolink-sandbox-id", "sb")), fallback,
                        pipes_above=None)


async def test_a_refused_token_is_the_calls_typed_failure(relay):
    assert stat.S_IMODE(os.stat(relay.path).st_mode) == 0o600
    call = calls_to(relay, Fallback())()
    await call.write(REQUEST)
    with pytest.raises(SandboxAuthenticationError, match="Bearer wrong"):
        await asyncio.wait_for(anext(call), GUARD_SECONDS)


async def test_at_its_limit_the_relay_sends_the_call_to_grpc(relay):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as silent:
        silent.connect(relay.path)  # holds the one connection: it says nothing yet
        silent.setblocking(False)
        greeting = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(silent, 64), GUARD_SECONDS)
        assert greeting.startswith(GREETING)
        fallback = Fallback()
        calls = calls_to(relay, fallback)
        with pytest.raises(Unsent):
            await calls().write(REQUEST)
        assert calls() == "grpc" and fallback.calls == 1


@pytest.mark.parametrize("free", [0, 1, 2])
async def test_out_of_descriptors_it_waits_and_then_serves(relay, caplog, free):
    """With fewer descriptors free than a connection and its greeting's pipe need, the connection
    waits in the backlog (not taken and dropped) and is served once they are free."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare = []
    gc.disable()  # the collector would free descriptors of earlier tests' garbage meanwhile
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        call = calls_to(relay, Fallback())()  # its socket is made now
        while True:
            try:
                spare.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        for _ in range(free):
            os.close(spare.pop())
        await asyncio.sleep(0.5)  # the relay cannot serve the connection meanwhile
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        gc.enable()
    await call.write(REQUEST)
    with pytest.raises(SandboxAuthenticationError):
        await asyncio.wait_for(anext(call), GUARD_SECONDS)
    tries = [record.created for record in caplog.records if "cannot accept" in record.message]
    assert tries  # it could not serve the connection while out of descriptors
    gaps = [later - earlier for earlier, later in zip(tries, tries[1:])]
    assert min(gaps, default=PAUSE_SECONDS) >= PAUSE_SECONDS * 0.9  # a pause between tries, not a spin


async def test_its_socket_is_gone_after_close(tmp_path: Path):
    relay = CommandRelay(str(tmp_path / "svc.sock.commands"), refuse, None)
    relay.start()
    await relay.aclose()
    assert not os.path.exists(relay.path)


async def test_a_request_written_after_the_refusal_came_is_refused_alike(relay):
    """The relay refuses as soon as it reads the authorization, before any request: a request the
    client writes after that (a stream's next process) fails with the same typed error."""
    call = calls_to(relay, Fallback())()
    with pytest.raises(SandboxAuthenticationError):
        await asyncio.wait_for(anext(call), GUARD_SECONDS)
    with pytest.raises(Unsent) as unsent:
        await call.write(REQUEST)
    assert isinstance(unsent.value.error, SandboxAuthenticationError)
