"""LocalProcesses: run one approved ProcessSpec on this host and supervise it to the end.

The process is the leader of a new session and process group, with stdin on /dev/null unless
the caller gives it a pipe's read end.
Stdout and stderr are read by :class:`~protolink.execution.output_pipes.OutputPipes`: the
first ``max_output_bytes`` are kept (:class:`OutputCap`) and handed, in order, to an
:class:`OutputSink`: on the host an :class:`OutputCollector`, which decodes, keeps and emits
them as ``process.output`` events. Whatever ends the process, its group is killed and the
leader reaped before ``execute`` returns or raises:

- normal exit: SIGKILL to the group, so ordinary descendants left behind die with it;
- timeout: SIGTERM to the group, a short grace, SIGKILL to the group; the result has
  ``timed_out=True`` and ``exit_code`` is the negative number of the signal that ended the
  leader (``None`` if the kernel never reported it dead). A launcher may kill the group itself
  once the timeout and that grace have passed (the sandbox's keepers do, for a server its
  commands starve of the CPU); the result is then timed out too;
- cancellation: the same cleanup, shielded, then :class:`ProcessCancelledError` carrying the
  partial result (``canceled=True``).

After the leader is gone, output already written is read for at most
:data:`DRAIN_GRACE_SECONDS`; descendants that escaped into their own session may hold the
pipes open longer, and their later output is discarded.

The pipes and the leader's exit are watched by the event loop itself (a pidfd on Linux), so
a running process costs no thread. A :class:`Launcher` is the one step that starts the leader:
:class:`HostLauncher` on the host; the sandbox server passes one that starts commands through
its spawner, as the command user, and supervises them with everything else here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from protolink.errors import ToolExecutionError

from .groups import completed_within, signal_group, terminate_group
from .output import Channel, OutputCap, OutputCollector, OutputSink
from .output_pipes import OutputPipes
from .process_types import Emitter, ProcessCancelledError, ProcessResult, ProcessSpec
from .resolve import Resolved, check_real_executable, resolve_command

T = TypeVar("T")

#: How long pipes are still read after the process group is gone.
DRAIN_GRACE_SECONDS = 1.0

#: Offered the read ends of a process's stdout and stderr: True when it has taken them
#: (sent them elsewhere; the caller closes its own copies).
HandOff = Callable[[int, int], bool]


class Leader(Protocol):
    """A started process: the leader of its own session and process group."""

    pid: int
    #: Completed once the leader has been reaped; never canceled by waiting for it.
    exited: asyncio.Future[None]
    #: Whether the launcher's own guard killed the group at the timeout and its grace.
    killed_at_deadline: bool

    @property
    def exit_code(self) -> int | None:
        """The leader's exit code (negative: the signal that ended it) once reaped, else None."""

    def close(self) -> None:
        """Stop watching for the exit (the result is being built without it)."""


class Launcher(Protocol):
    """What starts processes for :class:`LocalProcesses`, and resolves commands as the processes
    it starts would find them: this host (:class:`HostLauncher`), or the sandbox server's
    spawner, which starts them as the command user."""

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        """``argv`` resolved by the rules of :mod:`protolink.execution.resolve`."""

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None = None) -> Leader:
        """Start ``spec`` as the leader of a new session, stdin on ``stdin`` (None: /dev/null),
        stdout and stderr on the given pipe ends (the caller closes its own copies). OSError when it cannot
        start, ValueError when argv[0] no longer resolves to ``spec.real_executable``; when
        canceled, whatever it started is killed."""


class HostLauncher:
    """Processes of this host's user, started with ``vfork`` by :func:`start_process`."""

    async def resolve_command(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Resolved:
        return await asyncio.to_thread(resolve_command, argv, cwd, env)

    async def launch(self, spec: ProcessSpec, stdout: int, stderr: int, stdin: int | None = None) -> Leader:
        if spec.real_executable is not None:
            check_real_executable(spec.argv[0], spec.real_executable)
        popen = start_process(spec.argv, spec.cwd, spec.env, stdout, stderr, stdin=stdin)
        return _PopenLeader(popen, asyncio.get_running_loop())


class LocalProcesses:
    """Runs each ProcessSpec to its end through a :class:`Launcher` and supervises it here:
    output, caps, timeouts, group kills (see the module docstring)."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher

    async def execute(self, spec: ProcessSpec, execution: Emitter) -> ProcessResult:
        """Run ``spec`` to completion, timeout or cancellation; see the module docstring."""
        return await self.run(spec, OutputCollector(execution))

    async def run(self, spec: ProcessSpec, output: OutputSink, *, hand_off: HandOff | None = None,
                  stdin: int | None = None) -> ProcessResult:
        """:meth:`execute` with the kept output going to ``output``, whose text the result holds.
        ``hand_off``, when given, is offered the pipes' read ends before the process starts (so
        that their reader is ready when it writes): when it takes them, nothing is read here
        (the result's output is empty, never truncated). ``stdin``, when given, is the read end
        of a pipe for the process's standard input, closed here once the process has it (or
        could not start)."""
        child = _Child(spec)
        await child.start(self.launcher.launch, output, hand_off, stdin)
        try:
            child.timed_out = (not await completed_within(child.exited, spec.timeout_seconds)
                               or child.killed_at_deadline)
            await asyncio.shield(child.stop(terminate=child.timed_out))
            await child.pipes.delivered()
            await output.finish()
            return child.result(output)
        except asyncio.CancelledError:
            await uninterrupted(child.stop(terminate=True))
            await child.pipes.abandon()
            output.close()
            raise ProcessCancelledError(child.result(output, canceled=True)) from None


class _Child:
    """One process: its output pipes, exit watch and cleanup."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.timed_out = False
        self._loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        self._stopping: asyncio.Future[None] | None = None

    async def start(self, launch: Callable[[ProcessSpec, int, int, int | None], Awaitable[Leader]],
                    output: OutputSink, hand_off: HandOff | None, stdin: int | None) -> None:
        """Launch the process with both output pipes (and ``stdin``, which is closed here) and
        read them into ``output``, unless ``hand_off`` takes them first; ToolExecutionError when
        it cannot start."""
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        pipes: dict[int, Channel] = {stdout_read: "stdout", stderr_read: "stderr"}
        if hand_off is not None and hand_off(stdout_read, stderr_read):
            os.close(stdout_read)
            os.close(stderr_read)
            pipes = {}
        # Awaited in this task (no task of its own, which took three event-loop turns more per
        # command): a cancellation that lands while the launch waits is the launcher's to handle
        # (it kills whatever it starts once canceled); one that comes as the launch returns is
        # pending on this task, and is looked at here: the process would run on unwatched.
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        try:
            self._leader = await launch(self.spec, stdout_write, stderr_write, stdin)
            if task is not None and task.cancelling() > cancels:
                signal_group(self._leader.pid, signal.SIGKILL)
                self._leader.close()
                raise asyncio.CancelledError
        except BaseException as error:
            for fd in pipes:
                os.close(fd)
            if isinstance(error, OSError):
                reason = error.strerror or str(error)
                raise ToolExecutionError(f"could not start {self.spec.argv[0]!r} in {self.spec.cwd!r}: {reason}") from None
            raise
        finally:
            os.close(stdout_write)
            os.close(stderr_write)
            if stdin is not None:
                os.close(stdin)
        self.pipes = OutputPipes(pipes, OutputCap(self.spec.max_output_bytes), output)

    @property
    def exited(self) -> asyncio.Future[None]:
        return self._leader.exited

    @property
    def killed_at_deadline(self) -> bool:
        return self._leader.killed_at_deadline

    def stop(self, *, terminate: bool) -> asyncio.Future[None]:
        """Kill and reap the group, drain, close the pipes. Started once; later calls join it.

        A group that already ended with its pipes drained (the usual end) is settled at once."""
        if self._stopping is None:
            if not terminate:
                signal_group(self._leader.pid, signal.SIGKILL)
            self.pipes.drain()
            if not terminate and self.pipes.closed.done():
                self._stopping = self._loop.create_future()
                self._release()
                self._stopping.set_result(None)
            else:
                self._stopping = asyncio.ensure_future(self._stop(terminate))
        return self._stopping

    async def _stop(self, terminate: bool) -> None:
        if terminate:
            await terminate_group(self._leader.pid, self.exited)
        await completed_within(self.pipes.closed, DRAIN_GRACE_SECONDS)
        self._release()

    def _release(self) -> None:
        """Close what is left of the pipes and stop watching the leader."""
        self.pipes.close()
        self._leader.close()

    def result(self, output: OutputSink, *, canceled: bool = False) -> ProcessResult:
        return ProcessResult(
            exit_code=self._leader.exit_code,
            stdout=output.stdout,
            stderr=output.stderr,
            truncated=self.pipes.cap.truncated,
            timed_out=self.timed_out,
            canceled=canceled,
            duration_seconds=time.monotonic() - self._started,
        )


def start_process(argv: Sequence[str], cwd: str, env: Mapping[str, str], stdout: int, stderr: int,
                  stdin: int | None = None, **options: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session, stdin on ``stdin`` (None: /dev/null),
    stdout and stderr on the given descriptors; ``options`` are extra :class:`subprocess.Popen`
    arguments (the sandbox's spawner sets the umask). CPython starts it with vfork as long as
    no option changes the user or groups."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL if stdin is None else stdin, stdout=stdout, stderr=stderr, cwd=cwd, env=dict(env),
                            start_new_session=True, **options)


class _PopenLeader:
    """A child of this process, watched by the event loop through a pidfd (or a waiter thread)."""

    #: Nothing but :class:`LocalProcesses` kills a host command at its deadline.
    killed_at_deadline = False

    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop) -> None:
        self.pid = popen.pid
        self.exited: asyncio.Future[None] = loop.create_future()
        self._popen = popen
        self._loop = loop
        try:
            self._pidfd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            # No pidfd (not Linux, or an old kernel): a daemon thread waits for this one child.
            self._pidfd = None
            threading.Thread(target=self._wait, name=f"protolink-wait-{popen.pid}", daemon=True).start()
        else:
            loop.add_reader(self._pidfd, self._ready)

    @property
    def exit_code(self) -> int | None:
        return self._popen.returncode

    def close(self) -> None:
        if self._pidfd is not None:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

    def _ready(self) -> None:
        self.close()
        self._popen.poll()
        self._reaped()

    def _wait(self) -> None:
        self._popen.wait()
        self._loop.call_soon_threadsafe(self._reaped)

    def _reaped(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


async def uninterrupted(cleanup: Awaitable[T]) -> T:
    """The result of ``cleanup``, waited for even if the caller is canceled again meanwhile."""
    future = asyncio.ensure_future(cleanup)
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            continue
    return future.result()
