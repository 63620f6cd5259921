"""The Execute stream's own asyncio client (:mod:`protolink.sandbox.aio_call`): flow control that
holds back a server a slow consumer does not keep up with, every frame of a lying server checked,
pings answered and sent, cancellation a reset stream.

The server here is a hand-made HTTP/2 peer on a Unix socket that keeps to the window the client
grants (as gRPC's does), so that it stalls exactly when the client stops granting.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from protolink.errors import SandboxNotReachedError, SandboxProtocolError, SandboxUnavailableError
from protolink.sandbox import aio_call, grpc_call, hpack_codec
from protolink.sandbox.aio_call import AsyncCall
from protolink.sandbox.grpc_call import DATA, GOAWAY, HEADERS, PING, RST_STREAM, SETTINGS, WINDOW_UPDATE, frame
from protolink.sandbox.process_stream import EXECUTE, Output, ProcessStream, own_calls
from protolink.wire._pb import process_pb2
from protolink.wire.output_events import output_event

#: A bound on waits for what must happen (never a timing claim).
HANG_GUARD = 60
ANSWER_HEADERS = frame(HEADERS, 4, 1, hpack_codec.encode([(b":status", b"200"),
                                                          (b"content-type", b"application/grpc")]))
OK_TRAILERS = frame(HEADERS, 5, 1, hpack_codec.encode([(b"grpc-status", b"0")]))


def message(data: bytes) -> bytes:
    return b"\0" + struct.pack(">I", len(data)) + data


class Peer:
    """One connection's server side: reads the client's frames, sends within the client's window."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.window = 65_535  # what the client lets us send on the stream (and the connection: tracked alike)
        self.connection_window = 65_535
        self.received: list[tuple[int, int, int, bytes]] = []  # (type, flags, stream, payload)
        self.requests: list[bytes] = []
        self.requested = asyncio.Event()
        self.sent = 0  # bytes of DATA sent
        self.granted = asyncio.Event()
        self.stalled = asyncio.Event()  # set while we wait for the client's window
        self.closed = asyncio.Event()

    async def read_frames(self) -> None:
        try:
            assert await self.reader.readexactly(24) == grpc_call.PREFACE
            while True:
                header = await self.reader.readexactly(9)
                length = int.from_bytes(header[:3], "big")
                kind, flags, stream = header[3], header[4], int.from_bytes(header[5:], "big")
                payload = await self.reader.readexactly(length)
                self.received.append((kind, flags, stream, payload))
                if kind == SETTINGS and not flags & 1:
                    for key, value in struct.iter_unpack(">HI", payload):
                        if key == grpc_call.SETTINGS_INITIAL_WINDOW_SIZE:
                            self.window += value - 65_535
                    self.granted.set()
                elif kind == WINDOW_UPDATE:
                    increment = struct.unpack(">I", payload)[0]
                    if stream:
                        self.window += increment
                    else:
                        self.connection_window += increment
                    self.granted.set()
                elif kind == DATA and payload:
                    self.requests.append(payload[5:])
                    self.requested.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def send_data(self, body: bytes, size: int = 1 << 16) -> None:
        """``body`` in DATA frames of ``size``, never past the window the client granted."""
        at = 0
        while at < len(body):
            room = min(self.window, self.connection_window, size, len(body) - at)
            if room <= 0:
                self.stalled.set()
                self.granted.clear()
                await self.granted.wait()
                self.stalled.clear()
                continue
            self.send(frame(DATA, 0, 1, body[at:at + room]))
            self.window -= room
            self.connection_window -= room
            self.sent += room
            at += room
            await self.writer.drain()

    def kinds(self) -> list[int]:
        return [kind for kind, *_ in self.received]


@contextlib.asynccontextmanager
async def peer_server(tmp_path: Path, script: Callable[[Peer], object]) -> AsyncIterator[tuple[str, Peers]]:
    """A server at a Unix socket whose every connection runs ``script(peer)`` (a coroutine)."""
    peers = Peers()
    tasks: list[asyncio.Task[object]] = []

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer)
        peers.append(peer)
        peers.arrived.put_nowait(peer)
        tasks.append(asyncio.ensure_future(peer.read_frames()))
        peer.send(frame(SETTINGS, 0, 0, b""))
        with contextlib.suppress(ConnectionError):
            await script(peer)  # type: ignore[misc]
            await peer.closed.wait()
        writer.close()

    path = tmp_path / "peer.sock"
    server = await asyncio.start_unix_server(connected, str(path))
    try:
        yield f"unix://{path}", peers
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        for peer in peers:
            peer.closed.set()  # its script ends
            peer.writer.close()


class Peers(list[Peer]):
    """The connections made so far; ``arrived`` hands each over as it comes."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: asyncio.Queue[Peer] = asyncio.Queue()


def call(address: str) -> AsyncCall:
    return AsyncCall(address, EXECUTE, [("authorization", "Bearer t")], max_message_bytes=1 << 22)


# Flow control -------------------------------------------------------------------------------


async def test_a_consumer_that_stops_taking_stops_the_server_and_everything_arrives_after(tmp_path):
    events = [output_event(1, 1, bytes([n]) * (1 << 18)) for n in range(64)]  # 16 MiB: four windows
    body = b"".join(message(event) for event in events)

    async def script(peer: Peer) -> None:
        peer.send(ANSWER_HEADERS)
        await peer.send_data(body)
        peer.send(OK_TRAILERS)

    async with peer_server(tmp_path, script) as (address, peers):
        answer = call(address)
        await answer.write(process_pb2.ExecuteRequest(id=1))
        peer = await asyncio.wait_for(peers.arrived.get(), HANG_GUARD)
        taken = [await asyncio.wait_for(anext(answer), HANG_GUARD) for _ in range(3)]
        await asyncio.wait_for(peer.stalled.wait(), HANG_GUARD)  # held back: the client grants no more
        # At most a window beyond what was taken; no stream window given back for what was not.
        assert peer.sent <= aio_call.WINDOW_BYTES + sum(len(message(data)) for data in taken) < len(body)
        assert not [payload for kind, _, stream, payload in peer.received if kind == WINDOW_UPDATE and stream]
        taken += [data async for data in answer]
    assert taken == events
    assert peer.sent == len(body)


def test_messages_too_large_for_half_the_window_are_held_back_too_while_none_is_taken():
    window = 1 << 17
    state = grpc_call.CallState("localhost", EXECUTE, [], max_message_bytes=window, window_bytes=window)
    state.open()
    body = b"".join(message(bytes([n]) * (window // 2 + 1)) for n in range(16))  # each granted as it arrives
    allowed = window  # what a server keeping to the window may send: the window, then what is granted

    def arrive(data: bytes) -> None:
        """``data`` from the server, read into the client's buffer as a socket would hand it over."""
        nonlocal allowed
        while data:
            room = state.buffer()
            count = min(len(room), len(data))
            room[:count] = data[:count]
            state.received(count)
            data = data[count:]
        allowed += sum(increment for stream, increment in window_updates(state.outgoing) if stream == grpc_call.STREAM)
        state.outgoing.clear()

    arrive(ANSWER_HEADERS)
    sent = 0
    while sent < len(body) and (room := min(allowed - sent, 1 << 14)) > 0:
        arrive(frame(DATA, 0, 1, body[sent:sent + room]))
        sent += room
    assert state.failure is None
    assert sent < 3 * window  # held back after a message and the start of the next, none taken
    while sent < len(body):  # taking them lets the rest come
        while state.take() is not None:
            pass
        arrive(b"")  # the grants the takes made
        room = min(allowed - sent, 1 << 14)
        assert room > 0
        arrive(frame(DATA, 0, 1, body[sent:sent + room]))
        sent += room


def window_updates(data: bytes | bytearray) -> Iterator[tuple[int, int]]:
    """The WINDOW_UPDATE frames among the frames ``data`` holds: (stream, increment)."""
    at = 0
    while at < len(data):
        length = int.from_bytes(data[at:at + 3], "big")
        if data[at + 3] == WINDOW_UPDATE:
            yield int.from_bytes(data[at + 5:at + 9], "big"), int.from_bytes(data[at + 9:at + 13], "big")
        at += 9 + length


# A server that breaks the protocol ---------------------------------------------------------


@pytest.mark.parametrize(("answer", "problem"), [
    (b"\x20\x00\x00\x00\x00\x00\x00\x00\x01", "frame of 2097152 bytes"),
    (frame(5, 4, 1, b"\x00\x00\x00\x02"), "unexpected type 5"),
    (frame(HEADERS, 4, 1, b"\xff\x00"), "do not decode"),
    (frame(HEADERS, 4, 3, hpack_codec.encode([(b":status", b"200")])), "headers outside its answer"),
    (ANSWER_HEADERS + frame(DATA, 0, 1, b"\0" + struct.pack(">I", 1 << 30)), "message of 1073741824 bytes"),
    (ANSWER_HEADERS + frame(DATA, 0, 3, message(b"")), "outside its answer"),
    (ANSWER_HEADERS + frame(WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"), "invalid window size"),
    (frame(PING, 0, 0, b"short"), "malformed PING"),
    (ANSWER_HEADERS + frame(RST_STREAM, 0, 1, struct.pack(">I", 2)), "INTERNAL_ERROR"),
], ids=["oversized-frame", "push", "bad-hpack", "other-stream", "oversized-message", "data-other-stream",
        "window-overflow", "bad-ping", "reset"])
async def test_a_frame_that_breaks_the_protocol_fails_the_call_and_closes_it(tmp_path, answer, problem):
    async def script(peer: Peer) -> None:
        peer.send(answer)

    async with peer_server(tmp_path, script) as (address, peers):
        answer_call = call(address)
        await answer_call.write(process_pb2.ExecuteRequest(id=1))
        with pytest.raises(SandboxProtocolError, match=problem):
            await asyncio.wait_for(anext(answer_call), HANG_GUARD)
        peer = await asyncio.wait_for(peers.arrived.get(), HANG_GUARD)
        await asyncio.wait_for(peer.closed.wait(), HANG_GUARD)
        assert answer_call.done()


async def test_data_past_the_granted_window_is_refused(tmp_path):
    async def script(peer: Peer) -> None:
        peer.send(ANSWER_HEADERS)
        piece = frame(DATA, 0, 1, b"\0" * grpc_call.MAX_FRAME_BYTES)  # empty messages, none taken
        for _ in range(aio_call.WINDOW_BYTES // grpc_call.MAX_FRAME_BYTES + 1):
            peer.send(piece)

    async with peer_server(tmp_path, script) as (address, peers):
        answer = call(address)
        await answer.write(process_pb2.ExecuteRequest(id=1))
        peer = await asyncio.wait_for(peers.arrived.get(), HANG_GUARD)
        await asyncio.wait_for(peer.closed.wait(), HANG_GUARD)  # the client hung up at the excess
        with pytest.raises(SandboxProtocolError, match="FLOW_CONTROL"):
            async for _ in answer:
                pass


@pytest.mark.parametrize("answer", [b"", ANSWER_HEADERS,
                                    ANSWER_HEADERS + frame(GOAWAY, 0, 0, struct.pack(">II", 0, 2)),
                                    ANSWER_HEADERS + frame(RST_STREAM, 0, 1, struct.pack(">I", 8))],
                         ids=["closed", "closed-mid-answer", "goaway", "reset"])
async def test_a_connection_that_ends_or_is_reset_is_unavailable(tmp_path, answer):
    async def script(peer: Peer) -> None:
        peer.send(answer)
        await peer.writer.drain()
        peer.writer.close()

    async with peer_server(tmp_path, script) as (address, _):
        answer_call = call(address)
        await answer_call.write(process_pb2.ExecuteRequest(id=1))
        with pytest.raises(SandboxUnavailableError):
            await asyncio.wait_for(anext(answer_call), HANG_GUARD)


async def test_an_error_status_is_typed_as_the_grpcio_client_types_it(tmp_path):
    async def script(peer: Peer) -> None:
        peer.send(frame(HEADERS, 5, 1, hpack_codec.encode([
            (b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"14"),
            (b"grpc-message", b"failed to connect to all addresses; last error: none")])))

    async with peer_server(tmp_path, script) as (address, _):
        answer = call(address)
        await answer.write(process_pb2.ExecuteRequest(id=1))
        with pytest.raises(SandboxNotReachedError):  # as from_rpc_error maps it: a call to make once more
            await asyncio.wait_for(anext(answer), HANG_GUARD)


# Pings and cancellation ---------------------------------------------------------------------


async def test_pings_are_answered_and_a_server_that_answers_none_is_given_up(tmp_path):
    async def script(peer: Peer) -> None:
        peer.send(ANSWER_HEADERS + frame(PING, 0, 0, b"12345678"))

    async with peer_server(tmp_path, script) as (address, peers):
        answer = call(address)
        await answer.write(process_pb2.ExecuteRequest(id=1))
        with pytest.raises(SandboxUnavailableError, match="did not answer a ping"):
            await asyncio.wait_for(anext(answer), HANG_GUARD)
        peer = await asyncio.wait_for(peers.arrived.get(), HANG_GUARD)
        await asyncio.wait_for(peer.closed.wait(), HANG_GUARD)
    assert (PING, 1, 0, b"12345678") in peer.received  # its ping, answered
    assert any(kind == PING and not flags & 1 for kind, flags, _, _ in peer.received)  # ours, sent


async def test_cancelling_resets_the_stream_and_closes_the_connection(tmp_path):
    async def script(peer: Peer) -> None:
        peer.send(ANSWER_HEADERS)

    async with peer_server(tmp_path, script) as (address, peers):
        answer = call(address)
        await answer.write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
        peer = await asyncio.wait_for(peers.arrived.get(), HANG_GUARD)
        await asyncio.wait_for(peer.requested.wait(), HANG_GUARD)
        assert answer.cancel()
        await asyncio.wait_for(peer.closed.wait(), HANG_GUARD)
        assert (RST_STREAM, 0, 1, struct.pack(">I", grpc_call.CANCEL)) in peer.received
        assert not answer.cancel()
        with pytest.raises(SandboxUnavailableError, match="cancelled"):
            await answer.write(process_pb2.ExecuteRequest(id=2))
        with pytest.raises(SandboxUnavailableError, match="cancelled"):
            await anext(answer)


async def test_a_process_fails_with_its_call_and_the_next_one_opens_a_new_call(tmp_path):
    """Through ProcessStream: a broken call fails the process on it, not one on the next call."""
    finished = process_pb2.ExecuteEvent(id=2, finished=process_pb2.Finished(exit_code=0)).SerializeToString()

    async def script(peer: Peer) -> None:
        await peer.requested.wait()
        request = process_pb2.ExecuteRequest.FromString(peer.requests[0])
        peer.send(ANSWER_HEADERS)
        if request.id == 1:
            peer.send(frame(DATA, 0, 1, b"\1" + struct.pack(">I", 1) + b"x"))  # compressed: refused
        else:
            peer.send(frame(DATA, 0, 1, message(finished)))

    class Quiet:
        async def emit(self, type: str, **data: object) -> None:
            pass

    async with peer_server(tmp_path, script) as (address, peers):
        stream = ProcessStream(own_calls(address, (), max_message_bytes=1 << 20), max_in_flight=4)
        with pytest.raises(SandboxProtocolError, match="compressed"):
            await stream.run(process_pb2.ExecuteRequest(argv=["/bin/true"]), Output(100, Quiet()), HANG_GUARD)
        facts = await stream.run(process_pb2.ExecuteRequest(argv=["/bin/true"]), Output(100, Quiet()), HANG_GUARD)
        assert facts["exit_code"] == 0
        assert len(peers) == 2
        await stream.aclose()
