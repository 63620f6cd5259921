"""Output pipes passed by the server on its command channel (:mod:`protolink.sandbox.pipe_connection`),
received by the client's process stream: read with the host backend's reader within every bound, and everything
a hostile server passes that is not a pipe's read end, or not asked for, closed and refused.

The server is played here: a real command channel (SOCK_SEQPACKET, in a temporary directory) that
answers each request with the events a test gives (and a scripted gRPC call where it offers none).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from protolink.errors import SandboxProtocolError
from protolink.execution.output import OutputCollector
from protolink.execution.process_types import NO_EVENTS
from protolink.sandbox.pipe_connection import ChannelCalls
from protolink.sandbox.process_stream import OPENING, PIPES_ABOVE_BYTES, Output, ProcessStream
from protolink.wire._pb import process_pb2
from protolink.wire.pipe_passing import (
    DATAGRAM_BYTES,
    EVENT,
    GREETING,
    HANDOFF,
    HANDOFF_KIND,
    KEY_BYTES,
    PING,
    SOCKET_NAME,
)

KEY = b"k" * KEY_BYTES
#: What a fresh pipe takes without a reader.
PIPE_BUF_BYTES = 4096
#: Generous: a test that ends waits far less, and one that hangs fails here instead.
DEADLINE_SECONDS = 60.0

Answer = Callable[[process_pb2.ExecuteRequest, "ChannelServer"], Awaitable[list[process_pb2.ExecuteEvent]]]


class ChannelServer:
    """The server's command channel (SOCK_SEQPACKET): greets each connection (with
    ``greeting_fds`` attached), takes its authorization, answers each process request with the
    events ``answer`` gives, and hands off pipes when a test says so."""

    def __init__(self, directory: Path, answer: Answer, greeting_fds: Callable[[], list[int]]) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(directory / SOCKET_NAME))
        self.listener.listen(4)
        self.listener.setblocking(False)
        self._answer = answer
        self._greeting_fds = greeting_fds
        self.connection: socket.socket | None = None
        self.requests: list[process_pb2.ExecuteRequest] = []
        self._serving: set[asyncio.Task[None]] = set()
        asyncio.get_running_loop().add_reader(self.listener.fileno(), self._accept)

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        fds = self._greeting_fds()
        connection.sendmsg([GREETING, KEY], _rights(fds))
        for fd in fds:
            os.close(fd)
        connection.setblocking(False)
        self.connection = connection
        task = asyncio.ensure_future(self._serve(connection))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    async def _serve(self, connection: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            await loop.sock_recv(connection, DATAGRAM_BYTES)  # the authorization
            while data := await loop.sock_recv(connection, DATAGRAM_BYTES):
                if data == PING:
                    continue
                for event in await answered(process_pb2.ExecuteRequest.FromString(data), self, self._answer):
                    connection.send(EVENT + event.SerializeToString())

    def hand_off(self, request_id: int, fds: list[int], data: bytes | None = None) -> None:
        """Send ``fds`` for ``request_id`` (or ``data`` in place of the hand-off), then close them here."""
        assert self.connection is not None
        self.connection.sendmsg([HANDOFF.pack(HANDOFF_KIND, request_id) if data is None else data], _rights(fds))
        for fd in fds:
            os.close(fd)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.listener.fileno())
        self.listener.close()
        for task in self._serving:
            task.cancel()
        if self.connection is not None:
            self.connection.close()


async def answered(request: process_pb2.ExecuteRequest, server: ChannelServer,
                   answer: Answer) -> list[process_pb2.ExecuteEvent]:
    """The events ``answer`` gives a process request (none for the opening or a cancel), its id set."""
    if request == OPENING or request.cancel:
        return []
    server.requests.append(request)
    events = await answer(request, server)
    for event in events:
        event.id = request.id
    return events


class ScriptedCall:
    """The Execute call on gRPC, where no command channel is offered: answers as the channel would."""

    def __init__(self, answer: Answer, server: ChannelServer) -> None:
        self._answer = answer
        self._server = server
        self._requests: asyncio.Queue[process_pb2.ExecuteRequest | None] = asyncio.Queue()
        self._done = False

    async def write(self, request: process_pb2.ExecuteRequest) -> None:
        await self._requests.put(request)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (request := await self._requests.get()) is not None:
            for event in await answered(request, self._server, self._answer):
                yield event.SerializeToString()

    def done(self) -> bool:
        return self._done

    def cancel(self) -> bool:
        self._done = True
        self._requests.put_nowait(None)
        return True


def _rights(fds: list[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []


def a_pipe_read_end() -> list[int]:
    read, write = os.pipe()
    os.close(write)
    return [read]


def finished(*, passed: bool, exit_code: int = 0) -> process_pb2.ExecuteEvent:
    return process_pb2.ExecuteEvent(finished=process_pb2.Finished(exit_code=exit_code, output_passed=passed))


async def run(tmp_path: Path, answer: Answer, *, max_output_bytes: int = PIPES_ABOVE_BYTES + 1,
              greeting_fds: Callable[[], list[int]] = a_pipe_read_end,
              ) -> tuple[dict[str, Any], Output, list[process_pb2.ExecuteRequest]]:
    """Run one process against the played server: its facts, its output and the process requests."""
    server = ChannelServer(tmp_path, answer, greeting_fds)
    calls = ChannelCalls(str(tmp_path / SOCKET_NAME), (), lambda: ScriptedCall(answer, server),
                         pipes_above=PIPES_ABOVE_BYTES)
    stream = ProcessStream(calls, max_in_flight=4)
    stream.open()
    output = Output(max_output_bytes, NO_EVENTS)
    try:
        request = process_pb2.ExecuteRequest(argv=["/bin/true"], max_output_bytes=max_output_bytes)
        facts = await stream.run(request, output, DEADLINE_SECONDS)
    finally:
        await stream.aclose()
        server.close()
    return facts, output, server.requests


def open_to(inode: int) -> bool:
    """Whether this process holds a descriptor of the pipe or file ``inode``."""
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{name}").st_ino == inode:
                return True
        except OSError:
            pass
    return False


def pipes_with(stdout: bytes, stderr: bytes, *, keep_writers: list[int] | None = None) -> list[int]:
    """The read ends of two pipes that get ``stdout`` and ``stderr`` and then their end (a thread
    writes what does not fit a pipe at once); or, with ``keep_writers``, the write ends kept there."""
    ends = []
    for data in (stdout, stderr):
        read, write = os.pipe()
        ends.append(read)
        if keep_writers is not None:
            os.write(write, data)
            keep_writers.append(write)
        elif len(data) > PIPE_BUF_BYTES:
            threading.Thread(target=_write_and_close, args=(write, data), daemon=True).start()
        else:
            _write_and_close(write, data)
    return ends


def _write_and_close(fd: int, data: bytes) -> None:
    with open(fd, "wb") as pipe:
        pipe.write(data)


async def test_passed_pipes_are_read_within_the_cap_and_decoded_as_the_host_backend_decodes(tmp_path):
    stdout, stderr = "é".encode() * PIPES_ABOVE_BYTES, b""

    async def answer(request: process_pb2.ExecuteRequest, server: ChannelServer) -> list[process_pb2.ExecuteEvent]:
        fds = pipes_with(stdout, stderr)
        server.hand_off(request.id, fds)
        return [finished(passed=True, exit_code=3)]

    facts, output, requests = await run(tmp_path, answer, max_output_bytes=PIPES_ABOVE_BYTES + 1)
    assert requests[0].pipe_connection == KEY
    expected = OutputCollector(NO_EVENTS)
    await expected.feed("stdout", stdout[:PIPES_ABOVE_BYTES + 1])
    await expected.finish()
    assert (facts["exit_code"], output.collector.stdout, output.collector.stderr) == (3, expected.stdout, "")
    assert output.cap.truncated


async def test_a_pipe_whose_writer_never_closes_is_read_until_the_drain_grace_after_finished(tmp_path):
    writers: list[int] = []

    async def answer(request: process_pb2.ExecuteRequest, server: ChannelServer) -> list[process_pb2.ExecuteEvent]:
        fds = pipes_with(b"before the end\n", b"", keep_writers=writers)
        server.hand_off(request.id, fds)
        return [finished(passed=True)]

    try:
        facts, output, _ = await run(tmp_path, answer)
    finally:
        for fd in writers:
            os.close(fd)
    assert (facts["exit_code"], output.collector.stdout) == (0, "before the end\n")


@pytest.mark.parametrize("passed", ["a regular file", "a write end", "three pipes", "none", "a long message"])
async def test_what_is_not_two_pipe_read_ends_is_closed_and_the_process_fails(tmp_path, passed):
    kept: list[int] = []
    inodes: list[int] = []

    async def answer(request: process_pb2.ExecuteRequest, server: ChannelServer) -> list[process_pb2.ExecuteEvent]:
        fds, data = pipes_with(b"", b""), None
        if passed == "a regular file":
            fds[0] = os.open(tmp_path / "file", os.O_RDONLY | os.O_CREAT)
        elif passed == "a write end":
            read, write = os.pipe()
            fds[1], _ = write, kept.append(read)
        elif passed == "three pipes":
            fds += pipes_with(b"", b"")[:1]
        elif passed == "none":
            fds = []
        else:
            data = HANDOFF.pack(HANDOFF_KIND, request.id) + b"x"
        inodes.extend(os.fstat(fd).st_ino for fd in fds)
        server.hand_off(request.id, fds, data)
        return [finished(passed=True)]

    try:
        with pytest.raises(SandboxProtocolError, match="something other than a process's two pipes|too long"):
            await run(tmp_path, answer)
    finally:
        for fd in kept:
            os.close(fd)
    assert not any(open_to(inode) for inode in inodes)


async def test_pipes_passed_twice_fail_the_process_and_are_closed(tmp_path):
    inodes: list[int] = []

    async def answer(request: process_pb2.ExecuteRequest, server: ChannelServer) -> list[process_pb2.ExecuteEvent]:
        for _ in range(2):
            fds = pipes_with(b"x", b"")
            inodes.extend(os.fstat(fd).st_ino for fd in fds)
            server.hand_off(request.id, fds)
        return [finished(passed=True)]

    with pytest.raises(SandboxProtocolError, match="not asked for"):
        await run(tmp_path, answer)
    assert not any(open_to(inode) for inode in inodes)


async def test_pipes_passed_and_then_denied_fail_the_process(tmp_path):
    async def answer(request: process_pb2.ExecuteRequest, server: ChannelServer) -> list[process_pb2.ExecuteEvent]:
        fds = pipes_with(b"x", b"")
        server.hand_off(request.id, fds)
        return [finished(passed=False)]

    with pytest.raises(SandboxProtocolError, match="said it had not"):
        await run(tmp_path, answer)


async def test_output_events_for_a_process_whose_pipes_were_passed_fail_it(tmp_path):
    async def answer(request: process_pb2.ExecuteRequest, server: ChannelServer) -> list[process_pb2.ExecuteEvent]:
        server.hand_off(request.id, pipes_with(b"", b""))
        return [process_pb2.ExecuteEvent(output=process_pb2.Output(channel=process_pb2.CHANNEL_STDOUT, data=b"x")),
                finished(passed=True)]

    with pytest.raises(SandboxProtocolError, match="output events"):
        await run(tmp_path, answer)


def a_regular_file() -> list[int]:
    fd, path = tempfile.mkstemp()
    os.unlink(path)
    return [fd]


@pytest.mark.parametrize(("max_output_bytes", "greeting_fds"), [
    (PIPES_ABOVE_BYTES, a_pipe_read_end),  # little output: not worth a hand-off
    (PIPES_ABOVE_BYTES + 1, list),  # a greeting without the proof
    (PIPES_ABOVE_BYTES + 1, a_regular_file),
], ids=["little output", "no descriptor in the greeting", "a regular file in the greeting"])
async def test_the_output_stays_on_the_stream_without_a_reason_and_a_proof_for_pipes(tmp_path, max_output_bytes,
                                                                                    greeting_fds):
    async def answer(request: process_pb2.ExecuteRequest, server: ChannelServer) -> list[process_pb2.ExecuteEvent]:
        return [process_pb2.ExecuteEvent(output=process_pb2.Output(channel=process_pb2.CHANNEL_STDOUT, data=b"hi\n")),
                finished(passed=False)]

    _, output, requests = await run(tmp_path, answer, max_output_bytes=max_output_bytes, greeting_fds=greeting_fds)
    assert not requests[0].pipe_connection
    assert output.collector.stdout == "hi\n"
