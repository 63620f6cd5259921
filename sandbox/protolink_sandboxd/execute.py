"""One ``Execute`` call: the processes its requests start, and their events on one stream.
The requests and events are serialized messages, whatever carries them: the gRPC method, or a
connection to the command channel of a host on this machine (:mod:`protolink_sandboxd.pipe_listener`).

Each request starts one process (or cancels one an earlier request started: its group is
killed and reaped, then its ``Finished`` says ``canceled`` and how it ended) and every event
carries its request's id, so a client runs all its processes on a single call instead of
paying for a call per process. A process's output goes out as the bytes its command wrote,
within its cap; the client decodes and keeps it, and this server keeps none. At most one
output event of a process waits to be sent: what the command writes meanwhile is merged into
the next, larger event, and while too much waits the command's pipes are not read (see
:mod:`protolink.execution.output_pipes`), so a slow client slows the command down instead of
filling this server's memory. Processes run through
:class:`~protolink.execution.local_processes.LocalProcesses` (started as the command user by
the spawner, :mod:`protolink_sandboxd.spawner_client`, through :class:`CommandLauncher`), at most ``max_concurrency`` at once across all calls; a call
that asks for more than twice that at once gets a limit error for each one beyond.
A process that cannot run gets an ``error`` event with a typed wire error; a request that does
not parse, or reuses the id of a running process, fails the whole call (``INVALID_ARGUMENT``).
A request that names its client's pipe connection (a local host, see
:mod:`protolink_sandboxd.pipe_listener`) has its pipes' read ends passed there instead: this
server then reads none of its output, and its ``Finished`` says so.
A request that asks for ``stdin`` gives its process a pipe for standard input, fed by the call's
later ``input`` requests of its id (at most :data:`MAX_INPUT_BYTES` each) until one closes it.
This server holds at most one such request's bytes per call: while they wait for room in the
pipe, the call takes no more requests (the client's transport holds them back). Input for a
process that has ended, or never ran, is dropped (the client cannot know it ended before its
``Finished`` arrives); input for a running process that did not ask for ``stdin``, or over the
size, fails the call.
The call ends once the client has half-closed it and its processes have finished; when it is
canceled, or the client goes away, every process it started is killed and reaped first.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from google.protobuf.message import Message

from protolink.errors import SandboxLimitError
from protolink.execution.local_processes import Leader, LocalProcesses
from protolink.execution.output import Channel
from protolink.execution.output_pipes import HEADROOM_BYTES
from protolink.execution.process_types import (
    ProcessCancelledError,
    ProcessResult,
    ProcessSpec,
)
from protolink.execution.resolve import Resolved, changed_executable
from protolink.wire import convert
from protolink.wire._pb import process_pb2
from protolink.wire.output_events import output_event_in
from protolink.wire.status import to_status

from .activity import Activity
from .pipe_listener import PipeListener
from .spawner_client import CommandSpec, ResolutionChanged, SpawnerClient
from .strays import StraySweeper

#: A quiet process still sends an event this often, so either side notices a dead peer.
KEEPALIVE_SECONDS = 5.0
#: A process that sends nothing else this soon after it starts gets a ``started`` event: the
#: client learns that it runs, and a short command does not pay for one more message, also in a
#: burst, where commands waiting for the CPU take hundreds of milliseconds each.
STARTED_NOTICE_SECONDS = 1.0
#: Pauses before a command refused a process for lack of tasks (EAGAIN) is tried again: the
#: strays a sweep has just killed (a fork bomb's) count against the limits until they are reaped.
NO_TASK_RETRY_SECONDS = (0.05, 0.1, 0.2, 0.4, 0.8)
#: The most bytes of standard input one request may carry: all this server holds of a process's input.
MAX_INPUT_BYTES = 64 * 1024


class CommandLauncher:
    """The :class:`~protolink.execution.local_processes.Launcher` of the server: commands are
    resolved and started by the spawner, as the command user; a launch refused for lack of
    tasks is tried again after a sweep for strays. Supervision stays in LocalProcesses."""

    def __init__(self, spawner: SpawnerClient, sweeper: StraySweeper) -> None:
        self._spawner = spawner
        self._sweeper = sweeper

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        return await self._spawner.resolve_command(argv, cwd, env)

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None = None) -> Leader:
        """Start ``spec`` through the spawner; refused for lack of tasks, it is tried again
        after a sweep for strays and a pause (NO_TASK_RETRY_SECONDS) before the refusal stands."""
        for pause in NO_TASK_RETRY_SECONDS:
            try:
                return await self._start(spec, stdout, stderr, stdin)
            except OSError as error:
                if error.errno != errno.EAGAIN:
                    raise
            await self._sweeper.sweep()
            await asyncio.sleep(pause)
        return await self._start(spec, stdout, stderr, stdin)

    async def _start(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None) -> Leader:
        try:
            return await self._spawner.launch(spec, stdout, stderr, stdin)
        except ResolutionChanged:
            raise ValueError(await self._change(spec)) from None

    async def _change(self, spec: ProcessSpec) -> str:
        """Why the command of ``spec`` no longer starts the approved file in the approved directory."""
        try:
            if isinstance(spec, CommandSpec) and spec.resolved_from is not None:
                executable, cwd = spec.resolved_from
                written = await self._spawner.resolve_command([executable], cwd, spec.env)
                if (written.argv[0], written.cwd) != (spec.argv[0], spec.cwd):
                    return (f"{executable!r} in {cwd!r} now resolves to {written.argv[0]!r} in {written.cwd!r}, not "
                            f"to the {spec.argv[0]!r} in {spec.cwd!r} resolved before approval; nothing was started")
            if spec.real_executable is not None:
                now = (await self._spawner.resolve_command([spec.argv[0]], spec.cwd, spec.env)).real_executable
                if now != spec.real_executable:
                    return str(changed_executable(spec.argv[0], now, spec.real_executable))
        except ValueError as error:
            return f"{error}; nothing was started"
        return f"{spec.argv[0]!r} in {spec.cwd!r} changed while it was starting; nothing was started"


class Runner:
    """What every Execute call shares: the launcher, the processes it starts, the stray sweep,
    the slots, the server's activity (a running process counts as a running call), and the
    ``environment`` every command gets (the egress proxy's variables, when the sandbox has
    egress; the trust variables, when it has a CA file): a variable the request's own
    environment names keeps the request's value, so a caller may point one elsewhere or set
    ``NO_PROXY`` or ``PIP_CERT`` itself; the others are added. (Either way the container has no
    network interface: only the relay leads out.)"""

    def __init__(self, spawner: SpawnerClient, sweeper: StraySweeper, activity: Activity, *, max_concurrency: int,
                 max_output_bytes: int, environment: Mapping[str, str] | None = None,
                 pipes: PipeListener | None = None) -> None:
        self.launcher = CommandLauncher(spawner, sweeper)
        self.processes = LocalProcesses(self.launcher)
        self.sweeper = sweeper
        self.activity = activity
        self.slots = asyncio.Semaphore(max_concurrency)
        #: Processes one call may have running or waiting for a slot: a client keeps to
        #: max_concurrency (Info's limits); the slack covers processes it canceled that are
        #: still being reaped here.
        self.max_per_call = 2 * max_concurrency
        self.max_output_bytes = max_output_bytes
        self.environment = dict(environment or {})
        #: Where a request that names its client's pipe connection has its output's pipes passed.
        self.pipes = pipes


#: An event to send, serialized, with the future to complete once it is taken for sending; or
#: what failed the call; or None, the end of the call.
_Queued = tuple[bytes, "asyncio.Future[None] | None"] | BaseException | None


class ProcessCall:
    """The processes of one Execute call; iterate :meth:`events` to serve it. Its requests come
    from the iterator :meth:`events` is given (gRPC's), or one by one through :meth:`take` as
    they are read (the command channel's: no queue, no task between the request and its process)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._queue: asyncio.Queue[_Queued] = asyncio.Queue()
        self._running: dict[int, asyncio.Task[None]] = {}
        self._inputs: dict[int, _Stdin] = {}  # the running processes that asked for stdin
        self._reader: asyncio.Future[None] | None = None
        self._reading = True
        self._taking = True

    @property
    def waiting(self) -> int:
        """How many of the call's events wait to be taken from :meth:`events`."""
        return self._queue.qsize()

    def take(self, data: bytes) -> asyncio.Future[None] | None:
        """Start the process request ``data`` asks for, cancel the one it names, or feed its
        input. A request that does not parse, or reuses the id of a running process, fails the
        call: it and every request after it start nothing. Beyond the call's limit of processes,
        the request gets a limit error of its own. Returns a future when the call takes no more
        requests until it is done (the input waits for room in its process's pipe)."""
        if not self._taking:
            return None
        try:
            return self._start_or_cancel(data)
        except Exception as error:
            self._fail(error)
            return None

    async def events(self, requests: AsyncIterator[bytes] | None = None) -> AsyncIterator[bytes]:
        """The call's events, serialized, until it ends; raises what failed the call. With
        ``requests``, the call ends once they have and its processes have finished; without,
        the requests come through :meth:`take` until the call is closed."""
        if requests is not None:
            self._reader = asyncio.ensure_future(self._read(requests))
        try:
            while (item := await self._queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                event, taken = item
                if taken is not None and not taken.done():  # done: its process was canceled
                    taken.set_result(None)
                yield event
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Take no more requests; kill and reap every process the call started."""
        self._taking = False
        tasks = list(self._running.values())
        if self._reader is not None:
            tasks.append(self._reader)
        for task in tasks:
            task.cancel()  # a process's task kills and reaps its group before it ends
        await _settled(tasks)

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for request in requests:
                if (blocked := self.take(request)) is not None:
                    await blocked
        except Exception as error:  # a broken protocol
            self._fail(error)
        finally:
            self._reading = False
            self._end_if_done()

    def _fail(self, error: Exception) -> None:
        self._taking = False
        self._queue.put_nowait(error)

    def _start_or_cancel(self, data: bytes) -> asyncio.Future[None] | None:
        request = convert.parse(process_pb2.ExecuteRequest, data)
        if request.cancel:
            if (task := self._running.get(request.id)) is not None:
                task.cancel()
            return None
        if request.HasField("input"):
            return self._feed(request.id, request.input)
        convert.require(request.id not in self._running, f"request id {request.id} is already running")
        if len(self._running) >= self._runner.max_per_call:
            refusal = SandboxLimitError(f"more than {self._runner.max_per_call} processes on one call")
            self._queue.put_nowait((_event(request.id, error=to_status(refusal)[1]), None))
            return None
        stdin = None
        if request.stdin:
            stdin = self._inputs[request.id] = _Stdin()
        task = asyncio.ensure_future(self._run(request, stdin))
        self._running[request.id] = task
        task.add_done_callback(lambda _: self._finished(request.id))
        return None

    def _feed(self, request_id: int, given: process_pb2.Input) -> asyncio.Future[None] | None:
        """Write ``given`` to the stdin of process ``request_id``; the future of :meth:`take`."""
        convert.require(len(given.data) <= MAX_INPUT_BYTES, f"input of more than {MAX_INPUT_BYTES} bytes in one request")
        stdin = self._inputs.get(request_id)
        if stdin is None:
            convert.require(request_id not in self._running, f"input for request id {request_id}, which has no stdin")
            return None  # its process has ended: nothing reads it any more
        return stdin.feed(given.data, close=given.close)

    def _finished(self, request_id: int) -> None:
        del self._running[request_id]
        if self._inputs:  # forgotten with the process: input for it is dropped from now on
            self._inputs.pop(request_id, None)
        self._end_if_done()

    def _end_if_done(self) -> None:
        if not self._reading and not self._running:
            self._queue.put_nowait(None)

    async def _run(self, request: process_pb2.ExecuteRequest, stdin: _Stdin | None) -> None:
        """Run one process, queueing its events. Canceled, its group is killed and reaped
        first; then its Finished says how it ended (``canceled``, the signal's exit code)."""
        events = _ProcessEvents(request.id, self._queue)
        started = time.monotonic()
        try:
            with self._runner.activity.call():
                result = await self._execute(request, events, stdin)
        except ProcessCancelledError as canceled:
            result = canceled.result
        except asyncio.CancelledError:  # before it started
            result = ProcessResult(None, "", "", canceled=True, duration_seconds=time.monotonic() - started)
        except Exception as error:
            events.put(error=to_status(error)[1])
            return
        finally:
            events.close()
            if stdin is not None:
                stdin.close()
        events.put(finished=process_pb2.Finished(
            exit_code=result.exit_code,
            truncated=result.truncated,
            timed_out=result.timed_out,
            canceled=result.canceled,
            duration_seconds=result.duration_seconds,
            output_passed=events.passed,
        ))

    async def _execute(self, request: process_pb2.ExecuteRequest, events: _ProcessEvents,
                       stdin: _Stdin | None) -> ProcessResult:
        spec = convert.process_spec(request)
        if self._runner.environment:
            spec = dataclasses.replace(spec, env={**self._runner.environment, **spec.env})
        spec = CommandSpec.of(spec, convert.command_as_written(request))
        convert.require(spec.max_output_bytes <= self._runner.max_output_bytes,
                         f"max_output_bytes is over this sandbox's limit of {self._runner.max_output_bytes}")
        hand_off = None
        if request.pipe_connection and self._runner.pipes is not None:
            hand_off = functools.partial(events.hand_off, self._runner.pipes, request.pipe_connection)
        async with self._runner.slots, self._runner.sweeper.command():
            events.starting()
            return await self._runner.processes.run(spec, events, hand_off=hand_off,
                                                    stdin=None if stdin is None else stdin.hand_over())


class _Stdin:
    """A process's standard input: a pipe whose read end the process gets and whose write end
    (non-blocking) this server feeds, one request's bytes at a time, on the event loop. When the
    process has ended or closed its end, what comes is dropped."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._loop = asyncio.get_running_loop()
        self._pending = memoryview(b"")
        self._closing = False
        self._room: asyncio.Future[None] | None = None

    def hand_over(self) -> int:
        """The read end, for the process: its taker closes it."""
        fd, self._read = self._read, -1
        return fd

    def feed(self, data: bytes, *, close: bool) -> asyncio.Future[None] | None:
        """Write ``data`` (then close the pipe when ``close``); a future done once it has all gone
        into the pipe (or been dropped), when it could not at once."""
        if self._write < 0:
            return None
        self._pending, self._closing = memoryview(data), close
        self._flush()
        if self._write < 0 or not self._pending:
            return None
        self._room = self._loop.create_future()
        self._loop.add_writer(self._write, self._flush)
        return self._room

    def close(self) -> None:
        """Close the pipe (its process has ended, or never started)."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1
        self._end()

    def _end(self) -> None:
        """Close the write end (the input has ended, or nothing reads it); what waits is dropped."""
        if self._write >= 0:
            if self._room is not None:
                self._loop.remove_writer(self._write)
            os.close(self._write)
            self._write = -1
        self._pending = memoryview(b"")
        self._release()

    def _flush(self) -> None:
        try:
            while self._pending:
                self._pending = self._pending[os.write(self._write, self._pending):]
        except BlockingIOError:
            return
        except OSError:  # EPIPE: nothing reads the pipe any more
            self._end()
            return
        if self._closing:
            self._end()
        elif self._room is not None:
            self._loop.remove_writer(self._write)
            self._release()

    def _release(self) -> None:
        """The call takes requests again (its wait may have been canceled: the call is ending)."""
        if self._room is not None and not self._room.done():
            self._room.set_result(None)
        self._room = None


class _ProcessEvents:
    """One process's events into the call's queue: the OutputSink LocalProcesses feeds (its
    output, as bytes, at most one event waiting), a ``started`` event when nothing else comes
    first, and a keepalive every KEEPALIVE_SECONDS until closed. It keeps no text: the
    result's output is empty here, the client assembles it."""

    stdout = stderr = ""
    #: Whether the output's pipes went to the client's pipe connection (no output event comes).
    passed = False

    def __init__(self, request_id: int, queue: asyncio.Queue[_Queued]) -> None:
        self._id = request_id
        self._queue = queue
        self._loop = asyncio.get_running_loop()
        self._sent = False
        self._notice: asyncio.TimerHandle | None = None
        self._keepalive = self._loop.call_later(KEEPALIVE_SECONDS, self._keep_alive)
        self._waiting: asyncio.Future[None] | None = None

    def starting(self) -> None:
        """The process has its slot: ``started`` follows in STARTED_NOTICE_SECONDS unless
        another event (output, finished) has told the client first."""
        self._notice = self._loop.call_later(STARTED_NOTICE_SECONDS, self._notify_started)

    def put(self, **event: Message) -> None:
        self._sent = True
        self._queue.put_nowait((_event(self._id, **event), None))

    def hand_off(self, pipes: PipeListener, key: bytes, stdout: int, stderr: int) -> bool:
        """Pass the read ends ``stdout`` and ``stderr`` to the client's pipe connection ``key``
        (:class:`~protolink.execution.local_processes.HandOff`)."""
        self.passed = pipes.hand_off(key, self._id, stdout, stderr)
        return self.passed

    async def feed(self, channel: Channel, data: memoryview) -> None:
        """Queue an Output event once the previous one has been taken for sending; the event is
        made in one copy, its head written into the room OutputPipes leaves in front of ``data``."""
        if self._waiting is not None:
            await self._waiting
        self._sent = True
        self._waiting = self._loop.create_future()
        event = output_event_in(data.obj, HEADROOM_BYTES, HEADROOM_BYTES + len(data), self._id,
                                convert.CHANNEL_NUMBERS[channel])
        self._queue.put_nowait((event, self._waiting))

    async def finish(self) -> None:
        """Nothing to do: the Finished event follows the output."""

    def close(self) -> None:
        """No more started or keepalive events."""
        if self._notice is not None:
            self._notice.cancel()
        self._keepalive.cancel()

    def _notify_started(self) -> None:
        if not self._sent:
            self.put(started=process_pb2.Started())

    def _keep_alive(self) -> None:
        self.put(keepalive=process_pb2.Keepalive())
        self._keepalive = self._loop.call_later(KEEPALIVE_SECONDS, self._keep_alive)


def _event(request_id: int, **event: Message) -> bytes:
    return process_pb2.ExecuteEvent(id=request_id, **event).SerializeToString()


async def _settled(tasks: list[asyncio.Task[None] | asyncio.Future[None]]) -> None:
    """Wait until every task is done, even when this wait is canceled meanwhile."""
    while pending := [task for task in tasks if not task.done()]:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait(pending)
