"""Worker processes that run workspace and document operations as the command user.

A worker serves one request at a time and is reused while it stays healthy. One that runs
past its wall time, dies (memory or CPU limit, a crash), breaks the pipe protocol, or is
abandoned by a canceled call is killed and reaped; the next call starts a fresh one. The
caller gets a typed error and the server lives on.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from google.protobuf.message import DecodeError

from protolink.sandbox._pb import errors_pb2
from protolink.sandbox.errors import KINDS, SandboxLimitError

from . import frames


class OperationFailed(Exception):
    """The operation raised inside its worker; ``error`` is the wire error to answer with."""

    def __init__(self, error: errors_pb2.Error) -> None:
        super().__init__(error.message)
        self.error = error


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def ask(self, frame: bytes, max_reply_bytes: int) -> tuple[int, bytes]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(frame)
        await self.process.stdin.drain()
        status, length = frames.REPLY.unpack(await self.process.stdout.readexactly(frames.REPLY.size))
        if status not in (frames.OK, frames.ERROR):
            raise _Broken(f"a reply with status {status}")
        if length > max_reply_bytes:
            raise _TooLarge(length)
        return status, await self.process.stdout.readexactly(length)

    async def stop(self) -> int:
        """Kill the worker and reap it; its exit status."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return await self.process.wait()


class _Broken(Exception):
    """The worker broke the pipe protocol."""


class _TooLarge(Exception):
    """The worker's answer is larger than a message may be."""

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length


class WorkerPool:
    """Runs operations in worker processes, at most ``max_workers`` at once."""

    def __init__(self, *, uid: int, gid: int, memory_bytes: int, max_workers: int, max_message_bytes: int) -> None:
        self._command = [
            sys.executable, "-I", "-m", "sandbox.worker",
            "--uid", str(uid), "--gid", str(gid),
            "--memory-bytes", str(memory_bytes), "--max-request-bytes", str(max_message_bytes),
            "--server", str(os.getpid()),
        ]
        self._max_message_bytes = max_message_bytes
        self._slots = asyncio.Semaphore(max_workers)
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()

    async def warm(self) -> None:
        """Start one worker ahead of the first call."""
        self._idle.append(await self._spawn())

    async def call(self, method: str, payload: bytes, *, seconds: float, what: str) -> bytes:
        """The response payload of ``method``; OperationFailed with the operation's own error,
        TimeoutError past ``seconds`` of wall time, SandboxLimitError when the worker died."""
        frame = frames.request_frame(method, payload, seconds)
        async with self._slots:
            worker = await self._idle_or_new()
            self._busy.add(worker)
            healthy = False
            try:
                status, reply = await asyncio.wait_for(worker.ask(frame, self._max_message_bytes), seconds)
                failure = _failure(reply) if status == frames.ERROR else None
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
                self._busy.discard(worker)
                if healthy and worker.process.returncode is None:
                    self._idle.append(worker)
                else:
                    await asyncio.shield(worker.stop())
        if failure is not None:
            raise failure
        return reply

    async def aclose(self) -> None:
        """Kill and reap every worker."""
        workers = [*self._idle, *self._busy]
        self._idle.clear()
        await asyncio.gather(*(worker.stop() for worker in workers))

    async def _idle_or_new(self) -> _Worker:
        # A worker may have died while idle (a command of the same uid can kill it).
        while self._idle:
            worker = self._idle.pop()
            if worker.process.returncode is None:
                return worker
            await worker.stop()
        return await self._spawn()

    async def _spawn(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            *self._command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd="/",
            env={"PATH": os.defpath},
            start_new_session=True,
        )
        return _Worker(process)


def _failure(reply: bytes) -> OperationFailed:
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
