"""The service's hop on a sandbox's command channel joins the output events that have arrived
into events as large as a sandbox's own gRPC events, in order, and loses nothing before a
failure."""

from __future__ import annotations

from collections import deque

import pytest

from protolink.errors import SandboxProtocolError
from protolink.execution.output_pipes import PIECE_BYTES
from protolink.sandbox.service.channel_hop import _joined
from protolink.wire._pb import process_pb2
from protolink.wire.output_events import output_event, read_output_event

STDOUT, STDERR = 1, 2
FINISHED = process_pb2.ExecuteEvent(id=1, finished=process_pb2.Finished(exit_code=0)).SerializeToString()


class Arrivals:
    """A channel call whose datagrams come in bursts: those of a burst have all arrived when
    the first of it is taken; the next burst comes only when the reader waits."""

    def __init__(self, *bursts: list[bytes | Exception]) -> None:
        self._bursts = deque(deque(burst) for burst in bursts)

    def arrived(self) -> bytes | None:
        if not self._bursts or not self._bursts[0]:
            return None
        return self._take()

    async def __anext__(self) -> bytes:
        while self._bursts and not self._bursts[0]:
            self._bursts.popleft()
        if not self._bursts:
            raise StopAsyncIteration
        return self._take()

    def _take(self) -> bytes:
        item = self._bursts[0].popleft()
        if isinstance(item, Exception):
            raise item
        return item


async def joined(call: Arrivals) -> list[bytes]:
    return [item async for item in _joined(call)]


def outputs(items: list[bytes]) -> list[tuple[int, int, bytes] | bytes]:
    """Each item as (id, channel, data) when it is output, else as it is."""
    read = [read_output_event(item) for item in items]
    return [(event.id, event.channel, bytes(event.data)) if event else item for event, item in zip(read, items)]


async def test_output_that_has_arrived_is_joined_per_stream_in_order():
    burst = [output_event(1, STDOUT, b"a" * 100_000), output_event(1, STDOUT, b"b" * 100_000),
             output_event(1, STDERR, b"!"), output_event(1, STDOUT, b"c"), output_event(2, STDOUT, b"d"), FINISHED]
    assert outputs(await joined(Arrivals(burst))) == [
        (1, STDOUT, b"a" * 100_000 + b"b" * 100_000), (1, STDERR, b"!"), (1, STDOUT, b"c"), (2, STDOUT, b"d"), FINISHED]


async def test_output_not_arrived_yet_is_not_waited_for():
    call = Arrivals([output_event(1, STDOUT, b"first")], [output_event(1, STDOUT, b"later")])
    assert outputs(await joined(call)) == [(1, STDOUT, b"first"), (1, STDOUT, b"later")]


async def test_a_joined_event_holds_at_most_a_piece():
    piece = b"p" * (PIECE_BYTES // 3)
    burst = [output_event(1, STDOUT, piece) for _ in range(7)]
    sizes = [len(data) for _, _, data in outputs(await joined(Arrivals(burst)))]
    assert sizes == [3 * len(piece), 3 * len(piece), len(piece)] and max(sizes) <= PIECE_BYTES


async def test_output_before_a_failure_goes_on_before_it():
    failure = SandboxProtocolError("the sandbox sent a datagram of unknown kind")
    call = Arrivals([output_event(1, STDOUT, b"kept"), output_event(1, STDOUT, b" too"), failure])
    seen = []
    with pytest.raises(SandboxProtocolError):
        async for item in _joined(call):
            seen.append(item)
    assert outputs(seen) == [(1, STDOUT, b"kept too")]
