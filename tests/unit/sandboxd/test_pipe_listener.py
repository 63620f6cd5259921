"""The server's command channel (:mod:`protolink_sandboxd.pipe_listener`), spoken to here as a raw
socket: each connection is greeted with the protocol's version, its key and the proof of pipe
passing; it is one Execute call once its authorization is taken; output pipes go to the connection
the key names, and only there."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from protolink.errors import SandboxAuthenticationError
from protolink.net.descriptors import receive_next
from protolink.wire import status
from protolink.wire._pb import errors_pb2
from protolink.wire.pipe_passing import (
    AT_LIMIT,
    AUTHORIZATION,
    DATAGRAM_BYTES,
    EVENT,
    FAILURE,
    GREETING,
    HANDOFF,
    HANDOFF_KIND,
    KEY_BYTES,
    PING,
    PONG,
    SOCKET_NAME,
)
from protolink_sandboxd.pipe_listener import MAX_WAITING, PipeListener

pytestmark = pytest.mark.root  # the socket is bound as its directory's owner (seteuid)

MAX_CONNECTIONS = 2
TOKEN = b"Bearer secret"
#: How many requests the host sends before it lets the server read.
SENT_BEFORE_A_TURN = 32


class EchoCall:
    """An Execute call that answers each request with its own bytes, once ``sending`` is set."""

    def __init__(self, sending: asyncio.Event | None = None) -> None:
        self._answers: asyncio.Queue[bytes] = asyncio.Queue()
        self._sending = sending

    @property
    def waiting(self) -> int:
        return self._answers.qsize()

    def take(self, request: bytes) -> None:
        self._answers.put_nowait(request)

    async def events(self) -> AsyncIterator[bytes]:
        if self._sending is not None:
            await self._sending.wait()
        while True:
            yield await self._answers.get()

    async def aclose(self) -> None:
        pass


@pytest.fixture
async def listener(tmp_path: Path) -> AsyncIterator[PipeListener]:
    pipes = PipeListener(str(tmp_path), command_uid=65534, max_connections=MAX_CONNECTIONS)
    pipes.serve(EchoCall, lambda supplied: supplied == TOKEN)
    yield pipes
    await pipes.aclose()


async def greeted(tmp_path: Path) -> tuple[socket.socket, bytes]:
    """A connection and its key; the key is empty when the greeting did not come."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, str(tmp_path / SOCKET_NAME))
    async with asyncio.timeout(30):
        greeting, fds, _ = await receive_next(sock, DATAGRAM_BYTES, 1)
    for fd in fds:
        os.close(fd)
    assert not greeting or (greeting.startswith(GREETING) and len(fds) == 1)
    return sock, greeting.removeprefix(GREETING)


async def next_datagram(sock: socket.socket) -> tuple[bytes, list[int]]:
    async with asyncio.timeout(30):
        data, fds, _ = await receive_next(sock, DATAGRAM_BYTES, 2)
    return data, fds


async def test_an_authorized_connection_is_one_execute_call_and_its_pings_are_answered(tmp_path, listener):
    sock, key = await greeted(tmp_path)
    with sock:
        assert len(key) == KEY_BYTES
        sock.send(AUTHORIZATION + TOKEN)
        sock.send(PING)
        assert await next_datagram(sock) == (PONG, [])
        sock.send(b"a request")
        assert await next_datagram(sock) == (EVENT + b"a request", [])


@pytest.mark.parametrize("first", [AUTHORIZATION + b"Bearer wrong", b"a request without authorization"])
async def test_a_connection_without_the_token_is_refused_with_a_typed_error(tmp_path, listener, first):
    sock, _ = await greeted(tmp_path)
    with sock:
        sock.send(first)
        data, _ = await next_datagram(sock)
        assert data.startswith(FAILURE)
        error = status.from_wire(errors_pb2.Error.FromString(data[len(FAILURE):]))
        assert isinstance(error, SandboxAuthenticationError)
        assert await next_datagram(sock) == (b"", [])  # and the connection is closed


async def test_a_call_whose_events_are_not_sent_holds_back_the_hosts_sends(tmp_path):
    """A call's events wait in the server only up to a bound: past it the host's sends wait for
    room, and once the events go out, every request is served, in order."""
    go = asyncio.Event()
    pipes = PipeListener(str(tmp_path), command_uid=65534, max_connections=MAX_CONNECTIONS)
    pipes.serve(lambda: EchoCall(go), lambda supplied: supplied == TOKEN)
    sock, _ = await greeted(tmp_path)
    try:
        sock.send(AUTHORIZATION + TOKEN)
        sent, ceiling, blocked_since = 0, 100 * MAX_WAITING, None
        loop = asyncio.get_running_loop()
        while sent < ceiling:
            try:
                sock.send(b"request %d" % sent)
            except BlockingIOError:
                blocked_since = blocked_since or loop.time()
                if loop.time() - blocked_since > 1.0:
                    break  # the server has had many turns to read, and took nothing more
                await asyncio.sleep(0.01)
                continue
            sent, blocked_since = sent + 1, None
            if sent % SENT_BEFORE_A_TURN == 0:
                await asyncio.sleep(0)  # the server's turn to read
        assert sent < ceiling, "the server read every request of a call that took none"
        go.set()
        for number in range(sent):
            assert await next_datagram(sock) == (EVENT + b"request %d" % number, [])
    finally:
        sock.close()
        await pipes.aclose()


async def test_the_read_ends_go_to_the_connection_the_key_names(tmp_path, listener):
    (first, first_key), (second, second_key) = await greeted(tmp_path), await greeted(tmp_path)
    (stdout, stdout_writer), (stderr, stderr_writer) = os.pipe(), os.pipe()
    try:
        assert first_key != second_key
        assert listener.hand_off(second_key, 7, stdout, stderr)
        data, fds = await next_datagram(second)
        assert HANDOFF.unpack(data) == (HANDOFF_KIND, 7)
        assert [os.fstat(fd).st_ino for fd in fds] == [os.fstat(fd).st_ino for fd in (stdout, stderr)]
        for fd in fds:
            os.close(fd)
        with pytest.raises(BlockingIOError):
            first.recv(DATAGRAM_BYTES)
    finally:
        for fd in (stdout, stdout_writer, stderr, stderr_writer):
            os.close(fd)
        first.close()
        second.close()


async def test_no_hand_off_without_a_connection_of_that_key(tmp_path, listener):
    sock, key = await greeted(tmp_path)
    read, write = os.pipe()
    try:
        assert not listener.hand_off(b"x" * len(key), 1, read, read)
        sock.close()
        for _ in range(6000):
            if not listener.hand_off(key, 1, read, read):
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the closed connection was not dropped")
    finally:
        os.close(read)
        os.close(write)


async def test_connections_beyond_the_limit_are_told_so_and_closed(tmp_path, listener):
    held = [await greeted(tmp_path) for _ in range(MAX_CONNECTIONS)]
    assert all(key for _, key in held)
    refused = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    refused.setblocking(False)
    await asyncio.get_running_loop().sock_connect(refused, str(tmp_path / SOCKET_NAME))
    async with asyncio.timeout(30):
        answer, fds, _ = await receive_next(refused, DATAGRAM_BYTES, 1)
        assert (answer, fds) == (AT_LIMIT, [])
        assert (await receive_next(refused, DATAGRAM_BYTES, 1))[0] == b""  # then closed
    for sock, _ in held:
        sock.close()
    refused.close()
