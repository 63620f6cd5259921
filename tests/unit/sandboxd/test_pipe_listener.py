"""The server's pipe listener hands a command's output pipes to the connection its key names, and
only there; the host's side (:mod:`protolink.sandbox.pipe_connection`) receives them."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protolink.sandbox.pipe_connection import PassedPipes, PipeConnection
from protolink.wire.pipe_passing import SOCKET_NAME
from protolink_sandboxd.pipe_listener import PipeListener

pytestmark = pytest.mark.root  # the socket is bound as its directory's owner (seteuid)

MAX_CONNECTIONS = 2


@pytest.fixture
async def listener(tmp_path: Path) -> AsyncIterator[PipeListener]:
    pipes = PipeListener(str(tmp_path), command_uid=65534, max_connections=MAX_CONNECTIONS)
    yield pipes
    pipes.close()


async def connect(tmp_path: Path, handed: list[PassedPipes]) -> PipeConnection | None:
    return await PipeConnection.open(str(tmp_path / SOCKET_NAME), handed.append)


async def until(condition, what: str) -> None:
    for _ in range(6000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_read_ends_go_to_the_connection_the_key_names(tmp_path, listener):
    first_handed: list[PassedPipes] = []
    second_handed: list[PassedPipes] = []
    first, second = await connect(tmp_path, first_handed), await connect(tmp_path, second_handed)
    assert first is not None and second is not None and first.key != second.key
    (stdout, stdout_writer), (stderr, stderr_writer) = os.pipe(), os.pipe()
    try:
        assert listener.hand_off(second.key, 7, stdout, stderr)
        await until(lambda: second_handed, "the hand-off")
        passed = second_handed[0]
        assert passed.request_id == 7
        assert [os.fstat(fd).st_ino for fd in (passed.stdout, passed.stderr)] == [
            os.fstat(fd).st_ino for fd in (stdout, stderr)]
        assert not first_handed
        passed.close()
    finally:
        for fd in (stdout, stdout_writer, stderr, stderr_writer):
            os.close(fd)
        first.close()
        second.close()


async def test_no_hand_off_without_a_connection_of_that_key(tmp_path, listener):
    connection = await connect(tmp_path, [])
    assert connection is not None
    read, write = os.pipe()
    try:
        assert not listener.hand_off(b"x" * len(connection.key), 1, read, read)
        connection.close()
        await until(lambda: not listener.hand_off(connection.key, 1, read, read), "the closed connection to be dropped")
    finally:
        os.close(read)
        os.close(write)


async def test_connections_beyond_the_limit_are_refused(tmp_path, listener):
    held = [await connect(tmp_path, []) for _ in range(MAX_CONNECTIONS)]
    assert all(held)
    assert await connect(tmp_path, []) is None
    for connection in held:
        assert connection is not None
        connection.close()
