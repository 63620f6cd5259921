"""The one ``Execute`` call a :class:`~protolink.sandbox.client.SandboxBackend` runs its processes on.

Each process is a request on the call, with an id of its own; the events of every process
come back on the call tagged with that id, and one reader hands each to the process it belongs
to. The call is made on a connection of the client's own when the backend knows the server's
address (:mod:`.aio_call`: no grpcio in the receive of output), else through grpcio's channel
(a sandbox service's). It is opened when the backend attaches (:meth:`ProcessStream.open`: the
first command does not pay for the connection and the stream on each hop), on first use after
it ended, and again after it fails; a failure of the
call fails every process waiting on it (:class:`~protolink.wire.status.SandboxUnavailableError`
and friends).
A server on a Unix socket (a sandbox on this host, not a service's forwarding, not TCP) offers
the call as datagrams on a local socket instead (:mod:`.pipe_connection`), and may pass there the
output pipes of a process that may keep more than :data:`PIPES_ABOVE_BYTES` instead of sending
its output: they are then read here with the host backend's own reader
(:class:`~protolink.execution.output_pipes.OutputPipes`), within the same cap, drained for the
same grace once the process has finished; its exit status and other events still come on the call.
Everything the server sends is untrusted: events are parsed and checked in order (an output
event's bytes are read where they arrived, :mod:`protolink.wire.output_events`), output is
capped at the process's ``max_output_bytes`` whatever the server claims (then decoded, kept and
emitted by the same :class:`~protolink.execution.output.OutputCollector` the host backend uses),
each process's events wait in a bounded queue (a server that floods one makes the reader wait,
it cannot fill this process's memory), and a process whose events stop coming, keepalives
included, is given up. (A deadline this side's loop was held up past first reads what came
meanwhile: :mod:`protolink.deadlines`.)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import Any

import grpc

from protolink import deadlines
from protolink.errors import SandboxError, SandboxProtocolError, SandboxUnavailableError
from protolink.execution.groups import TERMINATE_GRACE_SECONDS, completed_within
from protolink.execution.local_processes import DRAIN_GRACE_SECONDS, uninterrupted
from protolink.execution.output import Channel, OutputCap, OutputCollector
from protolink.execution.output_pipes import PIECE_BYTES, OutputPipes
from protolink.execution.process_types import Emitter
from protolink.wire import convert
from protolink.wire._pb import process_pb2, sandbox_pb2
from protolink.wire.output_events import OutputEvent, read_output_event
from protolink.wire.status import CallEnd, Status, checked_answer, from_wire

from .aio_call import AsyncCall
from .pipe_connection import PassedPipes, Unsent

#: A process that sends nothing (not even a keepalive) for this long is lost.
IDLE_SECONDS = 20.0
#: Events of one process that may wait for it to read them (an honest server's output events
#: hold a mebibyte at most: it merges output into pieces of that size while this side is slow).
QUEUED_EVENTS = 8
#: A call with no process left on it is ended after this long, unless the call says how long
#: it may stay (``idle_seconds``: a command channel's, which is no gRPC call); the next process
#: opens a new one. An open gRPC call is also why gRPC's fork handlers may crash a child the host
#: process forks meanwhile (``subprocess`` with ``user=`` or ``preexec_fn``): see the README.
IDLE_CALL_SECONDS = 1.0
#: How long closing waits for the tasks of a canceled call to end before it cancels them.
CLOSE_SECONDS = 5.0
#: How long a canceled process's Finished is waited for: the server's grace between SIGTERM and
#: SIGKILL, and a margin for a loaded machine.
CANCEL_SECONDS = TERMINATE_GRACE_SECONDS + 4.0

#: A process may keep more output than this before its pipes are asked for: a hand-off costs a
#: short command about 0.7 ms more than the stream (two descriptors, a reader, one more wakeup of
#: this side), where output of at most one piece (1 MiB, one event) costs the stream less than that.
PIPES_ABOVE_BYTES = PIECE_BYTES

#: The request that opens a call ahead of its first process: a cancel of request 0, which no
#: process has (ids start at 1), so the server (and a service that forwards the call to it once
#: its first request arrives) takes it and does nothing.
OPENING = process_pb2.ExecuteRequest(id=0, cancel=True)

EXECUTE = f"/{sandbox_pb2.DESCRIPTOR.services_by_name['Sandbox'].full_name}/Execute"

_Event = process_pb2.ExecuteEvent | OutputEvent
_Item = _Event | PassedPipes | BaseException


class Canceled(Exception):
    """The process was canceled. ``facts``: its Finished facts once the sandbox has killed and
    reaped its group (None when they did not come within :data:`CANCEL_SECONDS`)."""

    def __init__(self, facts: dict[str, Any] | None) -> None:
        super().__init__("canceled")
        self.facts = facts


class ProcessStream:
    """Processes over the Execute calls ``calls()`` opens (see the module; :func:`grpc_calls`,
    :func:`own_calls`, :class:`~.pipe_connection.ChannelCalls`). ``in_flight``, when given, is
    shared with another stream to the same server (in place of one of ``max_in_flight``)."""

    def __init__(self, calls: Callable[[], Any], *, max_in_flight: int = 1,
                 in_flight: asyncio.Semaphore | None = None) -> None:
        self._calls = calls
        self._in_flight = in_flight if in_flight is not None else asyncio.Semaphore(max_in_flight)
        self._call: Any = None
        self._waiting: dict[int, tuple[Any, asyncio.Queue[_Item]]] = {}  # by request id: its call, its events
        self._next_id = 1
        self._writing = asyncio.Lock()
        self._idle_close: asyncio.TimerHandle | None = None
        self._readers: set[asyncio.Task[None]] = set()  # one a call, until the call ends
        self._writes: set[asyncio.Task[None]] = set()  # the opening and cancel requests under way

    async def run(self, request: process_pb2.ExecuteRequest, output: Output, deadline_seconds: float) -> dict[str, Any]:
        """Start ``request``'s process and follow it to its Finished facts, within ``deadline_seconds``.

        Failing, it tells the server to kill and reap the process group. Canceled once the
        process was asked for, it waits (however often canceled again) for the server to have
        killed and reaped it, then raises :class:`Canceled`. At most ``max_in_flight`` processes
        run at once (the server's ``max_concurrency``); more wait here.
        """
        async with self._in_flight:
            return await self._run(request, output, deadline_seconds)

    async def _run(self, request: process_pb2.ExecuteRequest, output: Output, deadline_seconds: float) -> dict[str, Any]:
        if self._idle_close is not None:
            self._idle_close.cancel()
        request.id = self._next_id
        self._next_id += 1
        finished = False
        events: asyncio.Queue[_Item] | None = None
        try:
            async with deadlines.timeout(deadline_seconds) as deadline:
                events = await self._send(request)
                facts = await _follow(events, output, asked_for_pipes=bool(request.pipe_connection))
            finished = True
            return facts
        except asyncio.CancelledError:
            if events is None:
                raise
            finished = True
            raise Canceled(await uninterrupted(self._reaped(request.id, events))) from None
        except TimeoutError:
            if not deadline.expired():
                raise
            raise SandboxUnavailableError(
                f"the sandbox did not finish the process within {deadline_seconds:g} s") from None
        finally:
            call, events = self._waiting.pop(request.id)
            while not events.empty():
                _discard(events.get_nowait())  # the reader may wait for room in this queue: it is never read again
            if not finished:
                self._cancel(call, request.id)
            if not self._waiting:
                self._end_when_idle(call)

    async def _send(self, request: process_pb2.ExecuteRequest) -> asyncio.Queue[_Item]:
        """Write ``request`` on the open call; the queue its events come to. (A command
        channel's call names itself in ``request`` for the process's pipes, when it asks for them.)

        A request the call ended before (:class:`Unsent`) goes once more, on a new call: it never
        reached the server, and the status that ended the old call may have been lost to grpcio
        (:class:`GrpcCall`); a refusal on the new one, where it is the first request, arrives whole.
        """
        for attempt in range(2):
            call = self._open()
            events: asyncio.Queue[_Item] = asyncio.Queue(QUEUED_EVENTS)  # the old call's reader may fill an old one
            self._waiting[request.id] = (call, events)
            try:
                await self._write(call, request)
                return events
            except Unsent as unsent:
                if attempt:
                    raise unsent.error from None
        raise AssertionError("unreachable")

    def open(self) -> None:
        """Open the call now, ahead of the first process, sending :data:`OPENING` on it (once more
        on a new call when it was not sent: where the server offers no command channel, that one
        is gRPC's); like an idle one it ends after IDLE_CALL_SECONDS unless a process comes."""
        self._keep(self._opening(self._open()), self._writes)

    async def _opening(self, call: Any) -> None:
        for _ in range(2):
            self._end_when_idle(call)
            try:
                await self._write(call, OPENING)
                return
            except SandboxError:
                return  # the call failed: the next process opens another
            except Unsent:
                call = self._open()

    async def aclose(self) -> None:
        """End the call: the server kills and reaps whatever still runs on it. Returns once this
        object's tasks have ended, so that none is left pending when the loop closes."""
        if self._idle_close is not None:
            self._idle_close.cancel()
        if self._call is not None:
            self._call.cancel()
            self._call = None
        for write in self._writes:
            write.cancel()  # the call is over: what they would write goes nowhere
        tasks = (*self._readers, *self._writes)
        if tasks:  # a canceled call's reader ends at once, failing the processes left on it
            _, late = await asyncio.wait(tasks, timeout=CLOSE_SECONDS)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    def _handed(self, pipes: PassedPipes, call: Any) -> None:
        """Hand ``pipes`` to the process of ``call`` waiting for them, behind its events; else close them."""
        waiting = self._waiting.get(pipes.request_id)
        if waiting is None or waiting[0] is not call or waiting[1].full():
            pipes.close()
            return
        waiting[1].put_nowait(pipes)

    def _end_when_idle(self, call: Any) -> None:
        if self._idle_close is not None:
            self._idle_close.cancel()
        idle_seconds = getattr(call, "idle_seconds", IDLE_CALL_SECONDS)
        self._idle_close = asyncio.get_running_loop().call_later(idle_seconds, self._end_idle, call)

    def _end_idle(self, call: Any) -> None:
        if call is self._call and not self._waiting:
            self._call = None
            call.cancel()

    def _open(self) -> Any:
        if self._call is None or self._call.done():
            self._call = self._calls()
            self._keep(self._read(self._call), self._readers)
        return self._call

    @staticmethod
    def _keep(work: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]]) -> None:
        """Run ``work`` in a task held in ``tasks`` until it ends."""
        task = asyncio.ensure_future(work)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _write(self, call: Any, request: process_pb2.ExecuteRequest) -> None:
        async with self._writing:
            await call.write(request)

    def _cancel(self, call: Any, request_id: int) -> None:
        if call is self._call and not call.done():
            cancel = process_pb2.ExecuteRequest(id=request_id, cancel=True)
            self._keep(self._write_quietly(call, cancel), self._writes)

    async def _reaped(self, request_id: int, events: asyncio.Queue[_Item]) -> dict[str, Any] | None:
        """Ask the server to kill and reap process ``request_id``; its Finished facts (None when
        they do not come within CANCEL_SECONDS, or the call fails). Its later output is dropped:
        a canceled process's result holds what came before."""
        call = self._waiting[request_id][0]
        if call is not self._call or call.done():
            return None
        await self._write_quietly(call, process_pb2.ExecuteRequest(id=request_id, cancel=True))
        try:
            async with asyncio.timeout(CANCEL_SECONDS):
                while True:
                    event = await events.get()
                    if isinstance(event, BaseException):
                        return None
                    kind = event.WhichOneof("event") if isinstance(event, process_pb2.ExecuteEvent) else None
                    if kind == "finished":
                        return checked_answer(convert.finished_facts, event.finished)
                    if kind == "error":
                        return None
                    _discard(event)
        except (TimeoutError, SandboxProtocolError):
            return None

    async def _write_quietly(self, call: Any, request: process_pb2.ExecuteRequest) -> None:
        try:
            await self._write(call, request)
        except (SandboxError, Unsent):
            pass  # the call failed: the server kills everything it ran anyway

    async def _read(self, call: Any) -> None:
        """Hand each event to its process until the call ends; then fail the processes left."""
        try:
            async for data in call:
                if isinstance(data, PassedPipes):
                    self._handed(data, call)
                    continue
                event = _parsed(data)
                if (waiting := self._waiting.get(event.id)) is not None and waiting[0] is call:
                    await waiting[1].put(event)
                elif not 0 < event.id < self._next_id:
                    raise SandboxProtocolError(f"the sandbox sent an event for request {event.id}, never made")
                # else: an event of a process that is over, or given up: dropped
            failure: BaseException = SandboxProtocolError("the sandbox ended the process stream")
        except Exception as error:  # noqa: BLE001 (the call's end, typed by protolink.wire.status)
            failure = error
        if self._call is call:
            self._call = None
        call.cancel()
        for on, events in self._waiting.values():
            if on is call:
                _put_failure(events, failure)


def grpc_calls(channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]]) -> Callable[[], GrpcCall]:
    """Execute calls through grpcio's ``channel`` (one a sandbox service forwards, over TLS, say)."""
    # Events are handed over as the bytes that arrived, so that output is read where it lies
    # (protolink.wire.output_events); other events are parsed here.
    execute = channel.stream_stream(EXECUTE, request_serializer=process_pb2.ExecuteRequest.SerializeToString)
    return lambda: GrpcCall(execute(metadata=tuple(metadata), wait_for_ready=False))


class GrpcCall:
    """A grpcio Execute call with :class:`~.aio_call.AsyncCall`'s ways: a failed read raises the
    call's typed error, from its status as the other side sent it when grpcio kept it
    (:class:`~protolink.wire.status.CallEnd`); a failed write raises :class:`Unsent`."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call
        self._end = CallEnd(call)

    async def write(self, request: process_pb2.ExecuteRequest) -> None:
        try:
            await self._call.write(request)
        except grpc.aio.AioRpcError as error:
            raise Unsent(self._end.error(Status.raised_by(error))) from None
        except (grpc.aio.UsageError, asyncio.InvalidStateError):  # the call is over
            if not self._call.done() or self._call.cancelled():
                raise Unsent(SandboxUnavailableError("the sandbox's process stream has ended")) from None
            raise Unsent(self._end.error(await self._raised())) from None

    async def _raised(self) -> Status:
        """The status the call, over, raises to a reader: its last (for :class:`CallEnd`'s rule)."""
        call = self._call
        return Status(await call.code(), await call.details() or "", tuple(await call.trailing_metadata() or ()))

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._call:
                yield data
        except grpc.aio.AioRpcError as error:
            raise self._end.error(Status.raised_by(error)) from None

    def done(self) -> bool:
        return self._call.done()

    def cancel(self) -> bool:
        return self._call.cancel()


def own_calls(address: str, metadata: Sequence[tuple[str, str]], *, max_message_bytes: int) -> Callable[[], Any]:
    """Execute calls on connections of their own to ``address`` (:mod:`.aio_call`, no grpcio)."""
    return functools.partial(AsyncCall, address, EXECUTE, tuple(metadata), max_message_bytes=max_message_bytes)


def _parsed(data: bytes | memoryview) -> _Event:
    """The event the server sent as ``data``: an output event read in place, any other parsed."""
    if (output := read_output_event(data)) is not None:
        return output
    return checked_answer(convert.parse, process_pb2.ExecuteEvent, data)


def _put_failure(events: asyncio.Queue[_Item], failure: BaseException) -> None:
    """Queue ``failure`` for a process, making room for it if its queue is full."""
    if events.full():
        _discard(events.get_nowait())
    events.put_nowait(failure)


def _discard(item: _Item) -> None:
    """Drop a queued item unread (closing passed pipes)."""
    if isinstance(item, PassedPipes):
        item.close()


class Output:
    """A process's output as received: capped at ``max_bytes`` again, whatever the server claims,
    then decoded, kept and emitted to ``execution`` as the host backend does with its pipes."""

    def __init__(self, max_bytes: int, execution: Emitter) -> None:
        self.cap = OutputCap(max_bytes)
        self.collector = OutputCollector(execution)

    async def feed(self, channel: Channel, data: bytes | memoryview) -> None:
        if kept := self.cap.take(data):
            await self.collector.feed(channel, kept)


async def _follow(events: asyncio.Queue[_Item], output: Output, *, asked_for_pipes: bool) -> dict[str, Any]:
    """Read one process's events to its Finished facts. Order: started?, output*, finished (or
    error). Asked for the process's pipes, the server may hand them over on the command channel
    instead of output events: they are read here as the host backend reads its own (see
    :func:`_read_passed`)."""
    begun = streamed = False
    reading: OutputPipes | None = None
    loop = asyncio.get_running_loop()
    try:
        # One deadline for the whole process, pushed back by every event (no task per read).
        async with deadlines.timeout(IDLE_SECONDS) as idle:
            while True:
                event = await events.get()
                if isinstance(event, BaseException):
                    raise event
                if isinstance(event, PassedPipes):
                    reading = _read_passed(event, asked_for_pipes and reading is None and not streamed, output)
                    continue
                if isinstance(event, OutputEvent):
                    piece: OutputEvent | process_pb2.Output = event
                    kind = "output"
                else:
                    piece = event.output
                    kind = event.WhichOneof("event")
                if kind == "keepalive":
                    idle.reschedule(loop.time() + IDLE_SECONDS)
                    continue
                if kind == "error":
                    raise from_wire(event.error)
                if kind is None or (kind == "started" and begun):
                    raise SandboxProtocolError(f"the sandbox sent an unexpected {kind or 'empty'} event")
                begun = True
                if kind == "output":
                    channel = convert.CHANNELS.get(piece.channel)
                    if channel is None:
                        raise SandboxProtocolError(f"the sandbox sent output on unknown channel {piece.channel}")
                    if reading is not None:
                        raise SandboxProtocolError("the sandbox sent output events for a process whose pipes it passed")
                    streamed = True
                    idle.reschedule(None)  # however long the consumer takes
                    await output.feed(channel, piece.data)
                elif kind == "finished":
                    facts = checked_answer(convert.finished_facts, event.finished)
                    for passed in _passed_before(events):
                        reading = _read_passed(passed, asked_for_pipes and reading is None and not streamed, output)
                    if event.finished.output_passed and reading is None:
                        raise SandboxProtocolError("the sandbox said it passed output pipes that never came")
                    if not event.finished.output_passed and reading is not None:
                        raise SandboxProtocolError("the sandbox passed output pipes and then said it had not")
                    if reading is not None:
                        idle.reschedule(None)  # the drain is bounded; the consumer takes what it takes
                        await _drained(reading)
                        reading = None
                    await output.collector.finish()
                    return facts
                idle.reschedule(loop.time() + IDLE_SECONDS)
    except TimeoutError:
        if not idle.expired():
            raise
        raise SandboxUnavailableError(f"the sandbox sent nothing for {IDLE_SECONDS:g} seconds") from None
    finally:
        if reading is not None:  # failed or canceled: read and feed nothing more
            reading.close()
            await reading.abandon()


def _read_passed(passed: PassedPipes, allowed: bool, output: Output) -> OutputPipes:
    """Start reading the pipes the server passed, with the host backend's own reader, into
    ``output``'s cap and collector; ``allowed``: they were asked for, and neither pipes nor output
    events came for this process before."""
    if not allowed:
        passed.close()
        raise SandboxProtocolError("the sandbox passed output pipes it was not asked for, or beside output events")
    return OutputPipes({passed.stdout: "stdout", passed.stderr: "stderr"}, output.cap, output.collector)


def _passed_before(events: asyncio.Queue[_Item]) -> Iterator[PassedPipes]:
    """The pipes passed for a process whose Finished has come: the server sends them before it,
    on the same connection, so every hand-off of this process is in its queue (nothing else comes
    after Finished)."""
    while not events.empty():
        if isinstance(item := events.get_nowait(), PassedPipes):
            yield item
        else:
            _discard(item)


async def _drained(reading: OutputPipes) -> None:
    """The process has ended: read what is left, for at most the host backend's grace (a
    descendant that escaped its group may hold the pipes open), then feed it all."""
    reading.drain()
    await completed_within(reading.closed, DRAIN_GRACE_SECONDS)
    reading.close()
    await reading.delivered()
