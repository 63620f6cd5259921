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

The pipes and the leader's exit are watched by the event loop itself (a pidfd on Linux), so
a running process costs no thread.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

from protolink.core.errors import ToolExecutionError

from .groups import completed_within, signal_group, terminate_group
from .output import Channel, OutputCollector
from .process import ProcessCancelledError, ProcessResult, ProcessSpec
from .resolve import resolve_command

#: How long pipes are still read after the process group is gone.
DRAIN_GRACE_SECONDS = 1.0
#: Bytes read from a pipe per wakeup (a Linux pipe holds 64 KiB by default).
READ_CHUNK_BYTES = 64 * 1024

_Outbox = asyncio.Queue["tuple[Channel, str] | None"]


class Emitter(Protocol):
    """Where output events go: a ToolContext, or the sandbox server's event stream."""

    async def emit(self, type: str, **data: Any) -> None: ...


class LocalProcesses:
    """Host process execution: the ExecutionBackend half of LocalExecutionBackend."""

    #: Extra :class:`subprocess.Popen` options for every command (the sandbox server sets the
    #: command user and group here).
    popen_options: Mapping[str, Any] = MappingProxyType({})

    async def resolve_command(
        self, argv: Sequence[str], cwd: str, env: Mapping[str, str]
    ) -> tuple[tuple[str, ...], str]:
        """Resolve argv[0] and the working directory where the process will run (this host)."""
        return await asyncio.to_thread(resolve_command, argv, cwd, env)

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult:
        """Run ``spec`` to completion, timeout or cancellation; see the module docstring."""
        child = _Child(spec, OutputCollector(spec.max_output_bytes), self.popen_options)
        pump = asyncio.create_task(_emit_output(child.outbox, execution))
        try:
            child.timed_out = not await completed_within(child.exited, spec.timeout_seconds)
            await asyncio.shield(child.stop(terminate=child.timed_out))
            child.finish_output()
            await pump
            return child.result()
        except asyncio.CancelledError:
            await _uninterrupted(child.stop(terminate=True))
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
            raise ProcessCancelledError(child.result(canceled=True)) from None


class _Child:
    """One started process: its pipes, exit watch, collected output and cleanup."""

    def __init__(self, spec: ProcessSpec, collector: OutputCollector,
                 options: Mapping[str, Any]) -> None:
        self.collector = collector
        self.outbox: _Outbox = asyncio.Queue()
        self.timed_out = False
        self._loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        self._popen, self._pipes = _spawn(spec, options)
        self.closed: asyncio.Future[None] = self._loop.create_future()
        for fd in self._pipes:
            self._loop.add_reader(fd, self._read, fd)
        self.exited, self._unwatch = _watch_exit(self._popen, self._loop)
        self._stopping: asyncio.Future[None] | None = None
        self._finished_output = False

    def stop(self, *, terminate: bool) -> asyncio.Future[None]:
        """Kill and reap the group, drain, close the pipes. Started once; later calls join it."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(terminate))
        return self._stopping

    async def _stop(self, terminate: bool) -> None:
        if terminate:
            await terminate_group(self._popen.pid, self.exited)
        else:
            signal_group(self._popen.pid, signal.SIGKILL)
        await completed_within(self.closed, DRAIN_GRACE_SECONDS)
        for fd in list(self._pipes):
            self._close_pipe(fd)
        self._unwatch()

    def finish_output(self) -> None:
        """Flush the decoders into the event queue and end it."""
        for item in self._flush():
            self.outbox.put_nowait(item)
        self.outbox.put_nowait(None)

    def result(self, *, canceled: bool = False) -> ProcessResult:
        self._flush()
        return ProcessResult(
            exit_code=self._popen.returncode,
            stdout=self.collector.stdout,
            stderr=self.collector.stderr,
            truncated=self.collector.truncated,
            timed_out=self.timed_out,
            canceled=canceled,
            duration_seconds=time.monotonic() - self._started,
        )

    def _flush(self) -> list[tuple[Channel, str]]:
        if self._finished_output:
            return []
        self._finished_output = True
        return self.collector.close()

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, READ_CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_pipe(fd)
            return
        channel = self._pipes[fd]
        text = self.collector.feed(channel, data)
        if text:
            self.outbox.put_nowait((channel, text))

    def _close_pipe(self, fd: int) -> None:
        self._loop.remove_reader(fd)
        os.close(fd)
        del self._pipes[fd]
        if not self._pipes and not self.closed.done():
            self.closed.set_result(None)


def _spawn(spec: ProcessSpec, options: Mapping[str, Any]
           ) -> tuple[subprocess.Popen[bytes], dict[int, Channel]]:
    """Start the leader of a new session with both output pipes; return it and the read ends."""
    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    try:
        popen = subprocess.Popen(
            spec.argv, stdin=subprocess.DEVNULL, stdout=stdout_write, stderr=stderr_write,
            cwd=spec.cwd, env=dict(spec.env), start_new_session=True, **options,
        )
    except OSError as error:
        os.close(stdout_read)
        os.close(stderr_read)
        reason = error.strerror or str(error)
        raise ToolExecutionError(f"could not start {spec.argv[0]!r}: {reason}") from None
    finally:
        os.close(stdout_write)
        os.close(stderr_write)
    for fd in (stdout_read, stderr_read):
        os.set_blocking(fd, False)
    return popen, {stdout_read: "stdout", stderr_read: "stderr"}


def _watch_exit(popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop
                ) -> tuple[asyncio.Future[None], Callable[[], None]]:
    """A future completed once the leader is reaped, and a function to stop watching early."""
    exited: asyncio.Future[None] = loop.create_future()

    def reaped() -> None:
        if not exited.done():
            exited.set_result(None)

    try:
        pidfd = os.pidfd_open(popen.pid)
    except (AttributeError, OSError):
        # No pidfd (not Linux, or an old kernel): a daemon thread waits for this one child.
        def wait() -> None:
            popen.wait()
            loop.call_soon_threadsafe(reaped)

        threading.Thread(target=wait, name=f"protolink-wait-{popen.pid}", daemon=True).start()
        return exited, lambda: None

    def unwatch() -> None:
        if pidfd in watching:
            watching.clear()
            loop.remove_reader(pidfd)
            os.close(pidfd)

    def ready() -> None:
        unwatch()
        popen.poll()
        reaped()

    watching = {pidfd}
    loop.add_reader(pidfd, ready)
    return exited, unwatch


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
