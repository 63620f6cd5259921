"""A process's deadline on the host (:class:`~protolink.sandbox.process_stream.ProcessStream`)
against a played command channel: a process the sandbox does not finish in time fails at its
deadline, but one that finished while the host's loop was held up past its deadline is not failed
as one that never finished, and one whose answer came while the loop was held up past its idle
deadline is not taken for a silent sandbox."""

from __future__ import annotations

import asyncio
import time

import pytest

from protolink.errors import SandboxUnavailableError
from protolink.sandbox import process_stream
from protolink.deadlines import LATE_SECONDS
from protolink.sandbox.pipe_connection import ChannelCalls
from protolink.sandbox.process_stream import Output, ProcessStream
from protolink.wire._pb import process_pb2
from protolink.wire.pipe_passing import EVENT

from .test_command_channel import server  # noqa: F401 (a fixture)
from .test_untrusted_answers import Recorder

#: The process's deadline: far longer than the few turns of the loop before the test holds it.
DEADLINE_SECONDS = 1.0


async def test_a_process_that_finished_while_this_loop_was_held_past_its_deadline_is_not_failed(server):  # noqa: F811
    """A blocking step of the caller's held the loop past a process's deadline while the sandbox
    said the process finished: the answer waits unread behind the deadline's own callback, and
    the process ends with it instead of failing as one the sandbox did not finish in time."""
    stream = ProcessStream(ChannelCalls(server.path, (), lambda: "grpc", pipes_above=None))
    try:
        stream.open()
        await server.datagrams(2)  # the authorization and the opening request
        running = asyncio.ensure_future(
            stream.run(process_pb2.ExecuteRequest(argv=["/bin/true"]), Output(100, Recorder()), DEADLINE_SECONDS))
        await asyncio.sleep(0)  # its request is sent, its deadline running
        (sent,) = await server.datagrams(1)  # there already: the loop does not turn
        finished = process_pb2.ExecuteEvent(id=process_pb2.ExecuteRequest.FromString(sent).id,
                                            finished=process_pb2.Finished(exit_code=0))
        server.connections[0].send(EVENT + finished.SerializeToString())
        time.sleep(DEADLINE_SECONDS + 2 * LATE_SECONDS)  # held up well past the deadline
        async with asyncio.timeout(5):
            assert (await running)["exit_code"] == 0
    finally:
        await stream.aclose()


async def test_a_process_the_sandbox_does_not_finish_fails_at_its_deadline(server):  # noqa: F811
    """The sandbox keeps the process's events coming (keepalives) but never its end."""
    stream = ProcessStream(ChannelCalls(server.path, (), lambda: "grpc", pipes_above=None))
    try:
        running = asyncio.ensure_future(
            stream.run(process_pb2.ExecuteRequest(argv=["/bin/true"]), Output(100, Recorder()), DEADLINE_SECONDS))
        _, sent = await server.datagrams(2)  # the authorization, the request
        keepalive = process_pb2.ExecuteEvent(id=process_pb2.ExecuteRequest.FromString(sent).id,
                                             keepalive=process_pb2.Keepalive())
        async with asyncio.timeout(30):  # a hang guard
            while not running.done():
                server.connections[0].send(EVENT + keepalive.SerializeToString())
                await asyncio.sleep(0.1)
        with pytest.raises(SandboxUnavailableError, match="did not finish the process within"):
            running.result()
    finally:
        await stream.aclose()


async def test_a_process_that_answered_while_this_loop_was_held_up_is_not_taken_for_silent(server, monkeypatch):  # noqa: F811
    """A blocking step of the caller's held the loop past a process's idle deadline while the
    sandbox answered: the answer waits unread, and the process ends with it instead of failing
    as a sandbox that sent nothing."""
    monkeypatch.setattr(process_stream, "IDLE_SECONDS", 0.2)
    stream = ProcessStream(ChannelCalls(server.path, (), lambda: "grpc", pipes_above=None))
    try:
        running = asyncio.ensure_future(
            stream.run(process_pb2.ExecuteRequest(argv=["/bin/true"]), Output(100, Recorder()), 30))
        _, sent = await server.datagrams(2)  # the authorization, the request
        finished = process_pb2.ExecuteEvent(id=process_pb2.ExecuteRequest.FromString(sent).id,
                                            finished=process_pb2.Finished(exit_code=0))
        server.connections[0].send(EVENT + finished.SerializeToString())
        time.sleep(0.2 + 2 * LATE_SECONDS)  # held up well past the idle deadline
        async with asyncio.timeout(5):
            assert (await running)["exit_code"] == 0
    finally:
        await stream.aclose()
