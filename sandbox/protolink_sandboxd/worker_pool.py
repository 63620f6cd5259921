"""Worker processes that run workspace and document operations as the command user.

A worker serves one request at a time and is reused while it stays healthy. One that runs
past its wall time, dies (memory or CPU limit, a crash), breaks the pipe protocol, or is
abandoned by a canceled call is killed and reaped; the next call starts a fresh one. The
caller gets a typed error and the server lives on.

A worker is forked from the server when a call needs one: it shares the server's pages (the
modules a worker runs among them) until either writes them, and starts in a few milliseconds,
so an idle sandbox need hold none (:meth:`WorkerPool.retire_idle`). A document operation
takes a worker started with exec instead, which loads the document parsers before it drops
its ids, as every worker of a server that holds a token is (a forked one would carry it).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from protolink.errors import SandboxError, SandboxLimitError
from protolink.wire._pb import errors_pb2
from protolink.wire.status import KINDS

from . import frames
from .command_line import show_command_line

if TYPE_CHECKING:
    from protolink.wire.operations import WireOperation

#: How often a killed worker is checked for its exit until it is reaped.
REAP_POLL_SECONDS = 0.01
#: How long a failed worker start waits before the next attempt.
SPAWN_RETRY_SECONDS = 0.2
#: How long one call must hold a worker, while another waits, before the pool starts another.
GROW_AFTER_SECONDS = 0.1
#: A worker whose resident memory is past this share of its address-space limit after a call is
#: replaced: Python seldom gives back what a parse grew to, and what an idle worker holds is taken
#: from commands (under gVisor a worker kept 356 MiB after two memory bombs, and the next command's
#: allocations then had the host end the whole sandbox).
KEEP_AT_MOST_SHARE = 0.25

log = logging.getLogger("sandbox")


class OperationFailed(Exception):
    """The operation raised inside its worker; ``error`` is the wire error to answer with."""

    def __init__(self, error: errors_pb2.Error) -> None:
        super().__init__(error.message)
        self.error = error


class _Worker:
    """A worker process, a child of this one, and the two pipes to it."""

    def __init__(self, pid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 inbound: asyncio.BaseTransport, *, parsers: bool) -> None:
        self.pid = pid
        self.parsers = parsers  # whether it has the document parsers loaded
        self._reader, self._writer, self._inbound = reader, writer, inbound
        self._code: int | None = None

    @classmethod
    async def open(cls, pid: int, to_worker: int, from_worker: int, *, parsers: bool) -> _Worker:
        """Talk to worker ``pid`` over the pipe ends ``to_worker`` and ``from_worker``, taken over:
        should this fail, or be canceled (the pool closes as the worker starts), the worker is
        killed and reaped and the pipes closed."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        outbound = os.fdopen(to_worker, "wb", buffering=0)
        inbound: asyncio.BaseTransport | None = None
        try:
            inbound, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                      os.fdopen(from_worker, "rb", buffering=0))
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, outbound)
        except BaseException:  # a connect that fails closes its own pipe's transport
            if inbound is not None:
                inbound.close()
            else:
                outbound.close()
            await _kill_and_reap(pid)
            raise
        return cls(pid, reader, asyncio.StreamWriter(transport, protocol, None, loop), inbound, parsers=parsers)

    @property
    def running(self) -> bool:
        """Whether the worker has not exited (an exited one is reaped here)."""
        if self._code is None:
            self._code = _reaped(self.pid)
        return self._code is None

    async def ask(self, frame: bytes, max_reply_bytes: int) -> tuple[int, bytes]:
        self._writer.write(frame)
        await self._writer.drain()
        status, length = frames.REPLY.unpack(await self._reader.readexactly(frames.REPLY.size))
        if status not in (frames.OK, frames.ERROR):
            raise _Broken(f"a reply with status {status}")
        if length > max_reply_bytes:
            raise _TooLarge(length)
        return status, await self._reader.readexactly(length)

    async def stop(self) -> int:
        """Kill the worker and reap it; its exit status."""
        self._writer.close()
        self._inbound.close()
        if self._code is None:
            self._code = await _kill_and_reap(self.pid)
        return self._code


class _Broken(Exception):
    """The worker broke the pipe protocol."""


class _TooLarge(Exception):
    """The worker's answer is larger than a message may be."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


class WorkerPool:
    """Runs operations in worker processes, at most ``max_workers`` of them; ``forks``: whether
    they may be forked from this process (not when it holds a secret).

    A call takes whichever worker is idle first. When none is, the pool grows in the
    background, one worker at a time, so a burst of short calls is served by the workers that
    exist instead of waiting for new ones to load.
    """

    def __init__(self, *, uid: int, gid: int, memory_bytes: int, max_workers: int, max_message_bytes: int,
                 forks: bool = True) -> None:
        self._command = [
            sys.executable, "-I", "-m", "protolink_sandboxd.worker",
            "--uid", str(uid), "--gid", str(gid),
            "--memory-bytes", str(memory_bytes), "--max-request-bytes", str(max_message_bytes),
            "--server", str(os.getpid()),
        ]
        self._forks = forks
        self._max_message_bytes = max_message_bytes
        self._max_resident_bytes = int(memory_bytes * KEEP_AT_MOST_SHARE)
        self._max_workers = max_workers
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._live: set[_Worker] = set()
        self._growing: asyncio.Task[None] | None = None
        self._spawn_error: OSError | None = None
        self._busy: dict[_Worker, float] = {}  # worker -> when its current call started

    @property
    def pids(self) -> list[int]:
        """The pids of the workers this pool holds (each a child of this process)."""
        return [worker.pid for worker in self._live]

    async def call(self, method: str, payload: bytes, *, seconds: float, what: str) -> bytes:
        """The response payload of ``method``; OperationFailed with the operation's own error,
        TimeoutError past ``seconds`` of wall time, SandboxLimitError when the worker died."""
        frame = frames.request_frame(method, payload, seconds)
        row = operations().get(method)
        worker = await self._take(parsers=row is not None and row.operation.document)
        self._busy[worker] = time.monotonic()
        healthy = False
        try:
            status, reply = await asyncio.wait_for(worker.ask(frame, self._max_message_bytes), seconds)
            failure = failed_operation(reply) if status == frames.ERROR else None
            # A worker that ran out of memory answers, then exits: it is not reused.
            healthy = failure is None or failure.error.kind != errors_pb2.ERROR_KIND_LIMIT_EXCEEDED
        except TimeoutError:
            raise TimeoutError(f"{what} did not finish within {seconds:g} seconds; its worker was stopped") from None
        except _TooLarge as large:
            raise SandboxLimitError(f"the answer of {what} is {large.length} bytes, over this sandbox's "
                                    f"message limit of {self._max_message_bytes}") from None
        except (asyncio.IncompleteReadError, ConnectionError, _Broken, DecodeError):
            raise SandboxLimitError(f"{what} was stopped: {await _death(worker)}") from None
        finally:
            del self._busy[worker]
            if healthy and worker.running and resident_bytes(worker.pid) <= self._max_resident_bytes:
                self._idle.put_nowait(worker)
            else:
                await asyncio.shield(self._retire(worker))
        if failure is not None:
            raise failure
        return reply

    async def aclose(self) -> None:
        """Kill and reap every worker, the one starting too."""
        if self._growing is not None:
            self._growing.cancel()
            await asyncio.gather(self._growing, return_exceptions=True)
        await asyncio.gather(*(self._retire(worker) for worker in list(self._live)))

    async def retire_idle(self) -> None:
        """Kill and reap the workers no call holds; the next call forks another."""
        idle = [self._idle.get_nowait() for _ in range(self._idle.qsize())]
        await asyncio.gather(*(self._retire(worker) for worker in idle))

    async def _take(self, *, parsers: bool) -> _Worker:
        while True:
            patience = GROW_AFTER_SECONDS if self._live else 0.0
            getter = asyncio.ensure_future(self._idle.get())
            try:
                # Short calls free their workers sooner than a new one would load (a start costs
                # a few hundred milliseconds of CPU): grow only when a worker has been held by
                # one call for a while, or when there is none at all.
                done, _ = await asyncio.wait({getter}, timeout=patience)
                if not done and self._should_grow():
                    self._growing = asyncio.ensure_future(self._grow(parsers=parsers))
                growing = self._growing
                waits = {getter} if growing is None or growing.done() else {getter, growing}
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()  # the item, if one was just put, stays queued
                elif not getter.cancelled() and sys.exc_info()[0] is not None:
                    self._idle.put_nowait(getter.result())  # canceled after all: give the worker back
            if getter.done() and not getter.cancelled():
                worker = getter.result()
                if worker.running and (worker.parsers or not parsers):
                    return worker
                await self._retire(worker)  # it died while idle (a crash, the OOM killer), or has no parsers
            elif self._spawn_error is not None and not self._live:
                raise SandboxError(f"cannot start a worker process: {self._spawn_error}")

    def _should_grow(self) -> bool:
        if len(self._live) >= self._max_workers or not (self._growing is None or self._growing.done()):
            return False
        held_since = time.monotonic() - GROW_AFTER_SECONDS
        return not self._live or any(started < held_since for started in self._busy.values())

    async def _grow(self, *, parsers: bool) -> None:
        try:
            worker = await self._spawn(parsers=parsers)
        except OSError as error:  # e.g. a full process table: a fork bomb is running
            self._spawn_error = error
            log.warning("cannot start a worker process: %s", error)
            await asyncio.sleep(SPAWN_RETRY_SECONDS)  # waiting callers retry at this pace
            return
        self._spawn_error = None
        self._live.add(worker)
        self._idle.put_nowait(worker)

    async def _retire(self, worker: _Worker) -> None:
        self._live.discard(worker)
        await worker.stop()

    async def _spawn(self, *, parsers: bool) -> _Worker:
        """A worker forked from this process, or one started with exec (some 40 MB, and a few
        hundred milliseconds of CPU), which loads the document ``parsers`` (some 20 MB more)."""
        if not parsers and self._forks:
            return await _Worker.open(*self._fork(), parsers=False)
        to_worker, from_worker = os.pipe(), os.pipe()
        try:
            pid = os.posix_spawn(sys.executable, self._command, {"PATH": os.defpath}, setsid=True, file_actions=[
                (os.POSIX_SPAWN_DUP2, to_worker[0], 0), (os.POSIX_SPAWN_DUP2, from_worker[1], 1)])
        except BaseException:
            os.close(to_worker[1])
            os.close(from_worker[0])
            raise
        finally:
            os.close(to_worker[0])
            os.close(from_worker[1])
        return await _Worker.open(pid, to_worker[1], from_worker[0], parsers=True)

    def _fork(self) -> tuple[int, int, int]:
        """Fork a worker from this process (the pid, the pipe end to it, the pipe end from it).

        The server has threads (gRPC's) by now; the child has only this one, and runs none of
        their code: it leaves the event loop's signal handling, closes every descriptor but its
        pipes, as exec would, and serves requests with the modules the server has loaded."""
        from .worker import main as serve_requests  # loaded once, here: each forked child finds it loaded

        to_worker, from_worker = os.pipe(), os.pipe()
        try:
            pid = os.fork()
        except BaseException:
            for end in (*to_worker, *from_worker):
                os.close(end)
            raise
        if pid == 0:  # pragma: no cover - the child never returns
            code = 1
            try:
                gc.freeze()  # the collector would write to every object it scans: the pages would part
                signal.set_wakeup_fd(-1)
                for signum in (signal.SIGTERM, signal.SIGINT):
                    signal.signal(signum, signal.SIG_DFL)
                os.setsid()
                os.dup2(to_worker[0], 0)
                os.dup2(from_worker[1], 1)
                os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # gRPC's, the spawner's channel, ...
                os.environ.clear()
                os.environ["PATH"] = os.defpath
                show_command_line(self._command)
                code = serve_requests(self._command[4:], parsers=False)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()  # os._exit flushes nothing: the server's log would miss why
                os._exit(code)
        os.close(to_worker[0])
        os.close(from_worker[1])
        return pid, to_worker[1], from_worker[0]


def operations() -> Mapping[str, WireOperation[Any]]:
    """The operations' table. It loads at the first operation, in the server, before the first
    worker is forked (a worker drops its ids before it serves: it must find every module loaded);
    the server's start, which a cold sandbox's first command waits for, does without it."""
    from protolink.wire.operations import WIRE_OPERATIONS

    return WIRE_OPERATIONS


def _reaped(pid: int) -> int | None:
    """The exit status of child ``pid`` once it has exited (reaping it), else None."""
    try:
        reaped, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere: its status is lost, it is reported as killed
        return -signal.SIGKILL
    return os.waitstatus_to_exitcode(status) if reaped else None


async def _kill_and_reap(pid: int) -> int:
    """Kill child ``pid``'s process group and reap it, polled (gVisor has no pidfds); its exit status."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while (code := _reaped(pid)) is None:
        await asyncio.sleep(REAP_POLL_SECONDS)
    return code


def resident_bytes(pid: int) -> int:
    """The resident memory of process ``pid`` (0 once it is gone). A read of /proc, not of a
    disk: it does not block the event loop."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def failed_operation(reply: bytes) -> OperationFailed:
    """The OperationFailed a worker's ERROR reply stands for."""
    error = errors_pb2.Error.FromString(reply)
    if error.kind not in KINDS:
        raise _Broken(f"an error of unknown kind {error.kind}")
    return OperationFailed(error)


async def _death(worker: _Worker) -> str:
    """Why a worker stopped answering, once it is reaped."""
    code = await worker.stop()
    if code == -signal.SIGXCPU:
        return "its worker exceeded its CPU time limit"
    if code < 0:
        return f"its worker was killed by signal {-code} (a memory or CPU limit, or a crash)"
    return f"its worker exited with status {code}"
