"""The server's side of the spawner checks every answer: a spawner that breaks the protocol is
killed and reaped, what waited on it fails with a typed error, and a launch canceled before its
answer still kills the command once it starts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink.execution.process import ProcessSpec
from sandbox import spawner
from sandbox.launcher import SpawnerConnection, SpawnerError

MAX_ANSWER_BYTES = 1 << 16


class FakeSpawner:
    """The spawner's end of the channel, driven by the test, and a process standing in for it."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.server_end, self.channel = socket.socketpair()
        self.channel.settimeout(30)

    def request(self) -> tuple[int, int, dict]:
        kind, request, length = spawner.HEADER.unpack(self._exactly(spawner.HEADER.size))
        return kind, request, json.loads(self._exactly(length))

    def answer(self, kind: int, request: int, payload: dict) -> None:
        self.channel.sendall(spawner.encode(kind, request, payload))

    def gone(self) -> bool:
        return not Path(f"/proc/{self.process.pid}").exists()

    def _exactly(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            data += self.channel.recv(size - len(data))
        return data


@pytest.fixture
def fake() -> Iterator[FakeSpawner]:
    fake = FakeSpawner()
    yield fake
    fake.channel.close()
    if not fake.gone():
        fake.process.kill()
        fake.process.wait()


def connect(fake: FakeSpawner) -> SpawnerConnection:
    return SpawnerConnection(fake.process.pid, fake.server_end, asyncio.get_running_loop(), MAX_ANSWER_BYTES)


async def settled(condition) -> None:
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    pytest.fail("the condition never held")


@pytest.mark.parametrize("answer", [
    b"not json",
    json.dumps(["a", "list"]).encode(),
    json.dumps({"argv": "not a list", "cwd": "/"}).encode(),
    json.dumps({"argv": [1], "cwd": "/"}).encode(),
    b"[" * 5_000,  # nested past the recursion limit
])
async def test_an_answer_that_does_not_fit_kills_the_spawner(fake, answer):
    connection = connect(fake)
    asked = connection.request(spawner.RESOLVE, {"argv": ["true"], "cwd": "/", "env": {}})
    _, request, _ = await asyncio.to_thread(fake.request)
    fake.channel.sendall(spawner.HEADER.pack(spawner.RESOLVED, request, len(answer)) + answer)
    with pytest.raises(SpawnerError, match="invalid answer"):
        await asked
    await settled(fake.gone)
    assert not connection.alive


async def test_an_oversized_answer_kills_the_spawner(fake):
    connection = connect(fake)
    asked = connection.request(spawner.RESOLVE, {"argv": ["true"], "cwd": "/", "env": {}})
    _, request, _ = await asyncio.to_thread(fake.request)
    fake.channel.sendall(spawner.HEADER.pack(spawner.RESOLVED, request, MAX_ANSWER_BYTES + 1))
    with pytest.raises(SpawnerError, match="answer of"):
        await asked
    await settled(fake.gone)


@pytest.mark.parametrize("kind, payload", [
    (spawner.EXITED, {"code": 0}),  # no such command
    (spawner.STARTED, {"pid": 1}),  # no such request
])
async def test_an_answer_to_nothing_kills_the_spawner(fake, kind, payload):
    connection = connect(fake)
    fake.answer(kind, 12345, payload)
    await settled(fake.gone)
    assert not connection.alive


async def test_a_spawner_that_dies_ends_its_commands_and_fails_what_waits(fake):
    connection = connect(fake)
    read, write = os.pipe()
    launched = asyncio.ensure_future(connection.launch(ProcessSpec(("/bin/true",), "/", {}, 5, 100), write, write))
    _, request, _ = await asyncio.to_thread(fake.request)
    fake.answer(spawner.STARTED, request, {"pid": fake.process.pid})
    command = await launched
    os.close(read)
    os.close(write)
    waiting = connection.request(spawner.RESOLVE, {"argv": ["true"], "cwd": "/", "env": {}})
    fake.channel.close()  # the spawner is gone
    with pytest.raises(SpawnerError, match="exited"):
        await waiting
    await asyncio.wait_for(command.exited, 30)
    assert command.exit_code is None


async def test_a_launch_canceled_before_its_answer_kills_the_command_once_it_starts(fake):
    connection = connect(fake)
    read, write = os.pipe()
    spec = ProcessSpec(("/bin/true",), "/", {}, 5, 100)
    launch = asyncio.ensure_future(connection.launch(spec, write, write))
    _, request, _ = await asyncio.to_thread(fake.request)
    launch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await launch
    command = subprocess.Popen(["sleep", "60"], start_new_session=True)
    fake.answer(spawner.STARTED, request, {"pid": command.pid})
    assert await asyncio.to_thread(command.wait, 30) == -signal.SIGKILL
    os.close(read)
    os.close(write)
