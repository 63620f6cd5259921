"""The client treats the server's answers as untrusted: bounded, checked, and never a hang.

A fake server on a Unix socket answers each call with whatever the test scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from protolink.errors import SandboxError, SandboxNotReachedError, SandboxProtocolError, SandboxUnavailableError
from protolink.execution.process_types import ProcessSpec
from protolink.sandbox import connect, process_stream
from protolink.sandbox import client as sandbox_client
from protolink.sandbox.client import attach
from protolink.wire._pb import errors_pb2, process_pb2, sandbox_pb2, workspace_pb2
from protolink.wire.status import NOT_CONNECTED_DETAILS

SERVICE = "protolink.sandbox.v1.Sandbox"
SPEC = ProcessSpec(("/bin/true",), "/ws", {}, 5.0, 100)


def started() -> process_pb2.ExecuteEvent:
    return process_pb2.ExecuteEvent(started=process_pb2.Started())


def output(text: str, channel: int = process_pb2.CHANNEL_STDOUT) -> process_pb2.ExecuteEvent:
    return process_pb2.ExecuteEvent(output=process_pb2.Output(channel=channel, data=text.encode()))


def finished(**facts: Any) -> process_pb2.ExecuteEvent:
    return process_pb2.ExecuteEvent(finished=process_pb2.Finished(**facts))


class Script:
    """What the fake server answers: Info, the Execute event stream, and ReadText."""

    def __init__(self) -> None:
        self.info = sandbox_pb2.InfoResponse(boundary="sandbox:fake", server_version="0")
        self.events: list[process_pb2.ExecuteEvent] = []
        self.then_silence = False
        self.read_text = workspace_pb2.ReadTextResponse()
        #: Calls to fail the way gRPC fails a call it could not send, before answering any.
        self.unsent = 0
        self.calls: list[str] = []
        self.ended = 0  # Execute calls over

    async def _answered(self, name: str, context: Any) -> None:
        self.calls.append(name)
        if self.unsent:
            self.unsent -= 1
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"{NOT_CONNECTED_DETAILS}; last error: none")

    async def _info(self, request: bytes, context: Any) -> bytes:
        await self._answered("Info", context)
        return self.info.SerializeToString()

    async def _execute(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        """Answers the first process's request with the scripted events, under its id unless an
        event has one; a cancel (the request that opens the call, say) gets nothing, as it does
        from the real server when no such process runs."""
        await self._answered("Execute", context)
        try:
            async for request in requests:
                parsed = process_pb2.ExecuteRequest.FromString(request)
                if parsed.cancel:
                    continue
                for event in self.events:
                    tagged = process_pb2.ExecuteEvent()
                    tagged.CopyFrom(event)
                    tagged.id = tagged.id or parsed.id
                    yield tagged.SerializeToString()
                if self.then_silence:
                    await asyncio.sleep(3600)
                return
        finally:
            self.ended += 1

    async def _read_text(self, request: bytes, context: Any) -> bytes:
        return self.read_text.SerializeToString()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Info": grpc.unary_unary_rpc_method_handler(self._info),
            "Execute": grpc.stream_stream_rpc_method_handler(self._execute),
            "ReadText": grpc.unary_unary_rpc_method_handler(self._read_text),
        })


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    async def emit(self, type: str, **data: Any) -> None:
        self.events.append((type, data))


@contextlib.asynccontextmanager
async def serving(script: Script, address: str) -> AsyncIterator[grpc.aio.Server]:
    """A fake server answering from ``script``; stopped on the way out, whatever happened (an
    aio server left running hangs the interpreter's garbage collection once its loop is closed)."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((script.handler(),))
    server.add_insecure_port(address)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(None)


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[tuple[Script, str]]:
    script, address = Script(), f"unix://{tmp_path / 'fake.sock'}"
    async with serving(script, address):
        yield script, address


async def run(address: str, recorder: Recorder | None = None, **connect_options: Any):
    async with await connect(address, **connect_options) as backend:
        return await backend.execute(SPEC, recorder or Recorder())


async def test_output_past_the_cap_is_cut_even_when_the_server_claims_otherwise(fake):
    script, address = fake
    script.events = [started(), *[output("x" * 60, channel) for channel in (1, 2, 1)], finished(exit_code=0)]
    recorder = Recorder()
    result = await run(address, recorder)
    assert result.truncated and len(result.stdout) + len(result.stderr) == SPEC.max_output_bytes
    emitted = "".join(data["text"] for _, data in recorder.events)
    assert len(emitted) == SPEC.max_output_bytes
    assert result.stdout == "x" * 60 and result.stderr == "x" * 40


@pytest.mark.parametrize("events", [
    [output("early"), started(), finished(exit_code=0)],
    [started(), started(), finished(exit_code=0)],
    [started(), output("?", channel=7), finished(exit_code=0)],
    [started(), output("no end")],
    [started(), finished(exit_code=100_000)],
    [started(), process_pb2.ExecuteEvent(), finished(exit_code=0)],
    [process_pb2.ExecuteEvent(id=99, started=process_pb2.Started()), started(), finished(exit_code=0)],
    [started(), process_pb2.ExecuteEvent(error=errors_pb2.Error(kind=999, message="?"))],
], ids=["started-after-output", "two-starts", "bad-channel", "no-finish", "bad-exit-code", "empty-event",
        "unknown-id", "unknown-error-kind"])
async def test_a_malformed_event_stream_is_a_protocol_error(fake, events):
    script, address = fake
    script.events = events
    with pytest.raises(SandboxProtocolError):
        await run(address)


async def test_a_silent_server_is_reported_unavailable(fake, monkeypatch):
    script, address = fake
    script.events, script.then_silence = [started()], True
    monkeypatch.setattr(process_stream, "IDLE_SECONDS", 0.2)
    with pytest.raises(SandboxUnavailableError, match="sent nothing"):
        await run(address)


async def test_an_oversized_answer_is_refused(fake):
    script, address = fake
    script.read_text = workspace_pb2.ReadTextResponse(path="/ws/a", content="x" * 200_000)
    async with await connect(address, max_message_bytes=64 * 1024) as backend:
        with pytest.raises(SandboxProtocolError):
            await backend.read_text("/ws/a", roots=["/ws"], offset=0, max_chars=20_000, max_file_bytes=10**6)


async def test_an_answer_beyond_the_request_is_refused(fake):
    script, address = fake
    script.read_text = workspace_pb2.ReadTextResponse(path="/elsewhere/a", content="x")
    async with await connect(address) as backend:
        with pytest.raises(SandboxProtocolError, match="outside the roots"):
            await backend.read_text("/ws/a", roots=["/ws"], offset=0, max_chars=10, max_file_bytes=100)


@pytest.mark.parametrize("boundary", ["host", "sandbox:" + "x" * 300, "sandbox:\x1b[31mred"])
async def test_an_invalid_boundary_is_refused_at_connect(fake, boundary):
    script, address = fake
    script.info = sandbox_pb2.InfoResponse(boundary=boundary)
    with pytest.raises(SandboxProtocolError, match="boundary"):
        await connect(address)


async def test_invalid_limits_are_refused_at_connect(fake):
    script, address = fake
    script.info = sandbox_pb2.InfoResponse(boundary="sandbox:fake", limits=sandbox_pb2.Limits(max_message_bytes=-1))
    with pytest.raises(SandboxProtocolError, match="limit"):
        await connect(address)


async def test_nothing_listening_is_unavailable_without_a_hang(tmp_path):
    address = f"unix://{tmp_path / 'nobody.sock'}"
    with pytest.raises(SandboxNotReachedError) as raised:
        await connect(address, timeout=0.5)
    assert isinstance(raised.value, SandboxUnavailableError)
    assert str(raised.value) == f"no sandbox server answered at {address} within 0.5 s: its socket does not exist"


async def test_a_closed_backend_refuses_calls(fake):
    _, address = fake
    backend = await connect(address)
    await backend.aclose()
    with pytest.raises(SandboxError, match="closed"):
        await backend.info()
    with pytest.raises(SandboxError, match="closed"):
        await backend.execute(SPEC, Recorder())


async def test_a_call_waits_a_moment_for_a_lost_connection_to_come_back(tmp_path, monkeypatch):
    """With no server, a call fails (after RECONNECT_SECONDS); with the server back half a second
    after the next call starts, that call waits for it instead of failing at once."""
    script, address = Script(), f"unix://{tmp_path / 'fake.sock'}"
    async with contextlib.AsyncExitStack() as servers:
        first = await servers.enter_async_context(serving(script, address))
        async with await connect(address) as backend:
            await first.stop(None)
            async with asyncio.timeout(60):  # a hang guard: the client sees the connection end (a busy host takes a moment)
                while backend._channel.get_state() is grpc.ChannelConnectivity.READY:
                    await asyncio.sleep(0.01)
            with pytest.raises(SandboxUnavailableError):
                await backend.info()
            # Its wait, longer than the server's return and the reconnection take on a loaded machine.
            monkeypatch.setattr(sandbox_client, "RECONNECT_SECONDS", 30.0)

            async def come_back() -> None:
                await asyncio.sleep(0.5)
                await servers.enter_async_context(serving(script, address))

            returning = asyncio.ensure_future(come_back())
            try:
                assert (await backend.info()).boundary == "sandbox:fake"
            finally:
                await returning


async def test_a_call_that_could_not_be_sent_is_made_once_more(fake, monkeypatch):
    """A connection lost just before a call fails it unsent (gRPC: "failed to connect to all
    addresses"); the backend makes such a call once more, a process included, and no more."""
    script, address = fake
    script.events = [output("ran"), finished(exit_code=0)]  # no started: a short command's output says it ran
    monkeypatch.setattr(process_stream, "IDLE_CALL_SECONDS", 0.05)
    async with await connect(address) as backend:
        async with asyncio.timeout(60):  # a hang guard: the call opened at attach ends, idle
            while script.calls != ["Info", "Execute"] or script.ended != 1:
                await asyncio.sleep(0.01)
        script.calls.clear()
        script.unsent = 1
        assert (await backend.info()).boundary == "sandbox:fake"
        script.unsent = 1
        assert (await backend.execute(SPEC, Recorder())).stdout == "ran"
        assert script.calls == ["Info", "Info", "Execute", "Execute"]
        script.unsent = 2
        with pytest.raises(SandboxUnavailableError, match=NOT_CONNECTED_DETAILS):
            await backend.info()


async def test_a_backend_closed_as_soon_as_it_attached_leaves_no_failure_behind(fake):
    """Closing cancels the call opened at attach before its opening request is written; that
    write ends with the close, not as a task whose error nobody retrieved (reported on the loop)."""
    script, address = fake
    reported: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
    channel = grpc.aio.insecure_channel(address)  # a service's channel, say: the call is grpcio's
    try:
        backend = await attach(channel)
        await backend.aclose()
        gc.collect()
        assert reported == []
    finally:
        await channel.close()
