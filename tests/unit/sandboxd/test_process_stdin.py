"""A process's standard input on an Execute call (:class:`protolink_sandboxd.execute.ProcessCall`),
its processes started on this host: the bytes of ``input`` requests reach it in order until one
closes it; while its pipe is full the call takes no more requests, yet the process's end (or the
call's) still frees it; input for a process that has ended is dropped, and input it did not ask
for, or too large, fails the call."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator

import pytest
from protolink_sandboxd.activity import Activity
from protolink_sandboxd.execute import MAX_INPUT_BYTES, ProcessCall, Runner

from protolink.execution.local_processes import HostLauncher, Leader
from protolink.execution.process_types import ProcessSpec
from protolink.sandbox import exec_client
from protolink.wire._pb import process_pb2

ENV = {"PATH": "/usr/bin:/bin"}


class HostSpawner(HostLauncher):
    """The spawner's part, played by this host's own launcher; it keeps what it started."""

    def __init__(self) -> None:
        self.started: list[Leader] = []

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None = None) -> Leader:
        leader = await super().launch(spec, stdout, stderr, stdin)
        self.started.append(leader)
        return leader


class NoStrays:
    @contextlib.asynccontextmanager
    async def command(self) -> AsyncIterator[None]:
        yield

    async def sweep(self) -> None:
        pass


def runner(spawner: HostSpawner | None = None) -> Runner:
    return Runner(spawner or HostSpawner(), NoStrays(), Activity(), max_concurrency=4,  # type: ignore[arg-type]
                  max_output_bytes=1 << 24)


def start(request_id: int, *argv: str, stdin: bool = True, timeout: float = 60) -> bytes:
    return process_pb2.ExecuteRequest(id=request_id, argv=argv, cwd="/", env=ENV, timeout_seconds=timeout,
                                      max_output_bytes=1 << 24, stdin=stdin).SerializeToString()


def feed(request_id: int, data: bytes, *, close: bool = False) -> bytes:
    return process_pb2.ExecuteRequest(id=request_id, input=process_pb2.Input(data=data, close=close)).SerializeToString()


async def outcome(call: ProcessCall, requests: AsyncIterator[bytes]) -> dict[int, tuple[bytes, int | None]]:
    """Each process's output and exit code, once the call has ended."""
    output: dict[int, bytearray] = {}
    codes: dict[int, int | None] = {}
    async for data in call.events(requests):
        event = process_pb2.ExecuteEvent.FromString(data)
        if event.WhichOneof("event") == "output":
            output.setdefault(event.id, bytearray()).extend(event.output.data)
        elif event.WhichOneof("event") == "finished":
            codes[event.id] = event.finished.exit_code if event.finished.HasField("exit_code") else None
    return {id_: (bytes(output.get(id_, b"")), code) for id_, code in codes.items()}


async def listed(*requests: bytes) -> AsyncIterator[bytes]:
    for request in requests:
        yield request


async def test_input_reaches_the_process_in_order_until_it_is_closed():
    data = bytes(range(256)) * 1024  # more than a pipe holds: the call waits for the process to read
    chunks = [data[at:at + MAX_INPUT_BYTES] for at in range(0, len(data), MAX_INPUT_BYTES)]
    requests = listed(start(1, "/bin/cat"), *(feed(1, chunk) for chunk in chunks), feed(1, b"", close=True))
    assert await outcome(ProcessCall(runner()), requests) == {1: (data, 0)}


async def test_without_stdin_the_process_reads_nothing():
    assert await outcome(ProcessCall(runner()), listed(start(1, "/bin/cat", stdin=False))) == {1: (b"", 0)}


async def test_a_process_that_never_reads_its_full_pipe_still_ends_and_frees_the_call():
    """Its pipe fills and the call stops taking requests; its end (here its timeout) frees the
    call, whose next requests are then taken: input for it is dropped, a new process runs."""
    chunk = b"y" * MAX_INPUT_BYTES
    requests = listed(start(1, "/bin/sleep", "60", timeout=0.5), *(feed(1, chunk) for _ in range(8)),
                      start(2, "/bin/cat"), feed(2, b"after", close=True))
    assert await outcome(ProcessCall(runner()), requests) == {1: (b"", -15), 2: (b"after", 0)}


async def test_a_canceled_call_kills_a_process_whose_pipe_is_full():
    spawner = HostSpawner()
    call = ProcessCall(runner(spawner))
    fed = asyncio.Event()
    all_fed = False

    async def endless() -> AsyncIterator[bytes]:
        nonlocal all_fed
        yield start(1, "/bin/sleep", "60")
        for count in range(8):  # more than a pipe holds: the call stops taking them
            if count == 1:  # the first has gone into the pipe
                fed.set()
            yield feed(1, b"y" * MAX_INPUT_BYTES)
        all_fed = True
        await asyncio.Event().wait()

    served = asyncio.ensure_future(outcome(call, endless()))
    await fed.wait()
    served.cancel()
    with pytest.raises(asyncio.CancelledError):
        await served
    [sleeper] = spawner.started
    assert sleeper.exited.done() and sleeper.exit_code == -signal.SIGTERM  # ended and reaped
    assert not all_fed


async def test_input_for_a_process_that_has_ended_is_dropped():
    requests = listed(start(1, "/bin/true"), feed(7, b"never started"))
    assert await outcome(ProcessCall(runner()), requests) == {1: (b"", 0)}


@pytest.mark.parametrize(("requests", "problem"), [
    ([start(1, "/bin/sleep", "5", stdin=False), feed(1, b"x")], "request id 1, which has no stdin"),
    ([start(1, "/bin/cat"), feed(1, b"x" * (MAX_INPUT_BYTES + 1))], f"more than {MAX_INPUT_BYTES} bytes"),
], ids=["not-asked-for", "too-large"])
async def test_input_a_process_did_not_ask_for_or_too_large_fails_the_call(requests, problem):
    with pytest.raises(ValueError, match=problem):
        await outcome(ProcessCall(runner()), listed(*requests))


def test_the_client_sends_no_more_than_the_server_takes():
    assert exec_client.MAX_INPUT_BYTES == MAX_INPUT_BYTES
