"""The server's side of the spawner checks every answer: a spawner that breaks the protocol is
killed and reaped, what waited on it fails with a typed error, and a launch canceled before its
answer still kills the command once it starts."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from protolink_sandboxd import spawner
from protolink_sandboxd.spawner_client import (
    MAX_ANSWER_BYTES,
    CommandSpec,
    SpawnerConnection,
    SpawnerError,
)

from protolink.execution.local_processes import Leader
from protolink.execution.process_types import ProcessSpec

MAX_REQUEST_BYTES = 1 << 16


class FakeSpawner:
    """The spawner's end of the channel, driven by the test, and a process standing in for it."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(["sleep", "60"], start_new_session=True)
        self.server_end, self.channel = socket.socketpair()
        self.channel.settimeout(30)

    def request(self) -> tuple[int, int, list[str]]:
        """The next request: kind, id and its NUL-terminated fields."""
        kind, request, length = spawner.HEADER.unpack(self._exactly(spawner.HEADER.size))
        return kind, request, os.fsdecode(self._exactly(length)).split("\0")[:-1]

    def answer(self, kind: int, request: int, payload: bytes = b"") -> None:
        self.channel.sendall(spawner.HEADER.pack(kind, request, len(payload)) + payload)

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
    return SpawnerConnection(fake.process.pid, fake.server_end, asyncio.get_running_loop(), MAX_REQUEST_BYTES)


def number(value: int) -> bytes:
    return spawner.NUMBER.pack(value)


def pids(command: int, keeper: int) -> bytes:
    return spawner.PIDS.pack(command, keeper)


async def settled(condition) -> None:
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    pytest.fail("the condition never held")


async def test_requests_carry_the_command_and_the_candidates_of_a_reused_resolution(fake):
    connection = connect(fake)
    read, write = os.pipe()
    spec = CommandSpec(("/usr/bin/true", "a b"), "/srv", {"PATH": "/usr/local/bin:relative:/usr/bin"}, 5, 100,
                       "/usr/lib/true", resolved_from=("true", "/srv/."))
    launched = asyncio.ensure_future(connection.launch(spec, write, write))
    kind, request, fields = await asyncio.to_thread(fake.request)
    assert kind == spawner.SPAWN
    # then the keeper's kill-after time: the timeout and the grace the server's SIGTERM gives
    assert fields == ["2", "/usr/bin/true", "a b", "/srv", "1", "PATH=/usr/local/bin:relative:/usr/bin", "6000",
                      "/srv/.", "2", "/usr/local/bin/true", "/usr/bin/true", "/usr/lib/true"]
    fake.answer(spawner.FAILED, request, number(2) + b"No such file or directory")
    with pytest.raises(FileNotFoundError, match="No such file"):
        await launched
    resolving = asyncio.ensure_future(connection.resolve("/srv", ["./bin/tool"]))
    kind, request, fields = await asyncio.to_thread(fake.request)
    assert (kind, fields) == (spawner.RESOLVE, ["/srv", "1", "./bin/tool"])
    fake.answer(spawner.RESOLVED, request, number(0) + b"/srv\0/srv/real/tool")
    assert await resolving == ("/srv", 0, "/srv/real/tool")
    os.close(read)
    os.close(write)


async def test_text_with_a_nul_is_refused_before_anything_is_sent(fake):
    connection = connect(fake)
    with pytest.raises(ValueError, match="NUL"):
        await connection.launch(ProcessSpec(("/bin/echo", "a\0b"), "/", {}, 5, 100), 1, 2)
    fake.channel.settimeout(0.2)
    with pytest.raises(TimeoutError):
        fake.channel.recv(1)
    assert connection.alive


async def test_a_path_too_long_to_pass_on_is_refused(fake):
    connection = connect(fake)
    spec = CommandSpec(("/usr/bin/true",), "/", {"PATH": ":".join(["/x"] * 4000)}, 5, 100, resolved_from=("t" * 20, "/"))
    with pytest.raises(ValueError, match="too large"):
        await connection.launch(spec, 1, 2)
    assert connection.alive


@pytest.mark.parametrize("kind, payload", [
    (spawner.RESOLVED, b"\0\0\0"),  # not a number
    (spawner.RESOLVED, number(1) + b"/srv\0/srv/tool"),  # no such candidate
    (spawner.RESOLVED, number(-2) + b"/srv\0"),
    (spawner.RESOLVED, number(0) + b"srv\0/srv/tool"),  # not an absolute path
    (spawner.RESOLVED, number(0) + b"/srv"),  # no real path
    (spawner.RESOLVED, number(0) + b"/srv\0tool"),  # a relative real path
    (spawner.RESOLVED, number(-1) + b"/srv\0/srv/tool"),  # a real path for no candidate
    (spawner.REFUSED, b"why"),  # REFUSED carries nothing
    (spawner.STARTED, pids(7, 8)),  # an answer to a SPAWN
    (99, b""),  # no such kind
])
async def test_an_answer_that_does_not_fit_kills_the_spawner(fake, kind, payload):
    connection = connect(fake)
    asked = asyncio.ensure_future(connection.resolve("/srv", ["/bin/true"]))
    _, request, _ = await asyncio.to_thread(fake.request)
    fake.answer(kind, request, payload)
    with pytest.raises(SpawnerError, match="invalid answer"):
        await asked
    await settled(fake.gone)
    assert not connection.alive


@pytest.mark.parametrize("kind, payload", [
    (spawner.STARTED, pids(0, 8)),  # no such pid
    (spawner.STARTED, pids(7, 0)),  # no such keeper
    (spawner.STARTED, number(7)),  # no keeper
    (spawner.STARTED, pids(7, 8) + b"\0"),
    (spawner.FAILED, b"\0\0"),
    (spawner.CHANGED, b"x"),
    (spawner.RESOLVED, number(0) + b"/"),  # an answer to a RESOLVE
])
async def test_a_launch_answer_that_does_not_fit_kills_the_spawner(fake, kind, payload):
    connection = connect(fake)
    read, write = os.pipe()
    launched = asyncio.ensure_future(connection.launch(ProcessSpec(("/bin/true",), "/", {}, 5, 100), write, write))
    _, request, _ = await asyncio.to_thread(fake.request)
    fake.answer(kind, request, payload)
    with pytest.raises(OSError, match="invalid answer"):
        await launched
    await settled(fake.gone)
    os.close(read)
    os.close(write)


async def test_an_oversized_answer_kills_the_spawner(fake):
    connection = connect(fake)
    asked = asyncio.ensure_future(connection.resolve("/", ["/bin/true"]))
    _, request, _ = await asyncio.to_thread(fake.request)
    fake.channel.sendall(spawner.HEADER.pack(spawner.RESOLVED, request, MAX_ANSWER_BYTES + 1))
    with pytest.raises(SpawnerError, match="answer of"):
        await asked
    await settled(fake.gone)


@pytest.mark.parametrize("kind, payload", [
    (spawner.EXITED, spawner.EXIT.pack(0, 0)),  # no such command
    (spawner.STARTED, number(1)),  # no such request
])
async def test_an_answer_to_nothing_kills_the_spawner(fake, kind, payload):
    connection = connect(fake)
    fake.answer(kind, 12345, payload)
    await settled(fake.gone)
    assert not connection.alive


async def started_command(fake: FakeSpawner, connection: SpawnerConnection) -> tuple[Leader, int]:
    """A command the fake spawner says it started, and the request it answered."""
    read, write = os.pipe()
    launched = asyncio.ensure_future(connection.launch(ProcessSpec(("/bin/true",), "/", {}, 5, 100), write, write))
    _, request, _ = await asyncio.to_thread(fake.request)
    fake.answer(spawner.STARTED, request, pids(fake.process.pid, fake.process.pid))
    command = await launched
    os.close(read)
    os.close(write)
    return command, request


async def test_an_exit_the_keeper_forced_at_the_deadline_is_reported_so(fake):
    connection = connect(fake)
    command, request = await started_command(fake, connection)
    fake.answer(spawner.EXITED, request, spawner.EXIT.pack(-signal.SIGKILL, 1))
    await asyncio.wait_for(command.exited, 30)
    assert (command.exit_code, command.killed_at_deadline) == (-signal.SIGKILL, True)
    command, request = await started_command(fake, connection)
    fake.answer(spawner.EXITED, request, spawner.EXIT.pack(-signal.SIGKILL, 0))
    await asyncio.wait_for(command.exited, 30)
    assert (command.exit_code, command.killed_at_deadline) == (-signal.SIGKILL, False)
    assert connection.alive


@pytest.mark.parametrize("payload", [
    spawner.NUMBER.pack(0),  # no word on the keeper's kill
    spawner.EXIT.pack(0, 2),
    spawner.EXIT.pack(0, 0) + b"\0",
])
async def test_an_exit_that_does_not_fit_kills_the_spawner(fake, payload):
    connection = connect(fake)
    command, request = await started_command(fake, connection)
    fake.answer(spawner.EXITED, request, payload)
    await settled(fake.gone)
    assert not connection.alive and command.exit_code is None


async def test_a_spawner_that_dies_ends_its_commands_and_fails_what_waits(fake):
    connection = connect(fake)
    command, _ = await started_command(fake, connection)
    waiting = asyncio.ensure_future(connection.resolve("/", ["/bin/true"]))
    await asyncio.to_thread(fake.request)
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
    fake.answer(spawner.STARTED, request, pids(command.pid, command.pid))
    assert await asyncio.to_thread(command.wait, 30) == -signal.SIGKILL
    os.close(read)
    os.close(write)
