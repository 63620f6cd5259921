"""The command channel (:mod:`protolink_sandboxd.pipe_listener`, :mod:`protolink.sandbox.pipe_connection`)
against the real sandbox server: a local backend runs its commands there, with the same results
and typed errors as on gRPC; a wrong token, and a request that does not parse, are refused typed;
closing the connection kills the command; what does not fit a datagram, ``command_channel=False``
and a server that offers no channel (an older image's pipe socket) go over gRPC instead."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from protolink.errors import SandboxAuthenticationError, SandboxError
from protolink.execution.process_types import NO_EVENTS, ProcessResult, ProcessSpec
from protolink.net.descriptors import receive_next
from protolink.sandbox import connect
from protolink.sandbox.aio_call import AsyncCall
from protolink.sandbox.pipe_connection import ChannelCall
from protolink.wire import status
from protolink.wire._pb import errors_pb2, process_pb2
from protolink.wire.pipe_passing import (
    AUTHORIZATION,
    DATAGRAM_BYTES,
    EVENT,
    FAILURE,
    GREETING,
    HANDED_FDS,
    HANDOFF_KIND,
    KEY_BYTES,
    SOCKET_NAME,
)
from protolink_sandboxd.execute import MAX_INPUT_BYTES
from tests.integration.test_sandbox_server import alive, settle
from tests.sandbox_server import RunningServer, sandbox_server, unused_uid

pytestmark = pytest.mark.root

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
TOKEN = secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
async def server(tmp_path_factory) -> AsyncIterator[tuple[RunningServer, Path]]:
    root = Path(tempfile.mkdtemp(prefix="protolink-command-channel-test-")).resolve()
    root.chmod(0o777)
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    async with sandbox_server([(root, True)], uid=unused_uid(), token=TOKEN,
                              args=["--token-file", str(token_file)]) as running:
        yield running, root


class Opened:
    """The Execute calls made while it records: on the command channel, on a connection of their own (gRPC)."""

    def __init__(self) -> None:
        self.channel: list[ChannelCall] = []
        self.grpc: list[AsyncCall] = []


@pytest.fixture
def opened(monkeypatch) -> Iterator[Opened]:
    record = Opened()
    for cls, made in ((ChannelCall, record.channel), (AsyncCall, record.grpc)):
        original = cls.__init__

        def recording(self: Any, *args: Any, _original: Any = original, _made: list[Any] = made, **kwargs: Any) -> None:
            _original(self, *args, **kwargs)
            _made.append(self)

        monkeypatch.setattr(cls, "__init__", recording)
    yield record


def facts(result: ProcessResult) -> tuple[Any, ...]:
    return result.exit_code, result.stdout, result.stderr, result.truncated, result.timed_out


async def test_a_local_backend_runs_its_commands_on_the_channel(server, opened):
    running, root = server
    async with await connect(running.address, token=TOKEN) as backend:
        results = await asyncio.gather(*(backend.execute(
            ProcessSpec(("/bin/echo", str(n)), str(root), ENV, 60, 1000), NO_EVENTS) for n in range(20)))
    assert [result.stdout for result in results] == [f"{n}\n" for n in range(20)]
    assert len(opened.channel) == 1  # every command on the one call the backend opened
    assert not opened.grpc


SPECS = {
    "exit code": ("/bin/sh", "-c", "echo out; echo err >&2; exit 3"),
    "signal": ("/bin/sh", "-c", "kill -TERM $$"),
    "stdin is empty": ("/bin/sh", "-c", "cat; echo read"),
    "cap": ("/bin/sh", "-c", "seq 1 100000"),
    "timeout": ("/bin/sh", "-c", "echo before; sleep 30"),
    "bytes that are not UTF-8": ("/bin/sh", "-c", "printf 'é\\377\\n'; printf '\\376' >&2"),
}


@pytest.mark.parametrize("argv", SPECS.values(), ids=SPECS.keys())
async def test_results_equal_the_grpc_paths(server, opened, argv):
    running, root = server
    timeout = 1 if "sleep" in argv[-1] else 60
    spec = ProcessSpec(argv, str(root), ENV, timeout, 4000)
    async with await connect(running.address, token=TOKEN) as on_channel:
        channel_result = await on_channel.execute(spec, NO_EVENTS)
    async with await connect(running.address, token=TOKEN, command_channel=False) as on_grpc:
        grpc_result = await on_grpc.execute(spec, NO_EVENTS)
    assert facts(channel_result) == facts(grpc_result)
    assert len(opened.channel) == 1 and len(opened.grpc) == 1


@pytest.mark.parametrize("spec", [
    ProcessSpec(("/no/such/program",), "/", ENV, 60, 1000),
    ProcessSpec(("/bin/true",), "/no/such/directory", ENV, 60, 1000),
    ProcessSpec(("/bin/true",), "/", ENV, 60, 1 << 40),  # over the server's output limit
], ids=["no program", "no directory", "cap over the limit"])
async def test_typed_errors_equal_the_grpc_paths(server, spec):
    running, _ = server
    errors = []
    for command_channel in (True, False):
        async with await connect(running.address, token=TOKEN, command_channel=command_channel) as backend:
            with pytest.raises(Exception) as raised:
                await backend.execute(spec, NO_EVENTS)
            errors.append((type(raised.value), str(raised.value)))
    assert errors[0] == errors[1]


async def greeted(running: RunningServer) -> socket.socket:
    """A raw connection to the server's command channel, its greeting read."""
    path = os.path.join(os.path.dirname(running.address.removeprefix("unix://")), SOCKET_NAME)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, path)
    async with asyncio.timeout(30):
        greeting, fds, _ = await receive_next(sock, DATAGRAM_BYTES, 1)
    for fd in fds:
        os.close(fd)
    assert greeting.startswith(GREETING)
    return sock


async def refusal_after(sock: socket.socket, *datagrams: bytes) -> errors_pb2.Error:
    """The FAILURE the server answers ``datagrams`` with."""
    for datagram in datagrams:
        sock.send(datagram)
    async with asyncio.timeout(30):
        refusal, _, _ = await receive_next(sock, DATAGRAM_BYTES, 0)
    assert refusal.startswith(FAILURE)
    return errors_pb2.Error.FromString(refusal[len(FAILURE):])


async def test_a_wrong_token_is_refused_with_a_typed_error(server):
    running, _ = server
    with await greeted(running) as sock:
        refusal = await refusal_after(sock, AUTHORIZATION + f"Bearer {TOKEN}x".encode())
    assert isinstance(status.from_wire(refusal), SandboxAuthenticationError)


async def test_a_request_that_does_not_parse_fails_the_call_with_a_typed_error(server):
    running, _ = server
    with await greeted(running) as sock:
        refusal = await refusal_after(sock, AUTHORIZATION + f"Bearer {TOKEN}".encode(), b"\xff\xff\xff garbage")
        async with asyncio.timeout(30):
            assert (await receive_next(sock, DATAGRAM_BYTES, 0))[0] == b""  # and the connection is closed
    assert refusal.kind == errors_pb2.ERROR_KIND_INVALID_ARGUMENT


def read_to_end(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as passed:
        return passed.read()


async def test_stdin_is_fed_on_the_channel_while_the_output_goes_through_passed_pipes(server):
    """A megabyte of input, more than a pipe holds (the channel is not read while the command's
    is full), reaches the command in order; its output comes through the read end passed."""
    running, root = server
    data = os.urandom(1 << 20)
    path = os.path.join(os.path.dirname(running.address.removeprefix("unix://")), SOCKET_NAME)
    loop = asyncio.get_running_loop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
        sock.setblocking(False)
        await loop.sock_connect(sock, path)
        async with asyncio.timeout(30):
            greeting, fds, _ = await receive_next(sock, DATAGRAM_BYTES, 1)
        for fd in fds:
            os.close(fd)
        key = greeting.removeprefix(GREETING)
        start = process_pb2.ExecuteRequest(id=1, argv=["/bin/cat"], cwd=str(root), env=ENV, timeout_seconds=60,
                                           max_output_bytes=len(data), stdin=True, pipe_connection=key)
        inputs = [process_pb2.ExecuteRequest(id=1, input=process_pb2.Input(data=data[at:at + MAX_INPUT_BYTES]))
                  for at in range(0, len(data), MAX_INPUT_BYTES)]
        inputs.append(process_pb2.ExecuteRequest(id=1, input=process_pb2.Input(close=True)))

        async def send() -> None:
            for request in [start, *inputs]:
                await loop.sock_sendall(sock, request.SerializeToString())

        sock.send(AUTHORIZATION + f"Bearer {TOKEN}".encode())
        sending = asyncio.ensure_future(send())
        output: asyncio.Future[bytes] | None = None
        async with asyncio.timeout(60):
            while True:
                datagram, fds, _ = await receive_next(sock, DATAGRAM_BYTES, HANDED_FDS)
                if datagram.startswith(HANDOFF_KIND):
                    os.close(fds[1])
                    output = asyncio.ensure_future(asyncio.to_thread(read_to_end, fds[0]))
                    continue
                assert datagram.startswith(EVENT), datagram
                event = process_pb2.ExecuteEvent.FromString(datagram[len(EVENT):])
                if event.WhichOneof("event") == "finished":
                    break
            await sending
            assert output is not None
            assert (await output) == data
        assert (event.finished.exit_code, event.finished.output_passed) == (0, True)


async def test_a_closed_connection_kills_the_command(server, opened):
    running, root = server
    marker = root / "sleeper.pid"
    backend = await connect(running.address, token=TOKEN)
    spec = ProcessSpec(("/bin/sh", "-c", f"sleep 300 & echo $! > {marker}.tmp; mv {marker}.tmp {marker}; wait"),
                       str(root), ENV, 600, 1000)
    call = asyncio.ensure_future(backend.execute(spec, NO_EVENTS))
    try:
        await settle(marker.exists, "the command to start")
        sleeper = int(marker.read_text())
        assert len(opened.channel) == 1 and not opened.grpc
        opened.channel[0].cancel()  # the connection closes; nothing else tells the server
        with pytest.raises(SandboxError):
            await call
        await settle(lambda: not alive(sleeper), "the sleeper to be killed")
    finally:
        await backend.aclose()
        marker.unlink(missing_ok=True)


async def test_a_request_too_large_for_a_datagram_goes_over_grpc(server, opened):
    running, root = server
    halves = ("a" * (DATAGRAM_BYTES // 2 + 1), "b" * (DATAGRAM_BYTES // 2 + 1))
    spec = ProcessSpec(("/bin/sh", "-c", 'echo $((${#1} + ${#2}))', "sh", *halves), str(root), ENV, 60, 1000)
    async with await connect(running.address, token=TOKEN) as backend:
        result = await backend.execute(spec, NO_EVENTS)
        small = await backend.execute(ProcessSpec(("/bin/echo", "small"), str(root), ENV, 60, 1000), NO_EVENTS)
    assert (result.exit_code, result.stdout, small.stdout) == (0, f"{DATAGRAM_BYTES + 2}\n", "small\n")
    assert len(opened.grpc) == 1 and len(opened.channel) == 1


async def test_command_channel_false_runs_commands_over_grpc(server, opened):
    running, root = server
    async with await connect(running.address, token=TOKEN, command_channel=False) as backend:
        result = await backend.execute(ProcessSpec(("/bin/echo", "grpc"), str(root), ENV, 60, 1000), NO_EVENTS)
    assert result.stdout == "grpc\n"
    assert not opened.channel and len(opened.grpc) == 1


async def test_a_server_without_the_channel_is_used_over_grpc(opened, tmp_path):
    """An older server's pipe socket greets with a bare key: no offer of the channel."""
    root = Path(tempfile.mkdtemp(prefix="protolink-command-channel-old-")).resolve()
    root.chmod(0o777)
    async with sandbox_server([(root, True)], uid=unused_uid()) as running:
        path = os.path.join(os.path.dirname(running.address.removeprefix("unix://")), SOCKET_NAME)
        os.unlink(path)  # the server's own listener keeps its socket, no longer reachable by this name
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as old:
            old.bind(path)
            old.listen(4)
            old.setblocking(False)
            greeted: list[socket.socket] = []

            def greet_as_before() -> None:
                connection, _ = old.accept()
                read, write = os.pipe()
                connection.sendmsg([b"k" * KEY_BYTES], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                         read.to_bytes(4, "little"))])
                os.close(read)
                os.close(write)
                greeted.append(connection)

            asyncio.get_running_loop().add_reader(old.fileno(), greet_as_before)
            try:
                await asyncio.sleep(0)  # the server's own backend (sandbox_server's) has made its attempt
                before = len(opened.channel)
                async with await connect(running.address) as backend:
                    results = [await backend.execute(ProcessSpec(("/bin/echo", str(n)), str(root), ENV, 60, 1000),
                                                     NO_EVENTS) for n in range(3)]
            finally:
                asyncio.get_running_loop().remove_reader(old.fileno())
                for connection in greeted:
                    connection.close()
    assert [result.stdout for result in results] == ["0\n", "1\n", "2\n"]
    assert len(opened.channel) == before + 1  # asked once; never again once the server made no offer
    assert len(opened.grpc) >= 1
