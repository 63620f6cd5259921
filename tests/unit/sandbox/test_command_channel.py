"""The host's side of the command channel (:mod:`protolink.sandbox.pipe_connection`) against a
played server: a burst of requests waits for room instead of breaking the call, a server that
stops answering pings fails the call with a typed error, one that does not greet with this
protocol is not asked again, and one that refuses a connection at its limit (saying so, or
after it greeted one) leaves that call alone to gRPC; an idle call stays open for the next command longer than a gRPC call,
and one closed as its server closes it leaves no watch on its descriptor for the next connection."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protolink.errors import SandboxUnavailableError
from protolink.net.descriptors import receive_next
from protolink.sandbox import pipe_connection, process_stream
from protolink.sandbox.pipe_connection import ChannelCall, ChannelCalls
from protolink.sandbox.process_stream import ProcessStream
from protolink.wire._pb import process_pb2
from protolink.wire.pipe_passing import (
    AT_LIMIT,
    AUTHORIZATION,
    DATAGRAM_BYTES,
    EVENT,
    GREETING,
    KEY_BYTES,
    PING,
    PONG,
    SOCKET_NAME,
)

from .test_passed_pipes import _rights, a_pipe_read_end


class PlayedServer:
    """A listening command channel that greets each connection (``greeting``, a pipe's read end
    attached) and then does only what a test tells it to."""

    def __init__(self, directory: Path, greeting: bytes = GREETING + b"k" * KEY_BYTES, *,
                 greets: int | None = None, at_limit: bool = False) -> None:
        self.path = str(directory / SOCKET_NAME)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self._greeting = greeting
        self.greets = greets  # how many more connections it greets (None: every one); later ones it closes
        self.at_limit = at_limit  # whether it says so when it closes one (as the server does)
        self.connections: list[socket.socket] = []
        self.listener.setblocking(False)
        asyncio.get_running_loop().add_reader(self.listener.fileno(), self._accept)

    def _accept(self) -> None:
        connection, _ = self.listener.accept()
        if self.greets is not None:
            if self.greets == 0:
                if self.at_limit:
                    connection.send(AT_LIMIT)
                connection.close()  # at its limit of connections (or unable to send the proof)
                return
            self.greets -= 1
        fds = a_pipe_read_end()
        connection.sendmsg([self._greeting], _rights(fds))
        os.close(fds[0])
        connection.setblocking(False)
        self.connections.append(connection)

    async def datagrams(self, count: int) -> list[bytes]:
        """The next ``count`` datagrams of the first connection."""
        async with asyncio.timeout(30):
            while not self.connections:
                await asyncio.sleep(0.01)
            return [(await receive_next(self.connections[0], DATAGRAM_BYTES, 0))[0] for _ in range(count)]

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.listener.fileno())
        self.listener.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture
async def server(tmp_path: Path) -> Iterator[PlayedServer]:
    played = PlayedServer(tmp_path)
    yield played
    played.close()


async def test_a_burst_larger_than_the_send_buffer_waits_for_room_and_arrives_whole(server):
    call = ChannelCall(server.path, AUTHORIZATION, None, lambda _: None)
    requests = [process_pb2.ExecuteRequest(id=n, argv=["/bin/true", "x" * 8192]) for n in range(1, 101)]
    try:
        async def send_in_order() -> None:  # one write at a time, as the process stream writes
            for request in requests:
                await call.write(request)

        sending = asyncio.ensure_future(send_in_order())
        await asyncio.sleep(0.2)  # far more than the send buffer holds: some wait for the server
        assert not sending.done() and not call.done()
        received = await server.datagrams(1 + len(requests))
        await sending
        assert received[0] == AUTHORIZATION
        assert [process_pb2.ExecuteRequest.FromString(data).id for data in received[1:]] == list(range(1, 101))
        assert not call.done()
    finally:
        call.cancel()


async def test_a_server_that_stops_answering_pings_fails_the_call(server, monkeypatch):
    monkeypatch.setattr(pipe_connection, "PING_SECONDS", 0.05)
    monkeypatch.setattr(pipe_connection, "PING_TIMEOUT_SECONDS", 0.15)
    call = ChannelCall(server.path, AUTHORIZATION, None, lambda _: None)
    try:
        await call.write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
        with pytest.raises(SandboxUnavailableError, match="did not answer a ping"):
            async with asyncio.timeout(30):
                await anext(call)
        assert PING in await server.datagrams(4)  # it was pinged, and never answered
    finally:
        call.cancel()


@pytest.mark.parametrize("greeting", [b"k" * KEY_BYTES, b"protolink-commands/2:" + b"k" * KEY_BYTES],
                         ids=["an older server's bare key", "another version"])
async def test_a_server_that_does_not_greet_with_this_protocol_is_not_asked_again(tmp_path, greeting):
    played = PlayedServer(tmp_path, greeting)
    fallback_calls: list[str] = []
    calls = ChannelCalls(played.path, (), lambda: fallback_calls.append("grpc") or "grpc", pipes_above=None)
    try:
        first = calls()
        with pytest.raises(pipe_connection.Unsent):
            await first.write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
        assert not calls.offered
        assert calls() == "grpc" and calls() == "grpc"
        assert len(played.connections) == 1
    finally:
        played.close()


async def test_a_server_that_never_greets_is_not_asked_again(tmp_path):
    """A server that closes every connection ungreeted (its kernel cannot pass the proof: gVisor's)."""
    played = PlayedServer(tmp_path, greets=0)
    calls = ChannelCalls(played.path, (), lambda: "grpc", pipes_above=None)
    try:
        with pytest.raises(pipe_connection.Unsent):
            await calls().write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
        assert not calls.offered
        assert calls() == "grpc" and calls() == "grpc"
    finally:
        played.close()


async def refused_once(calls: ChannelCalls, played: PlayedServer) -> None:
    """A call the server refuses at its limit goes alone to gRPC; once it has room, the channel
    serves the next."""
    with pytest.raises(pipe_connection.Unsent):
        await calls().write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
    assert calls.offered
    assert calls() == "grpc"  # the call the refused request goes on
    played.greets = None  # room again
    again = calls()
    assert isinstance(again, ChannelCall)
    await again.write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
    again.cancel()


async def test_a_connection_closed_at_the_servers_limit_falls_back_for_that_call_only(tmp_path):
    """A server that greeted a connection of this backend and closes the next ungreeted (an
    older server at its limit said nothing)."""
    played = PlayedServer(tmp_path, greets=1)
    calls = ChannelCalls(played.path, (), lambda: "grpc", pipes_above=None)
    first = calls()
    try:
        await first.write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))  # greeted: the channel is offered
        await refused_once(calls, played)
    finally:
        first.cancel()
        played.close()


async def test_a_first_connection_the_server_says_is_over_its_limit_falls_back_for_that_call_only(tmp_path):
    """Before any connection of this backend was greeted, only the server's word tells a server
    at its limit from one that cannot pass the proof (which closes without a word)."""
    played = PlayedServer(tmp_path, greets=0, at_limit=True)
    try:
        await refused_once(ChannelCalls(played.path, (), lambda: "grpc", pipes_above=None), played)
    finally:
        played.close()


async def test_a_full_queue_of_connections_falls_back_for_that_call_only(tmp_path, monkeypatch):
    """The server does not accept (its loop is busy) and its socket's queue is full: the kernel
    refuses at once (the greeting's time limit, pushed far away, is not what ends the wait)."""
    monkeypatch.setattr(pipe_connection, "GREETING_SECONDS", 3600)
    path = str(tmp_path / SOCKET_NAME)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as listener:
        listener.bind(path)
        listener.listen(0)
        queued = []
        try:
            for _ in range(4):  # fill the queue
                waiting = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                waiting.setblocking(False)
                queued.append(waiting)
                waiting.connect(path)
        except BlockingIOError:
            pass
        calls = ChannelCalls(path, (), lambda: "grpc", pipes_above=None)
        try:
            with pytest.raises(pipe_connection.Unsent):
                async with asyncio.timeout(60):  # a hang guard
                    await calls().write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
            assert calls.offered
            assert calls() == "grpc"
            assert isinstance(pending := calls(), ChannelCall)
            pending.cancel()
        finally:
            for waiting in queued:
                waiting.close()


async def test_an_idle_call_on_the_channel_outlasts_a_grpc_calls_idle_time_then_closes(server, monkeypatch):
    """An agent's commands come seconds apart: the channel's connection waits for the next one
    (no new connection and greeting for each), for ChannelCall.idle_seconds, not gRPC's second."""
    monkeypatch.setattr(process_stream, "IDLE_CALL_SECONDS", 0.01)
    monkeypatch.setattr(ChannelCall, "idle_seconds", 3.0)
    stream = ProcessStream(ChannelCalls(server.path, (), lambda: "grpc", pipes_above=None))
    try:
        stream.open()
        assert await server.datagrams(2) == [AUTHORIZATION, process_stream.OPENING.SerializeToString()]
        await asyncio.sleep(0.1)  # ten times gRPC's idle time
        with pytest.raises(BlockingIOError):  # open, nothing sent: not closed
            server.connections[0].recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        while (datagram := (await server.datagrams(1))[0]) == PING:
            pass  # pinged while open
        assert datagram == b""  # closed once idle for idle_seconds
    finally:
        await stream.aclose()


async def test_an_idle_call_closed_as_its_server_closes_leaves_no_watch_for_the_next(server, monkeypatch):
    """The host's loop was held up (a blocking step of the caller's) while the server closed an
    idle call's connection: when the loop runs again, the connection's end and the idle time's
    end come in the same turn. The call is closed without leaving its descriptor watched, so the
    next connection, which may get that descriptor's number, is greeted and read."""
    monkeypatch.setattr(ChannelCall, "idle_seconds", 0.2)
    stream = ProcessStream(ChannelCalls(server.path, (), lambda: "grpc", pipes_above=None))
    try:
        stream.open()
        await server.datagrams(2)  # the authorization and the opening request
        first = stream._call._sock.fileno()
        server.connections.pop(0).close()
        time.sleep(0.3)  # the loop is held up past the idle time; the close waits to be read
        await asyncio.sleep(0.05)
        assert stream._call is None
        loop = asyncio.get_running_loop()
        assert not loop.remove_reader(first), "the closed call's descriptor is still watched"
        after = ChannelCall(server.path, AUTHORIZATION, None, lambda _: None)
        try:
            async with asyncio.timeout(pipe_connection.GREETING_SECONDS / 2):
                assert await asyncio.shield(after._greeted)
            server.connections[0].send(EVENT + b"answer")
            async with asyncio.timeout(5):
                assert await anext(after) == b"answer"
        finally:
            after.cancel()
    finally:
        await stream.aclose()



async def test_arrived_takes_what_has_come_without_waiting_and_skips_pongs(server):
    call = ChannelCall(server.path, AUTHORIZATION, None, lambda _: None)
    try:
        assert call.arrived() is None  # not greeted yet
        await call.write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
        await server.datagrams(2)  # the authorization and the request: it is greeted
        assert call.arrived() is None  # nothing has come: None at once
        for datagram in (PONG, EVENT + b"first", PONG, EVENT + b"second"):
            server.connections[0].send(datagram)
        assert await anext(call) == b"first"
        assert call.arrived() == b"second"
        assert call.arrived() is None
        server.connections[0].close()
        with pytest.raises(SandboxUnavailableError, match="closed its command channel"):
            async with asyncio.timeout(30):
                while call.arrived() is None:  # the end, once it has come, raises as iterating does
                    await asyncio.sleep(0.01)
        assert call.done()
    finally:
        call.cancel()
