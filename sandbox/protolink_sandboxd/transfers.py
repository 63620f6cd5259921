"""The server's side of uploads and downloads: one transfer process per call
(:mod:`protolink_sandboxd.transfer_worker`), fed and read over its pipes.

At most ``max_processes`` run at once; more calls wait. A call that ends early (canceled, or
its client went away) closes the process's input: an upload then removes what it wrote and
exits, within :data:`ABANDON_SECONDS`, or is killed. A download is killed at once. What a
killed upload left, the next transfer into that directory removes
(:mod:`protolink.execution.transfer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator

from protolink.errors import SandboxLimitError
from protolink.execution.transfer import CHUNK_BYTES

from . import frames
from .worker_pool import failed_operation

#: How long an abandoned upload may take to remove what it wrote before it is killed.
ABANDON_SECONDS = 10.0


class TransferProcesses:
    """Starts transfer processes acting as ``uid``/``gid``."""

    def __init__(self, *, uid: int, gid: int, memory_bytes: int, max_processes: int, max_message_bytes: int,
                 cpu_seconds: float) -> None:
        self._command = [
            sys.executable, "-I", "-m", "protolink_sandboxd.transfer_worker",
            "--uid", str(uid), "--gid", str(gid), "--memory-bytes", str(memory_bytes),
            "--max-request-bytes", str(max_message_bytes), "--server", str(os.getpid()),
        ]
        self._max_message_bytes = max_message_bytes
        self._cpu_seconds = cpu_seconds
        self._slots = asyncio.Semaphore(max_processes)

    @contextlib.asynccontextmanager
    async def start(self, method: str, request: bytes) -> AsyncIterator[Transfer]:
        """A transfer process performing ``method`` (``Upload`` or ``Download``) for ``request``."""
        async with self._slots:
            # limit: a whole chunk's frame is buffered without pausing the pipe at 128 KiB.
            process = await asyncio.create_subprocess_exec(
                *self._command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd="/",
                env={"PATH": os.defpath}, start_new_session=True, limit=2 * CHUNK_BYTES)
            transfer = Transfer(process, self._max_message_bytes)
            try:
                await transfer.write(frames.request_frame(method, request, self._cpu_seconds))
                yield transfer
            finally:
                await asyncio.shield(transfer.finish(ABANDON_SECONDS if method == "Upload" else 0.0))


class Transfer:
    """One transfer process: frames to its input, frames from its output."""

    def __init__(self, process: asyncio.subprocess.Process, max_message_bytes: int) -> None:
        self._process = process
        self._max_message_bytes = max_message_bytes

    async def send(self, message: bytes) -> bool:
        """Pass one message of the call on (an empty one: the call's stream ended); False once
        the process takes no more input (it has answered)."""
        return await self.write(frames.REPLY.pack(frames.DATA, len(message)), message)

    async def write(self, *pieces: bytes) -> bool:
        assert self._process.stdin is not None
        try:
            self._process.stdin.writelines(pieces)
            await self._process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    async def receive(self) -> tuple[int, bytes]:
        """The next frame: ``DATA`` or ``OK`` with its message; OperationFailed for an ``ERROR``
        frame; SandboxLimitError when the process died without answering."""
        assert self._process.stdout is not None
        try:
            status, length = frames.REPLY.unpack(await self._process.stdout.readexactly(frames.REPLY.size))
            if status not in (frames.OK, frames.ERROR, frames.DATA) or length > self._max_message_bytes:
                raise ValueError(f"a frame of status {status} and {length} bytes")
            payload = await self._process.stdout.readexactly(length)
        except (asyncio.IncompleteReadError, ValueError):
            code = await self._stop()
            raise SandboxLimitError(f"the transfer was stopped: its process ended with status {code} "
                                    "(a memory or CPU limit, or a crash)") from None
        if status == frames.ERROR:
            raise failed_operation(payload)
        return status, payload

    async def finish(self, grace: float) -> None:
        """Close the process's input; give it ``grace`` seconds to exit, then kill it; reap it."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        if grace:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._process.wait(), grace)
        await self._stop()

    async def _stop(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            if self._process.returncode is None:
                os.killpg(self._process.pid, signal.SIGKILL)
        return await self._process.wait()

