"""LocalProcesses: run one approved ProcessSpec on this host and supervise it to the end.

The process is the leader of a new session and process group, with stdin on /dev/null.
Stdout and stderr are drained concurrently through an :class:`OutputCollector`; kept text is
emitted as ``process.output`` events as it arrives. Whatever ends the process, its group is
killed and the leader reaped before ``execute`` returns or raises:

- normal exit: SIGKILL to the group, so ordinary descendants left behind die with it;
- timeout: SIGTERM to the group, a short grace, SIGKILL to the group; the result has
  ``timed_out=True`` and ``exit_code`` is the negative number of the signal that ended the
  leader (``None`` if the kernel never reported it dead);
- cancellation: the same cleanup, shielded, then :class:`ProcessCancelledError` carrying the
  partial result (``canceled=True``).

After the leader is gone, output already written is read for at most
:data:`DRAIN_GRACE_SECONDS`; descendants that escaped into their own session may hold the
pipes open longer, and their later output is discarded.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from protolink.core.errors import ToolExecutionError

from .groups import completed_within, signal_group, terminate_group
from .output import CHANNELS, Channel, OutputCollector
from .process import ProcessCancelledError, ProcessResult, ProcessSpec
from .resolve import resolve_command

#: How long pipes are still read after the process group is gone.
DRAIN_GRACE_SECONDS = 1.0

_Outbox = asyncio.Queue["tuple[Channel, str] | None"]


class Emitter(Protocol):
    """Where output events go: a ToolContext, or the sandbox server's event stream."""

    async def emit(self, type: str, **data: Any) -> None: ...


class LocalProcesses:
    """Host process execution: the ExecutionBackend half of LocalExecutionBackend."""

    #: Extra keyword arguments for the subprocess: the sandbox server sets the command's
    #: ``user``, ``group``, ``extra_groups`` and ``umask`` here. Empty on the host.
    popen_options: Mapping[str, Any] = MappingProxyType({})

    async def resolve_command(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str]
    ) -> tuple[tuple[str, ...], str]:
        """Resolve argv[0] and the working directory where the process will run (this host)."""
        return await asyncio.to_thread(resolve_command, argv, cwd, env)

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult:
        """Run ``spec`` to completion, timeout or cancellation; see the module docstring."""
        started = time.monotonic()
        collector = OutputCollector(spec.max_output_bytes)
        try:
            run = await _Supervised.start(spec, collector, execution, started, self.popen_options)
        except asyncio.CancelledError:
            result = ProcessResult(None, "", "", canceled=True,
                                   duration_seconds=time.monotonic() - started)
            raise ProcessCancelledError(result) from None
        try:
            return await run.supervise(spec.timeout_seconds)
        except asyncio.CancelledError:
            await _uninterrupted(run.stop(terminate=True))
            await run.abandon_events()
            raise ProcessCancelledError(run.result(canceled=True)) from None


class _Pipes(asyncio.SubprocessProtocol):
    """Feeds pipe chunks into the collector and queues the kept text for emission."""

    def __init__(self, collector: OutputCollector, outbox: _Outbox) -> None:
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self._collector = collector
        self._outbox = outbox
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        channel = CHANNELS[fd - 1]
        text = self._collector.feed(channel, data)
        if text:
            self._outbox.put_nowait((channel, text))

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.closed.done():
            self.closed.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


class _Supervised:
    """One running process: its transport, output, event pump and cleanup."""

    def __init__(self, transport: asyncio.SubprocessTransport, pipes: _Pipes,
                 collector: OutputCollector, outbox: _Outbox, execution: Emitter,
                 started: float) -> None:
        self.transport = transport
        self.pipes = pipes
        self.collector = collector
        self.outbox = outbox
        self.started = started
        self.timed_out = False
        self._pump = asyncio.create_task(_emit_output(outbox, execution))
        self._stopping: asyncio.Future[None] | None = None
        self._tails: list[tuple[Channel, str]] | None = None

    @classmethod
    async def start(cls, spec: ProcessSpec, collector: OutputCollector, execution: Emitter,
                    started: float, options: Mapping[str, Any]) -> _Supervised:
        loop = asyncio.get_running_loop()
        outbox: _Outbox = asyncio.Queue()
        try:
            transport, pipes = await loop.subprocess_exec(
                lambda: _Pipes(collector, outbox),
                *spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.cwd,
                env=dict(spec.env),
                start_new_session=True,
                **options,
            )
        except OSError as error:
            reason = error.strerror or str(error)
            raise ToolExecutionError(f"could not start {spec.argv[0]!r}: {reason}") from None
        return cls(transport, pipes, collector, outbox, execution, started)

    async def supervise(self, timeout: float) -> ProcessResult:
        self.timed_out = not await completed_within(self.pipes.exited, timeout)
        await asyncio.shield(self.stop(terminate=self.timed_out))
        for item in self._close_output():
            self.outbox.put_nowait(item)
        self.outbox.put_nowait(None)
        await self._pump
        return self.result()

    def stop(self, *, terminate: bool) -> asyncio.Future[None]:
        """Kill and reap the group, drain, close the pipes. Started once; later calls join it."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(terminate))
        return self._stopping

    async def _stop(self, terminate: bool) -> None:
        pgid = self.transport.get_pid()
        if terminate:
            await terminate_group(pgid, self.pipes.exited)
        else:
            signal_group(pgid, signal.SIGKILL)
        await completed_within(self.pipes.closed, DRAIN_GRACE_SECONDS)
        self.transport.close()
        await self.pipes.closed  # closing the pipes reports them lost on the next loop turns

    async def abandon_events(self) -> None:
        """Stop emitting: on cancellation the partial output travels in the result instead."""
        self._pump.cancel()
        await asyncio.gather(self._pump, return_exceptions=True)

    def result(self, *, canceled: bool = False) -> ProcessResult:
        self._close_output()
        return ProcessResult(
            exit_code=self.transport.get_returncode(),
            stdout=self.collector.stdout,
            stderr=self.collector.stderr,
            truncated=self.collector.truncated,
            timed_out=self.timed_out,
            canceled=canceled,
            duration_seconds=time.monotonic() - self.started,
        )

    def _close_output(self) -> list[tuple[Channel, str]]:
        if self._tails is None:
            self._tails = self.collector.close()
        return self._tails


async def _emit_output(outbox: _Outbox, execution: Emitter) -> None:
    while (item := await outbox.get()) is not None:
        channel, text = item
        await execution.emit("process.output", channel=channel, text=text)


async def _uninterrupted(future: asyncio.Future[None]) -> None:
    """Wait for cleanup to finish even if the caller is canceled again meanwhile."""
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue
