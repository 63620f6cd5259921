"""A refusal that ends the Execute call while the client still writes reaches the process as the
refusal, not as grpcio's INTERNAL "Internal error from Core" (grpc/grpc#36066), on a sandbox
reached through grpcio (a service's).

The refusing server runs on a loop of its own, in a thread (:mod:`.threaded_server`), so that
the client's loop can be held while the refusal arrives: the client's next write is then sent
on a stream its gRPC core has already closed, the case that replaced the status.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from protolink.errors import SandboxNotFoundError
from protolink.execution.process_types import NO_EVENTS
from protolink.sandbox.pipe_connection import Unsent
from protolink.sandbox.process_stream import GrpcCall, Output, ProcessStream, grpc_calls
from protolink.wire._pb import process_pb2
from protolink.wire.status import ERROR_METADATA_KEY, WRITE_FAILED_DETAILS, abort_with, to_status

from .threaded_server import threaded_server

#: How long the client's loop is held: ample for a loopback refusal to arrive.
HELD_SECONDS = 0.3
REFUSAL = SandboxNotFoundError("no sandbox 'f00d'")


async def refuse(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> None:
    """Read the first request, then end the call with :data:`REFUSAL`, as the service does."""
    await anext(aiter(requests))
    await abort_with(context, to_status(REFUSAL))


class Refusing(grpc.GenericRpcHandler):
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return grpc.stream_stream_rpc_method_handler(refuse)


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    """A server that refuses every call, on its own loop in a thread."""
    with threaded_server(Refusing()) as server:
        yield server.address


async def test_a_process_on_a_refused_stream_gets_the_refusal(address):
    async with grpc.aio.insecure_channel(address) as channel:
        for _ in range(5):
            stream = ProcessStream(grpc_calls(channel, ()), max_in_flight=4)
            stream.open()  # the opening request goes out; the server refuses on it
            await asyncio.sleep(0)
            time.sleep(HELD_SECONDS)  # the refusal arrives while this loop cannot take it
            request = process_pb2.ExecuteRequest(argv=["/bin/true"])
            with pytest.raises(SandboxNotFoundError, match="no sandbox 'f00d'"):
                await stream.run(request, Output(1024, NO_EVENTS), 30)
            await stream.aclose()


async def test_closing_a_stream_leaves_no_task_of_its_own_behind(address):
    """An open call's reader ends with the stream: none is left pending when the loop closes."""
    before = asyncio.all_tasks()
    async with grpc.aio.insecure_channel(address) as channel:
        stream = ProcessStream(grpc_calls(channel, ()), max_in_flight=4)
        stream.open()
        await asyncio.sleep(0)
        assert asyncio.all_tasks() - before, "the open call has a reader"
        await stream.aclose()
        assert asyncio.all_tasks() == before


class EndedCall:
    """A grpc.aio Execute call the server refused while a write failed, in the order grpcio
    (grpc/grpc#36066) sometimes sets the statuses: its INTERNAL of the failed write first (the one
    its done callbacks see), the refusal last (the one a reader gets). It takes no more writes."""

    def __init__(self) -> None:
        code, wire = to_status(REFUSAL)
        self._last = (code, wire.message, ((ERROR_METADATA_KEY, wire.SerializeToString()),))

    def add_done_callback(self, callback) -> None:
        first = EndedCall()
        first._last = (grpc.StatusCode.INTERNAL, WRITE_FAILED_DETAILS, ())
        callback(first)

    async def write(self, request: object) -> None:
        raise asyncio.InvalidStateError("the call is over")

    def done(self) -> bool:
        return True

    def cancelled(self) -> bool:
        return False

    async def code(self) -> grpc.StatusCode:
        return self._last[0]

    async def details(self) -> str:
        return self._last[1]

    async def initial_metadata(self) -> tuple:
        return ()

    async def trailing_metadata(self) -> tuple:
        return self._last[2]


async def test_a_write_on_a_call_already_over_is_unsent_with_the_calls_status_by_call_ends_rule():
    call = GrpcCall(EndedCall())
    with pytest.raises(Unsent) as unsent:
        await call.write(process_pb2.ExecuteRequest(id=1, argv=["/bin/true"]))
    assert isinstance(unsent.value.error, SandboxNotFoundError) and str(unsent.value.error) == str(REFUSAL)
