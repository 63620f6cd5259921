"""A call the other side ends while requests are still being written ends with the status that
side sent, whichever of that status and grpcio's INTERNAL "Internal error from Core"
(grpc/grpc#36066) grpcio set first: :class:`~protolink.wire.status.CallEnd`'s one rule."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from protolink.errors import TransferLimitError
from protolink.wire.status import CallEnd, Status, abort_with, to_status
from tests.unit.sandbox.threaded_server import threaded_server

CHUNK = bytes(1 << 20)
#: The requests the server takes before it refuses the call.
TAKEN = 2
#: How long the client's loop is held before each write past those: ample for the refusal to arrive.
HELD_SECONDS = 0.05
REFUSAL = TransferLimitError("the upload exceeds 2 MiB")


async def refuse_midway(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
    """Take :data:`TAKEN` requests, then end the call with :data:`REFUSAL`."""
    taken = 0
    async for _ in requests:
        taken += 1
        if taken == TAKEN:
            await abort_with(context, to_status(REFUSAL))
    raise AssertionError("the client stopped writing before the refusal")


class RefusingMidway(grpc.GenericRpcHandler):
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.stream_unary_rpc_method_handler(refuse_midway)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    with threaded_server(RefusingMidway()) as server:
        yield server.address


async def chunks() -> AsyncIterator[bytes]:
    """Large requests, many more than the server takes; past those, each is written after the
    loop was held, so on a stream the server has ended."""
    for sent in range(64):
        if sent >= TAKEN:
            time.sleep(HELD_SECONDS)
        yield CHUNK


async def test_a_refusal_while_requests_are_written_is_the_calls_error(address):
    async with grpc.aio.insecure_channel(address) as channel:
        for _ in range(10):  # grpcio sets the two statuses in either order
            call = channel.stream_unary("/test.Refusing/Upload")(chunks())
            end = CallEnd(call)
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call
            error = end.error(Status.raised_by(raised.value))
            assert isinstance(error, TransferLimitError) and str(error) == str(REFUSAL)
            assert end.of(Status.raised_by(raised.value)).code == grpc.StatusCode.OUT_OF_RANGE
