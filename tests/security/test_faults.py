"""Faults: a sandbox killed, frozen or stopped mid-call, an engine that goes away, a host process that
dies mid-session, many calls at once, and a fuzzed server. Typed errors, no hang, nothing lost.

An engine restart is not performed (it would stop every other test's containers): what it does
to a sandbox is what these tests do to one. Without live-restore the engine stops each container
(``docker stop``: SIGTERM, then SIGKILL), which test_container_stopped_mid_call covers; an engine
that cannot be reached covers the time it is down (test_engine_unreachable and
test_engine_gone_at_close).
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import docker
import grpc
import pytest
from google.protobuf import descriptor

from protolink.errors import SandboxUnavailableError
from protolink.sandbox import leftovers
from protolink.sandbox.docker import DockerSandbox
from protolink.wire._pb import documents_pb2, process_pb2, sandbox_pb2, workspace_pb2

from .conftest import (
    HANG_GUARD,
    RUNTIME,
    Attacker,
    dedicated_sandbox,
    figure,
    still_serves,
)

pytestmark = pytest.mark.docker


async def timed_failure(call: asyncio.Future[Any], started: float) -> float:
    """Seconds from ``started`` until ``call`` fails with SandboxUnavailableError (a hang-guarded wait)."""
    with pytest.raises(SandboxUnavailableError):
        await asyncio.wait_for(call, HANG_GUARD)
    return time.monotonic() - started


async def test_container_killed_mid_call(sandbox_image, docker_client, box_root):
    """The container is killed (docker kill) while a command is running.

    The call, and every later one (a file read too), fails with SandboxUnavailableError; the container is removed at exit.
    """
    async with dedicated_sandbox(sandbox_image, writable=[box_root]) as box:
        attacker = Attacker(box.backend, box_root)
        (box_root / "doc.txt").write_text("text\n")
        command = asyncio.ensure_future(attacker.run(["/bin/sleep", "60"], timeout=120))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await asyncio.to_thread(docker_client.containers.get(box.container_id).kill)
        seconds = await timed_failure(command, started)
        with pytest.raises(SandboxUnavailableError):
            await attacker.call("read_file", path=str(box_root / "doc.txt"))
    figure("container killed mid-call: typed error after", f"{seconds:.2f} s")
    assert not docker_client.containers.list(all=True, filters={"label": f"{leftovers.SESSION_LABEL}={box.session}"})


async def test_container_frozen_mid_call(sandbox_image, docker_client, box_root):
    """The container is frozen (docker pause: the cgroup freezer) while a command runs: alive, socket open, silent.

    The call fails with SandboxUnavailableError when keepalive pings go unanswered, long before its deadline; after docker unpause the sandbox serves again.
    """
    async with dedicated_sandbox(sandbox_image, writable=[box_root]) as box:
        attacker = Attacker(box.backend, box_root)
        container = docker_client.containers.get(box.container_id)
        command = asyncio.ensure_future(attacker.run(["/bin/sleep", "60"], timeout=120))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await asyncio.to_thread(container.pause)
        try:
            seconds = await timed_failure(command, started)
        finally:
            await asyncio.to_thread(container.unpause)
        await still_serves(attacker)
    figure("container frozen mid-call: typed error after", f"{seconds:.2f} s")


async def test_container_stopped_mid_call(sandbox_image, docker_client, box_root):
    """The engine stops the container (docker stop, as an engine restart without live-restore does) while a command runs.

    The server shuts down on SIGTERM (kills its commands); the call fails with SandboxUnavailableError; later calls too.
    """
    async with dedicated_sandbox(sandbox_image, writable=[box_root]) as box:
        attacker = Attacker(box.backend, box_root)
        command = asyncio.ensure_future(attacker.run(["/bin/sleep", "60"], timeout=120))
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await asyncio.to_thread(docker_client.containers.get(box.container_id).stop, timeout=5)
        seconds = await timed_failure(command, started)
        with pytest.raises(SandboxUnavailableError):
            await attacker.run(["/bin/true"])
    figure("container stopped mid-call: typed error after", f"{seconds:.2f} s")


async def test_engine_unreachable(sandbox_image, monkeypatch, tmp_path):
    """Starting a sandbox while the engine is down (DOCKER_HOST points at a socket nobody listens on).

    SandboxUnavailableError at once; nothing is created.
    """
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'engine.sock'}")
    sandbox = DockerSandbox([], image=sandbox_image)
    started = time.monotonic()
    with pytest.raises(SandboxUnavailableError):
        await asyncio.wait_for(sandbox.start(), HANG_GUARD)
    figure("engine unreachable at start: typed error after", f"{time.monotonic() - started:.3f} s")
    assert sandbox.container_id is None and all(not path.exists() for path in sandbox._host_dirs)


async def test_engine_gone_at_close(sandbox_image, docker_client, box_root, tmp_path):
    """The engine goes away during a session (the sandbox's engine client is pointed at a dead socket), then the sandbox is closed.

    Calls keep working (they do not use the engine); closing raises SandboxUnavailableError, removes the host directories and leaves the container to the reaper, which removes it.
    """
    sandbox = DockerSandbox(writable=[box_root], image=sandbox_image, runtime=RUNTIME)
    await sandbox.start()
    container_id = sandbox.container_id
    try:
        dead = docker.DockerClient(base_url=f"unix://{tmp_path / 'engine.sock'}", version="1.41")
        sandbox._docker, sandbox._container.client = dead, dead
        assert (await Attacker(sandbox.backend, box_root).run(["/bin/echo", "ok"])).stdout == "ok\n"
        with pytest.raises(SandboxUnavailableError, match="reaper"):
            await asyncio.wait_for(sandbox.aclose(), HANG_GUARD)
        assert all(not path.exists() for path in sandbox._host_dirs)
        assert docker_client.containers.get(container_id).status == "running"
    finally:
        await asyncio.to_thread(docker_client.containers.get(container_id).remove, force=True)


async def test_missing_runtime(sandbox_image, docker_client):
    """A sandbox asked to run under a runtime the engine does not have (as runsc is where gVisor is not installed).

    SandboxUnavailableError naming the runtime and the ones the engine has; no container is created.
    """
    sandbox = DockerSandbox([], image=sandbox_image, runtime="protolink-absent-runtime")
    with pytest.raises(SandboxUnavailableError, match="no runtime 'protolink-absent-runtime'"):
        await sandbox.start()
    assert sandbox.container_id is None


HOST_SCRIPT = """
import asyncio, sys
from protolink.sandbox.docker import DockerSandbox

async def main():
    sandbox = DockerSandbox([], image=sys.argv[1], runtime=sys.argv[2] or None)
    await sandbox.start()
    print(sandbox.container_id, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_host_process_dies_mid_session(sandbox_image, docker_client, box_root):
    """The host process that started a sandbox is killed with SIGKILL mid-session (no cleanup code runs).

    Its container outlives it; the next sandbox to start reaps it (its owner is gone) and reports it in .reaped.
    """
    host = await asyncio.create_subprocess_exec(sys.executable, "-c", HOST_SCRIPT, sandbox_image, RUNTIME or "",
                                                stdout=asyncio.subprocess.PIPE, cwd=Path(__file__).parents[2])
    assert host.stdout is not None
    try:
        orphan = (await asyncio.wait_for(host.stdout.readline(), HANG_GUARD)).decode().strip()
    finally:
        host.send_signal(signal.SIGKILL)
        await host.wait()
    assert docker_client.containers.get(orphan).status == "running"
    async with dedicated_sandbox(sandbox_image, writable=[box_root]) as box:
        reaped = {gone.container_id: gone.reason for gone in box.reaped}
    assert reaped.get(orphan[:12]) == "owner gone"
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(orphan)


async def test_thousand_calls_fifty_in_flight(attacker):
    """1,000 calls (commands and file reads, alternating) with 50 in flight at once against one sandbox.

    Every call returns exactly its own answer: none lost, none duplicated, none mixed up.
    """
    for index in range(0, 1000, 2):
        (attacker.ws / f"f{index}.txt").write_text(f"file {index}\n")
    limit = asyncio.Semaphore(50)

    async def one(index: int) -> tuple[int, str]:
        async with limit:
            if index % 2:
                return index, (await attacker.run(["/bin/echo", f"command {index}"])).stdout
            return index, (await attacker.call("read_file", path=str(attacker.ws / f"f{index}.txt")))["content"]

    started = time.monotonic()
    answers = await asyncio.gather(*(one(index) for index in range(1000)))
    seconds = time.monotonic() - started
    assert sorted(index for index, _ in answers) == list(range(1000))
    assert all(text == f"{'command' if index % 2 else 'file'} {index}\n" for index, text in answers)
    figure("1,000 calls, 50 in flight", f"{seconds:.1f} s ({1000 / seconds:.0f} calls/s), 0 lost")
    await still_serves(attacker)


# Fuzzing --------------------------------------------------------------------------------------

FUZZ_SECONDS = 15.0
REQUESTS = {
    "Info": sandbox_pb2.InfoRequest, "Execute": process_pb2.ExecuteRequest,
    "ResolveCommand": process_pb2.ResolveCommandRequest, "ReadText": workspace_pb2.ReadTextRequest,
    "ListFiles": workspace_pb2.ListFilesRequest, "SearchFiles": workspace_pb2.SearchFilesRequest,
    "SnapshotFile": workspace_pb2.SnapshotFileRequest, "ReplaceFile": workspace_pb2.ReplaceFileRequest,
    "ReadDocument": documents_pb2.ReadDocumentRequest, "SearchDocument": documents_pb2.SearchDocumentRequest,
}
#: What a fault looks like; any other status is an answer the server chose.
FAULTS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE}


class Fuzzer:
    """Random requests that parse: every field set to an extreme, a hostile path or a random value.

    (tests/integration/test_sandbox_server.py mutates bytes of valid requests against a server on
    this host; this one builds well-formed messages with hostile contents, against a container.)
    """

    def __init__(self, rng: random.Random, root: Path) -> None:
        self.rng = rng
        self.strings = [str(root), f"{root}/", f"{root}/x.txt", f"{root}/../..", "/", "/etc/passwd",
                        "/proc/self/mem", "", "\0", "a\0b", "x" * 5000, "é\u202e\ufeff", "*", "**/*",
                        "-rf", "--help", "/bin/true", "/bin/echo", "sh", "PATH", "=", "../" * 300]
        self.numbers = [0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, 2**64 - 1, 10**12]
        self.floats = [0.0, -1.0, 1e-9, 0.5, 1e308, math.inf, -math.inf, math.nan]

    def message(self, cls: type) -> Any:
        message = cls()
        self.fill(message, 0)
        return message

    def fill(self, message: Any, depth: int) -> None:
        for field in message.DESCRIPTOR.fields:
            if self.rng.random() < 0.3:
                continue
            value = getattr(message, field.name)
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                for _ in range(self.rng.randint(0, 3)):
                    value[self.rng.choice(self.strings)] = self.rng.choice(self.strings)
            elif field.is_repeated:
                for _ in range(self.rng.randint(0, 4)):
                    if field.message_type is None:
                        value.append(self.scalar(field))
                    elif depth < 3:
                        self.fill(value.add(), depth + 1)
            elif field.message_type is not None:
                if depth < 3:
                    self.fill(value, depth + 1)
                    value.SetInParent()
            else:
                setattr(message, field.name, self.scalar(field))

    def scalar(self, field: descriptor.FieldDescriptor) -> Any:
        kind = field.type
        if kind == descriptor.FieldDescriptor.TYPE_STRING:
            return self.rng.choice(self.strings)
        if kind == descriptor.FieldDescriptor.TYPE_BYTES:
            return self.rng.randbytes(self.rng.choice([0, 1, 100, 70_000]))
        if kind == descriptor.FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if kind in (descriptor.FieldDescriptor.TYPE_DOUBLE, descriptor.FieldDescriptor.TYPE_FLOAT):
            return self.rng.choice(self.floats)
        if kind == descriptor.FieldDescriptor.TYPE_ENUM:
            return self.rng.choice([value.number for value in field.enum_type.values] + [99])
        unsigned = kind in (descriptor.FieldDescriptor.TYPE_UINT32, descriptor.FieldDescriptor.TYPE_UINT64,
                            descriptor.FieldDescriptor.TYPE_FIXED32, descriptor.FieldDescriptor.TYPE_FIXED64)
        wide = kind in (descriptor.FieldDescriptor.TYPE_INT64, descriptor.FieldDescriptor.TYPE_UINT64,
                        descriptor.FieldDescriptor.TYPE_SINT64, descriptor.FieldDescriptor.TYPE_FIXED64,
                        descriptor.FieldDescriptor.TYPE_SFIXED64)
        low, high = (0 if unsigned else -(2**63 if wide else 2**31)), (2**(64 if wide else 32) - 1 if unsigned
                                                                        else 2**(63 if wide else 31) - 1)
        return min(max(self.rng.choice(self.numbers), low), high)


async def test_fuzzed_requests(sandbox, attacker):
    """15 s of random well-formed requests to every RPC of the server in a container: extreme numbers, NaN and infinite timeouts, hostile paths, NUL bytes, unknown enum values, oversized strings.

    Every request gets a chosen status (never INTERNAL, UNKNOWN or UNAVAILABLE); the server answers a health check after and serves the next call.
    """
    fuzzer = Fuzzer(random.Random(20261130), attacker.ws)
    counts: dict[str, int] = {}
    deadline = time.monotonic() + FUZZ_SECONDS
    assert sandbox.address is not None
    async with grpc.aio.insecure_channel(sandbox.address) as channel:
        while time.monotonic() < deadline:
            method = fuzzer.rng.choice(sorted(REQUESTS))
            payload = fuzzer.message(REQUESTS[method]).SerializeToString()
            path = f"/protolink.sandbox.v1.Sandbox/{method}"
            try:
                if method == "Execute":
                    call = channel.stream_stream(path)(timeout=HANG_GUARD)
                    await call.write(payload)
                    await call.done_writing()
                    async for _ in call:
                        pass
                else:
                    await channel.unary_unary(path)(payload, timeout=HANG_GUARD)
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as error:
                code = error.code()
            assert code not in FAULTS, (method, payload[:200], code)
            counts[code.name] = counts.get(code.name, 0) + 1
    figure("fuzzed requests in 15 s", ", ".join(f"{name} {n}" for name, n in sorted(counts.items())))
    assert await sandbox.backend.health()
    await still_serves(attacker)
